"""Track 3's figures: step time against the compute-only baseline with the data wait, and worker searches."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from cropbench import metrics as m
from cropbench.harness.flags import flagged
from cropbench.records import TRAINING_TRACK, Record
from cropbench.report.plots.drawing import (
    FLAGGED_COLOR,
    FLAGGED_EDGE,
    FLAGGED_HATCH,
    TAB10,
    axis_from_zero,
    flagged_handle,
    horizontal_bars,
    save_figure,
)
from cropbench.report.plots.rows import describe_loading, row_label, rows_of


def track3_bars(records: Sequence[Record], out_dir: Path) -> Path | None:
    """Step-time p50 against the compute-only baseline, and the data-wait fraction, per case."""
    rows = [r for r in rows_of(records, TRAINING_TRACK) if m.STEP_P50_MS in r.metrics]
    if not rows:
        return None
    positions = np.arange(len(rows))
    height = max(3.0, 0.36 * len(rows) + 1.8)
    below = (0.5, -0.75 / max(height - 1.2, 1.0))  # legends under the x labels, clear of the bars
    figure, (left, right) = plt.subplots(1, 2, figsize=(15, height), sharey=True)
    marked = [flagged(r) for r in rows]
    steps = [r.metrics[m.STEP_P50_MS] for r in rows]
    compute = [r.metrics.get(m.COMPUTE_ONLY_STEP_P50_MS, np.nan) for r in rows]
    horizontal_bars(left, positions, steps, "tab:purple", marked)
    ink = [FLAGGED_EDGE if mark else "black" for mark in marked]
    left.scatter(compute, positions, marker="|", s=250, c=ink, zorder=3)
    baseline = Line2D([], [], marker="|", markersize=14, color="black", linestyle="none", label="compute-only p50")
    left.set_yticks(positions, [row_label(r) for r in rows], fontsize=8)
    left.invert_yaxis()
    axis_from_zero(left, [*steps, *compute])
    left.set_xlabel("ms per step")
    left.set_title("Track 3 step time p50 (lower is better)")
    left.legend(
        handles=[
            Patch(color="tab:purple", label="step p50"),
            baseline,
            *([flagged_handle()] if any(marked) else []),
        ],
        fontsize=8,
        loc="upper center",
        bbox_to_anchor=below,
        ncol=1,
    )
    wait = [100 * r.metrics.get(m.DATA_WAIT_FRACTION, np.nan) for r in rows]
    stall = [100 * r.metrics.get(m.STALL_CROSSCHECK, np.nan) for r in rows]
    for fed in (True, False):
        chosen = [index for index, w in enumerate(wait) if (w < 10) == fed]
        horizontal_bars(
            right,
            positions[chosen],
            [wait[i] for i in chosen],
            "tab:green" if fed else "tab:red",
            [marked[i] for i in chosen],
        )
    right.scatter(stall, positions, marker="x", c=ink, zorder=3)
    crosscheck = Line2D([], [], marker="x", color="black", linestyle="none", label="(step − compute-only) / step")
    threshold = right.axvline(10, color="gray", linestyle=":", label="10%: the model's device >= 90% busy")
    right.set_xlabel("% of step time blocked on data (next() + copy to the model's device, if any)")
    right.set_title("Track 3 data-wait fraction (lower is better)")
    right.legend(
        handles=[
            Patch(color="tab:green", label="data wait < 10%: fed"),
            Patch(color="tab:red", label="data wait >= 10%: waits on data"),
            crosscheck,
            threshold,
            *([flagged_handle()] if any(marked) else []),
        ],
        fontsize=8,
        loc="upper center",
        bbox_to_anchor=below,
        ncol=1,
    )
    axis_from_zero(right, [*wait, *stall, 10.0])
    for axis in (left, right):
        axis.grid(axis="x", alpha=0.3)
    return save_figure(figure, out_dir / "track3_step_and_wait.png")


def _search_key(case: dict[str, Any]) -> str:
    """A worker search's case without what differs between its points: workers, step counts, run label."""
    rest = {key: value for key, value in case.items() if key not in {"steps", "warmup_steps", "run"}}
    rest["loader"] = {key: value for key, value in case.get("loader", {}).items() if key != "num_workers"}
    return json.dumps(rest, sort_keys=True, default=str)


