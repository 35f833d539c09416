"""``cropbench prefetch-bench`` (track prefetch): readers named by their read-ahead, any depth, bytes in flight
and threads; a name or setting it cannot measure is refused in one line before a server starts; each round's
records reach the results file as soon as the round has measured them."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest

from cropbench import metrics as m
from cropbench.cli import main
from cropbench.config import PrefetchConfig, StoreConfig
from cropbench.data.dataset import CropDataset
from cropbench.harness.validity import CACHE_HOLDS_PLATE_FLAG
from cropbench.records import Record, RecordWriter, read_records
from cropbench.tracks import prefetch
from cropbench.tracks.prefetch import DEFAULT_READERS, LOCAL, Measured, PrefetchBench, row, store_reader

MIB = 2**20


def test_a_reader_name_is_its_read_ahead() -> None:
    assert store_reader("store") == PrefetchConfig(batches=0)
    assert store_reader("store+ahead2/64MiB") == PrefetchConfig(batches=2, bytes_in_flight=64 * MIB)
    assert store_reader("store+ahead8/256MiB/6threads") == PrefetchConfig(
        batches=8, bytes_in_flight=256 * MIB, threads=6
    )
    assert all(store_reader(name) for name in DEFAULT_READERS)


@pytest.mark.parametrize(
    "name", ["local", "store+ahead0/64MiB", "store+ahead2", "store+ahead2/64MB", "store+ahead2/64MiB/0threads", ""]
)
def test_a_reader_it_cannot_read_is_one_line_naming_it(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="is not a reader"):
        store_reader(name)
    with pytest.raises(SystemExit) as exit_info:
        main(["prefetch-bench", "--plate", "absent.zarr", "--out", "absent.jsonl", "--readers", name])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--readers" in error and repr(name) in error


@pytest.mark.parametrize(
    ("option", "values"),
    [
        ("--coalesce-gap-kib", ["-1"]),
        ("--coalesce-gap-kib", ["64", "64"]),
        ("--in-flight", ["0"]),
        ("--in-flight", ["16", "16"]),
    ],
)
def test_settings_it_cannot_measure_are_one_line(
    option: str, values: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["prefetch-bench", "--plate", "absent.zarr", "--out", "absent.jsonl", option, *values])
    assert exit_info.value.code == 2
    assert option in capsys.readouterr().err.strip().splitlines()[-1]


def test_a_row_whose_reader_held_the_plate_in_its_cache_says_so() -> None:
    measured = Measured(rates=[100.0], round_rates=[90.0], delivered=[64], client_cpu_s=[1.0], wall_s=[1.0])
    context: dict[str, Any] = {"environment": {}}
    held = row("local", 2, measured, measured, None, context, (2**30, 1.5))
    assert held.metrics[m.VALIDITY_FLAGS] == [CACHE_HOLDS_PLATE_FLAG] and held.metrics[m.CACHE_FRACTION_OF_PLATE] == 1.5
    part = row("local", 2, measured, measured, None, context, (2**20, 0.25))
    assert part.metrics[m.VALIDITY_FLAGS] == [] and part.metrics[m.READER_CACHE_BYTES] == 2**20
    assert m.READER_CACHE_BYTES not in row("local", 2, measured, measured, None, context).metrics
    assert held.track == prefetch.TRACK


def test_a_rounds_records_are_written_before_the_next_round_is_measured(tmp_path: Path, tiny_plate: Path) -> None:
    """Interrupted in its second round, the run has left the first round's records in the file."""
    bench = PrefetchBench(readers=("store",), workers=(0,), rounds=3, batches=2, batch_size=4)
    readers = {name: CropDataset(tiny_plate, bench.crop()) for name in (LOCAL, "store")}
    out = tmp_path / "prefetch.jsonl"
    measured_rounds: list[int] = []

    def emit(record: Record) -> None:
        if record.repeat == 1:
            raise KeyboardInterrupt
        writer.write(record)
        measured_rounds.append(record.repeat)

    with RecordWriter(out) as writer, pytest.raises(KeyboardInterrupt):
        reads = {"store": (store_reader("store"), StoreConfig())}
        prefetch.measure_rounds(bench, readers, lambda _: contextlib.nullcontext(), {"environment": {}}, emit, reads)
    for dataset in readers.values():
        dataset.reader.close()
    written = read_records(out)
    assert [(r.case, r.repeat) for r in written] == [("local, 0 workers", 0), ("store, 0 workers", 0)]
    assert written[0].metrics[m.RATIO_TO_LOCAL] == 1.0 and written[1].metrics[m.SAMPLES_PER_S] > 0


def test_the_command_keeps_the_rows_written_before_an_interrupt(
    tmp_path: Path, tiny_plate: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C during a run: one line, exit 130, the rows measured so far in --out."""

    def interrupted(plate: Path, bench: PrefetchBench, emit: Any) -> list[Record]:
        emit(Record(prefetch.TRACK, "store, 0 workers", {}, {m.SAMPLES_PER_S: 1.0}, {}))
        raise KeyboardInterrupt

    monkeypatch.setattr("cropbench.cli.stores._need_emulation", lambda: None)
    monkeypatch.setattr(prefetch, "run_prefetch", interrupted)
    out = tmp_path / "new" / "prefetch.jsonl"
    code = main(
        ["prefetch-bench", "--plate", str(tiny_plate), "--out", str(out), "--readers", "store", "--batch-size", "8"]
    )
    assert code == 130
    assert capsys.readouterr().err.strip().splitlines() == ["cropbench: interrupted; every finished row is kept"]
    assert [record.case for record in read_records(out)] == ["store, 0 workers"]
