"""Crop atlases: every object's crop stored once more, as one chunk, inside an OME-Zarr plate.

A shuffled epoch reads each crop once, from anywhere in the plate. Cut from the fields, a 96 px crop
overlaps several field chunks (bytes it does not need, and ranges that do not join over an object
store); stored as a chunk of its own it is one read of about its own compressed bytes. The atlas is
an OME-Zarr image beside the plate's wells (``crop_atlas/s<size>/``: axes c, y, x, one ``size`` x
``size`` chunk per crop, in shards of ``shard_cells`` x ``shard_cells`` cells), which any NGFF or zarr
reader opens, and ``windows.json`` beside its array says which field window each cell holds.

Cells are numbered so that neighbours in number are neighbours on disk (:class:`AtlasGrid`): shard
after shard, and inside a shard row by row, in the order its chunks are stored. Crop ``i`` of the
plate's object table is cell ``i``, so a run of objects in table order is one byte range of one shard,
which the direct reader fetches as one request.

A reader routes a region to the atlas only where a cell holds it whole (:meth:`CropAtlas.route`): the
same pixels as the field, so what is read never depends on whether the atlas was used. Crops of other
sizes or windows, and everything else, read the fields. So do the crops of a long run of one field
(:class:`FieldRun`): a grouped pattern reads a field's crops one after another, and they share the
field's decoded chunks, which a cache then serves for less than decoding each crop's cell.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cropbench.errors import StoreError
from cropbench.formats.base import PlateMetadata, Regions
from cropbench.formats.metadata import ArrayMetadata
from cropbench.formats.ngff import read_array_metadata

#: The group under the plate that holds its atlases, one image per crop size.
ATLAS_GROUP = "crop_atlas"
#: The document beside an atlas's array naming the window each cell holds.
WINDOWS_NAME = "windows.json"
#: Bits of a window key per coordinate: origins from -size to MAX_FIELD_SIZE fit after shifting by size.
_COORD_BITS = 20


#: Regions of one field read one after another before the rest of the run reads the field's own chunks.
#: Longer than a shuffle's runs of consecutive objects (8 by default, :class:`~cropbench.data.sampling.ShuffledRuns`),
#: which the atlas serves in one byte range; far shorter than a field's few hundred crops.
GROUPED_RUN = 16
#: Regions of one field in a row inside one batch (those read before it included) that the batch reads
#: from the field's own chunks, all of them: a grouped batch's first regions too. Three of a shuffle's
#: runs of 8 fall together from one field in about 1 % of its batches of 64; a grouped pass's batch is
#: one or two fields.
BATCH_GROUPED_RUN = 24


@dataclass(frozen=True)
class FieldRun:
    """The run of regions of one field that a reader has just read: ``length`` of field ``field``."""

    field: int = -1
    length: int = 0

    def extend(self, fields: np.ndarray) -> tuple[np.ndarray, FieldRun]:
        """For each of ``fields`` (regions read in this order after this run), how many regions of its
        field came just before it; and the run after them all."""
        fields = np.asarray(fields, dtype=np.int64)
        if not len(fields):
            return np.empty(0, dtype=np.int64), self
        at = np.arange(len(fields))
        change = np.empty(len(fields), dtype=bool)
        change[0] = fields[0] != self.field
        change[1:] = fields[1:] != fields[:-1]
        before = at - np.maximum.accumulate(np.where(change, at, 0))
        if not change[0]:
            before[: int(np.argmax(change)) if change.any() else len(fields)] += self.length
        return before, FieldRun(int(fields[-1]), int(before[-1]) + 1)

    def in_fields(self, fields: np.ndarray) -> tuple[np.ndarray, FieldRun]:
        """Which of ``fields`` (regions read in this order after this run, one batch) read their field's
        own chunks rather than an atlas: past :data:`GROUPED_RUN` regions of their field, or in a stretch
        of the batch of :data:`BATCH_GROUPED_RUN` or more (this run included); and the run after them."""
        before, after = self.extend(fields)
        if not len(before):
            return np.empty(0, dtype=bool), after
        ends = np.flatnonzero(np.append(before[1:] == 0, True))  # each stretch's last region
        stretch = np.repeat(before[ends] + 1, np.diff(np.append(-1, ends)))
        return (before >= GROUPED_RUN) | (stretch >= BATCH_GROUPED_RUN), after

    def extend_one(self, field: int) -> FieldRun:
        """The run after one more region, of ``field``."""
        return FieldRun(field, self.length + 1 if field == self.field else 1)

    @property
    def grouped(self) -> bool:
        """Whether the region that made this run is past :data:`GROUPED_RUN` regions of its field."""
        return self.length > GROUPED_RUN


def atlas_folder(crop_size: int) -> str:
    """The atlas image of ``crop_size``-pixel crops, relative to the plate."""
    return f"{ATLAS_GROUP}/s{crop_size}"


def window_keys(field: np.ndarray, y0: np.ndarray, x0: np.ndarray, crop_size: int) -> np.ndarray:
    """One int per window (field, origin), so a batch's windows are looked up with array arithmetic."""
    return (
        np.asarray(field, dtype=np.int64) << 2 * _COORD_BITS
        | (np.asarray(y0, dtype=np.int64) + crop_size) << _COORD_BITS
        | (np.asarray(x0, dtype=np.int64) + crop_size)
    )


