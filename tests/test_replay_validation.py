"""``cropbench replay-validation`` predicting again from saved traces: on runs the model itself generated
with known client costs, each setting predicted from its two other settings comes out as measured. A traces
file or a setting it cannot use is one line before anything is measured; an interrupt keeps the traces
of every finished epoch."""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from cropbench.cli import main
from cropbench.measure import replay_validation
from cropbench.measure.replay import Client, Replay, Workload, predict
from cropbench.measure.store_emulation import RequestTrace, StoreModel

#: The costs the synthetic runs are generated with (the fit must find what they imply).
COMPUTE_S_PER_CROP, CLIENT_S_PER_BYTE = 0.0004, 2e-9


def _run(
    reader: str, in_flight: int, link: float, sizes: list[int], crops: int, batch_size: int, read_ahead: int = 0
) -> dict[str, object]:
    """A run whose wall time is the model's own, at the known costs and read-ahead."""
    requests = [
        RequestTrace("GET", "/k", "bytes=0-1", 206, size, index * 1e-3, index * 1e-3)
        for index, size in enumerate(sizes)
    ]
    workload = (
        Workload.batched(requests, crops, batch_size)
        if reader == "ome-zarr/direct"
        else Workload.streamed(requests, crops)
    )
    store = dataclasses.replace(StoreModel(median_latency_ms=20, p99_latency_ms=100), link_gbit_s=link)
    client = Client(
        2,
        in_flight,
        compute_s_per_crop=COMPUTE_S_PER_CROP,
        client_s_per_byte=CLIENT_S_PER_BYTE,
        read_ahead_steps=read_ahead,
    )
    seconds = predict(workload, Replay(store, client)).seconds
    trace = [dataclasses.astuple(request) for request in requests]
    return {
        "reader": reader,
        "round": 0,
        "in_flight": in_flight,
        "link_gbit_s": link,
        "crops": crops,
        "seconds": seconds,
        "read_ahead_steps": read_ahead,
        "trace": trace,
    }


@pytest.mark.parametrize("read_ahead", [0, 2])
def test_traces_are_predicted_again_and_each_setting_from_its_two_others(tmp_path: Path, read_ahead: int) -> None:
    direct = [
        _run("ome-zarr/direct", in_flight, 10.0, [400_000] * 800, 1280, 64, read_ahead) for in_flight in (4, 16, 64)
    ]
    shards = [_run("webdataset", 1, link, [40_000_000] * 8, 1280, 64) for link in (10.0, 1.0, 0.5)]
    settings = {"workers": 2, "batch_size": 64, "median_ms": 20.0, "seed": 0}
    traces = tmp_path / "replay-traces.json.gz"
    traces.write_bytes(gzip.compress(json.dumps({"settings": settings, "runs": direct + shards}).encode()))
    out = tmp_path / "replay.json"
    assert main(["replay-validation", "--traces", str(traces), "--out", str(out)]) == 0
    document = json.loads(out.read_text())
    assert len(document["validation"]) == 6
    for row in document["validation"]:
        assert row["target"] not in row["sources"], "a setting is never predicted from its own trace"
        if row["split_visible"]:
            assert row["ratio"] == pytest.approx(1.0, abs=0.02), row
    apart = [row["split_visible"] for row in document["validation"]]
    assert apart.count(False) == 1, "10 Gbit/s from 1 and 0.5 (both bound by the link) alone is a guess"
    assert {row["reader"] for row in document["real_store"]} == {"ome-zarr/direct", "webdataset"}
    assert out.with_suffix(".txt").read_text().count("\n| ome-zarr/direct |") >= 3
    assert not any(row["cores_saturated"] for row in document["validation"]), "no epoch recorded its cores busy"


