"""Layouts side by side out of memory (tracks/out_of_memory.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cropbench import api
from cropbench import metrics as m
from cropbench.config import CropConfig
from cropbench.errors import ConfigError
from cropbench.harness.work import WorkFolder
from cropbench.measure import memory_limit as ml
from cropbench.plates.scale import ScaleSpec
from cropbench.records import RESULTS_NAME, read_records
from cropbench.report.tables import out_of_memory_table
from cropbench.tracks import out_of_memory as oom

MIB = 2**20


@pytest.mark.parametrize(
    ("knob", "value", "message"),
    [
        ("plate_multiple", 1.5, "plate_multiple must be within 2..8"),
        ("limit_bytes", 10 * MIB, "limit_bytes must be at least 64 MiB"),
        ("layouts", ("nonsense",), "layout='nonsense'"),
        ("layouts", (), "layouts must name at least one"),
    ],
)
def test_bad_knobs_are_refused_by_name(knob: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        oom.OutOfMemoryComparison(**{knob: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("cold", [True, False])
def test_a_random_pass_reports_device_and_reader_bytes(tiny_plate: Path, cold: bool) -> None:
    metrics = oom.random_pass(str(tiny_plate), CropConfig(crop_size=32, dtype="uint16"), 40, 5, 0, cold)
    assert metrics[m.CROPS_PER_S] > 0
    assert metrics["bytes_fetched_per_crop"] > 0
    assert (m.DEVICE_READ_BYTES in metrics) == (ml.process_read_bytes() is not None)
    assert ("eviction_verified" in metrics) == cold
    assert metrics[m.LOADAVG_BEFORE] >= 0


def test_the_table_puts_the_layouts_side_by_side() -> None:
    row = {
        m.MEMORY_LIMIT_BYTES: 256 * MIB,
        m.MEMORY_LIMIT_MECHANISM: ml.CGROUP_V1,
        m.PLATE_STORED_BYTES: 2**30,
        m.PLATE_OVER_LIMIT: 4.0,
        m.DEVICE_BYTES_PER_CROP: 48_000.0,
        m.DEVICE_OVER_READER: 2.3,
        m.CROPS_PER_S: 700.0,
        m.LOADAVG_BEFORE: 1.0,
        m.LOADAVG_AFTER: 1.5,
    }
    cached = {**row, m.prefixed(m.CACHED_, m.CROPS_PER_S): 2600.0, m.prefixed(m.CACHED_, m.LOADAVG_BEFORE): 1.5}
    cached[m.prefixed(m.CACHED_, m.LOADAVG_AFTER)] = 1.2
    table = out_of_memory_table([("default", cached), ("planes", {**row, m.CACHED_SKIPPED: "not asked for"})])
    assert "| default | 256 | cgroup-v1 | 1.00 | 4.0 | 48.0 | 2.30 | 700 | 2,600 | 1.00-1.50 | 1.50-1.20 |" in table
    assert "| planes |" in table and "not asked for" in table


@pytest.mark.slow
def test_a_plate_twice_the_limit_is_read_from_the_device_inside_it(tmp_path: Path) -> None:
    comparison = oom.OutOfMemoryComparison(
        layouts=("default",),
        limit_bytes=64 * MIB,
        plate_multiple=2,
        plate=ScaleSpec(channels=1, distinct_fields=2),
        crop_size=64,
        samples=200,
        warmup=20,
    )
    work = tmp_path / "work"
    records = api.compare_out_of_memory(comparison, tmp_path / "out", work, bars=False)
    assert not work.exists()  # plates removed
    record = records[0]
    name, config, metrics = record.case, record.config, record.metrics
    assert name == "default" and config["layout_label"] == "call-yx64-blosc-lz4-shard-field"
    assert record.track == "out-of-memory" and record.case_id and record.run_id and record.repeat == 0
    assert [row.key for row in read_records(tmp_path / "out" / RESULTS_NAME)] == [record.key]
    assert metrics[m.PLATE_OVER_LIMIT] >= 2 and not metrics[m.PLATE_BELOW_MULTIPLE]
    assert metrics[m.MEMORY_LIMIT_MECHANISM] in ml.MECHANISMS
    if metrics[m.MEMORY_LIMIT_MECHANISM] == ml.FADVISE:
        assert metrics[m.MEMORY_LIMIT_NOTE].startswith("no cgroup")
    elif metrics.get(m.DEVICE_BYTES_PER_CROP):
        assert metrics[m.DEVICE_BYTES_PER_CROP] > 0
        assert metrics[m.prefixed(m.CACHED_, m.DEVICE_BYTES_PER_CROP)] < metrics[m.DEVICE_BYTES_PER_CROP]
    parent = ml.cgroup_parent()
    if not isinstance(parent, str):
        assert list(parent.path.glob(f"{ml.CGROUP_PREFIX}*")) == []


def test_the_size_probe_leaves_nothing_behind(tmp_path: Path) -> None:
    comparison = oom.OutOfMemoryComparison(
        limit_bytes=64 * MIB, plate=ScaleSpec(field_size=128, channels=2, distinct_fields=2)
    )
    kept = WorkFolder(tmp_path / "kept", keep=True)
    spec = oom.plate_spec_for(comparison, "tiles", kept)
    assert list((tmp_path / "kept").iterdir()) == []
    assert spec.fields > 1 and spec.objects == spec.fields * spec.fewest_per_field
    fresh = WorkFolder(tmp_path / "fresh")
    oom.plate_spec_for(comparison, "tiles", fresh)
    assert not (tmp_path / "fresh").exists()


@pytest.mark.slow
def test_the_asv_case_runs_once_on_a_small_plate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))
    from benchmarks import common
    from benchmarks import scale as suite

    if isinstance(ml.cgroup_parent(), str):
        pytest.skip(f"no writable memory cgroup: {ml.cgroup_parent()}")
    monkeypatch.chdir(tmp_path)
    for module in (common, suite):
        monkeypatch.setattr(module, "LIMIT_BYTES", 64 * MIB)
    monkeypatch.setattr(common, "PLATE_MULTIPLE", 2.0)
    monkeypatch.setattr(common, "CHANNELS", 2)
    monkeypatch.setattr(suite, "CROPS", 100)
    cached = common.make_out_of_memory_plate()
    assert cached["stored_bytes"] >= 2 * 64 * MIB
    case = suite.OutOfMemory()
    case.setup(cached)
    assert case.track_device_bytes_per_crop(cached) > 0
    assert case.track_crops_per_s(cached) > 0
    assert sorted(p.name for p in (tmp_path / "plates" / "scale").iterdir()) == ["out-of-memory-default.zarr"]
