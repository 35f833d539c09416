"""Track 1 on a real plate: rows carry consistent metrics, and the record is complete."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cropbench.config import CropConfig, Track1Case, plate_preset
from cropbench.errors import ConfigError
from cropbench.formats import read_plate_metadata
from cropbench.metrics import MISSING_CHUNKS
from cropbench.records import Record
from cropbench.tracks import RunContext, run_tracks
from cropbench.tracks.track1 import STAGE_SUM_TOLERANCE, VALIDITY_FLAGS, Track1, preset_cases, run_case


def test_samples_per_second_agrees_with_count_over_elapsed(tiny_plate: Path) -> None:
    case = Track1Case(crop=CropConfig(crop_size=32), samples=120, warmup=10, cold_samples=20)
    metrics = run_case(tiny_plate, case)
    assert metrics["count"] == 120
    assert metrics["samples_per_s"] == pytest.approx(120 / metrics["loop_seconds"])
    assert metrics["cold_count"] == 20 and metrics["eviction_verified"] in (True, False)
    assert len(metrics["warmup_ms"]) == 10 and len(metrics["first_pass_curve_ms"]) == 20
    assert metrics["p50_ms"] <= metrics["p95_ms"] <= metrics["p99_ms"] <= metrics["max_ms"]
    assert metrics["p99_reliable"] is False, "120 samples cannot support a p99"
    assert metrics["chunks_touched_per_crop"] >= 1


def test_transform_tiers_record_the_io_split(tiny_plate: Path) -> None:
    case = Track1Case(
        crop=CropConfig(crop_size=32, tier="typical"), access="paired", samples=60, warmup=5, cold_samples=0
    )
    metrics = run_case(tiny_plate, case)
    assert metrics["io_count"] == 60 and metrics["transform_only_mean_ms"] > 0
    assert metrics["transform_share"] < 1.0


def test_runner_emits_one_complete_record_per_case_and_resume_skips(tiny_plate: Path) -> None:
    emitted: list[Record] = []
    context = RunContext(tiny_plate, environment={"python": "x"}, thread_settings={"torch_threads": 1}, samples=30)
    cases = preset_cases("smoke", 30)
    assert len(run_tracks([Track1()], "smoke", context, emitted.append)) == len(cases)
    assert [r.case for r in emitted] == [c.label for c in cases]
    assert emitted[0].config["crop"]["crop_size"] == 96 and emitted[0].config["threads"]["torch_threads"] == 1
    assert len({r.case_id for r in emitted}) == len(cases) and all(r.config["layout"] for r in emitted)
    again: list[Record] = []
    done = frozenset(r.key for r in emitted[:3])
    assert len(run_tracks([Track1()], "smoke", context, again.append, done=done)) == len(cases) - 3


def test_full_preset_covers_the_required_grid() -> None:
    cases = preset_cases("full")
    assert {c.access for c in cases} >= {"random", "grouped-field", "paired"}
    assert len({c.crop.crop_size for c in cases}) >= 2 and len({c.crop.channels for c in cases}) >= 2
    assert {c.crop.tier for c in cases} == {"none", "light", "typical"}
    assert len({c.crop.dtype for c in cases}) >= 2 and len({c.crop.decode for c in cases}) >= 2
    assert min(c.samples for c in cases) >= 1000


def test_cold_cache_state_evicts_before_every_steady_block(tiny_plate: Path) -> None:
    case = Track1Case(crop=CropConfig(crop_size=32), samples=100, warmup=5, cold_samples=0, cache="cold")
    metrics = run_case(tiny_plate, case)
    assert metrics["cache"] == "cold" and case.label.endswith("/cold")
    assert metrics["steady_evictions"] == 4, "two blocks of 50, each read by both loops"
    assert metrics["chunks_decoded_per_crop"] > 0


def test_rows_carry_validity_flags(tiny_plate: Path) -> None:
    # The tiny plate: ~100 objects, 4 fields; a 32 MiB cache holds all of it, 160 items re-read crops.
    flagged = run_case(tiny_plate, Track1Case(crop=CropConfig(crop_size=32), samples=100, warmup=10, cold_samples=50))
    assert {"cache>=plate", "re-reads"} <= set(flagged["validity_flags"])
    assert set(flagged["validity_flags"]) <= set(VALIDITY_FLAGS)
    assert flagged["cache_fraction_of_plate"] > 1 and flagged["items_drawn"] == 160 > flagged["objects"]
    assert ("cold_p50_ms" in flagged) == flagged["eviction_verified"] != ("first_pass_p50_ms" in flagged)
    honest = run_case(
        tiny_plate,
        Track1Case(crop=CropConfig(crop_size=32, chunk_cache_bytes=2**16), samples=50, warmup=5, cold_samples=0),
    )
    assert not {"cache>=plate", "re-reads", "not-evicted"} & set(honest["validity_flags"])
    assert honest["rate_over_inverse_mean"] > 0


def test_uninstrumented_read_counters_are_absent_not_zero(tiny_plate: Path) -> None:
    zarr = run_case(
        tiny_plate, Track1Case(crop=CropConfig(crop_size=32, decode="zarr"), samples=50, warmup=5, cold_samples=0)
    )
    assert "decode_amplification" not in zarr and "chunks_touched_per_crop" not in zarr
    assert zarr["cache_fraction_of_plate"] is None and "cache>=plate" not in zarr["validity_flags"]


def test_smoke_cases_fit_the_smoke_plate() -> None:
    smoke = plate_preset("smoke")
    objects = smoke.rows * smoke.columns * smoke.fields_per_well * smoke.cells_per_field
    decoded = (
        smoke.rows * smoke.columns * smoke.fields_per_well * smoke.channels * smoke.field_height * smoke.field_width * 2
    )
    for case in preset_cases("smoke"):
        assert case.cold_samples + case.warmup + case.samples <= 0.9 * objects, case.label
        assert case.crop.chunk_cache_bytes < decoded / 4, case.label


def test_direct_rows_carry_a_stage_split_that_adds_up(tiny_plate: Path) -> None:
    case = Track1Case(crop=CropConfig(crop_size=32, tier="light"), samples=100, warmup=5, cold_samples=0)
    metrics = run_case(tiny_plate, case)
    stages = [metrics[f"stage_{name}_ms"] for name in ("index", "fetch", "decode", "assemble", "transform")]
    assert all(value >= 0 for value in stages)
    assert metrics["stage_sum_ms"] == pytest.approx(sum(stages))
    assert metrics["stage_sum_ms"] == pytest.approx(metrics["stage_total_ms"], rel=STAGE_SUM_TOLERANCE)
    assert metrics["stage_collate_ms"] > 0 and metrics["fidelity_sha256"]
    overhead = metrics["clock_overhead_fraction"]
    assert overhead is None or overhead > 0, "a clock overhead that does not resolve is absent, never 0"


def test_batch_access_mode_counts_items_and_hashes_the_same_items(tiny_plate: Path) -> None:
    crop = CropConfig(crop_size=32, tier="typical", decode_threads=2)
    single = Track1Case(crop=crop, samples=96, warmup=16, cold_samples=16)
    batched = Track1Case(crop=crop, samples=96, warmup=16, cold_samples=16, batch_size=16)
    assert batched.label == single.label.replace("/threads2", "/batch16/threads2")
    metrics = run_case(tiny_plate, batched)
    assert metrics["items_per_call"] == 16 and metrics["count"] == 96 // 16, "latencies are per call"
    assert metrics["samples_per_s"] == pytest.approx(96 / metrics["loop_seconds"])
    assert metrics["io_samples_per_s"] > 0 and metrics["chunks_touched_per_crop"] >= 1
    assert metrics["fidelity_sha256"] == run_case(tiny_plate, single)["fidelity_sha256"]
    with pytest.raises(ConfigError, match="batch_size"):
        Track1Case(access="paired", batch_size=4)


def test_deleted_chunks_are_counted_in_the_row_with_one_warning(tiny_plate: Path, tmp_path: Path) -> None:
    plate = tmp_path / "damaged.zarr"
    shutil.copytree(tiny_plate, plate)
    for chunk in (plate / read_plate_metadata(plate).fields[0].path / "c").rglob("*"):
        if chunk.is_file():
            chunk.unlink()
    case = Track1Case(crop=CropConfig(crop_size=32), samples=60, warmup=5, cold_samples=0)
    with pytest.warns(RuntimeWarning, match=f"chunk reads of {plate} found no chunk") as caught:
        damaged = run_case(plate, case)
    assert damaged[MISSING_CHUNKS] > 0 and len(caught) == 1
    assert run_case(tiny_plate, case)[MISSING_CHUNKS] == 0
    zarr_case = Track1Case(crop=CropConfig(crop_size=32, decode="zarr"), samples=30, warmup=5, cold_samples=0)
    assert run_case(plate, zarr_case)[MISSING_CHUNKS] is None, "zarr-python fills missing chunks uncounted"
