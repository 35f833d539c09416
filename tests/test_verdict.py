"""The verdict: the best configuration per track, its ratio to the ceiling, and why flagged rows are not quoted."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from cropbench import metrics as m
from cropbench.harness.flags import decide_run
from cropbench.records import Record
from cropbench.report.rules import paired_ratios
from cropbench.report.verdict import (
    HEADING,
    SMOKE_NOTE,
    configurations,
    plain_reason,
    track_lines,
    verdict,
)


def row(track: str, case: str, config: dict[str, Any], flags: list[str] | None = None, **metrics: Any) -> Record:
    return Record(
        track=track,
        case=case,
        config=config,
        metrics={**metrics, m.VALIDITY_FLAGS: flags or []},
        environment={},
    )


def track1(decode: str, rate: float, flags: list[str] | None = None, seed: int = 0) -> Record:
    config = {"access": "random", "crop": {"decode": decode}, "seed": seed}
    return row("dataset", f"random/{decode}", config, flags, **{m.SAMPLES_PER_S: rate})


def test_the_best_quotable_configuration_wins_and_a_flagged_one_is_never_called_quotable() -> None:
    answer = verdict([track1("direct", 900.0), track1("zarr", 5000.0, ["cache>=plate"]), track1("field", 300.0)])
    (one,) = answer.tracks
    assert one.best is not None and one.best.label == "random/direct" and one.value == 900.0
    assert one.quotable == 2 and one.configurations == 3 and one.reasons == (("cache>=plate", 1),)
    text = answer.text()
    assert text.splitlines()[0] == HEADING
    assert "best random/direct: 900 samples/s\n    no ceiling in this run" in text
    assert "not a number to quote" not in text, "the best row named is a clean one"
    assert (
        "2 of 3 configurations carry no flag; the others must not be quoted:" in text
        and plain_reason("cache>=plate") in text
    )


def test_when_every_row_is_flagged_no_best_is_named_and_the_verdict_says_why() -> None:
    answer = verdict([track1("direct", 900.0, ["few-samples"]), track1("zarr", 500.0, ["re-reads", "few-samples"])])
    (one,) = answer.tracks
    assert one.best is None and one.value is None and one.quotable == 0
    assert one.reasons == (("few-samples", 2), ("re-reads", 1))
    text = answer.text()
    assert "no configuration to name: every one that measured a number carries a flag (below)" in text
    assert "best" not in text
    assert "none of its 2 configurations may be quoted:" in text
    assert "no row of this run is a measurement to quote" in text


def test_repeats_are_one_configuration_judged_on_their_median_and_flagged_if_any_repeat_is() -> None:
    rows = [track1("direct", rate, seed=seed) for seed, rate in enumerate((100.0, 300.0, 200.0))]
    rows.append(track1("zarr", 250.0))
    rows.append(track1("zarr", 260.0, ["rate!=1/mean"], seed=1))
    (one,) = verdict(rows).tracks
    assert one.configurations == 2 and one.quotable == 1
    assert one.best is not None and one.best.label == "random/direct" and one.value == 200.0


def test_configurations_are_told_apart_by_their_config_not_their_label() -> None:
    same_label = [
        row("dataset", "random/direct", {"crop": {"decode": "direct", "dtype": dtype}}, **{m.SAMPLES_PER_S: rate})
        for dtype, rate in (("float32", 100.0), ("uint16", 400.0))
    ]
    (one,) = verdict(same_label).tracks
    assert one.configurations == 2 and one.value == 400.0
    without_config = [row("dataset", name, {}, **{m.SAMPLES_PER_S: rate}) for name, rate in (("a", 1.0), ("b", 3.0))]
    (two,) = verdict(without_config).tracks
    assert two.configurations == 2 and two.value == 3.0, "rows written without a config are not pooled"


def test_track2_is_measured_against_crops_in_memory_of_the_same_dtype() -> None:
    def track2(source: str, dtype: str, rate: float, flags: list[str] | None = None, workers: int = 2) -> Record:
        config = {"source": source, "crop": {"dtype": dtype}, "loader": {"num_workers": workers}}
        return row("loader", f"{source}/{dtype}/w{workers}", config, flags, **{m.SAMPLES_PER_S: rate})

    rows = [
        track2("plate", "float32", 1000.0),
        track2("plate", "float32", 9000.0, ["re-reads"], workers=1),
        track2("memory", "uint16", 8000.0),
        track2("memory", "float32", 4000.0),
    ]
    (two,) = verdict(rows).tracks
    assert two.best is not None and two.value == 1000.0
    assert two.ceiling is not None and two.ceiling.value == 4000.0 and two.ratio == pytest.approx(0.25)
    assert "0.25x the ceiling measured in the same run: crops already in memory" in verdict(rows).text()
    main_process = [*rows, track2("plate", "float32", 24000.0, workers=0)]
    (alone,) = verdict(main_process).tracks
    assert alone.value == 24000.0 and alone.ratio is None, "nothing is handed over: crops in memory do not bound it"
    assert "no ceiling in this run for loading in the main process" in verdict(main_process).text()


def test_track2_crops_in_memory_bound_only_the_same_workers_batch_and_collate() -> None:
    def track2(source: str, rate: float, workers: int, batch: int, collate: str = "default") -> Record:
        loader = {"num_workers": workers, "batch_size": batch, "collate": collate}
        config = {"source": source, "crop": {"dtype": "float32"}, "loader": loader}
        return row("loader", f"{source}/w{workers}/b{batch}/{collate}", config, None, **{m.SAMPLES_PER_S: rate})

    one_worker = [track2("plate", 23000.0, 2, 64), track2("memory", 6800.0, 1, 128)]
    (two,) = verdict(one_worker).tracks
    assert two.value == 23000.0 and two.ratio is None, "one worker's hand-over does not bound two workers"
    assert "no ceiling in this run at w2/b64: crops already in memory were handed over at w1/b128 only" in (
        verdict(one_worker).text()
    )
    (matched,) = verdict([*one_worker, track2("memory", 46000.0, 2, 64)]).tracks
    assert matched.ceiling is not None and matched.ceiling.value == 46000.0 and matched.ratio == pytest.approx(0.5)
    stacked = [track2("plate", 19000.0, 2, 64, "stack"), track2("memory", 9900.0, 2, 64)]
    assert (
        "no ceiling in this run at w2/b64/stack-collate: crops already in memory were handed over at w2/b64 only"
        in (verdict(stacked).text())
    ), "the default collate's hand-over does not bound the stacked one"
    (stack_matched,) = verdict([*stacked, track2("memory", 38000.0, 2, 64, "stack")]).tracks
    assert stack_matched.ratio == pytest.approx(0.5)


def track3(
    case: str, images: float, ceiling: float, stall: float, flags: list[str] | None = None, model: str | None = None
) -> Record:
    config = {"model": model or case, "loader": {"num_workers": 0 if model is None else case}}
    metrics = {m.IMAGES_PER_S: images, m.COMPUTE_ONLY_IMAGES_PER_S: ceiling, m.STALL_CROSSCHECK: stall}
    return row("training", case, config, flags, **metrics)


def test_track3_ranks_on_images_per_s_at_each_model_and_never_reports_more_than_the_ceiling() -> None:
    resnet = [track3("w0", 50.0, 60.0, 0.2, model="resnet18"), track3("w2", 35.0, 36.0, 0.03, model="resnet18")]
    rows = [
        *resnet,
        track3("smallcnn", 900.0, 1000.0, 0.1),
        track3("impossible", 1300.0, 1000.0, 0.0, ["impossible"], model="smallcnn"),
        track3("old-negative", 1780.0, 1000.0, -0.78, model="smallcnn"),
    ]
    search = row(
        "training",
        "emulated40ms/w*/min-workers",
        {"case": {"model": "emulated"}},
        **{m.TRIED_WORKERS: [0, 1], m.MIN_WORKERS_ANSWER: "1"},
    )
    answer = verdict(decide_run([*rows, search]))  # as the runner writes them
    resnet18, smallcnn, emulated = answer.tracks
    assert resnet18.best is not None and resnet18.best.label == "w0" and resnet18.value == 50.0, (
        "the faster configuration of the model, not the one nearer its own ceiling (w2: 0.97 of it)"
    )
    assert smallcnn.best is not None and smallcnn.best.label == "smallcnn" and smallcnn.value == 900.0
    assert smallcnn.ratio == pytest.approx(0.9) and smallcnn.ceiling is not None and smallcnn.ceiling.value == 1000.0
    assert smallcnn.configurations == 3 and smallcnn.quotable == 1
    assert dict(smallcnn.reasons) == {"impossible": 2}, "a negative stall is impossible too"
    assert emulated.configurations == 0, "the search's summary is not a measurement row"
    text = answer.text()
    assert "track training (training loop, model resnet18): best w0: 50 images/s" in text
    assert "chosen as the highest images/s of 2 configurations without flags" in text
    assert "old-negative: " in text and "stall cross-check -78.0% is negative" in text
    assert "fewest workers that keep emulated40ms/w* fed: 1" in text
    (only_impossible,) = verdict(decide_run(rows[3:])).tracks
    assert only_impossible.best is None, "an impossible row is never named best"
    assert "every one that measured a number contradicts itself" in verdict(decide_run(rows[3:])).text()


def test_the_best_is_stated_with_the_ratio_capped_by_the_stall() -> None:
    (three,) = verdict([track3("smallcnn", 990.0, 1000.0, 0.2)]).tracks
    assert three.ratio == pytest.approx(0.8), "the stall's share is the lower, so the one reported"
    assert three.ceiling is not None and three.ceiling.value == pytest.approx(990.0 / 0.8)
    (noisy,) = verdict([track3("resnet18", 21.8, 21.0, 0.01)]).tracks
    assert noisy.ratio == pytest.approx(0.99) and noisy.ceiling is not None
    assert noisy.ceiling.value >= 21.8, "the ceiling named is never below the rate it bounds"


def test_the_smoke_preset_says_what_the_run_proves_before_the_tracks() -> None:
    lines = verdict([track1("direct", 900.0)], preset="smoke").lines()
    note = [line for line in lines[1:] if not line.startswith("  track")][:-3]  # less the track's own lines
    assert lines[0] == HEADING and " ".join(line.strip() for line in note) == SMOKE_NOTE
    assert "--preset full" in SMOKE_NOTE
    assert lines[1 + len(note)].startswith("  track dataset (Dataset __getitem__): best random/direct")
    assert "no row of this run" not in "\n".join(lines), "the smoke note already says why"


def test_layouts_and_peers_are_measured_against_memmap_and_cropbench_direct() -> None:
    layouts = [
        row("layouts", name, {"layout_name": name}, **{m.access_crops_per_s_key("random"): rate})
        for name, rate in (("memmap", 10000.0), ("zarr-sharded", 2500.0), ("zarr-small", 1000.0))
    ]
    peers = [
        row("peers", name, {"peer": name, "kind": kind, **extra}, **{m.SAMPLES_PER_S: rate})
        for name, kind, extra, rate in (
            ("cropbench-direct", "cropbench", {"decode": "direct"}, 2000.0),
            ("dask-per-crop", "peer", {}, 20.0),
            ("tensorstore-batched", "peer", {}, 500.0),
        )
    ]
    peers.append(row("peers", "spatialdata", {"peer": "spatialdata", "kind": "peer"}, **{m.SKIPPED: True}))
    answer = verdict(layouts + peers)
    by_track = {t.track: t for t in answer.tracks}
    assert by_track["layouts"].best is not None and by_track["layouts"].best.label == "zarr-sharded"
    assert by_track["layouts"].ratio == pytest.approx(0.25)
    assert by_track["peers"].best is not None and by_track["peers"].best.label == "tensorstore-batched"
    assert by_track["peers"].ratio == pytest.approx(0.25) and by_track["peers"].configurations == 3


def targets_ratio(
    access: str,
    threads: int,
    reference: str,
    median: float,
    spread: float = 0.02,
    seed: int = 0,
) -> Record:
    """A ratio row as track targets writes it: the direct reader at ``threads`` over ``reference``."""
    config = {
        "access": access,
        "reader_name": f"direct-batched-{threads}t",
        "reference_name": reference,
        "reader": {"decode_threads": threads, "batch": 64},
        "reference": {"threads": threads} if reference.startswith("ceiling") else {"mode": "batch"},
    }
    metrics: dict[str, Any] = {
        m.RATIO_MEDIAN: median,
        m.RATIO_Q1: median - spread,
        m.RATIO_Q3: median + spread,
        m.RATIO_MIN: median - 2 * spread,
        m.RATIO_MAX: median + 2 * spread,
        m.PAIRED_BLOCKS: 16,
    }
    if reference.startswith("ceiling"):
        metrics[m.CEILING_THREADS] = threads
        metrics[m.VALIDITY_FLAGS] = ["impossible"] if median > 1 else []
    label = f"{access}/direct-batched-{threads}t/over/{reference}"
    return Record(track="targets", case=label, config=config, metrics=metrics, environment={}, seed=seed)


def targets_rows() -> list[Record]:
    rows = []
    for access, (one, two) in (("random", (0.21, 0.19)), ("grouped", (0.38, 1.4))):
        rows += [targets_ratio(access, 1, "ceiling-1t", one), targets_ratio(access, 2, "ceiling-2t", two)]
        rows += [targets_ratio(access, t, "tensorstore-batch", 1.5 * t) for t in (1, 2)]
        rows += [targets_ratio(access, t, "zarr-async", 150.0 + t) for t in (1, 2)]
    reader = {"reader_name": "zarr-async", "tuning": {}, "case": {"access": "grouped"}}
    metrics = {m.CROPS_PER_S: 100.0, m.IDENTICAL_TO_DIRECT: False}
    rows.append(Record(track="targets", case="grouped/zarr-async", config=reader, metrics=metrics, environment={}))
    skipped = {m.SKIPPED_PEERS: {"zarrs-async": "zarrs is not installed"}, m.OBJECTS: 105}
    rows.append(Record(track="targets", case="grouped", config={"access": "grouped"}, metrics=skipped, environment={}))
    return rows


def test_targets_says_per_access_pattern_the_ratio_to_the_same_thread_ceiling_and_to_each_peer() -> None:
    answer = verdict(targets_rows())
    (targets,) = answer.tracks
    lines = track_lines(targets)
    assert lines[0].startswith("track targets (direct reader against the copy ceiling and peers): ")
    assert "no configuration measured a number" not in answer.text()
    ceiling = "over the copy ceiling at the same thread count"
    assert lines[1:5] == [
        f"random, {ceiling}: 0.21x [0.19-0.23] with 1 decode thread, 0.19x [0.17-0.21] with 2",
        "random, over tensorstore-batch at its best: 1.50x [1.48-1.52] with 1 decode thread, 3.00x [2.98-3.02] with 2",
        "random, over zarr-async at its best: 151x [151-151] with 1 decode thread, 152x [152-152] with 2",
        f"grouped, {ceiling}: 0.38x [0.36-0.40] with 1 decode thread, "
        "1.40x [1.38-1.42] with 2 (flagged impossible: not a number to quote)",
    ]
    assert "peers left out (not installed or not applicable, see skipped_peers): zarrs-async" in lines
    assert any(
        line.startswith("crops not byte for byte the direct reader's") and "zarr-async (grouped)" in line
        for line in lines
    )
    assert targets.configurations == 4 and targets.quotable == 3, "the flag counts cover the ratios to the ceiling"
    assert "3 of 4 ratios to the ceiling carry no flag; the others must not be quoted:" in lines
    (reason,) = [line for line in lines if line.startswith("  - ")]
    assert "beat the copy ceiling" in reason and "the ceiling or the timing is wrong" in reason
    assert "compute-only" not in reason, "Track 3's explanation is not the targets one"


def test_targets_repeats_are_one_ratio_judged_on_their_medians() -> None:
    rows = [targets_ratio("random", 1, "ceiling-1t", median, seed=seed) for seed, median in enumerate((0.2, 0.3, 0.25))]
    (ratio,) = paired_ratios(configurations(rows))
    assert ratio.median == pytest.approx(0.25) and ratio.q1 == pytest.approx(0.23) and ratio.blocks == 48
    assert ratio.ceiling and ratio.threads == 1 and ratio.access == "random" and not ratio.flags
    unnamed = [dataclasses.replace(rows[0], config={"reader": {}, "reference": {}})]
    assert paired_ratios(configurations(unnamed)) == [], "rows that do not name their readers are left out"


def test_the_store_tracks_name_their_best_beside_the_same_on_local_disk() -> None:
    def remote(decode: str, workers: int, rate: float, local: float | None) -> Record:
        metrics: dict[str, Any] = {
            m.SAMPLES_PER_S: rate,
            m.REQUESTS_PER_CROP: 1.25 if decode == "direct" else 4.0,
            m.BYTES_TRANSFERRED_PER_CROP: 98304.0,
        }
        if local:
            metrics.update({m.LOCAL_SAMPLES_PER_S: local, m.RATIO_TO_LOCAL: rate / local})
        config = {"decode": decode, "workers": workers, "seed": 0}
        return Record(track="remote", case=f"{decode}/w{workers}/b32", config=config, metrics=metrics, environment={})

    rows = [remote("direct", 0, 300.0, 1200.0), remote("direct", 2, 500.0, 2000.0), remote("zarr", 0, 40.0, 400.0)]
    text = verdict(rows).text()
    assert "track remote (a plate in an object store): best direct/w2/b32: 500 crops/s through the loader" in text
    assert "0.25x the reference measured in the same run: the same case on local disk (2,000 crops/s through" in text
    assert (
        "requests per random crop, decoded-chunk cache off (bytes transferred): direct 1.25 (96 KiB), zarr 4.00" in text
    )
    alone = verdict([remote("direct", 0, 300.0, None)]).text()
    assert "no local plate measured beside the store in this run (--local-plate PATH does)" in alone

    def layout(name: str, direct: float, zarr: float) -> Record:
        metrics = {
            m.LAYOUT: name,
            m.STORED_MIB: 10.0,
            m.INJECTED_LATENCY_MS: 20.0,
            m.IN_FLIGHT: 16,
            **{
                m.prefixed(prefix, metric): value
                for prefix, rate, requests in ((m.DIRECT_, direct, 1.0), (m.ZARR_, zarr, 3.0))
                for metric, value in (
                    (m.SAMPLES_PER_S, rate),
                    (m.LOCAL_SAMPLES_PER_S, 4 * rate),
                    (m.REQUESTS_PER_CROP, requests),
                )
            },
        }
        return Record(track="store-layouts", case=name, config={"layout_name": name}, metrics=metrics, environment={})

    lines = verdict([layout("default", 200.0, 30.0), layout("tiles", 100.0, 45.0)]).text()
    assert "track store-layouts (layouts in an object store): best default: 200 crops/s, direct path" in lines
    assert (
        "0.25x the reference measured in the same run: the same layout on local disk (800 crops/s, direct path)"
        in lines
    )
    assert "zarr path: best tiles: 45 crops/s (0.25x the same layout on local disk)" in lines
    assert "requests per random crop (direct / zarr): default 1.00 / 3.00, tiles 1.00 / 3.00" in lines
    assert "over a loopback store at 20 ms injected per request, 16 requests in flight, no workers" in lines


def test_memmap_and_cropbench_direct_are_named_references_not_ceilings() -> None:
    layouts = [
        row("layouts", name, {"layout_name": name}, **{m.access_crops_per_s_key("random"): rate})
        for name, rate in (("memmap", 1000.0), ("zarr-sharded", 2500.0))
    ]
    (track,) = verdict(layouts).tracks
    assert track.ratio == pytest.approx(2.5) and track.ceiling is not None and track.ceiling.kind == "reference"
    assert "2.50x the reference measured in the same run: the memory-mapped raw plate" in verdict(layouts).text()


def test_impossible_rates_are_never_the_best() -> None:
    """A rate that cannot be true (1e300, negative, not finite) or a p95 below its p50 is flagged
    impossible, with its reason, and the best is the highest rate of the rows left."""
    rows = [
        track1("direct", 900.0),
        track1("zarr", 1e300),
        track1("field", -123.0),
        track1("tiff", float("inf")),
        row(
            "dataset", "random/memmap", {"decode": "memmap"}, **{m.SAMPLES_PER_S: 5000.0, m.P50_MS: 2.0, m.P95_MS: 1.0}
        ),
    ]
    rows = decide_run(rows)  # as the runner writes them
    (one,) = verdict(rows).tracks
    assert one.best is not None and one.best.label == "random/direct" and one.value == 900.0
    assert dict(one.reasons) == {"impossible": 4}
    text = verdict(rows).text()
    assert "random/zarr: samples_per_s is 1e+300" in text and "p95_ms 1 is below p50_ms 2" in text
    only_impossible = verdict(rows[1:]).text()
    assert "no configuration measured a number" not in only_impossible, "they measured numbers that contradict"
    assert "every one that measured a number contradicts itself" in only_impossible


def test_a_track2_rate_above_its_same_shape_ceiling_is_impossible_never_quoted_as_a_multiple() -> None:
    def track2(source: str, rate: float, collate: str = "default", access: str = "random") -> Record:
        config = {
            "source": source,
            "access": access,
            "loader": {"num_workers": 2, "batch_size": 64, "collate": collate},
        }
        return row("loader", f"{source}/{access}/w2/b64/{collate}", config, **{m.SAMPLES_PER_S: rate})

    rows = [track2("plate", 9308.0), track2("memory", 6563.0), track2("plate", 10_000_000.0, "stack")]
    rows += [track2("memory", 8500.0, "stack"), track2("plate", 5000.0, access="grouped")]
    answer = verdict(decide_run(rows))  # as the runner writes them: the ceilings measured in the run
    (two,) = answer.tracks
    assert two.best is not None and two.best.label == "plate/grouped/w2/b64/default" and two.value == 5000.0
    assert two.ratio is not None and two.ratio <= 1.0
    text = answer.text()
    assert "1.42x the in-memory ceiling at the same shape w2/b64 (6,563)" in text, text
    assert "0.76x the ceiling measured in the same run: crops already in memory" in text, "5,000 over 6,563"


# --- no answer rests on a flagged row: one test per decision ---------------------------------------------


def test_the_fastest_layout_named_is_the_fastest_without_flags() -> None:
    layouts = [
        row("layouts", name, {"layout_name": name}, flags, **{m.access_crops_per_s_key("random"): rate})
        for name, rate, flags in (
            ("memmap", 10000.0, None),
            ("zarr-sharded", 9000.0, ["cache>=plate"]),
            ("zarr-small", 1000.0, None),
        )
    ]
    (track,) = verdict(layouts).tracks
    assert track.best is not None and track.best.label == "zarr-small" and track.value == 1000.0


def test_a_flagged_reference_sets_no_ratio() -> None:
    """compare-layouts' memmap reference and the peers' cropbench direct: never a flagged row's rate."""
    layouts = [
        row("layouts", name, {"layout_name": name}, flags, **{m.access_crops_per_s_key("random"): rate})
        for name, rate, flags in (("memmap", 500.0, ["re-reads"]), ("zarr-sharded", 2500.0, None))
    ]
    (track,) = verdict(layouts).tracks
    assert track.best is not None and track.ratio is None and track.ceiling is None
    assert "no ceiling in this run: every row of the memory-mapped raw plate" in verdict(layouts).text()
    peers = [
        row(
            "peers", "cropbench-direct", {"kind": "cropbench", "decode": "direct"}, ["few-samples"], samples_per_s=90.0
        ),
        row("peers", "cropbench-direct-2", {"kind": "cropbench", "decode": "direct", "x": 1}, samples_per_s=40.0),
        row("peers", "dask", {"kind": "peer"}, samples_per_s=20.0),
    ]
    (track,) = verdict(peers).tracks
    assert track.ceiling is not None and track.ceiling.value == 40.0 and track.ratio == pytest.approx(0.5)


