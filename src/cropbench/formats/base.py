"""The reader interface every storage layout implements, and the value objects it shares.

A reader cuts (channels, y0:y1, x0:x1) regions out of the fields of one plate. Readers are
created in the main process, pickled into DataLoader workers, and open files lazily in each
process: ``__getstate__`` drops every handle and cache.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import warnings
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Self, TypeVar

import numpy as np
import psutil

from cropbench import metrics as m
from cropbench.config import LayoutSpec, ReaderOptions
from cropbench.errors import ConfigError, OutputError, StoreError
from cropbench.formats.metadata import ArrayMetadata

#: The display range of a channel without one: the whole uint16 range.
FULL_DISPLAY_RANGE = (0.0, 65535.0)


@dataclass(frozen=True)
class FieldInfo:
    """One field of view (site) of a plate, and where its pixels live relative to the store."""

    index: int
    plate: str
    well: str
    row: str
    column: str
    field: int
    path: str


@dataclass(frozen=True)
class PlateMetadata:
    """What a reader knows about a plate before reading any pixel."""

    path: Path
    name: str
    fields: tuple[FieldInfo, ...]
    channel_names: tuple[str, ...]
    field_shape: tuple[int, int, int]
    dtype: str
    #: The storage format (``ome-zarr``, ``tiff``, ``memmap``, ``ome-arrow``); ``layout_label`` names the layout.
    format: str
    #: Each channel's display range (start, end): viewers' window and the intensity scaling of crops;
    #: the whole uint16 range for a channel the plate records none for.
    display_ranges: tuple[tuple[float, float], ...] = ()
    #: cropbench's block in the plate (layout label, provenance, pixel size); empty for other tools' plates.
    attributes: dict[str, Any] = field(default_factory=dict, compare=False)
    #: Axis of the channels in the stored field arrays (NGFF orders t, c, z, y, x); None: the one before y, x.
    channel_axis: int | None = None
    #: The one file holding every field's pixels (memmap, OME-Arrow), relative to the plate.
    pixels_file: str = ""
    #: Each field's files, one per channel (TIFF), relative to the plate.
    channel_files: tuple[tuple[str, ...], ...] = ()
    #: The object table is kept inline beside the pixels (OME-Arrow ``colocate_objects``).
    objects_inline: bool = False
    #: The pointer (URL and store config) of a plate mirrored from an object store; None for a local plate.
    remote: dict[str, Any] | None = field(default=None, compare=False)
    #: Each field's zarr array metadata, validated when the plate was opened (OME-Zarr; empty otherwise).
    arrays: tuple[ArrayMetadata, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        ranges = tuple((float(start), float(end)) for start, end in self.display_ranges)
        if len(ranges) != len(self.channel_names):
            ranges = (FULL_DISPLAY_RANGE,) * len(self.channel_names)
        object.__setattr__(self, "display_ranges", ranges)

    @property
    def layout_label(self) -> str:
        """The layout the plate was written in (its writer's label), or its format when unknown."""
        label = self.attributes.get("layout_label")
        return str(label) if label else self.format

    def field_index(self, well: str, site: int) -> int:
        for info in self.fields:
            if info.well == well and info.field == site:
                return info.index
        raise ConfigError(f"no field (well={well!r}, field={site}) in plate {self.path}")


@dataclass
class ReadStats:
    """Counters that expose read amplification: what was fetched and decoded per crop."""

    regions: int = 0
    bytes_delivered: int = 0
    bytes_fetched: int = 0
    bytes_decoded: int = 0
    chunks_touched: int = 0
    chunks_decoded: int = 0
    #: Read calls (file reads or ``pread``s) for pixels, where a reader counts them.
    reads: int = 0
    #: Chunks touched that are not in the store (no chunk file, an empty shard-index entry): they
    #: read as the fill value, as zarr does, so a deleted chunk shows up here and nowhere else.
    missing_chunks: int = 0
    #: Regions read from a crop atlas (each one stored chunk) instead of the fields.
    atlas_regions: int = 0

    def reset(self) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, 0)

    def per_region(self) -> dict[str, float]:
        regions = max(self.regions, 1)
        delivered = max(self.bytes_delivered, 1)
        return {
            m.CHUNKS_TOUCHED_PER_CROP: self.chunks_touched / regions,
            m.CHUNKS_DECODED_PER_CROP: self.chunks_decoded / regions,
            m.READS_PER_CROP: self.reads / regions,
            m.BYTES_FETCHED_PER_CROP: self.bytes_fetched / regions,
            m.BYTES_DECODED_PER_CROP: self.bytes_decoded / regions,
            m.FETCH_AMPLIFICATION: self.bytes_fetched / delivered,
            m.DECODE_AMPLIFICATION: self.bytes_decoded / delivered,
            m.CROPS_FROM_ATLAS: self.atlas_regions / regions,
        }


