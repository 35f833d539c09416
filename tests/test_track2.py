"""Track 2 on a real plate: every row passes the independent wall-clock cross-check."""

from __future__ import annotations

from pathlib import Path

import pytest

from cropbench.config import CropConfig
from cropbench.data.loader import LoaderSpec
from cropbench.errors import ConfigError
from cropbench.records import Record
from cropbench.report.plots import plot_results
from cropbench.tracks import RunContext, context, run_tracks
from cropbench.tracks.track2 import (
    GPU_BATCH,
    GPU_STEADY_BATCHES,
    Track2,
    Track2Case,
    crosscheck,
    persistent_gain,
    preset_cases,
    run_case,
)

CROP = CropConfig(crop_size=32)


def _assert_consistent(metrics: dict[str, object], case: Track2Case) -> None:
    assert metrics["crosscheck_ok"] is True, metrics["crosscheck_ratio"]
    assert metrics["delivered_samples"] == metrics["expected_samples"] == case.samples * case.epochs
    assert metrics["first_batch_ms"] >= metrics["iter_create_ms"] > 0
    assert metrics["batch_p50_ms"] <= metrics["batch_p95_ms"] <= metrics["batch_max_ms"]
    assert metrics["samples_per_s"] > 0 and metrics["run_samples_per_s"] > 0
    assert len(metrics["epoch_seconds"]) == case.epochs and metrics["dataset_pickle_bytes"] > 0


def test_main_process_case_is_consistent(tiny_plate: Path) -> None:
    case = Track2Case(crop=CROP, loader=LoaderSpec(batch_size=8), samples=48)
    metrics = run_case(tiny_plate, case)
    _assert_consistent(metrics, case)
    assert metrics["warmup_batches"] == 1 and metrics["batches_per_epoch"] == 6
    assert "worker_rss_mib_max" not in metrics and metrics["main_rss_mib"] > 0
    assert metrics["epoch2_first_batch_ms"] > 0 and metrics["collate_ms_mean"] > 0


@pytest.mark.slow
@pytest.mark.parametrize(
    "loader",
    [
        LoaderSpec(num_workers=2, batch_size=8),
        LoaderSpec(num_workers=1, batch_size=16, persistent_workers=True, prefetch_factor=3, collate="stack"),
    ],
)
def test_worker_cases_are_consistent_and_record_worker_memory(tiny_plate: Path, loader: LoaderSpec) -> None:
    case = Track2Case(crop=CROP, loader=loader, samples=64)
    metrics = run_case(tiny_plate, case)
    _assert_consistent(metrics, case)
    assert len(metrics["worker_rss_mib"]) == loader.num_workers
    assert 0 < metrics["worker_uss_mib_max"] <= metrics["worker_rss_mib_max"]
    assert metrics["warmup_batches"] == loader.num_workers


def test_memory_source_isolates_the_transfer_and_counts_bytes(tiny_plate: Path) -> None:
    narrow = run_case(
        tiny_plate,
        Track2Case(crop=CROP.replace(dtype="uint16"), source="memory", samples=32, loader=LoaderSpec(batch_size=16)),
    )
    wide = run_case(tiny_plate, Track2Case(crop=CROP, source="memory", samples=32, loader=LoaderSpec(batch_size=16)))
    assert narrow["crosscheck_ok"] and wide["crosscheck_ok"]
    assert wide["batch_mib"] == pytest.approx(2 * narrow["batch_mib"])
    assert narrow["dataset_pickle_bytes"] > 5 * 32 * 32 * 2, "the crops travel with the dataset"


def test_crosscheck_catches_a_rate_timed_over_the_wrong_region() -> None:
    honest = crosscheck(2000.0, delivered=1000, independent_seconds=0.5, expected=1000)
    assert honest["crosscheck_ok"] and honest["crosscheck_ratio"] == pytest.approx(1.0)
    # The reference script timed `batch.shape` after the batch had arrived: 1.6e7 samples/s.
    shape_timed = crosscheck(1.6e7, delivered=1000, independent_seconds=0.5, expected=1000)
    assert not shape_timed["crosscheck_ok"]
    assert not crosscheck(2000.0, delivered=990, independent_seconds=0.495, expected=1000)["crosscheck_ok"]


