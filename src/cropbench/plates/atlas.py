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
from cropbench.formats.atlas import WINDOWS_NAME, atlas_document, atlas_folder
from cropbench.formats.base import Regions
from cropbench.formats.direct import DirectChunkReader
from cropbench.formats.omezarr import DEFAULT_PIXEL_SIZE_UM, compressors_for, image_attributes
from cropbench.objects import OBJECT_TABLE_NAME, crop_origins, read_object_table

#: Cells per shard side: 256 crops a shard, about 24 MiB of 96 px, 5-channel uint16 before compression.
SHARD_CELLS = 16


def atlas_columns(count: int) -> int:
    """Cells per atlas row for ``count`` crops: about square, in whole shards."""
    side = math.isqrt(max(count - 1, 0)) + 1
    return -(-side // SHARD_CELLS) * SHARD_CELLS


def write_crop_atlas(plate: str | Path, layout: LayoutSpec) -> int:
    """Write the atlas of ``layout.crop_atlas``-pixel crops of the plate's bundled objects (every
    channel, zero outside the field, as ``CropDataset`` pads them), read back from the fields just
    written; returns the crops written (0: no object table, or the layout names no atlas)."""
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
    columns = atlas_columns(count)
    rows = -(-count // columns)
    rows = -(-rows // SHARD_CELLS) * SHARD_CELLS
    folder = root / atlas_folder(size)
    image = zarr.open_group(str(folder), mode="w", zarr_format=3)
    image.attrs["ome"] = image_attributes(
        f"{metadata.name} crops of {size} px",
        metadata.channel_names,
        metadata.display_ranges,
        metadata.attributes.get("pixel_size_um", DEFAULT_PIXEL_SIZE_UM),
    )
    array = image.create_array(
        "0",
        shape=(channels, rows * size, columns * size),
        dtype=metadata.dtype,
        chunks=(channels, size, size),
        shards=(channels, SHARD_CELLS * size, SHARD_CELLS * size),
        compressors=compressors_for(layout),
        dimension_names=("c", "y", "x"),
        fill_value=0,
    )
    reader = DirectChunkReader(metadata)
    try:
        cells = np.arange(count)
        cell_row, cell_column = np.divmod(cells, columns)
        for shard_row in range(0, rows, SHARD_CELLS):
            for shard_column in range(0, columns, SHARD_CELLS):
                inside = (
                    (cell_row >= shard_row)
                    & (cell_row < shard_row + SHARD_CELLS)
                    & (cell_column >= shard_column)
                    & (cell_column < shard_column + SHARD_CELLS)
                )
                chosen = cells[inside]
                if not len(chosen):
                    continue
                crops = np.zeros((len(chosen), channels, size, size), dtype=metadata.dtype)
                regions = Regions.of_windows(field[chosen], y0[chosen], x0[chosen], size, metadata.field_shape)
                reader.read_regions(regions, crops)
                block = np.zeros((channels, SHARD_CELLS * size, SHARD_CELLS * size), dtype=metadata.dtype)
                for crop, r, c in zip(
                    crops, cell_row[chosen] - shard_row, cell_column[chosen] - shard_column, strict=True
                ):
                    block[:, r * size : (r + 1) * size, c * size : (c + 1) * size] = crop
                top, left = shard_row * size, shard_column * size
                array[:, top : top + block.shape[1], left : left + block.shape[2]] = block
    finally:
        reader.close()
    fields = [info.path for info in metadata.fields]
    windows = np.stack([field, y0, x0], axis=1)
    (folder / WINDOWS_NAME).write_text(json.dumps(atlas_document(size, columns, fields, windows)), encoding="utf-8")
    return count
