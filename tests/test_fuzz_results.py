"""Hostile results files: rows of the wrong types, sizes, nesting and text, read back by every command
that reads a results file (load, summary, verdict, report page and figures, CSV export).

Each input must end in one of: a typed error (OutputError: the CLI's one line, exit 2), or a read whose
bad rows are skipped with a warning naming their line, or flagged ``impossible``; never a traceback, and
never a number that cannot be true named as the best.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import json
import random
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from cropbench import metrics as m
from cropbench.cli import main
from cropbench.errors import OutputError
from cropbench.harness.flags import IMPOSSIBLE, decide, row_flags
from cropbench.records import MAX_DEPTH, Record, read_records, write_csv
from cropbench.report.html import render_report
from cropbench.report.plots import plot_results
from cropbench.report.stability import format_repeat_summary, summarise_repeats
from cropbench.report.summary import summary_table
from cropbench.report.text import terminal_safe
from cropbench.report.verdict import verdict

ROOT = Path(__file__).resolve().parents[1]
#: Committed rows of a GPU run (Tracks 2 and 3): real rows, every metric the figures read.
GPU_ROWS = ROOT / "measurements" / "gpu" / "h200-2026-11-30.jsonl"
#: The fuzz tier's seed and size: fixed, so a failure reruns the same inputs.
FUZZ_SEED = 20261204
FUZZ_INPUTS = 240
#: Of those, how many also go through the figures (matplotlib: a second or so each).
FUZZ_FIGURES = 12
ANSI = "\x1b[2J\x1b[31mred\x1b]0;title\x07"
#: Figures warn about rows they leave out; that is their answer to such rows, not a failure.
pytestmark = pytest.mark.filterwarnings(
    "ignore:.*(the metrics its figures draw|a value no figure can draw):UserWarning"
)


def track1_row(case: str = "random/direct", rate: float = 900.0, **metrics: Any) -> dict[str, Any]:
    record = Record(
        track="dataset",
        case=case,
        case_id=case,
        config={"access": "random", "crop": {"decode": case.rsplit("/", 1)[-1], "dtype": "float32"}},
        metrics={
            m.SAMPLES_PER_S: rate,
            m.P50_MS: 1.0,
            m.P95_MS: 2.0,
            m.P99_MS: 3.0,
            m.COUNT: 400,
            m.QUANTILES_MS: [0.5, 1.0, 2.0, 3.0],
            m.WARMUP_MS: [3.0, 2.0, 1.0, 1.0],
            m.FIRST_PASS_CURVE_MS: [4.0, 3.0],
            m.EVICTION_VERIFIED: True,
            m.HARNESS_OVERHEAD: 0.01,
            m.VALIDITY_FLAGS: [],
            **metrics,
        },
        environment={"ram_bytes": 64 * 2**30, "cpu": "x86_64"},
        run_id="run-a",
    )
    return json.loads(record.to_json())


def base_rows() -> list[dict[str, Any]]:
    """Track 1 rows made here and the committed GPU run's Track 2 and 3 rows."""
    committed = [json.loads(line) for line in GPU_ROWS.read_text().splitlines() if line.strip()]
    return [track1_row(), track1_row("random/zarr", 400.0), *committed[:6], *committed[28:36]]


def write_rows(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def read_all(path: Path) -> tuple[list[Record], list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = read_records(path)
    return rows, [str(w.message) for w in caught]


def every_reader(rows: list[Record], tmp_path: Path, figures: bool = False) -> str:
    """Summary, repeats, verdict, the report page, CSV (and figures): the text they print, joined."""
    printed = [summary_table(rows), format_repeat_summary(summarise_repeats(rows)), verdict(rows).text()]
    printed.append(render_report(rows))
    csv_path = write_csv(rows, tmp_path / "rows.csv")
    assert csv_path.is_file()
    if figures:
        # OutputError: no row holds what a figure draws, a typed error.
        with warnings.catch_warnings(), contextlib.suppress(OutputError):
            warnings.simplefilter("ignore")
            plot_results(rows, tmp_path / "plots")
    return "\n".join(printed)


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


# --- the defects, one by one -------------------------------------------------------------------------


def test_flags_that_are_not_a_list_skip_the_row_with_a_warning_naming_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = track1_row("random/zarr")
    bad["metrics"][m.VALIDITY_FLAGS] = 3
    path = write_rows(tmp_path / "results.jsonl", [track1_row(), bad])
    for command in ("report", "summary"):
        with pytest.warns(RuntimeWarning, match=r"results\.jsonl:2: skipped: its validity_flags are 3, not a list"):
            assert main([command, str(path)]) == 0
        assert "best random/direct: 900 samples/s" in capsys.readouterr().out


def test_a_row_nested_100000_deep_is_skipped_without_decoding_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nested = json.dumps(track1_row("random/deep")).replace('"validity_flags": []', f'"deep": {deep(100_000)}')
    path = write_rows(tmp_path / "results.jsonl", [track1_row(), nested])
    with pytest.warns(
        RuntimeWarning, match=rf"results\.jsonl:2: skipped: it nests 100,00\d levels deep; at most {MAX_DEPTH}"
    ):
        assert main(["summary", str(path)]) == 0
    assert "best random/direct" in capsys.readouterr().out


@pytest.mark.parametrize("case", ["$\\frac{$", "$\\frac{", "$x$ and $", "a" * 900])
def test_case_names_with_mathtext_or_a_thousand_characters_draw(tmp_path: Path, case: str) -> None:
    rows = [track1_row(case + "/direct"), track1_row()]
    path = write_rows(tmp_path / "results.jsonl", rows)
    assert main(["report", str(path)]) == 0
    assert (tmp_path / "plots" / "track1_latency_throughput.png").is_file()


@pytest.mark.parametrize("size", [2**20, 50 * 2**20])
def test_a_megabyte_case_name_is_skipped_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], size: int
) -> None:
    path = write_rows(tmp_path / "results.jsonl", [track1_row(), track1_row("x" * size)])
    with pytest.warns(RuntimeWarning, match=r"results\.jsonl:2: skipped: ('case' is|the line is)"):
        assert main(["report", str(path)]) == 0
    assert "best random/direct" in capsys.readouterr().out


