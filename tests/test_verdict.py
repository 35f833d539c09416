"""The verdict: the best configuration per track, its ratio to the ceiling, and why flagged rows are not quoted."""

from __future__ import annotations

from typing import Any

import pytest

from cropbench import metrics as m
from cropbench.records import Record
from cropbench.report.verdict import HEADING, SMOKE_NOTE, plain_reason, verdict


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
    return row("1", f"random/{decode}", config, flags, **{m.SAMPLES_PER_S: rate})


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


def test_when_every_row_is_flagged_the_best_is_named_as_flagged() -> None:
    answer = verdict([track1("direct", 900.0, ["few-samples"]), track1("zarr", 500.0, ["re-reads", "few-samples"])])
    (one,) = answer.tracks
    assert one.best is not None and one.best.label == "random/direct" and one.quotable == 0
    assert one.reasons == (("few-samples", 2), ("re-reads", 1))
    text = answer.text()
    assert "best random/direct: 900 samples/s [flagged: not a number to quote]" in text
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
        row("1", "random/direct", {"crop": {"decode": "direct", "dtype": dtype}}, **{m.SAMPLES_PER_S: rate})
        for dtype, rate in (("float32", 100.0), ("uint16", 400.0))
    ]
    (one,) = verdict(same_label).tracks
    assert one.configurations == 2 and one.value == 400.0
    without_config = [row("1", name, {}, **{m.SAMPLES_PER_S: rate}) for name, rate in (("a", 1.0), ("b", 3.0))]
    (two,) = verdict(without_config).tracks
    assert two.configurations == 2 and two.value == 3.0, "rows written without a config are not pooled"


def test_track2_is_measured_against_crops_in_memory_of_the_same_dtype() -> None:
    def track2(source: str, dtype: str, rate: float, flags: list[str] | None = None, workers: int = 2) -> Record:
        config = {"source": source, "crop": {"dtype": dtype}, "loader": {"num_workers": workers}}
        return row("2", f"{source}/{dtype}/w{workers}", config, flags, **{m.SAMPLES_PER_S: rate})

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


def track3(case: str, images: float, ceiling: float, stall: float, flags: list[str] | None = None) -> Record:
    config = {"model": case, "loader": {"num_workers": 0}}
    metrics = {m.IMAGES_PER_S: images, m.COMPUTE_ONLY_IMAGES_PER_S: ceiling, m.STALL_CROSSCHECK: stall}
    return row("3", case, config, flags, **metrics)


def test_track3_ranks_on_the_share_of_its_own_model_and_never_reports_more_than_the_ceiling() -> None:
    rows = [
        track3("resnet18", 50.0, 60.0, 0.2),
        track3("smallcnn", 900.0, 1000.0, 0.1),
        track3("impossible", 1300.0, 1000.0, 0.0, ["impossible"]),
        track3("old-negative", 1780.0, 1000.0, -0.78),
    ]
    search = row(
        "3",
        "emulated40ms/w*/min-workers",
        {"case": {"model": "emulated"}},
        **{m.TRIED_WORKERS: [0, 1], m.MIN_WORKERS_ANSWER: "1"},
    )
    answer = verdict([*rows, search])
    (three,) = answer.tracks
    assert three.best is not None and three.best.label == "smallcnn" and three.value == 900.0
    assert three.ratio == pytest.approx(0.9) and three.ceiling is not None and three.ceiling.value == 1000.0
    assert three.configurations == 4 and three.quotable == 2, "the search's summary is not a measurement row"
    assert dict(three.reasons) == {"impossible": 2}, "a negative stall read back from old rows is impossible too"
    assert "fewest workers that keep emulated40ms/w* fed: 1" in answer.text()
    only_impossible = verdict(rows[2:]).tracks[0]
    assert only_impossible.best is None, "an impossible row is never named best, flagged or not"
    assert "no configuration measured a number" in verdict(rows[2:]).text()


def test_a_flagged_best_is_stated_with_the_ratio_capped_by_the_stall() -> None:
    (three,) = verdict([track3("smallcnn", 990.0, 1000.0, 0.2, ["few-samples"])]).tracks
    assert three.ratio == pytest.approx(0.8), "the stall's share is the lower, so the one reported"
    assert three.ceiling is not None and three.ceiling.value == pytest.approx(990.0 / 0.8)
    (noisy,) = verdict([track3("resnet18", 21.8, 21.0, 0.01)]).tracks
    assert noisy.ratio == pytest.approx(0.99) and noisy.ceiling is not None
    assert noisy.ceiling.value >= 21.8, "the ceiling named is never below the rate it bounds"


def test_the_smoke_preset_says_what_the_run_proves_before_the_tracks() -> None:
    lines = verdict([track1("direct", 900.0, ["few-samples"])], preset="smoke").lines()
    note = [line for line in lines[1:] if not line.startswith("  track")][:-3]
    assert lines[0] == HEADING and " ".join(line.strip() for line in note) == SMOKE_NOTE
    assert "--preset full" in SMOKE_NOTE
    assert lines[1 + len(note)].startswith("  track 1 (Dataset __getitem__): best random/direct")
    assert "no row of this run" not in "\n".join(lines), "the smoke note already says why"


def test_layouts_and_peers_are_measured_against_memmap_and_cropbench_direct() -> None:
    layouts = [
        row("layouts", name, {"layout_name": name}, **{m.crops_per_s("random"): rate})
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