@dataclass(frozen=True, eq=False)
class Regions:
    """The windows of one batch as int64 columns: region ``b`` is ``field[b]``'s
    ``y0[b]:y1[b], x0[b]:x1[b]``, and it lands at ``(out_y0[b], out_x0[b])`` of slot ``b`` of the output.

    Columns rather than one object per crop, so a reader can plan a whole batch with array arithmetic.
    """

    field: np.ndarray
    y0: np.ndarray
    y1: np.ndarray
    x0: np.ndarray
    x1: np.ndarray
    out_y0: np.ndarray
    out_x0: np.ndarray

    def __len__(self) -> int:
        return len(self.field)

    @classmethod
    def of_windows(
        cls, field: np.ndarray, y0: np.ndarray, x0: np.ndarray, size: int, field_shape: tuple[int, int, int]
    ) -> Regions:
        """The ``size``-pixel windows at (``y0``, ``x0``) of their fields, clipped to the field: each
        lands where its crop starts inside the field, the rest of the crop being padding."""
        _, height, width = field_shape
        clipped_y0, clipped_x0 = np.maximum(y0, 0), np.maximum(x0, 0)
        clipped_y1, clipped_x1 = np.minimum(y0 + size, height), np.minimum(x0 + size, width)
        return cls(field, clipped_y0, clipped_y1, clipped_x0, clipped_x1, clipped_y0 - y0, clipped_x0 - x0)

    def columns(self) -> tuple[np.ndarray, ...]:
        """(field, y0, y1, x0, x1, out_y0, out_x0)."""
        return self.field, self.y0, self.y1, self.x0, self.x1, self.out_y0, self.out_x0

    def table(self) -> np.ndarray:
        """The columns as one C-contiguous (7, n) int64 array, rows in :meth:`columns` order."""
        return np.stack(self.columns()).astype(np.int64, copy=False)

    def rows(self) -> Iterator[tuple[int, int, int, int, int, int, int]]:
        """(field, y0, y1, x0, x1, out_y0, out_x0) of each region, as Python ints."""
        return zip(*(column.tolist() for column in self.columns()), strict=True)