def as_written(row: dict[str, Any]) -> dict[str, Any]:
    """The row with the flags the runner decides as it writes a row (a rate that is no number: impossible)."""
    return json.loads(decide(Record.from_dict(row)).to_json())


def test_a_metric_that_is_text_is_no_number_in_the_summary(tmp_path: Path, cropbench_cli: Any) -> None:
    text = "<script>alert(1)</script>"
    path = write_rows(tmp_path / "results.jsonl", [track1_row(), track1_row("random/zarr", text)])  # type: ignore[arg-type]
    result = cropbench_cli("summary", str(path))
    assert result.returncode == 0, result.stderr
    assert "best random/direct: 900 samples/s" in result.stdout, "read as written: a text is never the best"
    path = write_rows(
        tmp_path / "results.jsonl", [as_written(track1_row()), as_written(track1_row("random/zarr", text))]
    )  # type: ignore[arg-type]
    result = cropbench_cli("summary", str(path))
    assert "best random/direct: 900 samples/s" in result.stdout
    assert "random/zarr: samples_per_s is not a number" in result.stdout
    page = render_report(read_all(path)[0])
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_summary_never_prints_nan_or_inf_as_a_rate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [track1_row(), track1_row("random/zarr", float("nan")), track1_row("random/field", float("inf"))]
    path = write_rows(tmp_path / "results.jsonl", [as_written(row) for row in rows])
    assert main(["summary", str(path)]) == 0
    out = capsys.readouterr().out
    summary = out.split("\nVerdict")[0]
    assert "random/zarr" not in summary and "random/field" not in summary, "no median of a value that is not finite"
    assert "random/zarr: samples_per_s is nan" in out and "random/field: samples_per_s is inf" in out
    table = summary_table(read_all(path)[0])
    assert "nan (not a number to quote)" in table and "impossible" in table


def test_control_characters_of_a_case_name_never_reach_the_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_rows(tmp_path / "results.jsonl", [track1_row(f"{ANSI}/direct"), track1_row("x/zarr", -1.0)])
    for command in ("report", "summary"):
        assert main([command, str(path)]) == 0
        captured = capsys.readouterr()
        assert "\x1b" not in captured.out + captured.err and "\x07" not in captured.out + captured.err
        assert "\\x1b[2J\\x1b[31mred" in captured.out
    from cropbench.cli import _format_warning

    shown = _format_warning(UserWarning(f"left out (first: {ANSI})"), UserWarning)
    assert "\x1b" not in shown and shown.count("\n") == 1


def test_export_neutralises_formula_cells_and_keeps_negative_numbers(tmp_path: Path) -> None:
    row = track1_row("=cmd|' /C calc'!A0", -5.0, note='=HYPERLINK("http://x")', plus="+1+1", at="@SUM(A1)")
    row["config"]["text"] = "-2+3"
    row["config"]["negative"] = "-12.5"
    path = write_rows(tmp_path / "results.jsonl", [row])
    assert main(["export", str(path), "--csv", str(tmp_path / "out.csv")]) == 0
    with (tmp_path / "out.csv").open(newline="") as handle:
        (cells,) = list(csv.DictReader(handle))
    assert cells["case"] == "'=cmd|' /C calc'!A0"
    assert cells["metrics.note"] == '\'=HYPERLINK("http://x")'
    assert cells["metrics.plus"] == "'+1+1" and cells["metrics.at"] == "'@SUM(A1)"
    assert cells["config.text"] == "'-2+3"
    assert cells["metrics.samples_per_s"] == "-5.0" and cells["config.negative"] == "-12.5"


