"""Tidy asv's published site: every benchmark on it draws a line, wide series open on a log axis.

``asv publish`` lists every benchmark the suite defines, measured or not: a benchmark outside the
measured grid (the ``Full*`` and ``*Latency`` classes run only on request), skipped wherever it ran
or measured at one commit only becomes an empty frame or a lone dot. This leaves off the site every
benchmark none of whose graphs has two measured points (``index.json``, its graph files and its rows
of ``summary.json``) and lists them, each with the reason, on a page of their own (``left-out.html``,
linked from the navigation bar). ``summary.json`` (the benchmark list) also loses the rows of
parameter combinations never measured, most of its size on a site with a parameter grid.

A parameterised benchmark whose series differ by ten times or more (zarr-python's crop path beside
the direct reader's, say) draws the small ones as a flat line at the bottom of a linear axis; its
front-page link opens its graph on asv's log axis instead, where every series shows its steps.

    .venv/bin/python scripts/asv_site_tidy.py html      (scripts/asv_publish.sh runs it)
"""

from __future__ import annotations

import argparse
import html
import json
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cropbench.history import REPO

#: Series whose typical values differ by this factor or more are opened on a log axis.
LOG_SCALE_SPREAD = 10.0
#: The front-page link of each benchmark in asv 0.6's summarygrid.js, and the same link that opens
#: a benchmark marked ``log_scale`` with its y axis on a log scale (asv's own URL state).
SUMMARY_LINK = "'<a class=\"btn benchmark-container\" href=\"#' + bm.name +\n            '\"/>'"
LOG_LINK = (
    '\'<a class="btn benchmark-container" href="#\' + bm.name +\n'
    "            (bm.log_scale ? '?y-axis-scale=log' : '') + '\"/>'"
)


#: A line needs this many measured points; a benchmark none of whose graphs has them is left off.
MIN_POINTS = 2
#: The page that lists what was left off, and asv 0.6's last navigation entry, after which its link goes.
LEFT_OUT_PAGE = "left-out.html"
#: The same list as data, kept so that tidying a site twice keeps what the first pass left off.
LEFT_OUT_JSON = "left-out.json"
NAV_ANCHOR = '<li id="nav-li-regressions"><a href="#/regressions">Regressions</a></li>'
NAV_LINK = '<li id="nav-li-left-out"><a href="left-out.html">Not drawn ({count})</a></li>'


class TidyError(RuntimeError):
    """The folder is not a published asv site, or asv's page no longer has the link this rewrites."""


def graphs_of(html_dir: Path, name: str) -> list[Path]:
    """Benchmark ``name``'s graph files (each machine and branch), asv's summary graphs left out."""
    return [
        graph
        for graph in sorted((html_dir / "graphs").rglob(f"{name}.json"))
        if not (graph.parent.name == "summary" and graph.parent.parent.name == "graphs")
    ]


def measured(value: object) -> bool:
    """Whether one cell of a graph is a measured number (asv writes None, sometimes NaN, for the rest)."""
    return isinstance(value, int | float) and value == value


def points(graph: Path) -> int:
    """Commits at which ``graph`` has at least one measured value (of any parameter combination)."""
    count = 0
    for entry in json.loads(graph.read_text(encoding="utf-8")):
        cells = entry[1] if isinstance(entry[1], list) else [entry[1]]
        count += any(measured(cell) for cell in cells)
    return count


def left_out_reason(html_dir: Path, name: str) -> str | None:
    """Why benchmark ``name`` draws no line on the site (None: it draws one)."""
    graphs = graphs_of(html_dir, name)
    if not graphs:
        return "in no published result: outside the grid the results ran"
    most = max(points(graph) for graph in graphs)
    if most >= MIN_POINTS:
        return None
    if most == 1:
        return "measured at one commit only: a line needs two"
    return "in the results, but skipped or failed wherever it ran: no measured value"


def series(html_dir: Path, name: str) -> list[list[float]]:
    """Every measured value of benchmark ``name``, one list per parameter combination, over all its graphs
    (each machine and branch); the summary graphs (asv's means over parameters) are left out."""
    found: list[list[float]] = []
    for graph in graphs_of(html_dir, name):
        for entry in json.loads(graph.read_text(encoding="utf-8")):
            cells = entry[1] if isinstance(entry[1], list) else [entry[1]]
            if len(found) < len(cells):
                found += [[] for _ in range(len(cells) - len(found))]
            for index, value in enumerate(cells):
                if measured(value):
                    found[index].append(float(value))
    return [values for values in found if values]


def wide(measured: Iterable[list[float]]) -> bool:
    """Whether the series' medians (positive ones) differ by ``LOG_SCALE_SPREAD`` or more."""
    medians = [statistics.median(values) for values in measured]
    positive = [value for value in medians if value > 0]
    return len(positive) >= 2 and max(positive) / min(positive) >= LOG_SCALE_SPREAD


@dataclass(frozen=True)
class Tidied:
    """What :func:`tidy` did: benchmarks left off (name -> why), those opened on a log axis, and the
    rows of ``summary.json`` before and after."""

    left_out: dict[str, str]
    logged: list[str]
    summary_rows: tuple[int, int]