class PlateReader(ABC):
    """Reads regions of the fields of one plate. Subclasses implement one decode path in ``_fill``;
    ``read_region`` checks the window, provides the output and counts what was delivered."""

    decode: str = ""

    def __init__(self, metadata: PlateMetadata) -> None:
        self.metadata = metadata
        self.stats = ReadStats()

    @classmethod
    def from_options(cls, metadata: PlateMetadata, options: ReaderOptions) -> Self:
        """The reader of ``metadata`` with the ``options`` that apply to it: one signature for every
        reader, so the factory picks a class from a table. This reader takes none of them."""
        return cls(metadata)

    def read_region(
        self,
        field_index: int,
        y0: int,
        y1: int,
        x0: int,
        x1: int,
        channels: np.ndarray | None = None,
        out: np.ndarray | None = None,
        window: tuple[int, int] | None = None,
    ) -> np.ndarray:
        """Return pixels (channels, y1-y0, x1-x0); the window must lie inside the field. ``window`` says
        where the crop this region is part of starts, when the field's edge clips the crop (a reader
        that keeps whole crops, by their windows, reads it from there; others ignore it)."""
        self._check_window(field_index, y0, y1, x0, x1)
        channel_count = self.metadata.field_shape[0] if channels is None else len(channels)
        result = self._output(channel_count, y0, y1, x0, x1, out)
        self._fill_crop(result, field_index, y0, y1, x0, x1, channels, window or (y0, x0))
        self.stats.regions += 1
        self.stats.bytes_delivered += result.nbytes
        return result

    @abstractmethod
    def _fill(
        self, out: np.ndarray, field_index: int, y0: int, y1: int, x0: int, x1: int, channels: np.ndarray | None
    ) -> None:
        """Write the window's pixels into ``out`` (channels, y1-y0, x1-x0), already checked and shaped."""

    def _fill_crop(
        self,
        out: np.ndarray,
        field_index: int,
        y0: int,
        y1: int,
        x0: int,
        x1: int,
        channels: np.ndarray | None,
        window: tuple[int, int],
    ) -> None:
        """:meth:`_fill` for the part of a crop starting at ``window``; most readers need only the region."""
        self._fill(out, field_index, y0, y1, x0, x1, channels)

    def read_regions(self, regions: Regions, out: np.ndarray, channels: np.ndarray | None = None) -> np.ndarray:
        """Fill ``out`` (B, channels, H, W) with the regions of a batch; pixels outside them are left as they are.

        This default reads region by region; a reader with a batch planner overrides it.
        """
        self._check_regions(regions, out)
        for slot, (field_index, y0, y1, x0, x1, out_y0, out_x0) in enumerate(regions.rows()):
            target = out[slot, :, out_y0 : out_y0 + y1 - y0, out_x0 : out_x0 + x1 - x0]
            self.read_region(field_index, y0, y1, x0, x1, channels, target)
        return out

    def read_field(self, field_index: int, channels: np.ndarray | None = None) -> np.ndarray:
        _, height, width = self.metadata.field_shape
        return self.read_region(field_index, 0, height, 0, width, channels)

    def grain(self) -> tuple[int, int]:
        """(y, x) size of the unit this path decodes at once; chunk-aware sampling groups by it."""
        return self.metadata.field_shape[1], self.metadata.field_shape[2]

    def files(self) -> list[Path]:
        """Every file holding pixels, for page-cache eviction and size on disk."""
        return sorted(p for p in self.metadata.path.rglob("*") if p.is_file())

    def close(self) -> None:  # noqa: B027 - optional hook, most readers hold nothing to release
        """Release handles and caches; the reader reopens lazily if used again."""

    def __getstate__(self) -> dict[str, Any]:
        return {"metadata": self.metadata, **self._config_state()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    def _config_state(self) -> dict[str, Any]:
        return {}

    def _output(self, channel_count: int, y0: int, y1: int, x0: int, x1: int, out: np.ndarray | None) -> np.ndarray:
        shape = (channel_count, y1 - y0, x1 - x0)
        if out is None:
            return np.empty(shape, dtype=self.metadata.dtype)
        if out.shape != shape:
            raise ConfigError(f"out has shape {out.shape}, expected {shape}")
        return out

    def _check_window(self, field_index: int, y0: int, y1: int, x0: int, x1: int) -> None:
        _, height, width = self.metadata.field_shape
        if not 0 <= field_index < len(self.metadata.fields):
            raise ConfigError(f"field_index={field_index} outside 0..{len(self.metadata.fields) - 1}")
        if not (0 <= y0 < y1 <= height and 0 <= x0 < x1 <= width):
            raise ConfigError(
                f"window y{y0}:{y1} x{x0}:{x1} is not inside field {field_index} of shape {height}x{width}"
            )

    def _check_regions(self, regions: Regions, out: np.ndarray) -> None:
        """Every window of the batch inside its field, and inside its slot of ``out``."""
        _, height, width = self.metadata.field_shape
        if out.ndim != 4 or out.shape[0] != len(regions):
            raise ConfigError(f"out has shape {out.shape}, expected ({len(regions)}, channels, height, width)")
        inside = (
            (regions.field >= 0)
            & (regions.field < len(self.metadata.fields))
            & (regions.y0 >= 0)
            & (regions.y0 < regions.y1)
            & (regions.y1 <= height)
            & (regions.x0 >= 0)
            & (regions.x0 < regions.x1)
            & (regions.x1 <= width)
            & (regions.out_y0 >= 0)
            & (regions.out_y0 + regions.y1 - regions.y0 <= out.shape[2])
            & (regions.out_x0 >= 0)
            & (regions.out_x0 + regions.x1 - regions.x0 <= out.shape[3])
        )
        if not inside.all():
            slot = int(np.flatnonzero(~inside)[0])
            field_index, y0, y1, x0, x1, out_y0, out_x0 = list(regions.rows())[slot]
            raise ConfigError(
                f"region {slot} (field {field_index}, y{y0}:{y1} x{x0}:{x1} at {out_y0},{out_x0}) is not inside "
                f"a field of shape {height}x{width} ({len(self.metadata.fields)} fields) and its slot {out.shape[2:]}"
            )


Key = TypeVar("Key", bound=Hashable)
Value = TypeVar("Value")


def _nbytes(value: Any) -> int:
    return int(value.nbytes)


class LruCache(Generic[Key, Value]):
    """A least-recently-used mapping bounded by the total ``size`` of its values: every cache of
    decoded chunks, strips and whole fields in the readers.

    ``size`` weighs a value (its ``nbytes`` unless given; ``lambda _: 1`` bounds a count). A value
    heavier than the whole budget is not kept, unless ``keep_newest``: then the value just put is
    never evicted, for callers that must hold the one item in use however large it is.
    """

    def __init__(self, budget: int, size: Callable[[Value], int] = _nbytes, keep_newest: bool = False) -> None:
        self.budget = budget
        self.used = 0
        self._size = size
        self._keep_newest = keep_newest
        self._items: OrderedDict[Key, tuple[Value, int]] = OrderedDict()

    def get(self, key: Key) -> Value | None:
        entry = self._items.get(key)
        if entry is None:
            return None
        self._items.move_to_end(key)
        return entry[0]

    def get_many(self, keys: Iterable[Key]) -> dict[Key, Value]:
        """The values held for ``keys`` (absent keys left out), each marked as just used."""
        items, touch = self._items, self._items.move_to_end
        found = {key: items[key][0] for key in keys if key in items}
        for key in found:
            touch(key)
        return found

    def put(self, key: Key, value: Value) -> None:
        size = self._size(value)
        if size > self.budget and not self._keep_newest:
            return
        previous = self._items.pop(key, None)
        if previous is not None:
            self.used -= previous[1]
        self._items[key] = (value, size)
        self.used += size
        while self.used > self.budget and len(self._items) > 1:
            _, (_, evicted) = self._items.popitem(last=False)
            self.used -= evicted

    def put_many(self, items: Iterable[tuple[Key, Value]]) -> list[Value]:
        """:meth:`put` each (key, value) in turn, without a method call per item; the values let go
        (evicted, replaced, or heavier than the budget), for a caller that recycles them."""
        entries, size_of, budget, keep_newest = self._items, self._size, self.budget, self._keep_newest
        used = self.used
        dropped: list[Value] = []
        for key, value in items:
            size = size_of(value)
            if size > budget and not keep_newest:
                dropped.append(value)
                continue
            previous = entries.pop(key, None)
            if previous is not None:
                used -= previous[1]
                dropped.append(previous[0])
            entries[key] = (value, size)
            used += size
            while used > budget and len(entries) > 1:
                evicted, evicted_size = entries.popitem(last=False)[1]
                used -= evicted_size
                dropped.append(evicted)
        self.used = used
        return dropped

    def clear(self) -> None:
        self._items.clear()
        self.used = 0

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is held, without marking it used."""
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)


#: What reading a whole field costs, carried from the inner reader into the field cache's stats.
_FORWARDED_STATS = ("reads", "bytes_fetched", "bytes_decoded", "chunks_decoded", "missing_chunks")


class FieldCacheReader(PlateReader):
    """Decode path ``field``: read a whole field once, cut many crops from it (bounded LRU)."""

    decode = "field"

    def __init__(self, metadata: PlateMetadata, inner: PlateReader, max_fields: int = 2) -> None:
        super().__init__(metadata)
        field_bytes = int(np.prod(metadata.field_shape, dtype=object)) * np.dtype(metadata.dtype).itemsize
        memory = psutil.virtual_memory().total
        if field_bytes > memory:
            raise ConfigError(
                f"decode='field' holds whole fields in memory: a field of {metadata.path} "
                f"({'x'.join(map(str, metadata.field_shape))} {metadata.dtype}) is {field_bytes:,} bytes, more than "
                f"this machine's {memory:,}; use decode='direct'"
            )
        self.inner = inner
        self.max_fields = max_fields
        self._fields: LruCache[int, np.ndarray] = LruCache(max_fields, size=lambda _: 1)

    def _config_state(self) -> dict[str, Any]:
        return {"inner": self.inner, "max_fields": self.max_fields}

    def _fill(
        self, out: np.ndarray, field_index: int, y0: int, y1: int, x0: int, x1: int, channels: np.ndarray | None
    ) -> None:
        pixels = self._fields.get(field_index)
        if pixels is None:
            inner = self.inner.stats
            before = [getattr(inner, name) for name in _FORWARDED_STATS]
            pixels = self.inner.read_field(field_index)
            for name, value in zip(_FORWARDED_STATS, before, strict=True):
                setattr(self.stats, name, getattr(self.stats, name) + getattr(inner, name) - value)
            self._fields.put(field_index, pixels)
        out[...] = pixels[:, y0:y1, x0:x1] if channels is None else pixels[channels, y0:y1, x0:x1]

    def files(self) -> list[Path]:
        return self.inner.files()

    def close(self) -> None:
        self._fields.clear()
        self.inner.close()


@dataclass(frozen=True)
class PlateGeometry:
    """What a writer must know of a plate before its first pixel: name, channels, field shape,
    wells, sites per well and each channel's display range (NGFF ``omero`` window, for viewers)."""

    name: str
    channel_names: tuple[str, ...]
    field_shape: tuple[int, int, int]
    wells: tuple[tuple[str, str], ...]
    #: Sites per well: one count for every well, or one count per well (real plates are not always complete).
    fields_per_well: int | tuple[int, ...] = 1
    #: (start, end) per channel; empty means the whole uint16 range for every channel.
    display_ranges: tuple[tuple[float, float], ...] = ()

    def __post_init__(self) -> None:
        set_field = object.__setattr__  # normalised once here, so every writer sees plain tuples
        set_field(self, "channel_names", tuple(str(name) for name in self.channel_names))
        set_field(self, "field_shape", tuple(int(size) for size in self.field_shape))
        set_field(self, "wells", tuple((str(row), str(column)) for row, column in self.wells))
        counts = self.field_counts
        if len(counts) != len(self.wells) or any(count < 1 for count in counts):
            raise ConfigError(
                f"fields_per_well must be >= 1 for each of the {len(self.wells)} wells, got {self.fields_per_well}"
            )
        if len(self.channel_names) != self.field_shape[0]:
            raise StoreError(f"{len(self.channel_names)} channel names for {self.field_shape[0]} channels")
        ranges = tuple((float(start), float(end)) for start, end in self.display_ranges)
        if ranges and len(ranges) != len(self.channel_names):
            raise ConfigError(f"{len(ranges)} display ranges for {len(self.channel_names)} channels")
        set_field(self, "display_ranges", ranges or (FULL_DISPLAY_RANGE,) * len(self.channel_names))

    @property
    def field_counts(self) -> tuple[int, ...]:
        """Sites of each well."""
        counts = self.fields_per_well
        return (int(counts),) * len(self.wells) if isinstance(counts, int) else tuple(int(c) for c in counts)

    def field_slots(self) -> list[tuple[str, str, int]]:
        """(row, column, site) of every field, in plate order."""
        return [
            (row, column, site)
            for (row, column), count in zip(self.wells, self.field_counts, strict=True)
            for site in range(count)
        ]


class PlateWriter(ABC):
    """Writes the fields of one plate in one storage layout; every layout's writer takes the same
    arguments, so generation, import and conversion write any layout.

    ``attributes`` is cropbench's block in the plate's metadata (provenance, pixel size); the
    writer adds the layout and its label, which marks the plate as cropbench's own to replace later.
    Call :meth:`close` after the last field: some layouts write their metadata only then, so an
    interrupted write never looks like a finished plate.
    """

    def __init__(
        self,
        path: str | Path,
        geometry: PlateGeometry,
        layout: LayoutSpec,
        attributes: dict[str, Any] | None = None,
        overwrite: bool = False,
    ) -> None:
        self.path = Path(path)
        self.geometry = geometry
        self.layout = layout
        self.attributes = {**(attributes or {}), "layout": dataclasses.asdict(layout), "layout_label": layout.label}
        prepare_destination(self.path, overwrite)
        self._begin()

    def _begin(self) -> None:  # noqa: B027 - optional hook
        """Create what the layout needs before the first field (the destination is free by now)."""

    @abstractmethod
    def write_field(self, row: str, column: str, site: int, pixels: np.ndarray) -> None:
        """Store the (c, y, x) pixels of one field."""

    def close(self) -> None:
        """Finish the plate (metadata written last where the layout allows it)."""
        return None

    def _check_pixels(self, row: str, column: str, site: int, pixels: np.ndarray) -> None:
        if pixels.shape != self.geometry.field_shape:
            raise StoreError(
                f"field {row}{column}/{site} has shape {pixels.shape}, expected {self.geometry.field_shape}"
            )


def warn_missing_chunks(reader: PlateReader) -> int:
    """The reader's count of missing chunks touched, with a warning when there are any: a deleted
    chunk or shard reads as the fill value (zarr's rule), so a damaged plate would otherwise measure
    and hash like a sound one."""
    missing = reader.stats.missing_chunks
    if missing:
        warnings.warn(
            f"{missing} chunk reads of {reader.metadata.path} found no chunk and gave the fill value "
            "(a chunk or shard deleted, or never written because it held only the fill value)",
            RuntimeWarning,
            stacklevel=2,
        )
    return missing


def chunk_spans(start: int, stop: int, step: int) -> list[tuple[int, int, int]]:
    """(chunk index, chunk start, chunk end) of each chunk of edge ``step`` that [start, stop) touches,
    the chunk's extent clipped to [start, stop); all in absolute coordinates."""
    return [
        (index, max(start, index * step), min(stop, (index + 1) * step))
        for index in range(start // step, (stop - 1) // step + 1)
    ]


#: The file that makes a folder of non-zarr pixels a cropbench plate (written by ``marker``).
LAYOUT_MARKER = "cropbench_layout.json"


def cropbench_attributes(path: Path) -> dict[str, Any] | None:
    """The ``cropbench`` block a cropbench writer left in the plate at ``path`` (in its layout marker
    or its root NGFF attributes), or None: what marks a folder as cropbench's own to replace."""
    for name in (LAYOUT_MARKER, "zarr.json", ".zattrs"):
        document_path = path / name
        if not document_path.is_file():
            continue
        try:
            document = json.loads(document_path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return None
        if name == "zarr.json" and isinstance(document, dict):
            document = document.get("attributes")
        block = document.get("cropbench") if isinstance(document, dict) else None
        return block if isinstance(block, dict) and "layout_label" in block else None
    return None


def prepare_destination(path: Path, overwrite: bool) -> None:
    """Refuse to replace an existing output unless asked and it is a plate cropbench wrote (an
    empty folder counts as free); create the parent folder."""
    if os.path.lexists(path):
        if not overwrite:
            raise OutputError(f"{path} already exists; pass overwrite (--force) to replace it")
        if path.is_symlink() or not path.is_dir():
            raise OutputError(f"refusing to replace {path}: it is not a folder cropbench wrote")
        if any(path.iterdir()) and cropbench_attributes(path) is None:
            raise OutputError(f"refusing to replace {path}: it is not a plate cropbench wrote; remove it yourself")
        shutil.rmtree(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OutputError(f"cannot create {path.parent}: {error}") from error