def test_report_html_wraps_its_tables_and_shows_memory_in_gib() -> None:
    rows = [Record.from_dict(track1_row(flags="x"))]
    page = render_report(rows)
    assert "th { background: #f0f0f0; white-space: normal;" in page and 'class="flags"' in page
    assert "64.0 GiB" in page and str(64 * 2**30) not in page


# --- the fuzz tier -----------------------------------------------------------------------------------

#: Values a mutation puts where a row holds something else.
ODD_VALUES: list[Any] = [
    None,
    True,
    -1,
    0,
    -123.0,
    1e300,
    -1e300,
    float("nan"),
    float("inf"),
    float("-inf"),
    "",
    "text",
    "<script>alert(1)</script>",
    "$\\frac{",
    ANSI,
    "=cmd|' /C calc'!A0",
    "\u202eevil",
    [],
    [1, "a", None],
    {},
    {"nested": {"deeper": [1, 2]}},
    2**70,
]


def mutate(row: dict[str, Any], rng: random.Random) -> Any:
    """One row changed in one to three ways: a value replaced, a key removed, text grown, nesting added."""
    row = copy.deepcopy(row)
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(["metric", "metric", "config", "field", "drop", "long", "nest", "flags", "case"])
        section = rng.choice(["metrics", "config"])
        if kind == "metric" and row.get("metrics") and isinstance(row["metrics"], dict):
            row["metrics"][rng.choice(sorted(row["metrics"]))] = rng.choice(ODD_VALUES)
        elif kind == "config" and isinstance(row.get("config"), dict) and row["config"]:
            row["config"][rng.choice(sorted(row["config"]))] = rng.choice(ODD_VALUES)
        elif kind == "field":
            row[rng.choice(["track", "case", "seed", "repeat", "run_id", "case_id", section])] = rng.choice(ODD_VALUES)
        elif kind == "drop" and row:
            row.pop(rng.choice(sorted(row)))
        elif kind == "long":
            row["case"] = "x" * rng.choice([100, 1_001, 70_000])
        elif kind == "nest" and isinstance(row.get(section), dict):
            value: Any = 1
            for _ in range(rng.choice([5, MAX_DEPTH + 5, 500])):
                value = [value]
            row[section]["nested"] = value
        elif kind == "flags" and isinstance(row.get("metrics"), dict):
            row["metrics"][m.VALIDITY_FLAGS] = rng.choice(ODD_VALUES)
        elif kind == "case":
            row["case"] = rng.choice(["$\\frac{", ANSI, "a/b", "\u202e", "=1+1"])
    return row


def test_fuzzed_results_files_end_in_a_typed_error_or_a_sound_read(tmp_path: Path) -> None:
    rng = random.Random(FUZZ_SEED)
    bases = base_rows()
    counts: Counter[str] = Counter()
    for number in range(FUZZ_INPUTS):
        rows: list[Any] = [copy.deepcopy(row) for row in rng.sample(bases, rng.randint(2, 6))]
        for index in rng.sample(range(len(rows)), rng.randint(1, len(rows))):
            rows[index] = mutate(rows[index], rng)
        folder = tmp_path / str(number)
        folder.mkdir()
        path = write_rows(folder / "results.jsonl", rows)
        try:
            read, skipped = read_all(path)
        except OutputError:
            counts["typed errors"] += 1
            continue
        counts["rows skipped with a warning"] += len(skipped)
        counts["rows read"] += len(read)
        counts["rows flagged impossible"] += sum(IMPOSSIBLE in row_flags(row) for row in read)
        printed = every_reader(read, folder, figures=number < FUZZ_FIGURES)
        assert "\x1b" not in terminal_safe(printed), "what the commands print is escaped"
        for track in verdict(read).tracks:
            assert track.best is None or not track.best.flags, (number, track)
        counts["correct reads"] += 1
        assert printed
    print(f"\nresults fuzz (seed {FUZZ_SEED}): {FUZZ_INPUTS} inputs, {dict(counts)}, 0 crashes")
    assert counts["typed errors"] + counts["correct reads"] == FUZZ_INPUTS
    assert counts["correct reads"] > FUZZ_INPUTS // 4


def test_rows_whose_rates_are_all_negative_draw_figures_of_ordinary_size(tmp_path: Path) -> None:
    """A flag's note beside a bar of -123 samples/s once landed far off the axis: a figure 4e13 px wide."""
    from PIL import Image

    rows = [as_written(track1_row(f"random/{decode}", -123.0)) for decode in ("direct", "zarr", "field")]
    path = write_rows(tmp_path / "results.jsonl", rows)
    assert main(["plot", str(path), "--out", str(tmp_path / "plots")]) == 0
    figures = sorted((tmp_path / "plots").glob("*.png"))
    assert figures and all(max(Image.open(figure).size) < 5000 for figure in figures)