@dataclass(frozen=True)
class AtlasGrid:
    """Where each cell lies: ``columns`` cells per row of the image, in shards of ``shard_cells`` x
    ``shard_cells`` cells, filled shard by shard (shards row by row) and row by row inside a shard."""

    columns: int
    shard_cells: int

    def __post_init__(self) -> None:
        if self.shard_cells < 1 or self.columns < 1 or self.columns % self.shard_cells:
            raise ValueError(
                f"columns ({self.columns}) must be a positive multiple of shard_cells ({self.shard_cells})"
            )

    @property
    def per_shard(self) -> int:
        return self.shard_cells * self.shard_cells

    def rows(self, count: int) -> int:
        """Cell rows of an image that holds ``count`` cells: whole shards."""
        shards = -(-count // self.per_shard)
        return -(-shards // (self.columns // self.shard_cells)) * self.shard_cells

    def position(self, cells: Any) -> tuple[Any, Any]:
        """(row, column) of each cell: arrays for an array of cells, ints for one cell (an int)."""
        shard, inside = divmod(cells, self.per_shard)
        shard_row, shard_column = divmod(shard, self.columns // self.shard_cells)
        row, column = divmod(inside, self.shard_cells)
        return shard_row * self.shard_cells + row, shard_column * self.shard_cells + column


@dataclass(frozen=True, eq=False)
class CropAtlas:
    """One atlas of a plate: where its array lies, its cells' windows, and the lookup from a window to
    its cell."""

    #: The atlas's zarr array, relative to the plate.
    array_path: str
    array: ArrayMetadata
    crop_size: int
    grid: AtlasGrid
    #: The window key of each cell (:func:`window_keys`), sorted, and the cell each belongs to.
    keys: np.ndarray
    cells: np.ndarray

    @property
    def count(self) -> int:
        return len(self.keys)

    def route(self, regions: Regions, atlas_field: int, stay: np.ndarray | None = None) -> tuple[Regions, int]:
        """``regions`` with each one that a cell holds whole moved onto the atlas (field ``atlas_field``,
        the cell's pixels), landing where it did, except those ``stay`` marks; and how many moved.

        A region's window is where its crop starts: the region's origin less where it lands in the
        crop (a crop clipped at the field's edge lands inside its slot)."""
        size = self.crop_size
        if not len(self.keys):
            return regions, 0
        wy, wx = regions.y0 - regions.out_y0, regions.x0 - regions.out_x0
        wanted = window_keys(regions.field, wy, wx, size)
        found = np.minimum(np.searchsorted(self.keys, wanted), len(self.keys) - 1)
        hit = (self.keys[found] == wanted) & (regions.y1 - wy <= size) & (regions.x1 - wx <= size)
        if stay is not None:
            hit &= ~stay
        moved = int(hit.sum())
        if not moved:
            return regions, 0
        row, column = self.grid.position(self.cells[found].astype(np.int64))
        top, left = row * size - wy, column * size - wx
        return (
            Regions(
                np.where(hit, atlas_field, regions.field),
                np.where(hit, regions.y0 + top, regions.y0),
                np.where(hit, regions.y1 + top, regions.y1),
                np.where(hit, regions.x0 + left, regions.x0),
                np.where(hit, regions.x1 + left, regions.x1),
                regions.out_y0,
                regions.out_x0,
            ),
            moved,
        )

    def route_one(
        self, field: int, y0: int, y1: int, x0: int, x1: int, window: tuple[int, int]
    ) -> tuple[int, int, int, int] | None:
        """:meth:`route` for one region of the crop whose window starts at ``window`` (y, x), in plain
        ints (a crop read one at a time pays no array overhead): the region in the atlas's pixels, or
        None where no cell holds it."""
        size, (wy, wx) = self.crop_size, window
        if y1 - wy > size or x1 - wx > size or not len(self.keys):
            return None
        wanted = field << 2 * _COORD_BITS | (wy + size) << _COORD_BITS | (wx + size)
        found = int(self.keys.searchsorted(wanted))
        if found == len(self.keys) or int(self.keys[found]) != wanted:
            return None
        row, column = self.grid.position(int(self.cells[found]))
        top, left = row * size - wy, column * size - wx
        return y0 + top, y1 + top, x0 + left, x1 + left


def find_atlases(metadata: PlateMetadata) -> list[CropAtlas]:
    """The atlases of a plate (none for any plate without a ``crop_atlas`` group), each checked
    against the plate: its windows inside fields the plate has, its array the plate's channels."""
    group = metadata.path / ATLAS_GROUP
    if metadata.format != "ome-zarr" or not group.is_dir():
        return []
    return [read_atlas(metadata, folder) for folder in sorted(group.iterdir()) if (folder / WINDOWS_NAME).is_file()]


def read_atlas(metadata: PlateMetadata, folder: Path) -> CropAtlas:
    """One atlas, or a :class:`StoreError` naming the file and what is wrong with it."""
    where = folder / WINDOWS_NAME
    try:
        document = json.loads(where.read_text(encoding="utf-8"))
        crop_size = _positive(document, "crop_size")
        grid = AtlasGrid(_positive(document, "columns"), _positive(document, "shard_cells"))
        fields = document["fields"]
        windows = np.asarray(document["windows"], dtype=np.int64).reshape(-1, 3)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise StoreError(f"crop atlas {where} is unreadable: {str(error)[:200]}") from error
    by_path = {info.path: info.index for info in metadata.fields}
    unknown = [path for path in fields if path not in by_path]
    if unknown:
        raise StoreError(f"crop atlas {where} names field {unknown[0]!r}, which plate {metadata.path} lacks")
    if len(windows) and not (windows[:, 0].min() >= 0 and windows[:, 0].max() < len(fields)):
        raise StoreError(f"crop atlas {where}: a window names a field outside its 'fields' list")
    _, height, width = metadata.field_shape
    inside = (windows[:, 1:] > -crop_size).all() and (windows[:, 1] < height).all() and (windows[:, 2] < width).all()
    if not inside:
        raise StoreError(f"crop atlas {where}: a window of {crop_size} px does not touch its field")
    array_path = f"{folder.relative_to(metadata.path).as_posix()}/0"
    array = read_array_metadata(metadata.path / array_path)
    channels, rows = metadata.field_shape[0], grid.rows(len(windows))
    expected = (channels, crop_size, crop_size)
    chunk = array.sharding.chunk if array.sharding else array.chunk
    shard = array.chunk if array.sharding else None
    if (
        len(array.shape) != 3
        or array.shape[0] != channels
        or array.shape[1] < rows * crop_size
        or array.shape[2] < grid.columns * crop_size
        or tuple(chunk) != expected
        or shard != (channels, grid.shard_cells * crop_size, grid.shard_cells * crop_size)
        or array.dtype != np.dtype(metadata.dtype)
    ):
        raise StoreError(
            f"crop atlas {folder}: array {tuple(array.shape)} with chunks {tuple(chunk)} in shards {shard} "
            f"({array.dtype}) cannot hold {len(windows)} crops of {expected} ({metadata.dtype}) in rows of "
            f"{grid.columns}, {grid.shard_cells} x {grid.shard_cells} a shard"
        )
    field_index = np.asarray([by_path[path] for path in fields], dtype=np.int64)
    keys = window_keys(field_index[windows[:, 0]], windows[:, 1], windows[:, 2], crop_size)
    order = np.argsort(keys, kind="stable")
    return CropAtlas(array_path, array, crop_size, grid, keys[order], order.astype(np.int64))


def atlas_document(crop_size: int, grid: AtlasGrid, fields: list[str], windows: np.ndarray) -> dict[str, Any]:
    """What :data:`WINDOWS_NAME` holds: ``windows`` rows of (position in ``fields``, y0, x0), one per cell."""
    return {
        "crop_size": crop_size,
        "columns": grid.columns,
        "shard_cells": grid.shard_cells,
        "fields": fields,
        "windows": windows.tolist(),
    }


def _positive(document: dict[str, Any], name: str) -> int:
    value = document[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    return value
