"""Plates at experiment scale (plates/scale.py), the growth sweep over them (tracks/scale.py) and the
fit of its costs (report/growth.py)."""

from __future__ import annotations

import dataclasses
import math
import os
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from cropbench import api
from cropbench.config import LAYOUTS, CropConfig
from cropbench.data.dataset import CropDataset
from cropbench.errors import ConfigError, OutputError
from cropbench.metrics import CONSTRUCTION_RSS_BYTES, CONSTRUCTION_SECONDS, TRACK1_RANDOM_SAMPLES_PER_S
from cropbench.objects import OBJECT_TABLE_NAME, read_object_table
from cropbench.plates.scale import (
    PLATE_COLUMNS,
    PLATE_ROWS,
    ScaleSpec,
    generate_scale_plate,
)
from cropbench.report.growth import COSTS, faster_than_linear, growth, growth_table
from cropbench.tracks import scale as sweep_module
from cropbench.tracks.scale import ScaleSweep

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


# The growth sweep (tracks/scale.py).

TINY_SWEEP = ScaleSweep(
    objects=(100, 300),
    plate=ScaleSpec(field_size=128, channels=2, distinct_fields=2),
    crop_size=32,
    samples=60,
    warmup=10,
    batch_size=16,
    workers=1,
)


def _synthetic_rows() -> list[dict[str, float]]:
    rows = []
    for count in (10**3, 10**4, 10**5):
        row: dict[str, float] = {cost.metric: 5.0 for cost in COSTS}
        row.update(
            {
                "objects": count,
                CONSTRUCTION_SECONDS: 1e-7 * count**1.5,
                CONSTRUCTION_RSS_BYTES: 100.0 * count + 5e6,
                TRACK1_RANDOM_SAMPLES_PER_S: 1e4 / count**0.5,
            }
        )
        rows.append(row)
    return rows


def test_growth_names_what_grows_faster_than_expected() -> None:
    fitted = {item.cost.metric: item.exponent for item in growth(_synthetic_rows())}
    assert fitted[CONSTRUCTION_SECONDS] == pytest.approx(1.5)
    assert fitted[TRACK1_RANDOM_SAMPLES_PER_S] == pytest.approx(0.5)  # time per sample, from the rate
    assert 0 < fitted[CONSTRUCTION_RSS_BYTES] < 1
    named = {item.cost.metric for item in faster_than_linear(_synthetic_rows())}
    assert named == {CONSTRUCTION_SECONDS, TRACK1_RANDOM_SAMPLES_PER_S}
    table = growth_table(_synthetic_rows())
    assert "Grows faster than expected: dataset construction (s) grows as N^1.50 (expected N^1)" in table
    assert "| 100,000 |" in table
    assert "| 1,000 | 0 | 0.003 | 5.1 | - |" in table  # no marginal bytes for the first count
    assert "| 10,000 | 0 | 0.100 | 6.0 | 100 |" in table


def test_growth_needs_two_counts_and_skips_missing_values() -> None:
    rows = _synthetic_rows()
    rows[1][CONSTRUCTION_SECONDS] = None  # type: ignore[assignment]
    assert {item.cost.metric for item in growth(rows[:1])} == set()
    assert CONSTRUCTION_SECONDS in {item.cost.metric for item in growth(rows)}
    assert "No cost grows faster than expected" in growth_table(
        [{**row, CONSTRUCTION_SECONDS: 1.0, TRACK1_RANDOM_SAMPLES_PER_S: 1.0} for row in rows]
    )


def test_a_sweep_refuses_bad_counts() -> None:
    with pytest.raises(ConfigError, match="objects must be counts"):
        ScaleSweep(objects=(0, 10))
    with pytest.raises(ConfigError, match="layout"):
        ScaleSweep(layout="nonsense")


@pytest.mark.slow
def test_the_sweep_measures_every_cost_and_removes_its_plates(tmp_path: Path) -> None:
    work = tmp_path / "work"
    records = api.sweep_scale(TINY_SWEEP, tmp_path / "out", work, bars=False)
    rows = [record.metrics for record in records]
    assert [row["objects"] for row in rows] == [100, 300]
    assert [record.case for record in records] == ["100 objects", "300 objects"]
    assert all(record.case_id and record.run_id == records[0].run_id for record in records)
    for row in rows:
        for cost in COSTS:
            assert isinstance(row[cost.metric], (int, float)) and row[cost.metric] > 0, cost.metric
        assert row["plate_stored_bytes"] > 0 and row["generate_seconds"] > 0
    assert not work.exists()


@pytest.mark.slow
def test_a_kept_plate_is_reused_by_the_next_sweep(tmp_path: Path) -> None:
    sweep = dataclasses.replace(TINY_SWEEP, objects=(100,))
    first = [record.config for record in api.sweep_scale(sweep, tmp_path / "out", tmp_path, keep=True, bars=False)]
    kept = tmp_path / first[0]["plate"]  # rows name a plate outside the output folder by its folder name
    assert kept.is_dir()
    again = [record.metrics for record in api.sweep_scale(sweep, tmp_path / "out", tmp_path, keep=True, bars=False)]
    assert again[0]["generate_seconds"] is None and kept.is_dir()


def test_measure_point_counts_the_objects_of_the_plate(tmp_path: Path) -> None:
    written = generate_scale_plate(tmp_path / "p.zarr", TINY_SWEEP.spec(100), LAYOUTS["default"], progress=False)
    point = sweep_module.measure_point_in_child(written.path, TINY_SWEEP)
    assert point["objects"] == 100
    assert point["construction_seconds"] > 0 and point["track2_dataset_pickle_bytes"] > 0


def test_an_interrupted_sweep_leaves_no_plate_and_no_work_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = sweep_module.generate_scale_plate

    def interrupted(*args: object, **kwargs: object) -> object:
        def stop(done: int, total: int) -> None:
            raise KeyboardInterrupt

        return original(*args, **{**kwargs, "on_field": stop})  # type: ignore[arg-type]

    monkeypatch.setattr(sweep_module, "generate_scale_plate", interrupted)
    work = tmp_path / "work"
    with pytest.raises(KeyboardInterrupt):
        api.sweep_scale(TINY_SWEEP, tmp_path / "out", work, bars=False)
    assert not work.exists()