def test_persistent_gain_compares_epoch_two_with_the_twin() -> None:
    persistent = {"epoch_seconds": [1.0, 0.5], "epoch2_first_batch_ms": 10.0}
    twin = {"epoch_seconds": [1.0, 1.0], "epoch2_first_batch_ms": 110.0}
    gain = persistent_gain(persistent, twin)
    assert gain["persistent_epoch2_gain"] == pytest.approx(1.0)
    assert gain["persistent_first_batch_saving_ms"] == pytest.approx(100.0)
    assert persistent_gain({"epoch_seconds": [1.0]}, twin) == {}


def test_case_validation() -> None:
    with pytest.raises(ConfigError):
        Track2Case(loader=LoaderSpec(batch_size=64), samples=10)
    with pytest.raises(ConfigError):
        Track2Case(source="cloud")
    with pytest.raises(ConfigError):
        Track2Case(access="paired")
    assert Track2Case(loader=LoaderSpec(num_workers=3)).warmup == 3
    assert Track2Case(warmup_batches=0).warmup == 0


def test_presets_cover_the_required_grid() -> None:
    full = preset_cases("full")
    loaders = [c.loader for c in full]
    assert {0, 1, 2} <= {spec.num_workers for spec in loaders}
    assert {16, 64, 256} <= {spec.batch_size for spec in loaders}
    assert any(spec.persistent_workers for spec in loaders) and any(spec.prefetch_factor for spec in loaders)
    assert {"none", "typical"} <= {c.crop.tier for c in full}
    assert {"uint16", "float32"} <= {c.crop.dtype for c in full if c.source == "memory"}
    labels = [c.label for c in full]
    assert len(labels) == len(set(labels))
    smoke = preset_cases("smoke")
    persistent = [i for i, c in enumerate(smoke) if c.loader.persistent_workers]
    twins = [i for i, c in enumerate(smoke) if c.label + "/persistent" == smoke[persistent[0]].label]
    assert twins and twins[0] < persistent[0], "the non-persistent twin runs first"
    with pytest.raises(ConfigError):
        preset_cases("huge")


def test_gpu_preset_times_whole_rounds_at_the_gpu_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(context, "usable_cores", lambda: 16)
    cases = preset_cases("gpu")
    sweep = [c for c in cases if not c.loader.persistent_workers]
    assert {(c.crop.decode, c.crop.tier) for c in sweep} == {
        (d, t) for d in ("direct", "zarr") for t in ("none", "typical")
    }
    assert sorted({c.loader.num_workers for c in sweep}) == [0, 1, 2, 4, 8, 12, 16]
    for case in cases:
        workers = case.loader.num_workers
        steady = case.samples // GPU_BATCH - case.warmup
        assert case.loader.batch_size == GPU_BATCH and case.loader.pin_memory and case.samples % GPU_BATCH == 0
        assert steady >= GPU_STEADY_BATCHES and (workers == 0 or (steady % workers == 0 and steady >= 2 * workers))
        assert case.epochs == (2 if workers == 16 else 1)
    labels = [c.label for c in cases]
    assert len(labels) == len(set(labels))
    persistent = [i for i, c in enumerate(cases) if c.loader.persistent_workers]
    assert len(persistent) == 1 and labels.index(labels[persistent[0]].removesuffix("/persistent")) < persistent[0]
    assert preset_cases("gpu", samples=8 * GPU_BATCH)[0].samples == 9 * GPU_BATCH


@pytest.mark.slow
def test_runner_every_row_passes_the_crosscheck_and_plots(tiny_plate: Path, tmp_path: Path) -> None:
    emitted: list[Record] = []
    context = RunContext(tiny_plate, environment={"python": "x"}, thread_settings={"torch_threads": 1}, samples=64)
    cases = preset_cases("smoke", 64)
    assert len(run_tracks([Track2()], "smoke", context, emitted.append)) == len(cases)
    assert [r.case for r in emitted] == [c.label for c in cases]
    for record in emitted:
        assert record.metrics["crosscheck_ok"] is True, (record.case, record.metrics["crosscheck_ratio"])
        assert record.config["loader"]["batch_size"] > 0 and record.config["threads"]["torch_threads"] == 1
    persistent = next(r for r in emitted if r.config["loader"]["persistent_workers"])
    assert "persistent_epoch2_gain" in persistent.metrics
    paths = plot_results(emitted, tmp_path)
    assert {p.name for p in paths} >= {"track2_workers_scaling.png", "track2_first_batch.png"}
    again: list[Record] = []
    done = frozenset(r.key for r in emitted[:-1])
    assert len(run_tracks([Track2()], "smoke", context, again.append, done=done)) == 1