def test_track2_is_never_measured_against_a_flagged_ceiling() -> None:
    def track2(source: str, rate: float, flags: list[str] | None = None, dtype: str = "float32") -> Record:
        config = {"source": source, "crop": {"dtype": dtype}, "loader": {"num_workers": 2}}
        return row("loader", f"{source}/{dtype}/{rate}", config, flags, **{m.SAMPLES_PER_S: rate})

    rows = [track2("plate", 1000.0), track2("memory", 2000.0, ["few-samples"]), track2("memory", 4000.0, dtype="u")]
    (two,) = verdict(rows).tracks
    assert two.ceiling is not None and two.ceiling.value == 4000.0, "the clean one, of another dtype"
    (alone,) = verdict(rows[:2]).tracks
    assert (
        alone.ratio is None and "every row of crops already in memory there carries a flag" in verdict(rows[:2]).text()
    )


def test_the_zarr_path_best_layout_in_a_store_is_one_without_flags() -> None:
    def layout(name: str, zarr: float, flags: list[str] | None = None) -> Record:
        metrics = {m.prefixed(m.DIRECT_, m.SAMPLES_PER_S): 100.0, m.prefixed(m.ZARR_, m.SAMPLES_PER_S): zarr}
        return row("store-layouts", name, {"layout_name": name}, flags, **metrics)

    text = verdict([layout("default", 90.0, ["server-bound"]), layout("tiles", 45.0)]).text()
    assert "zarr path: best tiles: 45 crops/s" in text
    everything_flagged = verdict([layout("default", 90.0, ["server-bound"])]).text()
    assert "zarr path: no layout to name: every one that measured a number carries a flag" in everything_flagged