def tidy(html_dir: Path) -> Tidied:
    """Leave off ``html_dir``'s site every benchmark without a line (listed on ``LEFT_OUT_PAGE`` with the
    reason), drop never-measured rows from ``summary.json``, and mark wide benchmarks for a log axis."""
    index_path, grid_path, page_path = html_dir / "index.json", html_dir / "summarygrid.js", html_dir / "index.html"
    if not index_path.is_file() or not grid_path.is_file() or not page_path.is_file():
        raise TidyError(
            f"{html_dir} holds no published asv site (no index.json, summarygrid.js or index.html); run asv publish"
        )
    index = json.loads(index_path.read_text(encoding="utf-8"))
    benchmarks = index.get("benchmarks")
    if not isinstance(benchmarks, dict):
        raise TidyError(f"{index_path} lists no benchmarks; is it asv's index.json?")
    page = page_path.read_text(encoding="utf-8")
    if NAV_ANCHOR not in page:
        raise TidyError(f"{page_path}: asv's navigation bar is not the one this script adds a link to (asv changed?)")
    grid = grid_path.read_text(encoding="utf-8")
    if LOG_LINK not in grid and SUMMARY_LINK not in grid:
        raise TidyError(f"{grid_path}: asv's front-page link is not the one this script rewrites (asv changed?)")
    left_out, logged = {}, []
    for name in sorted(benchmarks):
        reason = left_out_reason(html_dir, name)
        if reason is not None:
            left_out[name] = reason
            del benchmarks[name]
            for graph in [*graphs_of(html_dir, name), html_dir / "graphs" / "summary" / f"{name}.json"]:
                graph.unlink(missing_ok=True)
        elif wide(series(html_dir, name)):
            benchmarks[name]["log_scale"] = True
            logged.append(name)
    rows = trim_summaries(html_dir, set(benchmarks))
    grid_path.write_text(grid.replace(SUMMARY_LINK, LOG_LINK), encoding="utf-8")
    index_path.write_text(json.dumps(index), encoding="utf-8")
    listed_path = html_dir / LEFT_OUT_JSON
    listed = json.loads(listed_path.read_text(encoding="utf-8")) if listed_path.is_file() else {}
    listed = dict(sorted({**listed, **left_out}.items()))
    if listed:
        listed_path.write_text(json.dumps(listed, indent=1), encoding="utf-8")
        (html_dir / LEFT_OUT_PAGE).write_text(left_out_page(str(index.get("project", "")), listed), encoding="utf-8")
        link = NAV_LINK.format(count=len(listed))
        page = re.sub(r'\s*<li id="nav-li-left-out">.*?</li>', "", page).replace(NAV_ANCHOR, f"{NAV_ANCHOR}\n\t{link}")
        page_path.write_text(page, encoding="utf-8")
    return Tidied(left_out, logged, rows)


def trim_summaries(html_dir: Path, kept: set[str]) -> tuple[int, int]:
    """Keep in each ``summary.json`` (asv's benchmark list) only measured rows of ``kept`` benchmarks; the
    rows (before, after), all files together. asv writes a row per parameter combination, measured or not."""
    before = after = 0
    for path in sorted((html_dir / "graphs").rglob("summary.json")):
        rows = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(rows, list):
            raise TidyError(f"{path} is not asv's list of summary rows")
        trimmed = [row for row in rows if row.get("name") in kept and row.get("last_value") is not None]
        before, after = before + len(rows), after + len(trimmed)
        if len(trimmed) != len(rows):
            path.write_text(json.dumps(trimmed), encoding="utf-8")
    return before, after


def left_out_page(project: str, left_out: dict[str, str]) -> str:
    """The page that lists the benchmarks the site does not draw, each with the reason."""
    items = "\n".join(
        f"<tr><td><code>{html.escape(name)}</code></td><td>{html.escape(reason)}</td></tr>"
        for name, reason in left_out.items()
    )
    return f"""<!doctype html>
<html>
<head>
<meta charset="utf-8">
<title>{html.escape(project)}: benchmarks not drawn</title>
<link rel="stylesheet" href="vendor/css/bootstrap.min.css">
</head>
<body style="margin: 2em">
<p><a href="index.html">&larr; back to the benchmarks</a></p>
<h3>Benchmarks this site does not draw</h3>
<p>A benchmark is drawn when one of its graphs has at least {MIN_POINTS} measured commits (a line). These
{len(left_out)} have none in the published results, so they have no tile and no graph:</p>
<table class="table table-condensed">
<tr><th>benchmark</th><th>why</th></tr>
{items}
</table>
</body>
</html>
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cropbench asv-site-tidy", description=__doc__.split("\n\n")[0])
    parser.add_argument("html_dir", type=Path, nargs="?", default=REPO / "html")
    args = parser.parse_args(argv)
    try:
        done = tidy(args.html_dir)
    except (TidyError, OSError, ValueError) as error:
        print(f"asv_site_tidy: error: {error}")
        return 2
    before, after = done.summary_rows
    print(
        f"tidy: {len(done.left_out)} benchmark(s) without a line left off the site, listed in {LEFT_OUT_PAGE}"
        + (f" ({', '.join(done.left_out)})" if done.left_out else "")
        + f"; {len(done.logged)} opened on a log axis"
        + (f" ({', '.join(done.logged)})" if done.logged else "")
        + f"; summary.json {before} -> {after} rows (never-measured ones dropped)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
