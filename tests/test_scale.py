"""Plates at experiment scale (plates/scale.py) and the growth sweep over them (tracks/scale.py)."""

from __future__ import annotations

import math
import os
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from cropbench.config import LAYOUTS, CropConfig
from cropbench.data.dataset import CropDataset
from cropbench.errors import ConfigError, OutputError
from cropbench.objects import OBJECT_TABLE_NAME, read_object_table
from cropbench.plates.scale import (
    PLATE_COLUMNS,
    PLATE_ROWS,
    ScaleSpec,
    generate_scale_plate,
    scale_spec_for_bytes,
)

#: Small fields, few channels: a plate of dozens of fields writes in seconds.
SMALL = ScaleSpec(objects=120, field_size=96, channels=2, cells_per_field=8, distinct_fields=2, seed=3)


def test_a_million_objects_fill_a_384_well_plate() -> None:
    spec = ScaleSpec(objects=1_000_000)
    wells = spec.well_sites()
    assert len(wells) <= PLATE_ROWS * PLATE_COLUMNS
    assert sum(count for _, count in wells) == spec.fields
    assert spec.fields * spec.fewest_per_field >= spec.objects
    assert len({well for well, _ in wells}) == len(wells)
    assert wells[-1][0] == ("P", "24") or len(wells) < PLATE_ROWS * PLATE_COLUMNS
    assert spec.sites_per_well >= 9


def test_small_plates_keep_nine_sites_per_well() -> None:
    spec = ScaleSpec(objects=1000)
    assert spec.sites_per_well == 9
    assert [count for _, count in spec.well_sites()] == [9] * (spec.fields // 9) + (
        [spec.fields % 9] if spec.fields % 9 else []
    )


@pytest.mark.parametrize(
    ("knob", "value"),
    [("objects", 0), ("objects", 10**8), ("field_size", 32), ("channels", 9), ("distinct_fields", -1)],
)
def test_bad_knobs_are_refused_by_name(knob: str, value: int) -> None:
    with pytest.raises(ConfigError, match=knob.split("_")[0]):
        ScaleSpec(**{knob: value})  # type: ignore[arg-type]


def test_spec_for_bytes_covers_the_bytes() -> None:
    spec = scale_spec_for_bytes(50 * 2**20, ScaleSpec(field_size=256, channels=2))
    assert spec.raw_bytes >= 50 * 2**20
    assert spec.raw_bytes < 50 * 2**20 + spec.field_bytes


def test_the_plate_holds_exactly_the_objects_asked_for(tmp_path: Path) -> None:
    written = generate_scale_plate(tmp_path / "scale.zarr", SMALL, LAYOUTS["default"], progress=False)
    table = read_object_table(written.path)
    assert written.objects == len(table) == SMALL.objects
    assert written.fields == SMALL.fields
    assert np.array_equal(table.object_id, np.arange(SMALL.objects))
    dataset = CropDataset(written.path, CropConfig(crop_size=32))
    assert len(dataset) == SMALL.objects
    assert dataset[len(dataset) - 1]["image"].shape == (2, 32, 32)
    # Fields that repeat a rendered template repeat its pixels and objects, at their own place.
    first, third = (dataset.reader.read_field(index) for index in (0, 2))
    assert np.array_equal(first, third)
    assert table.well[0] == "A1" and set(table.field.tolist()) <= set(range(9))


def test_the_object_table_is_written_in_row_groups_of_a_batch(tmp_path: Path) -> None:
    written = generate_scale_plate(
        tmp_path / "scale.zarr", SMALL, LAYOUTS["tiles"], progress=False, table_batch_fields=3
    )
    metadata = pq.ParquetFile(str(written.path / OBJECT_TABLE_NAME)).metadata
    assert metadata.num_row_groups == math.ceil(SMALL.fields / 3)
    largest_field = int(SMALL.cells_per_field * 1.1) + 8
    assert max(metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)) <= 3 * largest_field


def _peak_bytes(path: Path, objects: int) -> tuple[int, int]:
    spec = ScaleSpec(objects=objects, field_size=128, channels=2, cells_per_field=8, distinct_fields=1)
    tracemalloc.start()
    try:
        generate_scale_plate(path, spec, LAYOUTS["default"], progress=False, table_batch_fields=4)
        return tracemalloc.get_traced_memory()[1], spec.fields
    finally:
        tracemalloc.stop()


def test_memory_does_not_grow_with_the_fields(tmp_path: Path) -> None:
    _peak_bytes(tmp_path / "warm.zarr", 16)  # imports and first-use caches of the writer
    small_peak, small_fields = _peak_bytes(tmp_path / "small.zarr", 7 * 12)
    large_peak, large_fields = _peak_bytes(tmp_path / "large.zarr", 7 * 60)
    field_bytes = 2 * 128 * 128 * 2
    assert large_fields - small_fields >= 40
    # Holding the pixels of every field would add a field's bytes per field; a quarter is the bound.
    assert large_peak - small_peak < (large_fields - small_fields) * field_bytes / 4


def test_an_interrupt_leaves_no_partial_plate(tmp_path: Path) -> None:
    def interrupt(done: int, total: int) -> None:
        if done == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        generate_scale_plate(tmp_path / "scale.zarr", SMALL, LAYOUTS["default"], progress=False, on_field=interrupt)
    assert os.listdir(tmp_path) == []


def test_an_existing_folder_of_the_user_is_never_replaced(tmp_path: Path) -> None:
    mine = tmp_path / "scale.zarr"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match="not a plate cropbench wrote"):
        generate_scale_plate(mine, SMALL, LAYOUTS["default"], overwrite=True, progress=False)
    assert (mine / "notes.txt").read_text() == "mine"
