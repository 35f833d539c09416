"""Track 1 on a real plate: rows carry consistent metrics, and the record is complete."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cropbench import metrics as m
from cropbench.config import CropConfig, plate_preset
from cropbench.errors import ConfigError
from cropbench.formats import read_plate_metadata
from cropbench.harness.context import RunContext
from cropbench.harness.dataset_case import STAGE_SUM_TOLERANCE, DatasetCase, run_case
from cropbench.harness.runner import case_identity, run_tracks
from cropbench.harness.validity import VALIDITY_FLAGS
from cropbench.metrics import MISSING_CHUNKS
from cropbench.records import Record
from cropbench.tracks.dataset import Dataset, preset_cases


def test_samples_per_second_agrees_with_count_over_elapsed(tiny_plate: Path) -> None:
    case = DatasetCase(crop=CropConfig(crop_size=32), samples=120, warmup=10, cold_samples=20)
    metrics = run_case(RunContext(plate=tiny_plate), case)
    assert metrics[m.COUNT] == 120
    assert metrics[m.SAMPLES_PER_S] == pytest.approx(120 / metrics[m.LOOP_SECONDS])
    assert metrics[m.prefixed(m.COLD, m.COUNT)] == 20 and metrics[m.EVICTION_VERIFIED] in (True, False)
    assert len(metrics[m.WARMUP_MS]) == 10 and len(metrics[m.FIRST_PASS_CURVE_MS]) == 20
    assert metrics[m.P50_MS] <= metrics[m.P95_MS] <= metrics[m.P99_MS] <= metrics[m.MAX_MS]
    assert metrics[m.P99_RELIABLE] is False, "120 samples cannot support a p99"
    assert metrics[m.CHUNKS_TOUCHED_PER_CROP] >= 1


def test_transform_tiers_record_the_io_split(tiny_plate: Path) -> None:
    case = DatasetCase(
        crop=CropConfig(crop_size=32, tier="typical"), access="paired", samples=60, warmup=5, cold_samples=0
    )
    metrics = run_case(RunContext(plate=tiny_plate), case)
    assert metrics[m.prefixed(m.IO, m.COUNT)] == 60 and metrics[m.TRANSFORM_ONLY_MEAN_MS] > 0
    assert metrics[m.TRANSFORM_SHARE] < 1.0


def test_runner_emits_one_complete_record_per_case_and_resume_skips(tiny_plate: Path) -> None:
    emitted: list[Record] = []
    context = RunContext(tiny_plate, environment={"python": "x"}, thread_settings={"torch_threads": 1}, samples=30)
    cases = preset_cases("smoke", 30)
    assert len(run_tracks([Dataset()], "smoke", context, emitted.append)) == len(cases)
    assert [r.case for r in emitted] == [c.label for c in cases]
    assert emitted[0].config["crop"]["crop_size"] == 96 and emitted[0].config["threads"]["torch_threads"] == 1
    assert len({r.case_id for r in emitted}) == len(cases) and all(r.config["layout"] for r in emitted)
    again: list[Record] = []
    done = frozenset(r.key for r in emitted[:3])
    counted: list[tuple[int, int]] = []
    estimates: list[float | None] = []

    class Counter:
        def cases(self, done: int, total: int, left_s: float | None = None, case_s: float | None = None) -> None:
            counted.append((done, total))
            estimates.append(left_s)

    assert len(run_tracks([Dataset()], "smoke", context, again.append, done=done, counter=Counter())) == len(cases) - 3
    left = len(cases) - 3
    assert counted == [(i, left) for i in range(left + 1)], "the resumed run counts only the cases left, to the end"
    assert estimates[0] is None and estimates[-1] == 0.0, "no estimate before a case has finished; none left at the end"
    assert all(e is not None and e >= 0 for e in estimates[1:])


def test_a_case_keeps_the_identity_its_rows_had_under_the_former_track_value(tiny_plate: Path) -> None:
    """Rows written when track ``dataset`` was ``"1"`` hashed that value: ``--resume`` still skips them."""
    context = RunContext(tiny_plate, environment={"python": "x"}, thread_settings={"torch_threads": 1})
    case = preset_cases("smoke", 30)[0]
    assert case_identity(Dataset.name, case, context) == case_identity("1", case, context)
    assert case_identity("remote", case, context) != case_identity("1", case, context)


def test_fixed_cases_run_instead_of_the_preset_and_the_record_carries_the_rate(tiny_plate: Path) -> None:
    context = RunContext(tiny_plate, environment={"python": "x"}, thread_settings={"torch_threads": 1})
    case = DatasetCase(crop=CropConfig(crop_size=32, decode="zarr"), samples=40, warmup=4, cold_samples=0)
    emitted: list[Record] = []
    (record,) = run_tracks([Dataset([case])], "smoke", context, emitted.append)
    assert record.case == case.label and record.config["crop"]["decode"] == "zarr"
    assert record.metrics[m.SAMPLES_PER_S] == pytest.approx(40 / record.metrics[m.LOOP_SECONDS])


def test_full_preset_sweeps_one_knob_at_a_time_and_grid_keeps_the_product() -> None:
    cases = preset_cases("full")
    assert len(cases) <= 30, "the full preset fits an afternoon; the product of the knobs is 'grid'"
    assert {(c.access, c.crop.decode) for c in cases if c.batch_size == 1 and c.cache == "warm"} >= {
        (access, decode)
        for access in ("random", "grouped-field", "chunk-aware", "paired")
        for decode in ("direct", "field", "zarr")
    }
    assert len({c.crop.crop_size for c in cases}) >= 3 and len({c.crop.channels for c in cases}) >= 2
    assert {c.crop.tier for c in cases} == {"none", "light", "typical"}
    assert len({c.crop.dtype for c in cases}) >= 3 and {c.cache for c in cases} == {"warm", "cold"}
    assert {c.crop.decode_threads for c in cases if c.batch_size > 1} == {1, 2}
    assert min(c.samples for c in cases) >= 1000, "a p99 with ten samples beyond it"
    assert len({c.label for c in cases}) == len(cases)
    grid = preset_cases("grid")
    assert len(grid) > 200 and {c.crop.tier for c in grid} == {"none", "light", "typical"}
    assert len({c.label for c in grid}) == len(grid)


def test_cold_cache_state_evicts_before_every_steady_block(tiny_plate: Path) -> None:
    case = DatasetCase(crop=CropConfig(crop_size=32), samples=100, warmup=5, cold_samples=0, cache="cold")
    metrics = run_case(RunContext(plate=tiny_plate), case)
    assert metrics[m.CACHE] == "cold" and case.label.endswith("/cold")
    assert metrics[m.STEADY_EVICTIONS] == 4, "200 steady indices: four blocks of 50, each read by one loop"
    assert metrics[m.CHUNKS_DECODED_PER_CROP] > 0


def test_rows_carry_validity_flags(tiny_plate: Path) -> None:
    # The tiny plate: ~100 objects, 4 fields; a 32 MiB cache holds all of it, 260 items re-read crops.
    flagged = run_case(
        RunContext(plate=tiny_plate),
        DatasetCase(crop=CropConfig(crop_size=32), samples=100, warmup=10, cold_samples=50),
    )
    assert {"cache>=plate", "re-reads"} <= set(flagged[m.VALIDITY_FLAGS])
    assert set(flagged[m.VALIDITY_FLAGS]) <= set(VALIDITY_FLAGS)
    assert flagged[m.CACHE_FRACTION_OF_PLATE] > 1 and flagged[m.ITEMS_DRAWN] == 50 + 10 + 2 * 100 > flagged[m.OBJECTS]
    assert (m.COLD_P50_MS in flagged) == flagged[m.EVICTION_VERIFIED] != (m.prefixed(m.FIRST_PASS, m.P50_MS) in flagged)
    honest = run_case(
        RunContext(plate=tiny_plate),
        DatasetCase(crop=CropConfig(crop_size=32, chunk_cache_bytes=2**16), samples=40, warmup=5, cold_samples=0),
    )
    assert not {"cache>=plate", "re-reads", "not-evicted"} & set(honest[m.VALIDITY_FLAGS])
    assert honest[m.RATE_OVER_INVERSE_MEAN] > 0


def test_uninstrumented_read_counters_are_absent_not_zero(tiny_plate: Path) -> None:
    zarr = run_case(
        RunContext(plate=tiny_plate),
        DatasetCase(crop=CropConfig(crop_size=32, decode="zarr"), samples=50, warmup=5, cold_samples=0),
    )
    assert m.DECODE_AMPLIFICATION not in zarr and m.CHUNKS_TOUCHED_PER_CROP not in zarr
    assert zarr[m.CACHE_FRACTION_OF_PLATE] is None and "cache>=plate" not in zarr[m.VALIDITY_FLAGS]


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
    case = DatasetCase(crop=CropConfig(crop_size=32, tier="light"), samples=100, warmup=5, cold_samples=0)
    metrics = run_case(RunContext(plate=tiny_plate), case)
    stages = [metrics[m.stage_ms(name)] for name in ("index", "fetch", "decode", "assemble", "transform")]
    assert all(value >= 0 for value in stages)
    assert metrics[m.STAGE_SUM_MS] == pytest.approx(sum(stages))
    assert metrics[m.STAGE_SUM_MS] == pytest.approx(metrics[m.STAGE_TOTAL_MS], rel=STAGE_SUM_TOLERANCE)
    assert metrics[m.stage_ms("collate")] > 0 and metrics[m.FIDELITY_SHA256]
    overhead = metrics[m.CLOCK_OVERHEAD_FRACTION]
    assert overhead is None or overhead > 0, "a clock overhead that does not resolve is absent, never 0"


def test_batch_access_mode_counts_items_and_hashes_the_same_items(tiny_plate: Path) -> None:
    crop = CropConfig(crop_size=32, tier="typical", decode_threads=2)
    single = DatasetCase(crop=crop, samples=96, warmup=16, cold_samples=16)
    batched = DatasetCase(crop=crop, samples=96, warmup=16, cold_samples=16, batch_size=16)
    assert batched.label == single.label.replace("/threads2", "/batch16/threads2")
    metrics = run_case(RunContext(plate=tiny_plate), batched)
    assert metrics[m.ITEMS_PER_CALL] == 16 and metrics[m.COUNT] == 96 // 16, "latencies are per call"
    assert metrics[m.SAMPLES_PER_S] == pytest.approx(96 / metrics[m.LOOP_SECONDS])
    assert metrics[m.prefixed(m.IO, m.SAMPLES_PER_S)] > 0 and metrics[m.CHUNKS_TOUCHED_PER_CROP] >= 1
    assert metrics[m.FIDELITY_SHA256] == run_case(RunContext(plate=tiny_plate), single)[m.FIDELITY_SHA256]
    with pytest.raises(ConfigError, match="batch_size"):
        DatasetCase(access="paired", batch_size=4)


def test_deleted_chunks_are_counted_in_the_row_with_one_warning(tiny_plate: Path, tmp_path: Path) -> None:
    plate = tmp_path / "damaged.zarr"
    shutil.copytree(tiny_plate, plate)
    for chunk in (plate / read_plate_metadata(plate).fields[0].path / "c").rglob("*"):
        if chunk.is_file():
            chunk.unlink()
    case = DatasetCase(crop=CropConfig(crop_size=32), samples=60, warmup=5, cold_samples=0)
    with pytest.warns(RuntimeWarning, match=f"chunk reads of {plate} found no chunk") as caught:
        damaged = run_case(RunContext(plate=plate), case)
    assert damaged[MISSING_CHUNKS] > 0 and len(caught) == 1
    assert run_case(RunContext(plate=tiny_plate), case)[MISSING_CHUNKS] == 0
    zarr_case = DatasetCase(crop=CropConfig(crop_size=32, decode="zarr"), samples=30, warmup=5, cold_samples=0)
    assert run_case(RunContext(plate=plate), zarr_case)[MISSING_CHUNKS] is None, (
        "zarr-python fills missing chunks uncounted"
    )
