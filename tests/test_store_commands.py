"""The object-store commands (``store-calibration``, ``prefetch-bench``, ``replay-validation``,
``remote-bench``): every option, plate and output path a hostile user can hand them is refused in one
``cropbench: error:`` line with exit code 2 before a store starts, and what they measure is on disk as
soon as it is measured."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cropbench.cli import main
from cropbench.measure import store_calibration
from cropbench.measure.store_emulation import StoreModel, unavailable
from cropbench.records import Record, RecordWriter, read_records

needs_emulation = pytest.mark.skipif(unavailable() is not None, reason=f"{unavailable()}")


class StoreStarted(Exception):
    """A command got past its checks to where a store starts."""


def _no_store(*_: Any, **__: Any) -> Any:
    raise StoreStarted


@pytest.fixture(autouse=True)
def _stores_never_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refused command must not get as far as asking whether a store can run here, let alone start one."""
    monkeypatch.setattr("cropbench.cli.stores._need_emulation", _no_store)
    monkeypatch.setattr("cropbench.cli.stores._emulation_reason", _no_store)


def _refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """Run the command; it must exit 2 with one ``cropbench: error:`` line, which is returned."""
    try:
        code = main(list(args))
    except SystemExit as exit_info:
        code = exit_info.code  # type: ignore[assignment]
    error = capsys.readouterr().err
    lines = error.strip().splitlines()
    assert code == 2, error
    assert len(lines) == 1 and lines[0].startswith("cropbench: error:") and "Traceback" not in error, error
    return lines[0]


REMOTE_OPTIONS = [
    (["--latency-ms", "nan"], "--latency-ms"),
    (["--latency-ms", "-5"], "--latency-ms"),
    (["--latency-ms", "1e308"], "--latency-ms"),
    (["--in-flight", "0"], "--in-flight"),
    (["--workers", "-1"], "--workers"),
    (["--crops", "0"], "--crops"),
    (["--layouts", "memmap"], "--layouts"),
]


