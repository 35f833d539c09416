"""cropbench advise: the decisions as pure functions over synthetic rows, the feeding arithmetic, the model
names it takes, and one small run end to end on the tiny plate."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
from conftest import CliRunner

from cropbench import metrics as m
from cropbench.config import CropConfig
from cropbench.errors import ConfigError
from cropbench.harness.ratios import (
    predicted_data_wait,
    predicted_images_per_s,
    ratio_settled,
    supply_needed,
)
from cropbench.records import Record, read_records
from cropbench.report import advice
from cropbench.tracks.training import advise as measuring


def option(question: str, name: str, *, decode: str = "direct", workers: int = 0, batch: int = 64,
           flags: tuple[str, ...] = (), rate: float = 1000.0, predicted: float | None = None) -> Record:  # fmt: skip
    metrics: dict[str, Any] = {
        m.QUESTION: question,
        m.OPTION: name,
        m.WHOLE_EPOCH_SAMPLES_PER_S: rate,
        m.CORES_BUSY: 1.0,
        m.ROUNDS: 4,
        m.VALIDITY_FLAGS: list(flags),
    }
    if predicted is not None:
        metrics.update({m.PREDICTED_IMAGES_PER_S: predicted, m.PREDICTED_DATA_WAIT_FRACTION: 0.05, m.THRESHOLD: 0.10})
    config = {
        m.QUESTION: question,
        m.OPTION: name,
        "crop": {"decode": decode},
        "loader": {"num_workers": workers, "batch_size": batch, "prefetch_factor": None, "pin_memory": False},
    }
    return Record(track=advice.TRACK, case=f"{question}/{name}", config=config, metrics=metrics, environment={})


def ratio(question: str, reader: str, reference: str, median: float, q1: float, q3: float, *,
          flags: tuple[str, ...] = (), budget_ended: bool = False, load: float = 0.0) -> Record:  # fmt: skip
    metrics = {
        m.QUESTION: question,
        m.RATIO_MEDIAN: median,
        m.RATIO_Q1: q1,
        m.RATIO_Q3: q3,
        m.ROUNDS: 4,
        m.SETTLED: ratio_settled(median, q1, q3),
        m.BUDGET_ENDED: budget_ended,
        m.LOADAVG_START: load,
        m.VALIDITY_FLAGS: list(flags),
    }
    config = {m.QUESTION: question, m.READER: reader, "reference": reference, m.CORES: 2}
    case = f"{question}/{reader}/over/{reference}"
    return Record(track=advice.TRACK, case=case, config=config, metrics=metrics, environment={})


def read_paths(median: float, q1: float, q3: float, **knobs: Any) -> list[Record]:
    zarr_flags = knobs.pop("zarr_flags", ())
    return [
        option(advice.READ_PATH, "direct"),
        option(advice.READ_PATH, "zarr", decode="zarr", flags=zarr_flags),
        ratio(advice.READ_PATH, "direct", "zarr", median, q1, q3, **knobs),
    ]


def test_a_settled_ratio_picks_the_faster_option() -> None:
    decision = advice.decide_read_path(read_paths(0.5, 0.45, 0.55), budget_min=5)
    assert (decision.value, decision.open) == ("zarr", False)
    assert any("direct/over/zarr: 0.50x" in line for line in decision.evidence)
    assert "0.45-0.55" in decision.uncertainty


def test_a_flagged_row_never_decides() -> None:
    rows = read_paths(0.5, 0.45, 0.55, zarr_flags=("cache>=plate",))
    decision = advice.decide_read_path(rows, budget_min=5)
    assert decision.value == "direct" and decision.open  # the default, not the flagged row's answer
    assert "not used: read-path/zarr (flagged cache>=plate)" in decision.evidence
    assert "larger than the reader's chunk cache" in decision.settle
    # A ratio flagged for its inputs decides nothing either.
    flagged_ratio = read_paths(0.5, 0.45, 0.55, flags=("few-samples",))
    assert advice.decide_read_path(flagged_ratio, budget_min=5).open


def test_an_open_decision_when_the_spread_reaches_across_one() -> None:
    decision = advice.decide_read_path(read_paths(1.05, 0.95, 1.15, budget_ended=True), budget_min=5)
    assert decision.open and decision.value == "direct"
    assert "reach across 1" in decision.uncertainty
    assert "--budget-min 10" in decision.settle
    busy = advice.decide_read_path(read_paths(1.05, 0.95, 1.15, load=3.0), budget_min=5)
    assert "idle machine" in busy.settle and "3.0 on 2 cores" in busy.settle


def workers_rows(medians: dict[int, tuple[float, float, float]], flagged: tuple[int, ...] = ()) -> list[Record]:
    rows = []
    for workers, (median, q1, q3) in medians.items():
        flags = ("few-samples",) if workers in flagged else ()
        rows.append(option(advice.WORKERS, f"w{workers}", workers=workers, predicted=100.0, flags=flags))
        rows.append(ratio(advice.WORKERS, f"w{workers}", measuring.NEED, median, q1, q3))
    return rows


def test_the_fewest_workers_that_keep_the_model_fed() -> None:
    rows = workers_rows({0: (0.4, 0.38, 0.42), 1: (1.3, 1.25, 1.35), 2: (2.0, 1.9, 2.1)})
    decision = advice.decide_workers(rows, budget_min=5)
    assert (decision.value, decision.open) == (1, False)
    assert "1.30x the crops/s the model needs" in decision.uncertainty
    # The count below the answer may be fed within the noise: the answer stays, open.
    close = workers_rows({0: (0.95, 0.85, 1.05), 1: (1.3, 1.25, 1.35)})
    assert advice.decide_workers(close, budget_min=5).open
    # A flagged fed count is skipped: the next unflagged one answers.
    skipped = advice.decide_workers(workers_rows({0: (0.4, 0.38, 0.42), 1: (1.3, 1.2, 1.4), 2: (2.0, 1.9, 2.1)},
                                                 flagged=(1,)), budget_min=5)  # fmt: skip
    assert skipped.value == 2 and any("not used: workers/w1" in line for line in skipped.evidence)
    # None fed: the most supply, said so.
    starved = advice.decide_workers(workers_rows({0: (0.2, 0.19, 0.21), 1: (0.5, 0.48, 0.52)}), budget_min=5)
    assert starved.value == 1 and "no count tried" in starved.answer


def formats_rows(conversion: float, pays: bool, in_place: list[float], converted: list[float]) -> list[Record]:
    reference = {m.READER: m.REFERENCE, m.prefixed(m.SHUFFLED, m.EPOCH_SECONDS): in_place, m.VALIDITY_FLAGS: []}
    store: dict[str, Any] = {
        m.READER: "hdf5",
        m.CONVERSION_SECONDS: conversion,
        m.prefixed(m.SHUFFLED, m.EPOCH_SECONDS): converted,
        m.INTERLEAVED_EPOCH_SECONDS: min(converted),
        m.INTERLEAVED_IN_PLACE_EPOCH_SECONDS: min(in_place),
        m.prefixed(m.INTERLEAVED, m.CONVERTING_PAYS_OFF): pays,
        m.IDENTICAL_TO_PLATE: True,
        m.VALIDITY_FLAGS: [],
    }
    if pays:
        store[m.prefixed(m.INTERLEAVED, m.BREAK_EVEN_EPOCHS)] = conversion / (min(in_place) - min(converted))
    return [
        Record(track=advice.FORMATS_TRACK, case=m.REFERENCE, config={}, metrics=reference, environment={}),
        Record(track=advice.FORMATS_TRACK, case="hdf5", config={}, metrics=store, environment={}),
    ]


def test_converting_that_never_pays_says_never() -> None:
    decision = advice.decide_convert(formats_rows(10.0, False, [1.0, 1.1], [1.5, 1.6]))
    assert decision.value == "never" and not decision.open
    assert "never pays off" in decision.answer
    assert any(line.endswith("break-even never") for line in decision.evidence), decision.evidence


def test_converting_that_pays_gives_its_break_even_in_epochs() -> None:
    decision = advice.decide_convert(formats_rows(10.0, True, [3.0, 3.2], [1.0, 1.1]))
    assert decision.value == {"format": "hdf5", m.BREAK_EVEN_EPOCHS: pytest.approx(5.0)}
    assert not decision.open and "from 4.5 epochs to 5.3 epochs" in decision.uncertainty


def test_no_format_compared_is_open_and_names_the_setup() -> None:
    decision = advice.decide_convert([])
    assert decision.open and "setup_formats.sh" in decision.settle


def test_the_feeding_arithmetic_is_consistent() -> None:
    for workers in (0, 2):
        need = supply_needed(1000.0, workers, 0.1)
        assert predicted_data_wait(need, 1000.0, workers) == pytest.approx(0.1)
    assert predicted_images_per_s(500.0, 1000.0, 2) == 500.0
    assert predicted_images_per_s(1000.0, 1000.0, 0) == pytest.approx(500.0)
    assert ratio_settled(1.5, 1.4, 1.6) and not ratio_settled(1.05, 0.9, 1.2) and not ratio_settled(1.0, 1.0, 1.0)


def test_the_verification_says_plainly_when_the_recommendation_does_not_hold() -> None:
    predicted = {m.IMAGES_PER_S: 1000.0, m.DATA_WAIT_FRACTION: 0.05}

    def loop(images: float) -> Record:
        metrics = {m.IMAGES_PER_S: images, m.DATA_WAIT_FRACTION: 0.3, m.VALIDITY_FLAGS: []}
        return Record(track=advice.TRACK, case="verify/x", config={}, metrics=metrics, environment={})

    assert advice.verification(predicted, loop(900.0))["holds"]
    missed = advice.verification(predicted, loop(700.0))
    assert missed["holds"] is False and "does NOT hold" in missed["statement"] and "30% below" in missed["statement"]


def test_model_names() -> None:
    crop = CropConfig(crop_size=64, tier="light")
    case = measuring.model_case("emulated:5", crop, batch_size=16, steps=4)
    assert (case.model, case.emulated_step_ms) == ("emulated", 5.0)
    assert measuring.at_batch(case, 32).emulated_step_ms == 10.0  # same images/s at twice the batch
    for bad in ("emulated:x", "emulated:0", "vit"):
        with pytest.raises(ConfigError, match="--model"):
            measuring.model_case(bad, crop, batch_size=16, steps=4)


def test_a_model_of_the_users_own(tmp_path: Path) -> None:
    from cropbench.tracks.training.models import build_model, check_input

    source = tmp_path / "net.py"
    source.write_text(
        "from torch import nn\n"
        "def build(channels, classes):\n"
        "    pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())\n"
        "    return nn.Sequential(nn.Conv2d(channels, 4, 3), pool, nn.Linear(4, classes))\n"
        "def wrong(channels, classes):\n"
        "    return nn.Linear(7, classes)\n"
    )  # fmt: skip
    name = f"{source}:build"
    assert measuring.model_case(name, CropConfig(), 8, 2).model == name
    check_input(name, 5, 16, 32)
    assert sum(p.numel() for p in build_model(name, 5, 16).parameters()) > 0
    with pytest.raises(ConfigError, match="does not take crops of shape"):
        check_input(f"{source}:wrong", 5, 16, 32)
    with pytest.raises(ConfigError, match="defines no callable 'missing'"):
        build_model(f"{source}:missing", 5, 16)
    with pytest.raises(ConfigError, match="is not a file"):
        build_model(f"{tmp_path / 'gone.py'}:build", 5, 16)


def test_advise_end_to_end_on_the_tiny_plate(tiny_plate: Path, tmp_path: Path, cropbench_cli: CliRunner) -> None:
    out = tmp_path / "advice"
    result = cropbench_cli(
        "advise", "--plate", str(tiny_plate), "--model", "emulated:5", "--budget-min", "1", "--out", str(out),
        "--batch-size", "16", "--crop-size", "48", "--rounds", "2", "--max-rounds", "2", "--max-workers", "1",
        "--epoch-crops", "64", "--no-progress",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Advice:" in result.stdout and "Verification:" in result.stdout
    document = json.loads((out / advice.ADVICE_NAME).read_text())
    questions = [d["question"] for d in document["decisions"]]
    assert questions[:2] == [advice.READ_PATH, advice.WORKERS] and advice.CONVERT in questions
    for decision in document["decisions"]:
        assert {"question", "answer", "evidence", "uncertainty", "open"} <= set(decision)
        assert isinstance(decision["open"], bool) and isinstance(decision["evidence"], list)
    checked = document["verification"]
    assert {"predicted", "achieved"} <= set(checked)
    assert checked["achieved"][m.IMAGES_PER_S] > 0
    rows = read_records(out / "results.jsonl")
    assert any(r.case.startswith("verify/") for r in rows) and any(r.case.startswith("workers/w1") for r in rows)
    assert all(m.catalogued(key) for r in rows for key in r.metrics)
    epochs = [r for r in rows if m.WHOLE_EPOCH_SECONDS in r.metrics]
    assert epochs and all(len(r.metrics[m.WHOLE_EPOCH_SECONDS]) == r.metrics[m.ROUNDS] for r in epochs)
    assert all(r.metrics[m.CORES_BUSY] > 0 and math.isfinite(r.metrics[m.CORES_BUSY]) for r in epochs)
    # The chunk cache is a quarter of the plate: no epoch row measured cache hits alone.
    assert not any("cache>=plate" in advice.flags(r) for r in epochs)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--budget-min", "0"], "--budget-min"),
        (["--model", "emulated:fast"], "--model"),
        (["--rounds", "1"], "--rounds"),
    ],
)
def test_bad_options_are_one_line(args: list[str], named: str, tiny_plate: Path, cropbench_cli: CliRunner) -> None:
    base = {"--plate": str(tiny_plate), "--model": "emulated:5"}
    for option_name, value in zip(args[::2], args[1::2], strict=True):
        base[option_name] = value
    result = cropbench_cli("advise", *[part for pair in base.items() for part in pair], "--no-progress")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cropbench: error:") and named in lines[0]


def test_the_report_names_the_track_the_measurement_writes() -> None:
    assert advice.TRACK == measuring.TRACK


def test_formats_left_out_by_the_budget_say_so_and_what_would_settle_it() -> None:
    decision = advice.decide_convert([], "webdataset not compared: 12 s of the budget were left")
    assert decision.open and "12 s" in decision.evidence[0] and "--budget-min" in decision.settle


def test_a_format_comparison_is_cut_to_the_budget_epochs_first_then_formats() -> None:
    from cropbench.tracks.formats import FormatComparison

    comparison = FormatComparison(formats=("hdf5", "webdataset"), epochs=3, in_place=(m.REFERENCE,))
    whole = comparison.estimated_seconds(1.0)
    assert comparison.within(whole, 1.0) == comparison
    fewer_epochs = comparison.within(whole - 1e-9, 1.0)
    assert fewer_epochs is not None and fewer_epochs.epochs == 2 and fewer_epochs.formats == comparison.formats
    one_format = comparison.within(fewer_epochs.estimated_seconds(1.0) - 1e-9, 1.0)
    assert one_format is not None and one_format.formats == ("hdf5",) and one_format.epochs == 3
    smallest = dataclasses.replace(one_format, epochs=2)
    assert comparison.within(smallest.estimated_seconds(1.0), 1.0) == smallest
    assert comparison.within(smallest.estimated_seconds(1.0) - 1e-9, 1.0) is None
    with pytest.raises(ConfigError, match="in_place"):
        FormatComparison(in_place=("ome-zarr/zarr",))


def test_epochs_are_cut_to_what_the_budget_lets_every_round_read() -> None:
    assert measuring.fitted_crops(5000, 0.001, 4, math.inf, 64) == 5000, "no budget: whole epochs"
    assert measuring.fitted_crops(5000, 0.001, 4, 100.0, 64) == 5000, "4 x 5000 x 1 ms fits 100 s"
    assert measuring.fitted_crops(5000, 0.01, 4, 100.0, 64) == 2500
    assert measuring.fitted_crops(5000, 1.0, 4, 100.0, 64) == measuring.MIN_EPOCH_BATCHES * 64
    assert measuring.fitted_crops(100, 1.0, 4, 0.0, 64) == 100, "never more than asked"


def test_an_epoch_cut_to_the_budget_says_so_in_its_evidence() -> None:
    row = Record(
        track="advise",
        case="read-path/zarr",
        case_id="x",
        config={},
        metrics={
            m.WHOLE_EPOCH_SAMPLES_PER_S: 100.0,
            m.CORES_BUSY: 1.0,
            m.EPOCH_CROPS: 256,
            m.OBJECTS: 5384,
            m.EPOCH_CROPS_FITTED: True,
        },
        environment={},
    )
    assert "epochs of 256 of the 5384 crops, cut to fit the budget" in advice.describe_option(row)