def flagged_workers(search: Record, records: Sequence[Record]) -> set[int]:
    """The worker counts of a search whose own rows (same run, same case but for the workers) are flagged.

    A search's row holds its case under ``case``; what the run adds to every row (plate, layout,
    threads) sits beside it, and in each point's row beside the case's own fields.
    """
    case = search.config.get("case", {})

    def as_point(row: Record) -> dict[str, Any]:
        added = {name: search.config.get(name) for name in row.config if name not in case}
        return {**added, **case}

    return {
        int(r.config["loader"]["num_workers"])
        for r in records
        if r.track == TRAINING_TRACK
        and r is not search
        and r.run_id == search.run_id
        and "num_workers" in r.config.get("loader", {})
        and _search_key(r.config) == _search_key(as_point(r))
        and flagged(r)
    }


def track3_workers(records: Sequence[Record], out_dir: Path) -> Path | None:
    """Worker searches: data-wait fraction and images/s against num_workers, one line per search."""
    searches = [r for r in rows_of(records, TRAINING_TRACK) if r.metrics.get(m.TRIED_WORKERS)]
    if not searches:
        return None
    figure, (left, right) = plt.subplots(1, 2, figsize=(15, 5.5))
    any_flagged = False
    for color, record in zip(TAB10, searches, strict=False):
        workers = record.metrics[m.TRIED_WORKERS]
        answer = record.metrics.get(m.MIN_WORKERS)
        search = describe_loading(record.config.get("case", {}))
        name = f"{search} → min workers: {answer if answer is not None else 'not reached'}"
        left.plot(
            workers,
            [100 * v for v in record.metrics[m.DATA_WAIT_FRACTION_BY_WORKERS]],
            marker="o",
            color=color,
            label=name,
        )
        right.plot(workers, record.metrics[m.IMAGES_PER_S_BY_WORKERS], marker="o", color=color, label=name)
        marked = flagged_workers(record, records)
        for axis, values in (
            (left, [100 * v for v in record.metrics[m.DATA_WAIT_FRACTION_BY_WORKERS]]),
            (right, record.metrics[m.IMAGES_PER_S_BY_WORKERS]),
        ):
            points = [(w, v) for w, v in zip(workers, values, strict=False) if w in marked]
            if points:
                axis.scatter(
                    *zip(*points, strict=True),
                    s=90,
                    facecolor=FLAGGED_COLOR,
                    edgecolor=color,
                    hatch=FLAGGED_HATCH,
                    zorder=3,
                )
        any_flagged = any_flagged or bool(marked)
        ceiling = record.metrics.get(m.COMPUTE_ONLY_IMAGES_PER_S)
        if ceiling:
            right.axhline(ceiling, color=color, linestyle=":", linewidth=1)
            right.set_ylim(top=max(right.get_ylim()[1], ceiling * 1.1))
    left.axhline(10, color="gray", linestyle=":", label="10%: the model's device >= 90% busy")
    left.set_ylabel("% of step time blocked on data")
    left.set_title("Track 3 data wait vs num_workers (lower is better)")
    right.set_ylabel("images/s; dotted: compute-only ceiling")
    right.set_title("Track 3 images/s vs num_workers (higher is better)")
    tried = sorted({w for record in searches for w in record.metrics[m.TRIED_WORKERS]})
    for axis in (left, right):
        axis.set_xlabel("num_workers")
        axis.set_xticks(tried)
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
    handles, _ = left.get_legend_handles_labels()
    left.legend(handles=[*handles, *([flagged_handle()] if any_flagged else [])], fontsize=7)
    return save_figure(figure, out_dir / "track3_workers.png")