@pytest.mark.parametrize(("options", "named"), REMOTE_OPTIONS, ids=[" ".join(o) for o, _ in REMOTE_OPTIONS])
def test_remote_bench_refuses_options_it_cannot_measure(
    tiny_plate: Path, tmp_path: Path, options: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    line = _refused(capsys, "remote-bench", "--plate", str(tiny_plate), "--out", str(tmp_path / "out"), *options)
    assert named in line


def test_remote_bench_needs_a_plate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "--plate" in _refused(capsys, "remote-bench", "--out", str(tmp_path / "out"))
    assert "does not exist" in _refused(capsys, "remote-bench", "--plate", str(tmp_path / "missing.zarr"))


def test_remote_bench_refuses_an_out_holding_someone_elses_file(
    tiny_plate: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "results.jsonl").write_text("someone's notes\n")
    other_track = tmp_path / "other"
    with RecordWriter(other_track / "results.jsonl") as writer:
        writer.write(Record("dataset", "case", {}, {}, {}))
    a_file = tmp_path / "file"
    a_file.write_text("keep me\n")
    for out in (foreign, other_track, a_file):
        before = sorted((p.name, p.read_bytes()) for p in ([out] if out.is_file() else out.iterdir()))
        line = _refused(capsys, "remote-bench", "--plate", str(tiny_plate), "--out", str(out))
        assert "--out" in line and str(out) in line
        assert sorted((p.name, p.read_bytes()) for p in ([out] if out.is_file() else out.iterdir())) == before


def test_remote_bench_appends_to_its_own_results(tiny_plate: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with RecordWriter(out / "results.jsonl") as writer:
        writer.write(Record("remote", "case", {}, {}, {}))
    with pytest.raises(StoreStarted):
        main(["remote-bench", "--plate", str(tiny_plate), "--out", str(out)])


PREFETCH_OPTIONS = [
    (["--latency-ms", "nan"], "--latency-ms"),
    (["--batch-size", "0"], "--batch-size"),
    (["--rounds", "0"], "--rounds"),
    (["--chunk-cache-mib", "0"], "--chunk-cache-mib"),
    (["--chunk-cache-mib", "-1"], "--chunk-cache-mib"),
    (["--chunk-cache-mib", "1", "--readers", "store+ahead4/64MiB", "--batch-size", "8"], "--chunk-cache-mib"),
    (["--workers", "2", "--batches", "2"], "batches"),
    (["--workers", "-1"], "--workers"),
]


@pytest.mark.parametrize(("options", "named"), PREFETCH_OPTIONS, ids=[" ".join(o) for o, _ in PREFETCH_OPTIONS])
def test_prefetch_bench_refuses_options_it_cannot_measure(
    tiny_plate: Path, tmp_path: Path, options: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "prefetch.jsonl"
    line = _refused(capsys, "prefetch-bench", "--plate", str(tiny_plate), "--out", str(out), *options)
    assert named in line
    assert not out.exists()


def test_prefetch_bench_checks_its_output_before_anything_runs(
    tiny_plate: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "notes.jsonl").write_text("not rows\n")
    for out, says in [
        (tmp_path, "is a folder"),
        (tmp_path / "a-file" / "sub" / "pb.jsonl", "is not a folder"),
        (tmp_path / "notes.jsonl", "is not a results file"),
    ]:
        assert says in _refused(capsys, "prefetch-bench", "--plate", str(tiny_plate), "--out", str(out))
    assert (tmp_path / "notes.jsonl").read_text() == "not rows\n"
    # a folder that is not there yet is made when the first row is written
    with pytest.raises(StoreStarted):
        main(
            [
                "prefetch-bench",
                "--plate",
                str(tiny_plate),
                "--out",
                str(tmp_path / "new" / "pb.jsonl"),
                "--batch-size",
                "8",
            ]
        )


CALIBRATION_OPTIONS = [
    (["--in-flight", "0"], "--in-flight"),
    (["--in-flight", "4200"], "--in-flight"),
    (["--sizes-kib", "0"], "--sizes-kib"),
    (["--seconds", "nan"], "--seconds"),
    (["--seconds", "-1"], "--seconds"),
    (["--median-ms", "nan"], "--median-ms"),
    (["--median-ms", "50", "--p99-ms", "10"], "--p99-ms"),
]


@pytest.mark.parametrize(("options", "named"), CALIBRATION_OPTIONS, ids=[" ".join(o) for o, _ in CALIBRATION_OPTIONS])
def test_store_calibration_refuses_options_it_cannot_measure(
    options: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert named in _refused(capsys, "store-calibration", *options)


def test_store_calibration_leaves_someone_elses_file_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    notes = tmp_path / "notes.json"
    notes.write_text('{"mine": true}\n')
    assert "--out" in _refused(capsys, "store-calibration", "--out", str(notes))
    assert notes.read_text() == '{"mine": true}\n'


def _row(in_flight: int, answered: int) -> dict[str, Any]:
    return {
        "in_flight": in_flight,
        "response_bytes": 40 * 1024,
        "seconds": 1.0,
        "requests": answered,
        "requests_per_s": float(answered),
        "mb_per_s": 0.0,
        "predicted_requests_per_s": 50.0,
        "ratio_to_prediction": answered / 50,
        "server_core_share": 0.1,
        "server_busy_share": 0.1,
        "client_core_share": 0.1,
        "server_latency_p50_ms": 20.0 if answered else None,
        "server_latency_p99_ms": None,
        "flags": [] if answered else [store_calibration.NO_ANSWER_FLAG],
    }


def test_a_calibration_row_without_an_answer_is_a_row_saying_so() -> None:
    lines = store_calibration.table([_row(1, 0)]).splitlines()
    assert lines[-1].endswith(f"| - | - | {store_calibration.NO_ANSWER_FLAG} |")


def test_store_calibration_writes_each_row_as_it_is_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Interrupted after two rows: one line, exit 130, both rows in --out."""

    def interrupted(calibration: store_calibration.Calibration, on_row: Any) -> None:
        on_row(_row(1, 50))
        on_row(_row(16, 0))
        raise KeyboardInterrupt

    monkeypatch.setattr("cropbench.cli.stores._need_emulation", lambda: None)
    monkeypatch.setattr(store_calibration, "run_calibration", interrupted)
    out = tmp_path / "new" / "calibration.json"
    assert main(["store-calibration", "--out", str(out)]) == 130
    assert capsys.readouterr().err.strip().splitlines() == ["cropbench: interrupted; every finished row is kept"]
    document = json.loads(out.read_text())
    assert [row["in_flight"] for row in document["rows"]] == [1, 16]
    assert document["model"] == {**document["model"], "median_latency_ms": 20.0, "p99_latency_ms": 100.0}
    assert store_calibration.is_calibration_file(out), "a later run may replace it"


REPLAY_OPTIONS = [
    (["--in-flight", "0"], "--in-flight"),
    (["--links-gbit", "nan", "1"], "--links-gbit"),
    (["--links-gbit", "-1"], "--links-gbit"),
    (["--median-ms", "nan"], "--median-ms"),
    (["--workers", "0"], "--workers"),
    (["--rounds", "0"], "--rounds"),
]


@pytest.mark.parametrize(("options", "named"), REPLAY_OPTIONS, ids=[" ".join(o) for o, _ in REPLAY_OPTIONS])
def test_replay_validation_refuses_options_it_cannot_measure(
    tiny_plate: Path, options: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert named in _refused(capsys, "replay-validation", "--plate", str(tiny_plate), *options)


def test_replay_validation_checks_its_plate_and_output_first(
    tiny_plate: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "does not exist" in _refused(capsys, "replay-validation", "--plate", str(tmp_path / "missing.zarr"))
    assert "not an OME-Zarr plate" in _refused(capsys, "replay-validation", "--plate", str(tmp_path))
    notes = tmp_path / "notes.json"
    notes.write_text("[]")
    assert "--out" in _refused(capsys, "replay-validation", "--plate", str(tiny_plate), "--out", str(notes))
    assert "--out" in _refused(capsys, "replay-validation", "--plate", str(tiny_plate), "--out", str(tmp_path))
    assert notes.read_text() == "[]"


@pytest.mark.slow
@needs_emulation
def test_store_calibration_measures_a_row_per_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.undo()  # this one starts the store
    out = tmp_path / "calibration.json"
    assert (
        main(["store-calibration", "--in-flight", "1", "2", "--sizes-kib", "4", "--seconds", "0.3", "--out", str(out)])
        == 0
    )
    rows = json.loads(out.read_text())["rows"]
    assert [row["in_flight"] for row in rows] == [1, 2] and all(row["requests"] > 0 for row in rows)
    assert StoreModel(**json.loads(out.read_text())["model"]) == StoreModel()


@pytest.mark.slow
@needs_emulation
def test_prefetch_bench_appends_a_record_per_reader_and_round(
    tiny_plate: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.undo()  # this one starts the store
    out = tmp_path / "prefetch.jsonl"
    readers = ["store", "store+ahead1/16MiB"]
    options = ["--workers", "0", "--rounds", "2", "--batch-size", "8", "--latency-ms", "1", "--readers", *readers]
    assert main(["prefetch-bench", "--plate", str(tiny_plate), "--out", str(out), *options]) == 0
    rows = read_records(out)
    assert sorted((row.config["reader"], row.repeat) for row in rows) == sorted(
        (reader, repeat) for reader in ["local", *readers] for repeat in (0, 1)
    )
    assert all(row.track == "prefetch" and row.metrics["samples_per_s"] > 0 for row in rows)


@pytest.mark.slow
@needs_emulation
def test_remote_bench_writes_track_remote_rows(
    tiny_plate: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.undo()  # this one starts the store
    out = tmp_path / "remote"
    options = ["--workers", "0", "--in-flight", "1", "--crops", "8", "--batch-size", "4", "--latency-ms", "1"]
    assert main(["remote-bench", "--plate", str(tiny_plate), "--out", str(out), *options]) == 0
    rows = read_records(out / "results.jsonl")
    assert rows and {row.track for row in rows} == {"remote"}
    assert {row.config["store"]["zarr_client"] for row in rows} == {"fsspec", "obstore"}


@pytest.mark.slow
@needs_emulation
def test_a_measuring_command_stopped_by_sigterm_halfway_keeps_its_rows_and_leaves_no_folder(
    tiny_plate: Path, tmp_path: Path
) -> None:
    """SIGTERM once the first rounds' rows are written: one line, exit 143, those rows kept, and no
    scratch folder, namespace or routing rule of the run left behind."""
    import os
    import signal
    import subprocess
    import sys
    import tempfile
    import time

    from cropbench.measure.store_emulation import namespaces

    out = tmp_path / "prefetch.jsonl"
    options = ["--workers", "0", "--rounds", "50", "--batch-size", "8", "--latency-ms", "1", "--readers", "store"]
    command = [sys.executable, "-m", "cropbench", "prefetch-bench", "--plate", str(tiny_plate), "--out", str(out)]
    child = subprocess.Popen([*command, *options], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while child.poll() is None and time.monotonic() < deadline and len(_lines(out)) < 2:
        time.sleep(0.05)
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=120)
    assert child.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines()[-1].startswith("cropbench: interrupted (SIGTERM)")
    assert len(read_records(out)) >= 2, "the rounds measured before the signal are kept"
    left = list(Path(tempfile.gettempdir()).glob(f"cropbench-*-{child.pid}-*"))
    assert left == [], f"scratch left behind: {left}"
    assert not [name for name in namespaces() if name.startswith(f"cbs{child.pid}x")]
    assert os.path.exists(out)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []
