"""The result record: round trip, CSV, durability under a killed writer."""

from __future__ import annotations

import dataclasses
import errno
import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import CliRunner

from cropbench.errors import OutputError
from cropbench.records import SCHEMA_VERSION, Record, RecordWriter, read_records, track_name, write_csv


def make_record(case: str = "a", **metrics: float) -> Record:
    return Record(
        track="dataset",
        case=case,
        config={"crop": {"crop_size": 96}, "access": "random"},
        metrics={"p50_ms": 0.5, "warmup_ms": [1.0, 0.6], **metrics},
        environment={"python": "3.11", "packages": {"torch": "2.14.1"}},
    )


def test_round_trip_keeps_every_field(tmp_path: Path) -> None:
    with RecordWriter(tmp_path / "r.jsonl") as writer:
        record = writer.write(make_record())
        writer.write(make_record("b"))
    loaded = read_records(tmp_path / "r.jsonl")
    assert loaded[0] == record and loaded[1].case == "b"
    assert loaded[0].schema_version == SCHEMA_VERSION and loaded[0].timestamp and loaded[0].run_id


@pytest.mark.parametrize(("former", "name"), [("1", "dataset"), ("2", "loader"), ("3", "training")])
def test_a_row_of_a_former_track_value_reads_as_the_track_name(tmp_path: Path, former: str, name: str) -> None:
    old = json.loads(make_record().to_json()) | {"track": former}
    (tmp_path / "old.jsonl").write_text(json.dumps(old) + "\n")
    (loaded,) = read_records(tmp_path / "old.jsonl")
    assert loaded.track == name and loaded.case_id == old["case_id"] and loaded.run_id == old["run_id"]
    assert track_name(former) == name and track_name("layouts") == "layouts"
    with RecordWriter(tmp_path / "old.jsonl") as writer:  # a writer appending to old rows accepts them
        writer.write(make_record("new"))
    assert [r.track for r in read_records(tmp_path / "old.jsonl")] == [name, "dataset"]


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


def test_a_torn_tail_is_moved_aside_before_the_next_row(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    fragment = make_record("b").to_json()[:40]
    path.write_text(make_record("a").to_json() + "\n" + fragment)
    with pytest.warns(RuntimeWarning, match=r"torn last line .* r\.jsonl\.torn-1"), RecordWriter(path) as writer:
        writer.write(make_record("c"))
    assert [r.case for r in read_records(path)] == ["a", "c"], "the next row is not glued onto the fragment"
    assert (tmp_path / "r.jsonl.torn-1").read_text() == fragment
    path.write_text(path.read_text() + "{")
    with pytest.warns(RuntimeWarning, match="torn-2"), RecordWriter(path):
        pass


def test_a_whole_last_row_without_its_newline_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text(make_record("a").to_json())
    with RecordWriter(path) as writer:
        writer.write(make_record("b"))
    assert [r.case for r in read_records(path)] == ["a", "b"]
    assert not list(tmp_path.glob("*.torn-*"))


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ("garbage", "not a valid record"),
        ("[1, 2]", "expected a JSON object"),
        ('{"schema_version": 99, "track": "1"}', "schema_version 99"),
        ("METRICS_NULL", "'metrics' is NoneType"),
        ('{"schema_version": 1, "track": "1", "case": "x", "config": {}, "environment": {}}', "no 'metrics'"),
    ],
)
def test_every_existing_line_is_validated_when_the_writer_opens(tmp_path: Path, line: str, fragment: str) -> None:
    if line == "METRICS_NULL":
        line = json.dumps({**json.loads(make_record("x").to_json()), "metrics": None})
    path = tmp_path / "r.jsonl"
    path.write_text(make_record("a").to_json() + "\n" + line + "\n" + make_record("b").to_json() + "\n")
    before = path.read_bytes()
    with pytest.raises(OutputError, match=rf"r\.jsonl:2 .*{re.escape(fragment)}|r\.jsonl:2: .*{re.escape(fragment)}"):
        RecordWriter(path)
    with pytest.raises(OutputError, match=r"r\.jsonl:2"):
        read_records(path)
    assert path.read_bytes() == before


def test_one_writer_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    with RecordWriter(path), pytest.raises(OutputError, match="another cropbench run"):
        RecordWriter(path)
    with RecordWriter(path) as writer:  # the lock goes with the first writer
        writer.write(make_record())


def test_every_row_of_one_writer_carries_its_run_id(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    with RecordWriter(path) as writer:
        written = [writer.write(make_record(c)) for c in "abc"]
    with RecordWriter(path) as writer:
        writer.write(make_record("d"))
    ids = [r.run_id for r in read_records(path)]
    assert ids[:3] == [writer_id := written[0].run_id] * 3 and ids[3] != writer_id


def test_a_failed_write_leaves_no_half_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "r.jsonl"
    with RecordWriter(path) as writer:
        writer.write(make_record("a"))
        real_write = os.write

        def disk_full(fd: int, data: bytes) -> int:
            real_write(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "write", disk_full)
        with pytest.raises(OutputError, match="No space left"):
            writer.write(make_record("b"))
        monkeypatch.undo()
        writer.write(make_record("c"))
    assert [r.case for r in read_records(path)] == ["a", "c"]


def test_a_run_fails_on_a_bad_results_line_before_measuring(
    tiny_plate: Path, tmp_path: Path, cropbench_cli: CliRunner
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    results = out / "results.jsonl"
    results.write_text(make_record("a").to_json() + "\nnot json\n" + make_record("b").to_json() + "\n")
    before = results.read_bytes()
    result = cropbench_cli("run", "--plate", str(tiny_plate), "--out", str(out), "--samples", "20", "--no-progress")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert f"{results}:2" in result.stderr and results.read_bytes() == before


def test_one_cli_run_has_one_run_id_and_a_second_writer_is_refused(
    tiny_plate: Path, tmp_path: Path, cropbench_cli: CliRunner
) -> None:
    out = tmp_path / "out"
    run = ("run", "--plate", str(tiny_plate), "--out", str(out), "--samples", "20", "--no-progress")
    assert cropbench_cli(*run).returncode == 0
    assert len({r.run_id for r in read_records(out / "results.jsonl")}) == 1
    with RecordWriter(out / "results.jsonl"):  # flock: refused in this process too (a second open file)
        result = cropbench_cli(*run)
    assert result.returncode == 2 and "another cropbench run" in result.stderr, result.stderr


def test_a_foreign_results_file_is_refused_untouched_torn_tail_and_all(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_text('{"event": "epoch", "loss": 0.5}\n{"event": "epo')
    before = path.read_bytes()
    with pytest.raises(OutputError, match=r"results\.jsonl:1"):
        RecordWriter(path)
    assert path.read_bytes() == before
    assert not list(tmp_path.glob("*.torn-*")), "nothing is moved aside from a file that is refused"


def test_a_full_disk_during_the_csv_export_leaves_no_csv_cut_mid_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import csv

    destination = tmp_path / "r.csv"
    write_csv([make_record("old")], destination)
    before = destination.read_bytes()
    real_writerows = csv.DictWriter.writerows

    def disk_full(self: csv.DictWriter[str], rows: object) -> None:
        real_writerows(self, list(rows)[:1])  # type: ignore[call-overload]
        self.writer.writerow(["half"])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(csv.DictWriter, "writerows", disk_full)
    with pytest.raises(OutputError, match=r"r\.csv.*No space left"):
        write_csv([make_record("a"), make_record("b")], destination)
    assert destination.read_bytes() == before, "the previous export stays whole"
    assert [p.name for p in tmp_path.iterdir()] == ["r.csv"], "no temporary file is left behind"


def test_a_last_line_torn_inside_a_utf8_character_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    torn = make_record("b", **{"µ": 1.0}).to_json().replace("\\u00b5", "µ").encode()
    cut = torn.index("µ".encode()) + 1  # inside the two bytes of µ
    path.write_bytes(make_record("a").to_json().encode() + b"\n" + torn[:cut])
    with pytest.warns(RuntimeWarning, match="torn"):
        assert [r.case for r in read_records(path)] == ["a"]
    with pytest.warns(RuntimeWarning, match="torn"), RecordWriter(path) as writer:
        writer.write(make_record("c"))
    assert [r.case for r in read_records(path)] == ["a", "c"]
    path.write_bytes(path.read_bytes() + b"\xff\xfe\n")
    with pytest.raises(OutputError, match=r"r\.jsonl:3"):
        read_records(path)


def test_every_row_is_written_by_the_one_results_writer() -> None:
    """No command or measuring script writes result rows itself: rows reach disk as Records through
    RecordWriter (the runner's tracks), so every row they write parses as a Record. (``cropbench.history``,
    the asv and gate tools, writes asv's configuration files and the gate's and campaign's own logs of
    verdicts, not result rows.)"""
    root = Path(__file__).resolve().parents[1]
    package = root / "src" / "cropbench"
    sources = [path for path in package.rglob("*.py") if (package / "history") not in path.parents]
    handwritten = re.compile(r"json\.dumps\([^\n]*\)\s*\+\s*\"\\n\"|store_layouts\.jsonl|def crops_per_s\(plate")
    offenders = [
        str(path.relative_to(root))
        for path in sources
        if path.name != "records.py" and handwritten.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []


def test_parse_record_validates_one_line() -> None:
    from cropbench.records import parse_record

    record = Record(track="t", case="c", config={}, metrics={"samples_per_s": 1.0}, environment={})
    assert parse_record(record.to_json()) == record
    with pytest.raises(OutputError, match="not a valid record: no 'metrics'"):
        parse_record(json.dumps({"schema_version": SCHEMA_VERSION, "track": "t", "case": "c", "config": {}}))


def test_a_reader_named_by_a_string_is_read_back(tmp_path: Path) -> None:
    """Track formats names its reader ('ome-zarr/direct'); track targets describes it in an object: both read."""
    path = tmp_path / "results.jsonl"
    rows = [
        Record(
            track="formats", case="ome-zarr/direct", config={"reader": "ome-zarr/direct"}, metrics={}, environment={}
        ),
        Record(track="targets", case="t", config={"reader": {"decode_threads": 1}}, metrics={}, environment={}),
    ]
    path.write_text("".join(row.to_json() + "\n" for row in rows))
    assert [row.config["reader"] for row in read_records(path)] == ["ome-zarr/direct", {"decode_threads": 1}]


def test_amend_writes_over_only_the_rows_this_writer_wrote(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"

    def row(rate: float, flags: list[str]) -> Record:
        return Record(
            track="dataset",
            case="c",
            config={},
            metrics={"samples_per_s": rate, "validity_flags": flags},
            environment={},
        )

    with RecordWriter(path) as before:
        before.write(row(1.0, []))
    kept = path.read_bytes()
    with RecordWriter(path) as writer:
        first, second = writer.write(row(2.0, [])), writer.write(row(3.0, []))
        with pytest.raises(ValueError, match="amend takes the 2 rows"):
            writer.amend([first])
        flagged = dataclasses.replace(first, metrics={**first.metrics, "validity_flags": ["impossible"]})
        amended = writer.amend([flagged, second])
        writer.write(row(4.0, []))  # the writer goes on appending to the file as amended
    assert path.read_bytes().startswith(kept), "rows before this writer's are kept byte for byte"
    rows = read_records(path)
    assert [r.metrics["samples_per_s"] for r in rows] == [1.0, 2.0, 3.0, 4.0]
    assert rows[1] == amended[0] and rows[1].metrics["validity_flags"] == ["impossible"]
    assert {r.run_id for r in rows[1:]} == {writer.run_id} and len(list(tmp_path.iterdir())) == 1
    with RecordWriter(path):
        pass  # the lock was released with the amended file


@pytest.mark.parametrize(
    ("plate", "recorded"),
    [
        ("{out}/plates/full.zarr", "plates/full.zarr"),
        ("/elsewhere/data/full.zarr", "full.zarr"),
        ("/elsewhere/data/../data/full.zarr/", "full.zarr"),
        ("data/full.zarr", "data/full.zarr"),
        ("https://host/bucket/full.zarr", "https://host/bucket/full.zarr"),
    ],
)
def test_a_row_names_its_plate_relative_to_its_folder_or_by_its_name(tmp_path: Path, plate: str, recorded: str) -> None:
    plate = plate.format(out=tmp_path)
    record = make_record()
    record = Record(
        track=record.track,
        case=record.case,
        config={**record.config, "plate": plate},
        metrics=record.metrics,
        environment={**record.environment, "storage": {"path": plate, "mountpoint": "/"}},
    )
    with RecordWriter(tmp_path / "results.jsonl") as writer:
        written = writer.write(record)
    (row,) = read_records(tmp_path / "results.jsonl")
    assert row == written
    assert row.config["plate"] == recorded and row.environment["storage"]["path"] == recorded
    assert row.environment["storage"]["mountpoint"] == "/", "what is not a plate path is kept"
    assert record.config["plate"] == plate, "the measured record is not changed in place"


def test_no_committed_row_names_a_machines_folder() -> None:
    """Rows committed under measurements/ name their plate relative to their folder or by its name."""
    root = Path(__file__).resolve().parents[1] / "measurements"
    found = []
    for path in sorted(root.rglob("*.json*")):
        text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text(encoding="utf-8")
        found += [f"{path.relative_to(root)}: {hit}" for hit in re.findall(r'"(?:/work|/tmp|/home|/root)/[^"]*"', text)]
    assert not found, found[:5]
