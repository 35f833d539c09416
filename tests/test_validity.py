"""Validity flags: every track's rows carry the same flags, computed by one function, and the summary prints them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from cropbench import metrics as m
from cropbench.config import CropConfig
from cropbench.data.loader import LoaderSpec
from cropbench.harness import dataset_case as track1
from cropbench.harness import loader_case as track2
from cropbench.harness.context import RunContext
from cropbench.harness.validity import MIN_RATE_TIMINGS, VALIDITY_FLAGS, flag_meaning, validity
from cropbench.records import Record
from cropbench.report.summary import cell_value as summary_cell_value
from cropbench.report.summary import summary_table
from cropbench.tracks import training as track3

#: The tiny plate decodes to about 1.9 MiB and holds about 100 objects: the default 32 MiB cache holds
#: all of it, 64 KiB does not.
SMALL_CACHE = CropConfig(crop_size=32, chunk_cache_bytes=2**16)
BIG_CACHE = CropConfig(crop_size=32)


def test_track2_rows_carry_the_track1_flags(tiny_plate: Path) -> None:
    flagged = track2.run_case(
        RunContext(plate=tiny_plate), track2.LoaderCase(crop=BIG_CACHE, loader=LoaderSpec(batch_size=16), samples=96)
    )
    assert {"cache>=plate", "re-reads", "few-samples"} <= set(flagged[m.VALIDITY_FLAGS]) <= set(VALIDITY_FLAGS)
    assert flagged[m.CACHE_FRACTION_OF_PLATE] > 1
    honest = track2.run_case(
        RunContext(plate=tiny_plate), track2.LoaderCase(crop=SMALL_CACHE, loader=LoaderSpec(batch_size=8), samples=48)
    )
    assert not {"cache>=plate", "re-reads"} & set(honest[m.VALIDITY_FLAGS])
    memory = track2.run_case(
        RunContext(plate=tiny_plate),
        track2.LoaderCase(crop=BIG_CACHE, source="memory", loader=LoaderSpec(batch_size=8), samples=48),
    )
    assert memory[m.CACHE_FRACTION_OF_PLATE] is None, "crops held in memory: no reader cache to flag"


def test_track3_rows_carry_the_track1_flags(tiny_plate: Path) -> None:
    case = track3.TrainingCase(
        crop=CropConfig(crop_size=32, tier="light"),
        loader=LoaderSpec(batch_size=32),
        model="smallcnn",
        steps=4,
        warmup_steps=1,
    )
    metrics = track3.run_case(RunContext(plate=tiny_plate), case)
    assert {"cache>=plate", "re-reads", "few-samples"} <= set(metrics[m.VALIDITY_FLAGS]), "160 items, 4 steps"


def test_a_batched_track1_case_with_few_calls_is_flagged_as_too_few_samples(tiny_plate: Path) -> None:
    case = track1.DatasetCase(crop=SMALL_CACHE, samples=64, warmup=8, cold_samples=0, batch_size=8)
    metrics = track1.run_case(RunContext(plate=tiny_plate), case)
    assert metrics[m.COUNT] == 8 and "few-samples" in metrics[m.VALIDITY_FLAGS]


def test_the_summary_prints_track2_and_track3_flags_and_explains_them() -> None:
    rows = [
        Record(track=track, case="case", config={}, metrics={m.VALIDITY_FLAGS: ["few-samples"]}, environment={})
        for track in ("loader", "training")
    ]
    table = summary_table(rows)
    assert table.count("few-samples") == 4, "in each track's row and under each track's table"
    assert "timed batches" in table and "timed steps" in table, "in the terms of each track's headline, its rate"


def test_a_track2_rate_on_enough_batches_is_quoted_and_its_short_tail_is_not_shown(tiny_plate: Path) -> None:
    case = track2.LoaderCase(crop=SMALL_CACHE, loader=LoaderSpec(batch_size=4), samples=72, epochs=1)
    metrics = track2.run_case(RunContext(plate=tiny_plate), case)
    assert MIN_RATE_TIMINGS <= metrics[m.prefixed(m.BATCH, m.COUNT)] < 200
    assert metrics[m.prefixed(m.BATCH, m.P95_RELIABLE)] is False
    assert "few-samples" not in metrics[m.VALIDITY_FLAGS], "the rate rests on enough batches"
    row = Record(track="loader", case="c", config={}, metrics=metrics, environment={})
    assert summary_cell_value(row, m.BATCH_P95_MS) is None, "a p95 on too few batches is not shown"
    assert summary_cell_value(row, m.BATCH_P50_MS) == metrics[m.BATCH_P50_MS]
    short = track2.run_case(RunContext(plate=tiny_plate), dataclasses.replace(case, samples=32))
    assert "few-samples" in short[m.VALIDITY_FLAGS], "a rate on 7 batches is not quoted"


def test_impossible_is_a_flag_like_the_others_and_explained_in_each_tracks_terms() -> None:
    crop = CropConfig(crop_size=32)
    raised = validity(crop, None, items_drawn=10, objects=100, enough_timings=True, impossible=True)
    assert raised[m.VALIDITY_FLAGS] == ["impossible"]
    assert validity(crop, None, items_drawn=10, objects=100, enough_timings=True)[m.VALIDITY_FLAGS] == []
    assert "longer than the whole loaded step" in flag_meaning("impossible", "training")
    targets = flag_meaning("impossible", "targets")
    assert "beat" in targets and "the ceiling or the timing is wrong" in targets and "compute-only" not in targets
    assert flag_meaning("impossible") == flag_meaning("impossible", "dataset") == VALIDITY_FLAGS["impossible"]
    assert "compute-only" not in VALIDITY_FLAGS["impossible"], "the general meaning names no one track's numbers"
    assert flag_meaning("few-samples", "targets") == VALIDITY_FLAGS["few-samples"]
    assert flag_meaning("unknown-flag", "training") == "unknown-flag"


def test_the_summary_explains_impossible_in_the_terms_of_each_tracks_rows() -> None:
    def flagged(track: str) -> Record:
        metrics = {m.RATIO_MEDIAN: 1.4, m.VALIDITY_FLAGS: ["impossible"]}
        return Record(track=track, case="case", config={}, metrics=metrics, environment={})

    table = summary_table([flagged("training"), flagged("targets")])
    track3, targets = table.split("\n\n")
    assert flag_meaning("impossible", "training") in track3 and flag_meaning("impossible", "targets") not in track3
    assert flag_meaning("impossible", "targets") in targets and "1.400" in targets


def test_numbers_that_break_their_own_frame_are_contradictions() -> None:
    """Rows as a smoke run wrote them, unflagged: each is now impossible, with its reason."""
    from cropbench.harness.validity import IMPOSSIBLE, contradictions, with_contradictions

    resnet = {m.STEP_P50_MS: 465.2, m.COMPUTE_ONLY_STEP_P50_MS: 468.1, m.DATA_WAIT_FRACTION: 0.05}
    assert any("below its compute-only p50" in why for why in contradictions("training", resnet))
    fed = {m.DATA_WAIT_FRACTION: 0.017, m.STALL_CROSSCHECK: 0.132}
    assert any("differ by more than 5%" in why for why in contradictions("training", fed))
    assert contradictions("training", {m.DATA_WAIT_FRACTION: 0.03, m.STALL_CROSSCHECK: 0.06}) == []
    assert any("harness_overhead is -0.31" in why for why in contradictions("dataset", {m.HARNESS_OVERHEAD: -0.31}))
    assert contradictions("dataset", {m.HARNESS_OVERHEAD: -0.01}) == [], "noise around zero is no contradiction"
    for rate in (1e300, -123.0, float("nan"), float("inf"), "<script>alert(1)</script>"):
        assert contradictions("dataset", {m.SAMPLES_PER_S: rate}), rate
    assert contradictions("dataset", {m.P50_MS: 2.0, m.P95_MS: 1.0, m.P99_MS: 3.0}) == ["p95_ms 1 is below p50_ms 2"]
    assert contradictions("dataset", {m.SAMPLES_PER_S: 900.0, m.P50_MS: 1.0, m.P95_MS: 2.0, m.P99_MS: 3.0}) == []
    written = with_contradictions("training", {**fed, m.VALIDITY_FLAGS: ["few-samples"]})
    assert written[m.VALIDITY_FLAGS] == ["few-samples", IMPOSSIBLE] and written[m.IMPOSSIBLE_REASONS]


def test_a_list_of_rates_is_judged_rate_by_rate() -> None:
    from cropbench.harness.validity import contradictions

    assert contradictions("loader", {m.EPOCH_SAMPLES_PER_S: [1000.0, 1100.0]}) == []
    assert contradictions("loader", {m.EPOCH_SAMPLES_PER_S: [1000.0, -1.0, "x"]}) == ["epoch_samples_per_s is -1"]


def test_a_layout_read_faster_over_the_store_than_from_local_disk_is_a_contradiction() -> None:
    """The smoke plate's tiles layout with 32 crops: one timed batch, the store's rate 2.5x local disk's."""
    from cropbench.harness.validity import contradictions, with_contradictions

    row = {
        m.DIRECT_ + m.SAMPLES_PER_S: 22195.7,
        m.DIRECT_ + m.LOCAL_SAMPLES_PER_S: 8857.7,
        m.ZARR_ + m.SAMPLES_PER_S: 33.8,
        m.ZARR_ + m.LOCAL_SAMPLES_PER_S: 798.0,
    }
    reasons = contradictions("store-layouts", row)
    assert len(reasons) == 1 and reasons[0].startswith("direct_samples_per_s 22,195.7 over the store is 2.51x")
    assert contradictions("store-layouts", {**row, m.DIRECT_ + m.SAMPLES_PER_S: 9000.0}) == [], "within 5 %"
    assert contradictions("remote", row) == [], "only the layouts' rows pair a store rate with its local one"
    whole = {m.DIRECT_ + m.RUN_SAMPLES_PER_S: 900.0, m.DIRECT_ + m.LOCAL_RUN_SAMPLES_PER_S: 600.0}
    assert contradictions("store-layouts", whole) == [
        "direct_run_samples_per_s 900.0 over the store is 1.50x the same layout on local disk (600.0)"
    ], "the whole-pass rates are paired alike"
    assert "impossible" in with_contradictions("store-layouts", row)[m.VALIDITY_FLAGS]
    assert "faster than the same layout on local disk" in flag_meaning("impossible", "store-layouts")


def test_a_layout_whose_grown_cache_holds_the_plate_says_so_in_its_table_line() -> None:
    from cropbench.report.tables import layouts_table

    row = {m.LAYOUT: "planes", m.STORED_MIB: 12.0, m.VALIDITY_FLAGS: ["cache>=plate"]}
    for prefix in (m.DIRECT_, m.ZARR_):
        row |= {prefix + m.REQUESTS_PER_CROP: 1.0, prefix + m.SAMPLES_PER_S: 50.0, prefix + m.LOCAL_SAMPLES_PER_S: 60.0}
    record = Record(track="store-layouts", case="planes", config={}, metrics=row, environment={})
    line = layouts_table([record]).splitlines()[-1]
    assert line.lstrip().startswith("planes") and "cache>=plate: the chunk cache (grown to read ahead)" in line
    unflagged = Record(
        track="store-layouts", case="planes", config={}, metrics={**row, m.VALIDITY_FLAGS: []}, environment={}
    )
    assert "cache>=plate" not in layouts_table([unflagged])
    assert "the local reads are given the same" in flag_meaning("cache>=plate", "store-layouts")
