"""The comparison figures: storage layouts side by side, and peer loaders beside cropbench's own paths."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from cropbench import metrics as m
from cropbench.config import CEILING_LAYOUT as MEMMAP_LAYOUT
from cropbench.harness.flags import flagged
from cropbench.records import Record
from cropbench.report.plots.drawing import axis_from_zero, flagged_handle, horizontal_bars, save_figure
from cropbench.report.plots.rows import row_label, rows_of
from cropbench.report.text import figure_label


def layouts_comparison(records: Sequence[Record], out_dir: Path) -> Path | None:
    """Per layout: random and grouped crops/s beside the memmap layout (the comparison's reference, read
    through the same dataset: not a ceiling, batched readers pass it), and size on disk."""
    rows = rows_of(records, "layouts")
    if not rows:
        return None
    labels = [row_label(r) for r in rows]
    positions = np.arange(len(rows))
    figure, (left, right) = plt.subplots(1, 2, figsize=(14, max(3.0, 0.34 * len(rows) + 1.5)), sharey=True)
    marked = [flagged(r) for r in rows]
    rates: list[float] = []
    for offset, (access, color) in enumerate((("random", "tab:blue"), ("grouped", "tab:orange"))):
        values = [r.metrics.get(m.access_crops_per_s_key(access), np.nan) for r in rows]
        rates += values
        horizontal_bars(
            left, positions + (offset - 0.5) * 0.4, values, color, marked, height=0.4, label=f"{access} crops/s"
        )
        reference = [
            r.metrics.get(m.access_crops_per_s_key(access))
            for r in rows
            if r.config.get("layout_name") == MEMMAP_LAYOUT
        ]
        if reference and reference[0]:
            left.axvline(reference[0], color=color, linestyle=":", linewidth=1)
    left.set_yticks(positions, labels, fontsize=8)
    left.invert_yaxis()
    left.set_xlabel("crops/s, one process, warm page cache; dotted: memmap, the comparison's reference")
    left.set_title("Crop throughput per layout (higher is better)")
    handles, _ = left.get_legend_handles_labels()
    left.legend(handles=[*handles, *([flagged_handle()] if any(marked) else [])], fontsize=8, loc="lower right")
    sizes = [r.metrics.get(m.STORED_BYTES, np.nan) / 2**20 for r in rows]
    horizontal_bars(right, positions, sizes, "tab:green", marked)
    raw = [float(r.metrics[m.RAW_BYTES]) for r in rows if r.metrics.get(m.RAW_BYTES)]
    if raw:
        right.axvline(raw[0] / 2**20, color="black", linestyle=":", linewidth=1, label="raw pixels")
        right.legend(fontsize=8, loc="lower right")
    right.set_xlabel("MiB on disk")
    right.set_title("Size on disk (lower is better)")
    axis_from_zero(left, rates)
    axis_from_zero(right, [*sizes, *(value / 2**20 for value in raw)])
    for axis in (left, right):
        axis.grid(axis="x", alpha=0.3)
    return save_figure(figure, out_dir / "layouts_comparison.png")


def peers_comparison(records: Sequence[Record], out_dir: Path) -> Path | None:
    """Peers next to cropbench's decode paths: samples/s on the same crops, one panel per plate.

    Bars are the median over repeats (dots: each repeat); "direct N× faster" is the median of the
    ratios measured within each run. Skipped peers are listed with the reason.
    """
    plates: dict[str, dict[str, list[Record]]] = {}
    for record in rows_of(records, "peers"):
        plate = f"{record.config.get('layout', '?')}: {Path(str(record.config.get('plate', '?'))).name}"
        plates.setdefault(plate, {}).setdefault(str(record.config.get("peer", record.case)), []).append(record)
    if not plates:
        return None
    height = sum(0.42 * len(loaders) + 1.2 for loaders in plates.values()) + 0.5
    figure, axes = plt.subplots(len(plates), 1, figsize=(12, max(3.5, height)), squeeze=False)
    for axis, (plate, loaders) in zip(axes[:, 0], plates.items(), strict=True):
        names = list(loaders)
        positions = np.arange(len(names))
        measured = {name: [r for r in rows if r.metrics.get(m.SAMPLES_PER_S)] for name, rows in loaders.items()}
        medians = np.array(
            [
                np.median([r.metrics[m.SAMPLES_PER_S] for r in measured[name]]) if measured[name] else np.nan
                for name in names
            ]
        )
        marked = [any(flagged(r) for r in loaders[name]) for name in names]
        colors = ["tab:blue" if loaders[name][0].config.get("kind") == "cropbench" else "tab:orange" for name in names]
        bars = horizontal_bars(axis, positions, np.nan_to_num(medians, nan=0.0), "tab:orange", marked)
        for bar, color, mark in zip(bars.patches, colors, marked, strict=True):
            if not mark:
                bar.set_facecolor(color)
        every = [r.metrics[m.SAMPLES_PER_S] for name in names for r in measured[name]]
        high = max(every, default=1.0)
        for position, name in zip(positions, names, strict=True):
            rates = [r.metrics[m.SAMPLES_PER_S] for r in measured[name]]
            if len(rates) > 1:
                axis.scatter(rates, [position] * len(rates), color="black", s=10, zorder=3)
        for position, name, rate in zip(positions, names, medians, strict=True):
            rows = measured[name]
            if not rows:
                reason = str(loaders[name][-1].metrics.get(m.SKIP_REASON, ""))
                axis.text(
                    0.01 * high,
                    position,
                    f"skipped: {figure_label(reason, 120)}",
                    va="center",
                    fontsize=7,
                    color="gray",
                )
                continue
            note = (f"{rate:,.0f}/s" if rate >= 10 else f"{rate:,.1f}/s") + f" (n={rows[-1].metrics.get(m.COUNT, '?')}"
            note += f", {len(rows)} runs)" if len(rows) > 1 else ")"
            speedups = [r.metrics[m.DIRECT_SPEEDUP] for r in rows if r.metrics.get(m.DIRECT_SPEEDUP)]
            if speedups and name != "cropbench-direct":
                speedup = float(np.median(speedups))
                note += f"  direct {speedup:,.1f}× faster" if speedup >= 1 else f"  {1 / speedup:,.2f}× direct"
            axis.text(
                max(rate, *(r.metrics[m.SAMPLES_PER_S] for r in rows)) + 0.01 * high,
                position,
                note,
                va="center",
                fontsize=8,
            )
        if "cropbench-direct" in names and np.isfinite(medians[names.index("cropbench-direct")]):
            axis.axvline(medians[names.index("cropbench-direct")], color="tab:blue", linestyle=":", linewidth=1)
        axis_from_zero(axis, every, room=1.6)
        if any(marked):
            axis.legend(handles=[flagged_handle()], fontsize=7, loc="lower right")
        axis.set_yticks(positions, [figure_label(name) for name in names], fontsize=8)
        axis.invert_yaxis()
        axis.grid(axis="x", alpha=0.3)
        size = loaders[names[0]][0].config.get("crop_size", "?")
        axis.set_title(
            f"{figure_label(plate)} — {figure_label(str(size))}px crops, all channels, random order (higher is better)",
            fontsize=9,
        )
        axis.set_xlabel(
            "samples/s, one process, warm page cache (bar: median, dots: repeats); blue: cropbench, "
            "orange: peers; dotted: cropbench direct",
            fontsize=8,
        )
    figure.suptitle("Peer loaders vs cropbench on the same plate and crops", fontsize=11)
    return save_figure(figure, out_dir / "peers_comparison.png")
