"""Flags are decided once, by the runner, as each row is written (and once more when the run's rows are all
in); the terminal table, results.jsonl, the CSV, report.html and the verdict all read the same ones."""

from __future__ import annotations

import csv
import html
import json
import re
from pathlib import Path
from typing import Any

import pytest

from cropbench import metrics as m
from cropbench.cli import main
from cropbench.config import CropConfig
from cropbench.data.loader import LoaderSpec
from cropbench.harness import loader_case
from cropbench.harness.flags import IMPOSSIBLE, decide, decide_run, impossible_reasons, row_flags
from cropbench.harness.loader_case import LoaderCase
from cropbench.records import Record, RecordWriter, read_records
from cropbench.report.html import REPORT_NAME
from cropbench.report.verdict import plain_reason
from cropbench.tracks import loader


def track2(source: str, rate: float, workers: int = 2, flags: list[str] | None = None) -> Record:
    config = {"source": source, "crop": {"dtype": "float32"}, "loader": {"num_workers": workers, "batch_size": 64}}
    metrics = {m.SAMPLES_PER_S: rate, m.VALIDITY_FLAGS: flags or []}
    return Record(track="loader", case=f"{source}/w{workers}", config=config, metrics=metrics, environment={})


def test_a_row_faster_than_a_ceiling_measured_before_it_is_flagged_as_written() -> None:
    ceiling = track2("memory", 4000.0)
    written = decide(track2("plate", 6000.0), [ceiling])
    assert row_flags(written) == [IMPOSSIBLE]
    assert impossible_reasons(written) == [
        "samples/s 6,000 is 1.50x the in-memory ceiling at the same shape w2/b64 (4,000)"
    ]
    assert row_flags(decide(track2("plate", 4100.0), [ceiling])) == [], "within the tolerance"
    assert row_flags(decide(track2("plate", 6000.0, workers=0), [ceiling])) == [], "nothing handed over"
    impossible_ceiling = decide(track2("memory", 100.0, flags=[IMPOSSIBLE]))
    assert row_flags(decide(track2("plate", 6000.0), [impossible_ceiling])) == [], "no ceiling from an impossible row"


def test_a_ceiling_measured_after_a_row_flags_it_when_the_run_is_finalised() -> None:
    plate, memory = track2("plate", 6000.0, flags=["few-samples"]), track2("memory", 4000.0)
    assert row_flags(decide(plate, [plate])) == ["few-samples"], "no ceiling measured yet"
    final = decide_run([plate, memory])
    assert row_flags(final[0]) == ["few-samples", IMPOSSIBLE] and final[1] == memory
    earlier = decide_run([plate], earlier=[memory])
    assert row_flags(earlier[0]) == ["few-samples", IMPOSSIBLE], "a resumed run's earlier rows count"


def test_outputs_read_the_stored_flags_and_old_rows_load_as_written(tmp_path: Path) -> None:
    """A row written before a rule existed keeps the flags it was written with in every output."""
    path = tmp_path / "results.jsonl"
    old = Record(
        track="loader",
        case="plate/w2",
        config=track2("plate", 1.0).config,
        metrics={m.SAMPLES_PER_S: 9000.0},  # no validity_flags at all
        environment={},
    )
    with RecordWriter(path) as writer:
        writer.write(track2("memory", 4000.0))
        writer.write(old)
    rows = read_records(path)
    assert [row_flags(row) for row in rows] == [[], []] and m.VALIDITY_FLAGS not in rows[1].metrics
    assert main(["report", str(path), "--out", str(tmp_path / "page")]) == 0
    page = (tmp_path / "page" / REPORT_NAME).read_text()
    assert IMPOSSIBLE not in page


# --- one real run, every output --------------------------------------------------------------------------

#: The forced ceiling: the crops in memory reported this many times slower than measured, so the plate
#: rows at the same shape are faster than it, whatever the machine.
SLOWER = 1000.0


