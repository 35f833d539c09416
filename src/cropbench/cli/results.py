"""Commands that read a results file: ``plot``, ``report``, ``export`` and ``summary``; the figures and
report page the measuring commands end with."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from cropbench.cli.options import Commands
from cropbench.errors import ConfigError
from cropbench.metrics import SAMPLES_PER_S
from cropbench.records import Record, read_records, write_csv
from cropbench.report.text import terminal_safe


def echo(text: str) -> None:
    """Print ``text`` with the control characters a row may carry shown as escapes, never obeyed."""
    print(terminal_safe(text))


def draw_figures(results: Path, out_dir: Path, all_runs: bool = False) -> list[Path]:
    """Draw the figures of a results file into ``out_dir``, naming each file written."""
    from cropbench.report.plots import plot_results, runs_in

    records = read_records(results)
    figures = plot_results(records, out_dir, all_runs=all_runs)
    for path in figures:
        echo(f"wrote {path}")
    runs = len(runs_in(records))
    if runs > 1 and not all_runs:
        echo(
            f"figures show the latest row of each configuration; {results} holds {runs} runs "
            "(plot --all-runs overlays them)"
        )
    return figures


def write_report_page(records: Sequence[Record], out_dir: Path, figures: Sequence[Path], preset: str | None) -> str:
    """Write OUT/report.html (verdict, figures, rows, environment); returns the verdict's text."""
    from cropbench.report.html import write_report
    from cropbench.report.verdict import verdict

    answer = verdict(records, preset)
    echo(f"report (verdict, figures, rows, environment): {write_report(records, out_dir, figures, answer=answer)}")
    return answer.text()


def cmd_plot(args: argparse.Namespace) -> int:
    results = Path(args.results)
    draw_figures(results, Path(args.out) if args.out else results.parent / "plots", all_runs=args.all_runs)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Figures, OUT/report.html and the verdict for an existing results file: every row of it judged."""
    results = Path(args.results)
    out_dir = Path(args.out) if args.out else results.parent
    records = read_records(results)
    if not records:
        raise ConfigError(f"{results} holds no rows: nothing to report (run 'cropbench run --out DIR' first)")
    figures = draw_figures(results, out_dir / "plots")
    echo(f"\n{write_report_page(records, out_dir, figures, None)}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    path = write_csv(read_records(args.results), args.csv)
    echo(f"wrote {path}")
    return 0


def cmd_summary(args: argparse.Namespace) -> int:
    from cropbench.report.stability import format_repeat_summary, numeric_metrics, summarise_repeats
    from cropbench.report.verdict import verdict

    records = read_records(Path(args.results))
    known = numeric_metrics(records)
    if args.metric not in known:
        close = [m for m in known if args.metric[:6] in m][:8] or known[:8]
        raise ConfigError(
            f"--metric {args.metric!r} is in no row of {args.results}; "
            f"try {', '.join(close)} ({len(known)} numeric metrics in all)"
        )
    echo(format_repeat_summary(summarise_repeats(records, args.metric)))
    echo(f"\n{verdict(records).text()}")
    return 0


def add_result_commands(commands: Commands) -> None:
    """Register ``plot``, ``report``, ``export`` and ``summary``."""
    plot = commands.add_parser("plot", help="draw figures from a results file")
    plot.add_argument("results", help="results.jsonl")
    plot.add_argument("--out", help="directory for PNGs (default: plots/ beside the results)")
    plot.add_argument(
        "--all-runs",
        action="store_true",
        help="overlay every run in the file, each labelled with its run id (default: each track's latest run)",
    )
    plot.set_defaults(handler=cmd_plot)

    report = commands.add_parser(
        "report",
        help="write report.html, figures and the verdict for a results file",
        description="Draw the figures of RESULTS into DIR/plots, write DIR/report.html (one page: verdict, figures, "
        "every row, environment) and print the verdict. The verdict judges every row of the file (a run resumed "
        "after an interruption included); the figures draw the latest row of each configuration.",
    )
    report.add_argument("results", help="results.jsonl")
    report.add_argument("--out", metavar="DIR", help="folder for report.html and plots/ (default: beside the results)")
    report.set_defaults(handler=cmd_report)

    export = commands.add_parser("export", help="export a results file as CSV")
    export.add_argument("results", help="results.jsonl")
    export.add_argument("--csv", required=True, help="CSV file to write")
    export.set_defaults(handler=cmd_export)

    summary = commands.add_parser(
        "summary", help="median, 95%% interval and stability warnings over repeats, then the verdict"
    )
    summary.add_argument("results", help="results.jsonl")
    summary.add_argument(
        "--metric",
        default=SAMPLES_PER_S,
        help="numeric metric to summarise, e.g. samples_per_s, p95_ms, images_per_s, "
        "data_wait_fraction (default: %(default)s)",
    )
    summary.set_defaults(handler=cmd_summary)
