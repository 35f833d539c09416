"""The fetch targets: track ``targets`` of the runner on PLATE, several interleaved runs, then the
headline ratios with their spread over runs.

Usage: .venv/bin/python scripts/measure_targets.py PLATE OUT_DIR [--runs N] [--objects N]

It is ``cropbench run --plate PLATE --track targets --preset full --repeats N --out OUT_DIR`` (rows
in OUT_DIR/results.jsonl, each run with its own seed and load average) followed by a table: for
each access pattern and each ratio (the direct reader over the ceiling at its own thread count, and
over each installed peer at its best), the median over runs of each run's median per-block ratio,
and the lowest and highest run. PLATE should be the ``full`` preset in the default layout
(``python -m cropbench generate --preset full --out data/full.zarr``). Run it alone on a quiet
machine: the ratios are paired per block, but a loaded machine still shifts them.
"""

from __future__ import annotations

import argparse
import os
from collections import defaultdict
from pathlib import Path

import numpy as np

from cropbench import api
from cropbench import metrics as m
from cropbench.records import Record


def headline(records: list[Record]) -> str:
    """Each ratio row's median over runs and its range, with the load averages the runs saw."""
    ratios: dict[str, list[float]] = defaultdict(list)
    flagged: dict[str, int] = defaultdict(int)
    loads = []
    for record in records:
        if "/over/" in record.case:
            ratios[record.case].append(record.metrics[m.RATIO_MEDIAN])
            flagged[record.case] += bool(record.metrics.get(m.VALIDITY_FLAGS))
        elif m.LOADAVG_START in record.metrics:
            loads.append(record.metrics[m.LOADAVG_START][0])
    lines = [f"targets over {max(map(len, ratios.values()), default=0)} runs (1-min loadavg at start: {loads})"]
    for case, values in ratios.items():
        note = f"  FLAGGED impossible in {flagged[case]} runs" if flagged[case] else ""
        lines.append(f"  {case:<58} {np.median(values):6.2f}  ({min(values):.2f}-{max(values):.2f}){note}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("plate", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--runs", type=int, default=5, help="interleaved runs, each with its own seed")
    parser.add_argument("--objects", type=int, default=3072, help="crops per run (blocks of 192)")
    args = parser.parse_args()
    print(f"loadavg before {os.getloadavg()}", flush=True)
    records = api.run(args.plate, ["targets"], "full", args.out, samples=args.objects, repeats=args.runs)
    print(headline(records))


if __name__ == "__main__":
    main()
