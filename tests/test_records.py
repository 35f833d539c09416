"""The result record: round trip, CSV, durability under a killed writer."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from cropbench.errors import OutputError
from cropbench.records import SCHEMA_VERSION, Record, RecordWriter, read_records, write_csv


def make_record(case: str = "a", **metrics: float) -> Record:
    return Record(track="1", case=case, config={"crop": {"crop_size": 96}, "access": "random"},
                  metrics={"p50_ms": 0.5, "warmup_ms": [1.0, 0.6], **metrics},
                  environment={"python": "3.11", "packages": {"torch": "2.14.1"}})


def test_round_trip_keeps_every_field(tmp_path: Path) -> None:
    record = make_record()
    with RecordWriter(tmp_path / "r.jsonl") as writer:
        writer.write(record)
        writer.write(make_record("b"))
    loaded = read_records(tmp_path / "r.jsonl")
    assert loaded[0] == record and loaded[1].case == "b"
    assert loaded[0].schema_version == SCHEMA_VERSION and loaded[0].timestamp and loaded[0].run_id


def test_csv_export_is_flat_and_loadable_by_pandas(tmp_path: Path) -> None:
    path = write_csv([make_record("a"), make_record("b", extra=2.0)], tmp_path / "r.csv")
    frame = pd.read_csv(path)
    assert list(frame["case"]) == ["a", "b"]
    assert {"config.crop.crop_size", "metrics.p50_ms", "environment.packages.torch", "metrics.extra"} <= set(frame)
    assert json.loads(frame["metrics.warmup_ms"][0]) == [1.0, 0.6]


def test_a_torn_last_line_is_skipped_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text(make_record().to_json() + "\n" + make_record("b").to_json()[:40])
    with pytest.warns(RuntimeWarning, match="torn"):
        assert [r.case for r in read_records(path)] == ["a"]


def test_a_killed_writer_keeps_every_finished_row(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    script = (
        "import sys, time\n"
        "from cropbench.records import Record, RecordWriter\n"
        f"w = RecordWriter({str(path)!r})\n"
        "for i in range(1000):\n"
        "    w.write(Record(track='1', case=str(i), config={}, metrics={'i': i}, environment={}))\n"
        "    print(i, flush=True)\n"
        "    time.sleep(0.01)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    for _ in range(5):
        process.stdout.readline()
    process.send_signal(signal.SIGKILL)
    process.wait()
    time.sleep(0.05)
    records = read_records(path)
    assert len(records) >= 5
    assert [r.metrics["i"] for r in records] == list(range(len(records)))


def test_unwritable_destination_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OutputError, match="cannot write results"):
        RecordWriter(blocker / "r.jsonl")
    with pytest.raises(OutputError, match="does not exist"):
        read_records(tmp_path / "missing.jsonl")
    assert os.path.exists(blocker)