def formats_row(reader: str, whole: float | None, flags: list[str] | None = None, **metrics: Any) -> Record:
    rates = {} if whole is None else {m.prefixed(m.SHUFFLED, m.EPOCH_SAMPLES_PER_S): whole}
    return row("formats", reader, {m.READER: reader}, flags, **rates, **metrics)


def test_no_break_even_is_quoted_from_a_flagged_converted_store() -> None:
    pays = {m.prefixed(m.INTERLEAVED, m.CONVERTING_PAYS_OFF): True, m.prefixed(m.INTERLEAVED, m.BREAK_EVEN_EPOCHS): 3.0}
    rows = [
        formats_row("ome-zarr/direct", 1000.0),
        formats_row("mds", 3000.0, ["library-cache"], **pays, **{m.EPOCH_RATIO_TO_IN_PLACE: 3.0}),
        formats_row("hdf5", 2000.0, **pays, **{m.EPOCH_RATIO_TO_IN_PLACE: 2.0}),
    ]
    (formats,) = verdict(rows).tracks
    assert formats.best is not None and formats.best.label == "hdf5", "the flagged faster store is not the best"
    text = verdict(rows).text()
    assert "hdf5: converting pays off after 3.0 epochs" in text
    assert "mds: no break-even to quote (flagged library-cache)" in text and "mds: converting" not in text


def test_the_formats_verdict_names_the_in_place_numbers_when_no_store_measured_one() -> None:
    """The table showed ome-zarr/direct and ome-zarr/zarr rates; the verdict said nothing was measured."""
    skipped = formats_row("hdf5", None, **{m.SKIPPED: True, m.SKIP_REASON: "needs h5py"})
    rows = [formats_row("ome-zarr/direct", 7506.0), formats_row("ome-zarr/zarr", 428.0), skipped]
    text = verdict(rows).text()
    assert "no configuration measured a number" not in text
    assert (
        "track formats (crops converted to training formats): no converted store measured a number (each row says "
        "why); the plate read in place: ome-zarr/direct 7,506, ome-zarr/zarr 428 crops/s, whole shuffled epochs"
    ) in text
