"""Tidy asv's published site: no empty graph on the front page, wide series opened on a log axis.

``asv publish`` lists every benchmark the suite defines, measured or not: a benchmark outside the
measured grid (the ``Full*`` and ``*Latency`` classes run only on request) becomes an empty frame
on the front page. This drops from ``index.json`` every benchmark with no measured point in any of
its graphs, so the front page shows only graphs with a line.

A parameterised benchmark whose series differ by ten times or more (zarr-python's crop path beside
the direct reader's, say) draws the small ones as a flat line at the bottom of a linear axis; its
front-page link opens its graph on asv's log axis instead, where every series shows its steps.

    .venv/bin/python scripts/asv_site_tidy.py html      (scripts/asv_publish.sh runs it)
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: Series whose typical values differ by this factor or more are opened on a log axis.
LOG_SCALE_SPREAD = 10.0
#: The front-page link of each benchmark in asv 0.6's summarygrid.js, and the same link that opens
#: a benchmark marked ``log_scale`` with its y axis on a log scale (asv's own URL state).
SUMMARY_LINK = "'<a class=\"btn benchmark-container\" href=\"#' + bm.name +\n            '\"/>'"
LOG_LINK = (
    '\'<a class="btn benchmark-container" href="#\' + bm.name +\n'
    "            (bm.log_scale ? '?y-axis-scale=log' : '') + '\"/>'"
)


class TidyError(RuntimeError):
    """The folder is not a published asv site, or asv's page no longer has the link this rewrites."""


def series(html_dir: Path, name: str) -> list[list[float]]:
    """Every measured value of benchmark ``name``, one list per parameter combination, over all its graphs
    (each machine and branch); the summary graphs (asv's means over parameters) are left out."""
    found: list[list[float]] = []
    for graph in sorted((html_dir / "graphs").rglob(f"{name}.json")):
        if graph.parent.name == "summary" and graph.parent.parent.name == "graphs":
            continue
        points = json.loads(graph.read_text(encoding="utf-8"))
        for _, values in points:
            cells = values if isinstance(values, list) else [values]
            if len(found) < len(cells):
                found += [[] for _ in range(len(cells) - len(found))]
            for index, value in enumerate(cells):
                if isinstance(value, int | float) and value == value:  # not None, not NaN
                    found[index].append(float(value))
    return [values for values in found if values]


def wide(measured: Iterable[list[float]]) -> bool:
    """Whether the series' medians (positive ones) differ by ``LOG_SCALE_SPREAD`` or more."""
    medians = [statistics.median(values) for values in measured]
    positive = [value for value in medians if value > 0]
    return len(positive) >= 2 and max(positive) / min(positive) >= LOG_SCALE_SPREAD


def tidy(html_dir: Path) -> tuple[list[str], list[str]]:
    """Drop unmeasured benchmarks from ``html_dir``'s index and mark wide ones for a log axis;
    return (dropped, on a log axis), each sorted."""
    index_path = html_dir / "index.json"
    grid_path = html_dir / "summarygrid.js"
    if not index_path.is_file() or not grid_path.is_file():
        raise TidyError(f"{html_dir} holds no published asv site (no index.json or summarygrid.js); run asv publish")
    index = json.loads(index_path.read_text(encoding="utf-8"))
    benchmarks = index.get("benchmarks")
    if not isinstance(benchmarks, dict):
        raise TidyError(f"{index_path} lists no benchmarks; is it asv's index.json?")
    dropped, logged = [], []
    for name in sorted(benchmarks):
        measured = series(html_dir, name)
        if not measured:
            dropped.append(name)
            del benchmarks[name]
        elif wide(measured):
            benchmarks[name]["log_scale"] = True
            logged.append(name)
    grid = grid_path.read_text(encoding="utf-8")
    if LOG_LINK not in grid:
        if SUMMARY_LINK not in grid:
            raise TidyError(f"{grid_path}: asv's front-page link is not the one this script rewrites (asv changed?)")
        grid_path.write_text(grid.replace(SUMMARY_LINK, LOG_LINK), encoding="utf-8")
    index_path.write_text(json.dumps(index), encoding="utf-8")
    return dropped, logged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("html_dir", type=Path, nargs="?", default=REPO / "html")
    args = parser.parse_args(argv)
    try:
        dropped, logged = tidy(args.html_dir)
    except (TidyError, OSError, ValueError) as error:
        print(f"asv_site_tidy: error: {error}")
        return 2
    print(
        f"tidy: {len(dropped)} benchmark(s) with no measured point left off the front page"
        + (f" ({', '.join(dropped)})" if dropped else "")
        + f"; {len(logged)} opened on a log axis"
        + (f" ({', '.join(logged)})" if logged else "")
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
