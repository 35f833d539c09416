"""Track 1's figures: latency and throughput per configuration, latency CDFs, warm-up curves."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from cropbench import metrics as m
from cropbench.harness.flags import flagged, row_flags
from cropbench.records import DATASET_TRACK, Record
from cropbench.report.plots.drawing import (
    FLAGGED_EDGE,
    TAB10,
    axis_from_zero,
    flagged_handle,
    horizontal_bars,
    log_x_axis,
    save_figure,
)
from cropbench.report.plots.rows import row_label, rows_of


def _per_call(record: Record) -> str:
    """A note for rows whose latencies are per call of several items (the batch access mode)."""
    calls = int(record.metrics.get(m.ITEMS_PER_CALL) or 1)
    return f" [latency per call of {calls}]" if calls > 1 else ""


def track1_bars(records: Sequence[Record], out_dir: Path) -> Path | None:
    """p95 latency (lower is better) and samples/s (higher is better) per configuration."""
    rows = rows_of(records, DATASET_TRACK)
    if not rows:
        return None
    labels = [row_label(r) + _per_call(r) for r in rows]
    height = max(3.0, 0.32 * len(rows) + 1.8)
    figure, (left, right) = plt.subplots(1, 2, figsize=(14, height), sharey=True)
    positions = np.arange(len(rows))
    marked = [flagged(r) for r in rows]
    p95 = [r.metrics.get(m.P95_MS, np.nan) for r in rows]
    horizontal_bars(left, positions, p95, "tab:red", marked)
    left.set_yticks(positions, labels, fontsize=8)
    left.invert_yaxis()
    left.set_xlabel("p95 __getitem__ latency (ms)")
    left.set_title("Track 1 p95 latency (lower is better)")
    rates = [r.metrics.get(m.SAMPLES_PER_S, np.nan) for r in rows]
    horizontal_bars(right, positions, rates, "tab:blue", marked)
    right.set_xlabel("samples/s, one process")
    right.set_title("Track 1 throughput (higher is better)")
    top = np.nanmax(np.asarray(rates, dtype=float)) if any(math.isfinite(float(v)) for v in rates) else 1.0
    for position, record, rate in zip(positions, rows, rates, strict=True):
        flags = row_flags(record)
        if flags and math.isfinite(float(rate)) and float(rate) >= 0:  # a note beside a negative bar lands off the axis
            right.text(
                rate + 0.02 * top, position, "flags: " + ", ".join(flags), va="center", fontsize=7, color="dimgray"
            )
    if any(marked):  # under the figure, clear of the bars and their notes
        figure.legend(handles=[flagged_handle()], fontsize=8, loc="upper center", bbox_to_anchor=(0.5, 0.0))
    axis_from_zero(left, p95)
    axis_from_zero(right, rates, room=1.7 if any(marked) else 1.08)
    for axis in (left, right):
        axis.grid(axis="x", alpha=0.3)
    return save_figure(figure, out_dir / "track1_latency_throughput.png")


def track1_cdf(records: Sequence[Record], out_dir: Path) -> Path | None:
    """Steady-state latency CDF per configuration (left and steep is better).

    A batch-mode row's latencies are per call of several items, not per item: its curve is dashed
    and its label says so, rather than being drawn as if it were one crop's latency.
    """
    rows = [r for r in rows_of(records, DATASET_TRACK) if r.metrics.get(m.QUANTILES_MS)]
    if not rows:
        return None
    figure, axis = plt.subplots(figsize=(10, 6))
    for color, record in zip(itertools.cycle(TAB10), rows, strict=False):
        quantiles = record.metrics[m.QUANTILES_MS]
        per_call = _per_call(record)
        axis.plot(
            quantiles,
            np.linspace(0, 1, len(quantiles)),
            linestyle="--" if per_call else "-",
            color=FLAGGED_EDGE if flagged(record) else color,
            alpha=0.6 if flagged(record) else 1.0,
            label=row_label(record) + per_call + (" [flagged]" if flagged(record) else ""),
        )
    log_x_axis(axis)
    axis.set_xlabel("latency per call: one item, or a batch where dashed (ms, log scale)")
    axis.set_ylabel("fraction of samples")
    axis.set_title("Track 1 latency CDF, steady state (left is better)")
    axis.grid(alpha=0.3)
    handles, names = axis.get_legend_handles_labels()
    if any(flagged(r) for r in rows):
        handles, names = [*handles, flagged_handle()], [*names, "grey: [flagged] row, not a measurement to quote"]
    axis.legend(handles, names, fontsize=7, loc="lower right")
    return save_figure(figure, out_dir / "track1_latency_cdf.png")


#: Items in the warm-up curve's rolling median.
ROLLING_ITEMS = 5
#: The warm-up is over at the first item from which the rolling median stays within this factor of the steady p50.
STEADY_BAND = 1.5


def rolling_median(values: Sequence[float], window: int = ROLLING_ITEMS) -> np.ndarray:
    """Median of each item and the ``window - 1`` before it (fewer at the start)."""
    data = np.asarray(values, dtype=np.float64)
    return np.array([np.median(data[max(0, i - window + 1) : i + 1]) for i in range(len(data))])


def steady_from(curve: Sequence[float], steady_p50: float, band: float = STEADY_BAND) -> int | None:
    """First item (1-based) from which the rolling median stays within ``band`` × the steady p50; None if never."""
    inside = rolling_median(curve) <= band * steady_p50
    for start in range(len(inside)):
        if inside[start:].all():
            return start + 1
    return None


def track1_warmup(records: Sequence[Record], out_dir: Path) -> Path | None:
    """How many items until steady state: one panel per case, from its first item after eviction.

    Thin: each item's latency (first pass, then warm-up); thick: the rolling median; dotted: the
    steady-state p50; shaded: the first (cold) pass; dashed line: where steady state starts.
    """
    rows = [r for r in rows_of(records, DATASET_TRACK) if r.metrics.get(m.WARMUP_MS) and r.metrics.get(m.P50_MS)]
    if not rows:
        return None
    columns = min(2, len(rows))
    lines = -(-len(rows) // columns)
    figure, axes = plt.subplots(lines, columns, figsize=(7 * columns, 2.6 * lines + 1.2), squeeze=False, sharey=True)
    for axis, record in zip(axes.flat, rows, strict=False):
        first = list(record.metrics.get(m.FIRST_PASS_CURVE_MS) or [])
        curve, steady = first + list(record.metrics[m.WARMUP_MS]), record.metrics[m.P50_MS]
        items = np.arange(1, len(curve) + 1)
        settles = steady_from(curve, steady)
        if first:
            cold = "cold pass" if record.metrics.get(m.EVICTION_VERIFIED) else "first pass (eviction not verified)"
            axis.axvspan(0.5, len(first) + 0.5, color="tab:blue", alpha=0.08, label=cold)
        axis.plot(items, curve, color="gray", alpha=0.5, linewidth=0.8, label="each item")
        axis.plot(
            items, rolling_median(curve), color="tab:red", linewidth=2, label=f"rolling median of {ROLLING_ITEMS}"
        )
        axis.axhline(steady, color="black", linestyle=":", linewidth=1, label="steady-state p50")
        calls = int(record.metrics.get(m.ITEMS_PER_CALL) or 1)
        unit = "item" if calls == 1 else "call"
        if settles:
            axis.axvline(
                settles, color="tab:green", linestyle="--", linewidth=1.5, label=f"steady from {unit} {settles}"
            )
        verdict = f"steady from {unit} {settles}" if settles else f"not steady within {len(curve)} {unit}s"
        flags = row_flags(record)
        if flags:
            axis.set_facecolor("#f0f0f0")
            verdict += f" [flagged: {', '.join(flags)}]"
        axis.set_title(f"{row_label(record)}{_per_call(record)}: {verdict}", fontsize=8)
        axis.set_yscale("log")
        axis.grid(alpha=0.3, which="both")
        axis.set_xlabel(
            "item number after the page cache was emptied"
            if calls == 1
            else f"call number after the page cache was emptied ({calls} items a call)",
            fontsize=8,
        )
        axis.set_ylabel("latency (ms, log)", fontsize=8)
    for axis in list(axes.flat)[len(rows) :]:
        axis.set_visible(False)
    handles, names = axes.flat[0].get_legend_handles_labels()
    names = ["steady state starts" if name.startswith("steady from") else name for name in names]
    if any(flagged(r) for r in rows):
        handles, names = [*handles, flagged_handle()], [*names, "grey panel: flagged row, not a measurement to quote"]
    axes.flat[0].legend(handles, names, loc="upper right", fontsize=6)
    figure.suptitle(
        f"Track 1 warm-up: items until the rolling median stays within {STEADY_BAND}x the steady p50 "
        "(lower and earlier is better)",
        fontsize=10,
    )
    return save_figure(figure, out_dir / "track1_warmup.png")
