"""Track 2's figures: samples/s against workers per swept configuration, and first-batch latency."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch

from cropbench import metrics as m
from cropbench.harness.flags import flagged, row_flags
from cropbench.harness.validity import CACHE_HOLDS_PLATE_FLAG
from cropbench.records import LOADER_TRACK, Record
from cropbench.report.plots.drawing import (
    FLAGGED_COLOR,
    FLAGGED_HATCH,
    TAB10,
    axis_from_zero,
    flagged_handle,
    horizontal_bars,
    save_figure,
)
from cropbench.report.plots.rows import describe_loading, row_label, rows_of

#: Loader knobs a sweep varies: rows equal in every other config field are one sweep.
SWEPT_LOADER_KNOBS = ("num_workers", "batch_size")


def sweep_key(config: dict[str, Any]) -> str:
    """The config without the swept loader knobs and the repeat's seed: the key of one worker × batch sweep."""
    rest = {key: value for key, value in config.items() if key != "seed"}
    rest["loader"] = {k: v for k, v in config.get("loader", {}).items() if k not in SWEPT_LOADER_KNOBS}
    return json.dumps(rest, sort_keys=True, default=str)


def _median(rows: Sequence[Record], metric: str) -> float:
    """Median of a metric over repeats of one configuration."""
    return float(np.median([r.metrics.get(metric, np.nan) for r in rows]))


def _mark_flagged(axis: plt.Axes, workers: Sequence[int], points: dict[int, list[Record]], color: Any) -> None:
    """Flagged points of a steady samples/s line, drawn over it grey and hatched in the line's colour."""
    if workers:
        axis.scatter(
            workers,
            [_median(points[w], m.SAMPLES_PER_S) for w in workers],
            s=90,
            facecolor=FLAGGED_COLOR,
            edgecolor=color,
            hatch=FLAGGED_HATCH,
            zorder=3,
        )


def track2_scaling(records: Sequence[Record], out_dir: Path) -> Path | None:
    """Samples/s against num_workers, one line per batch size, one panel per swept configuration."""
    sweeps: dict[str, dict[int, dict[int, list[Record]]]] = {}
    for record in rows_of(records, LOADER_TRACK):
        loader = record.config.get("loader", {})
        if "num_workers" not in loader or m.SAMPLES_PER_S not in record.metrics:
            continue
        by_batch = sweeps.setdefault(sweep_key(record.config), {}).setdefault(int(loader["batch_size"]), {})
        by_batch.setdefault(int(loader["num_workers"]), []).append(record)
    panels = {key: lines for key, lines in sweeps.items() if any(len(points) >= 2 for points in lines.values())}
    if not panels:
        return None
    columns = min(2, len(panels))
    rows = -(-len(panels) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(7 * columns, 4.6 * rows), squeeze=False)
    for axis, (key, lines) in zip(axes.flat, panels.items(), strict=False):
        for color, (batch, points) in zip(TAB10, sorted(lines.items()), strict=False):
            workers = sorted(points)
            axis.plot(
                workers,
                [_median(points[w], m.SAMPLES_PER_S) for w in workers],
                marker="o",
                color=color,
                label=f"batch {batch}, steady",
            )
            _mark_flagged(axis, [w for w in workers if any(flagged(r) for r in points[w])], points, color)
            axis.plot(
                workers,
                [_median(points[w], m.RUN_SAMPLES_PER_S) for w in workers],
                marker=".",
                linestyle="--",
                color=color,
                alpha=0.7,
                label=f"batch {batch}, whole run",
            )
        axis.set_xticks(sorted({w for points in lines.values() for w in points}))
        axis.set_xlabel("num_workers (0 = loading in the main process)")
        axis.set_ylabel("samples/s")
        axis.set_ylim(bottom=0)
        title = describe_loading(json.loads(key))
        axis.set_title(f"Track 2 samples/s vs num_workers (higher is better)\n{title}", fontsize=9)
        axis.grid(alpha=0.3)
        panel_rows = [r for points in lines.values() for rows_at in points.values() for r in rows_at]
        runs = sorted({str(r.config["run"]) for r in panel_rows if "run" in r.config})
        if runs:
            axis.set_title(f"{axis.get_title()} [run {', '.join(runs)}]", fontsize=9)
        if any(CACHE_HOLDS_PLATE_FLAG in row_flags(r) for r in panel_rows):
            axis.text(
                0.02,
                0.03,
                "the reader's cache holds the whole plate: each read is a cache hit, so\n"
                "handing batches between processes, not reading, sets the pace",
                transform=axis.transAxes,
                fontsize=7,
                color="dimgray",
                va="bottom",
            )
        handles, _ = axis.get_legend_handles_labels()
        axis.legend(
            handles=[*handles, *([flagged_handle()] if any(flagged(r) for r in panel_rows) else [])], fontsize=7
        )
    for axis in list(axes.flat)[len(panels) :]:
        axis.set_visible(False)
    return save_figure(figure, out_dir / "track2_workers_scaling.png")


def track2_first_batch(records: Sequence[Record], out_dir: Path) -> Path | None:
    """First-batch latency per case: epoch 1 (workers start) and epoch 2 (persistent workers reuse)."""
    rows = [r for r in rows_of(records, LOADER_TRACK) if m.FIRST_BATCH_MS in r.metrics]
    if not rows:
        return None
    positions = np.arange(len(rows))
    figure, axis = plt.subplots(figsize=(12, max(3.0, 0.36 * len(rows) + 1.5)))
    marked = [flagged(r) for r in rows]
    first = [r.metrics[m.FIRST_BATCH_MS] for r in rows]
    second = [r.metrics.get(m.EPOCH2_FIRST_BATCH_MS, np.nan) for r in rows]
    horizontal_bars(axis, positions - 0.2, first, "tab:red", marked, height=0.4, label="epoch 1")
    horizontal_bars(axis, positions + 0.2, second, "tab:orange", marked, height=0.4, label="epoch 2")
    axis.set_yticks(positions, [row_label(r) for r in rows], fontsize=8)
    axis.invert_yaxis()
    axis_from_zero(axis, [*first, *second])
    axis.set_xlabel("ms from iter(loader) to the first batch in hand (worker start-up included)")
    axis.set_title("Track 2 first-batch latency (lower is better)")
    axis.grid(axis="x", alpha=0.3)
    handles = [
        Patch(color="tab:red", label="epoch 1"),
        Patch(color="tab:orange", label="epoch 2"),
        *([flagged_handle()] if any(marked) else []),
    ]
    axis.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_figure(figure, out_dir / "track2_first_batch.png")
