"""Writing a plate's crop atlas: every object's crop cut once from the fields and stored as one chunk.

The layout's ``crop_atlas`` names the crop size; :mod:`cropbench.formats.atlas` describes what is
written and how readers find it. Cells are written a shard at a time (``SHARD_CELLS`` x ``SHARD_CELLS``
crops), so memory stays at one shard however large the plate.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import zarr

from cropbench.config import LayoutSpec
from cropbench.formats import read_plate_metadata
from cropbench.formats.atlas import WINDOWS_NAME, AtlasGrid, atlas_document, atlas_folder
from cropbench.formats.base import Regions
from cropbench.formats.direct import DirectChunkReader
from cropbench.formats.omezarr import DEFAULT_PIXEL_SIZE_UM, compressors_for, image_attributes
from cropbench.formats.shard_order import reorder_shards
from cropbench.objects import OBJECT_TABLE_NAME, crop_origins, read_object_table

#: Cells per shard side: 256 crops a shard, about 24 MiB of 96 px, 5-channel uint16 before compression.
SHARD_CELLS = 16


def atlas_grid(count: int) -> AtlasGrid:
    """The grid of an atlas of ``count`` crops: about square, in whole shards."""
    side = math.isqrt(max(count - 1, 0)) + 1
    return AtlasGrid(-(-side // SHARD_CELLS) * SHARD_CELLS, SHARD_CELLS)


def write_crop_atlas(plate: str | Path, layout: LayoutSpec) -> int:
    """Write the atlas of ``layout.crop_atlas``-pixel crops of the plate's bundled objects (every
    channel, zero outside the field, as ``CropDataset`` pads them), read back from the fields just
    written, cell ``i`` the crop of object ``i``; returns the crops written (0: no object table, or the
    layout names no atlas)."""
    root, size = Path(plate), layout.crop_atlas
    if not size or not (root / OBJECT_TABLE_NAME).is_file():
        return 0
    metadata = read_plate_metadata(root)
    channels, height, width = metadata.field_shape
    if size > height or size > width:
        return 0
    table = read_object_table(root)
    lookup = {(info.well, info.field): info.index for info in metadata.fields}
    keys = zip(table.well.tolist(), table.field.tolist(), strict=True)
    field = np.fromiter((lookup.get(key, -1) for key in keys), np.int64, count=len(table))
    # Objects a CropDataset refuses (a field the plate lacks, a centroid outside the field) get no cell.
    kept = (
        (field >= 0)
        & (table.centroid_y >= 0)
        & (table.centroid_y < height)
        & (table.centroid_x >= 0)
        & (table.centroid_x < width)
    )
    y0, x0 = crop_origins(table.centroid_y[kept], table.centroid_x[kept], size)
    field, count = field[kept], int(kept.sum())
    if not count:
        return 0
    grid = atlas_grid(count)
    folder = root / atlas_folder(size)
    image = zarr.open_group(str(folder), mode="w", zarr_format=3)
    image.attrs["ome"] = image_attributes(
        f"{metadata.name} crops of {size} px",
        metadata.channel_names,
        metadata.display_ranges,
        metadata.attributes.get("pixel_size_um", DEFAULT_PIXEL_SIZE_UM),
    )
    edge = SHARD_CELLS * size
    array = image.create_array(
        "0",
        shape=(channels, grid.rows(count) * size, grid.columns * size),
        dtype=metadata.dtype,
        chunks=(channels, size, size),
        shards=(channels, edge, edge),
        compressors=compressors_for(layout),
        dimension_names=("c", "y", "x"),
        fill_value=0,
    )
    reader = DirectChunkReader(metadata)
    try:
        for first in range(0, count, grid.per_shard):
            cells = np.arange(first, min(first + grid.per_shard, count))
            crops = np.zeros((len(cells), channels, size, size), dtype=metadata.dtype)
            reader.read_regions(
                Regions.of_windows(field[cells], y0[cells], x0[cells], size, metadata.field_shape), crops
            )
            rows, columns = grid.position(cells)
            top, left = rows[0] // SHARD_CELLS * edge, columns[0] // SHARD_CELLS * edge
            block = np.zeros((channels, edge, edge), dtype=metadata.dtype)
            for crop, row, column in zip(crops, rows * size - top, columns * size - left, strict=True):
                block[:, row : row + size, column : column + size] = crop
            array[:, top : top + edge, left : left + edge] = block
    finally:
        reader.close()
    # Inner chunks in C order, which is cell order: a run of cells is one byte range.
    reorder_shards(folder / "0", order=lambda per_shard: np.arange(math.prod(per_shard)))
    fields = [info.path for info in metadata.fields]
    windows = np.stack([field, y0, x0], axis=1)
    (folder / WINDOWS_NAME).write_text(json.dumps(atlas_document(size, grid, fields, windows)), encoding="utf-8")
    return count