def _small_plan(preset: str, samples: int | None = None, objects: int | None = None) -> list[LoaderCase]:
    """Four Track 2 cases: a plate row measured before its ceiling, the ceiling, a row measured after it,
    and one loaded in the main process (no hand-over, so no ceiling)."""
    crop = CropConfig(crop_size=32)
    one = LoaderSpec(num_workers=1, batch_size=16)
    persistent = LoaderSpec(num_workers=1, batch_size=16, persistent_workers=True)
    return [
        LoaderCase(crop=crop, loader=one, samples=64),
        LoaderCase(crop=crop, loader=one, samples=64, source="memory"),
        LoaderCase(crop=crop, loader=persistent, samples=64),
        LoaderCase(crop=crop, loader=LoaderSpec(batch_size=16), samples=64),
    ]


def _slow_ceiling(context: Any, case: LoaderCase) -> dict[str, Any]:
    metrics = measure(context, case)
    if case.source == "memory":
        metrics[m.SAMPLES_PER_S] /= SLOWER
    return metrics


measure = loader_case.run_case


def _table_flags(printed: str) -> dict[str, list[str]]:
    """The flags column of the terminal table's loader block: case -> flags."""
    block = printed[printed.index("track loader case") :].split("\n\n")[0].splitlines()
    return {line.split()[0]: _flags(line.split()[-1]) for line in block[2:] if line.startswith(("plate/", "memory/"))}


def _flags(cell: str) -> list[str]:
    return [] if cell in ("ok", "-") else [flag.strip() for flag in cell.split(",")]


def _page_flags(page: str) -> dict[str, list[str]]:
    """The flags cell of each row of report.html's Track 2 table: case -> flags."""
    cells = re.findall(r'<tr[^>]*><td class="case">([^<]*)</td>.*?<td class="flags">([^<]*)</td></tr>', page)
    return {html.unescape(case): _flags(html.unescape(flags)) for case, flags in cells}


def _verdict_counts(printed: str) -> dict[str, int]:
    """How many configurations carry each flag, as the printed verdict says: ``(flag: count)``."""
    verdict = printed[printed.index("\nVerdict") :]
    return {flag: int(count) for flag, count in re.findall(r"\(([^():\s]+): (\d+)\)$", verdict, re.MULTILINE)}


def test_every_output_of_a_run_shows_each_rows_flags_as_written(
    tiny_plate: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(loader, "preset_cases", _small_plan)
    monkeypatch.setattr(loader, "run_case", _slow_ceiling)
    out = tmp_path / "out"
    assert main(["run", "--plate", str(tiny_plate), "--track", "2", "--out", str(out), "--no-progress", "--plot"]) == 0
    printed = capsys.readouterr().out

    rows = read_records(out / "results.jsonl")
    written = {row.case: row_flags(row) for row in rows}
    labels = [case.label for case in _small_plan("smoke")]
    assert list(written) == labels
    before, ceiling, after, main_process = labels
    assert IMPOSSIBLE in written[after], "faster than the ceiling measured before it"
    assert IMPOSSIBLE in written[before], "faster than the ceiling measured after it: flagged when the run ended"
    assert IMPOSSIBLE not in written[main_process] and IMPOSSIBLE not in written[ceiling]
    for case in (before, after):
        (reason,) = [r for r in impossible_reasons(rows[labels.index(case)]) if "in-memory ceiling" in r]
        assert "x the in-memory ceiling at the same shape w1/b16" in reason

    with (out / "results.csv").open(newline="") as handle:
        in_csv = {row["case"]: json.loads(row["metrics.validity_flags"]) for row in csv.DictReader(handle)}
    assert in_csv == written
    assert _table_flags(printed) == written
    assert _page_flags((out / REPORT_NAME).read_text()) == written
    counts: dict[str, int] = {}
    for flags in written.values():
        for flag in flags:
            counts[flag] = counts.get(flag, 0) + 1
    assert _verdict_counts(printed) == counts
    quotable = sum(not flags for flags in written.values())
    assert f"{quotable} of 4 configurations carry no flag" in printed or (
        quotable == 0 and "none of its 4 configurations may be quoted" in printed
    )
    assert plain_reason(IMPOSSIBLE, "loader") in printed
    assert f"  - {before}: " in printed and f"  - {after}: " in printed, "the verdict names the impossible rows"