def test_a_prediction_from_an_epoch_whose_cores_were_saturated_says_so(tmp_path: Path) -> None:
    direct = [_run("ome-zarr/direct", in_flight, 10.0, [400_000] * 800, 1280, 64) for in_flight in (4, 8, 16, 64)]
    direct[3]["machine_busy_share"] = 0.97
    settings = {"workers": 2, "batch_size": 64, "median_ms": 20.0, "seed": 0}
    traces = tmp_path / "replay-traces.json.gz"
    traces.write_bytes(gzip.compress(json.dumps({"settings": settings, "runs": direct}).encode()))
    out = tmp_path / "replay.json"
    assert main(["replay-validation", "--traces", str(traces), "--out", str(out)]) == 0
    document = json.loads(out.read_text())
    saturated = {row["target"]["in_flight"]: row["cores_saturated"] for row in document["validation"]}
    assert saturated == {4: False, 8: False, 16: False, 64: True}, "the others are predicted from free epochs"
    assert document["validation_within_cores_free"] == {"ome-zarr/direct": [3, 3]}
    assert out.with_suffix(".txt").read_text().count("(cores saturated)") == 1


def test_a_file_that_is_not_a_traces_file_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(b"not gzip")
    assert main(["replay-validation", "--traces", str(bad)]) == 2
    error = capsys.readouterr().err
    assert f"--traces {bad}" in error and error.count("\n") == 1


def test_a_negative_coalescing_gap_is_one_line_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["replay-validation", "--plate", str(tmp_path), "--coalesce-gap-kib", "-1"])
    assert exit_info.value.code == 2
    assert "argument --coalesce-gap-kib: expected a whole number" in capsys.readouterr().err


SETTINGS = {"workers": 2, "batch_size": 64, "median_ms": 20.0, "seed": 0}


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ([], "a JSON list"),
        ({"runs": []}, "lacks settings"),
        ({"settings": {"workers": 2}, "runs": []}, "lack batch_size, median_ms, seed"),
        ({"settings": {**SETTINGS, "median_ms": float("nan")}, "runs": []}, "median_ms"),
        ({"settings": {**SETTINGS, "workers": -1}, "runs": []}, "workers"),
        ({"settings": {**SETTINGS, "links_gbit": [float("nan"), 1]}, "runs": []}, "links_gbit"),
        ({"settings": SETTINGS, "runs": [{"reader": "ome-zarr/direct"}]}, "run 0"),
        ({"settings": SETTINGS, "runs": [{**_run("webdataset", 1, 1.0, [1], 10, 64), "seconds": 0}]}, "seconds"),
    ],
    ids=["list", "no settings", "missing settings", "nan latency", "negative workers", "nan link", "no run", "0 s"],
)
def test_a_traces_file_it_cannot_predict_from_is_one_line(
    tmp_path: Path, content: Any, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    traces = tmp_path / "traces.json.gz"
    traces.write_bytes(gzip.compress(json.dumps(content).encode()))
    assert main(["replay-validation", "--traces", str(traces), "--out", str(tmp_path / "replay.json")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"cropbench: error: --traces {traces} is not a traces file")
    assert reason in lines[0]
    assert not (tmp_path / "replay.json").exists()


def test_an_interrupt_keeps_the_traces_of_every_finished_epoch(
    tmp_path: Path, tiny_plate: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = replay_validation.Run.loaded(_run("ome-zarr/direct", 4, 10.0, [400_000] * 8, 64, 64))

    def interrupted(plate: Path, settings: Any, command: str, on_run: Any) -> dict[str, Any]:
        on_run(run, {"settings": dataclasses.asdict(settings), "runs": [run.saved()]})
        raise KeyboardInterrupt

    monkeypatch.setattr("cropbench.cli.stores._need_emulation", lambda: None)
    monkeypatch.setattr(replay_validation, "measure", interrupted)
    out = tmp_path / "replay.json"
    assert main(["replay-validation", "--plate", str(tiny_plate), "--out", str(out)]) == 130
    assert capsys.readouterr().err.strip().splitlines() == ["cropbench: interrupted; every finished row is kept"]
    settings, runs, _ = replay_validation.load_traces(replay_validation.traces_path(out))
    assert runs == [run] and settings == replay_validation.ReplaySettings()
