"""The ``compare-formats`` answer as files beside its rows: the table as text and one figure.

The figure has one row of bars per reader (the plate in place first, then each training format) and
one panel per question: what converting cost, how large the store is against the plate, random
crops/s (Track 1's protocol), shuffled-epoch crops/s on local disk and over the loopback store, and
the epochs after which converting pays for itself. Bars lie on linear axes from zero; a flagged row
is grey and hatched as in every cropbench figure; a reader without a bar in a panel says why in
words (skipped, no random access, never pays off, not read over the store).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from cropbench import metrics as m
from cropbench.errors import OutputError
from cropbench.records import Record
from cropbench.report.plots import axis_from_zero, flagged, flagged_handle, horizontal_bars
from cropbench.report.tables import formats_table
from cropbench.tracks import TRACKS

#: The files ``compare-formats`` writes beside ``results.jsonl``.
TABLE_NAME = "formats.txt"
FIGURE_NAME = "formats.png"

LOCAL_COLOR = "tab:blue"
IN_TURNS_COLOR = "tab:cyan"
REMOTE_COLOR = "tab:orange"


@dataclass(frozen=True)
class Series:
    """One kind of bar in a panel: a metric per reader, drawn in one colour."""

    metric: str
    color: str
    label: str


@dataclass(frozen=True)
class Panel:
    """One question of the comparison: its title, its axis and the series that answer it."""

    title: str
    axis_label: str
    series: tuple[Series, ...]


PANELS = (
    Panel("conversion", "seconds to cut and write", (Series(m.CONVERSION_SECONDS, LOCAL_COLOR, "local disk"),)),
    Panel(
        "size", "stored bytes / the plate's (dotted: the plate)", (Series(m.SIZE_RATIO_TO_PLATE, LOCAL_COLOR, "local"),)
    ),
    Panel(
        "random access (Track 1)",
        "crops/s",
        (Series(m.prefixed(m.RANDOM, m.SAMPLES_PER_S), LOCAL_COLOR, "local disk"),),
    ),
    Panel(
        "shuffled epochs (Track 2)",
        "crops/s",
        (
            Series(m.prefixed(m.SHUFFLED, m.SAMPLES_PER_S), LOCAL_COLOR, "local disk"),
            Series(m.prefixed(m.REMOTE, m.SAMPLES_PER_S), REMOTE_COLOR, "over the emulated object store"),
        ),
    ),
    Panel(
        "break-even",
        "epochs until converting has paid off",
        (
            Series(m.BREAK_EVEN_EPOCHS, LOCAL_COLOR, "local disk"),
            Series(
                m.prefixed(m.INTERLEAVED, m.BREAK_EVEN_EPOCHS),
                IN_TURNS_COLOR,
                "local disk, converted and in place read in turns",
            ),
            Series(m.prefixed(m.REMOTE, m.BREAK_EVEN_EPOCHS), REMOTE_COLOR, "over the emulated object store"),
        ),
    ),
)


def _number(value: Any) -> float | None:
    """A finite number, or None (missing, a flag, NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def why_no_bar(record: Record, metric: str) -> str:
    """What a reader's empty place in a panel means, in a word or two."""
    row = record.metrics
    if row.get(m.SKIPPED):
        return "skipped"
    if metric.startswith(m.REMOTE) and m.REMOTE_SKIP_REASON in row:
        return "not read over the store"
    if metric.startswith(m.REMOTE) and m.prefixed(m.REMOTE, m.SAMPLES_PER_S) not in row:
        return "no store (--latency-ms)"
    if metric.endswith(m.BREAK_EVEN_EPOCHS):
        if record.case in m.IN_PLACE:
            return "reads in place"
        pays_off = metric.removesuffix(m.BREAK_EVEN_EPOCHS) + m.CONVERTING_PAYS_OFF
        return "never pays off" if row.get(pays_off) is False else "-"
    if metric in (m.CONVERSION_SECONDS, m.SIZE_RATIO_TO_PLATE) and record.case in m.IN_PLACE:
        return "reads in place"
    if metric.startswith(m.RANDOM):
        return "no random access"
    return "-"


def _label(record: Record, repeats: bool) -> str:
    return f"{record.case} #{record.repeat}" if repeats else record.case


def _measured(series: Series, record: Record) -> bool:
    """Whether the row has the series at all (a break-even series also by its pays-off answer)."""
    pays_off = series.metric.removesuffix(m.BREAK_EVEN_EPOCHS) + m.CONVERTING_PAYS_OFF
    return series.metric in record.metrics or (
        series.metric.endswith(m.BREAK_EVEN_EPOCHS) and pays_off in record.metrics
    )


def _panel(axis: plt.Axes, panel: Panel, rows: Sequence[Record], repeats: bool) -> tuple[Series, ...]:
    """Draw one panel; returns the series drawn (a series no row has, such as the remote one of a
    run without a store, is left out)."""
    marked = [flagged(r) for r in rows]
    drawn = tuple(s for s in panel.series if any(_measured(s, r) for r in rows)) or panel.series[:1]
    height = 0.8 / len(drawn)
    values: list[float] = []
    missing: list[list[tuple[str, float, str]]] = [[] for _ in rows]  # per reader: why no bar, where, colour
    for offset, series in enumerate(drawn):
        positions = [i - 0.4 + height * (offset + 0.5) for i in range(len(rows))]
        numbers = [_number(r.metrics.get(series.metric)) for r in rows]
        values.extend(v for v in numbers if v is not None)
        horizontal_bars(axis, positions, [v or 0.0 for v in numbers], series.color, marked, height=height)
        for row, (number, position, record) in enumerate(zip(numbers, positions, rows, strict=True)):
            reason = why_no_bar(record, series.metric) if number is None else "-"
            if reason != "-":  # "-": nothing to say (a row written without the metric)
                missing[row].append((reason, position, series.color))
    for row, why in enumerate(missing):
        reasons = {reason for reason, _, _ in why}
        if len(why) == len(drawn) and len(reasons) == 1:  # no bar at all, for one reason: said once
            axis.text(0, row, " " + reasons.pop(), va="center", fontsize=7, color="dimgray")
            continue
        for reason, position, color in why:  # each in its own series' place and colour
            small = len(drawn) > 1
            axis.text(
                0, position, " " + reason, va="center", fontsize=6 if small else 7, color=color if small else "dimgray"
            )
    if panel.series[0].metric == m.SIZE_RATIO_TO_PLATE:
        axis.axvline(1.0, color="black", linestyle=":", linewidth=1)
        values.append(1.0)
    axis_from_zero(axis, values, room=1.1)
    axis.set_yticks(range(len(rows)), [_label(r, repeats) for r in rows])
    axis.invert_yaxis()  # the in-place reference on top, as in the table
    axis.set_title(panel.title, fontsize=10)
    axis.set_xlabel(panel.axis_label, fontsize=8)
    axis.tick_params(labelsize=8)
    return drawn


def formats_figure(records: Sequence[Record], path: Path) -> Path | None:
    """The comparison's figure at ``path``; None when ``records`` hold no ``formats`` row."""
    rows = [r for r in records if r.track == TRACKS["formats"].name]
    if not rows:
        return None
    repeats = len({r.repeat for r in rows}) > 1
    latency = next((r.metrics[m.INJECTED_LATENCY_MS] for r in rows if m.INJECTED_LATENCY_MS in r.metrics), None)
    figure, axes = plt.subplots(2, 3, figsize=(15, 3.0 + 0.55 * len(rows)))
    drawn: dict[str, Series] = {}
    for axis, panel in zip(axes.flat, PANELS, strict=False):
        drawn.update({series.color: series for series in _panel(axis, panel, rows, repeats)})
    notes = axes.flat[-1]
    notes.axis("off")
    reasons = [
        f"{r.case}: {r.metrics[m.SKIP_REASON] if r.metrics.get(m.SKIPPED) else r.metrics[m.REMOTE_SKIP_REASON]}"
        for r in rows
        if r.metrics.get(m.SKIPPED) or (m.REMOTE_SKIP_REASON in r.metrics and r.case not in m.IN_PLACE)
    ]
    if reasons:
        text = "\n".join(textwrap.fill(reason, 70, subsequent_indent="  ") for reason in reasons)
        notes.text(0, 1, "not measured, and why:\n" + text, va="top", fontsize=7, wrap=True)
    at = f" ({latency:g} ms per request)" if latency is not None else ""
    handles = [
        Patch(color=series.color, label=series.label + (at if series.color == REMOTE_COLOR else ""))
        for series in drawn.values()
    ]
    if any(flagged(r) for r in rows):
        handles.append(flagged_handle())
    figure.legend(handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=len(handles))
    figure.suptitle("convert or read in place: each reader on the same crops (x: linear, from zero)", fontsize=11)
    figure.tight_layout()
    try:
        figure.savefig(path, dpi=110, bbox_inches="tight")
    except OSError as error:
        raise OutputError(f"cannot write the figure {path}: {error}") from error
    finally:
        plt.close(figure)
    return path


def write_formats_report(records: Sequence[Record], out_dir: str | Path) -> list[Path]:
    """The comparison's table (``formats.txt``) and figure (``formats.png``) in ``out_dir``; the paths written."""
    folder = Path(out_dir)
    table = folder / TABLE_NAME
    try:
        table.write_text(formats_table(records) + "\n")
    except OSError as error:
        raise OutputError(f"cannot write the table {table}: {error}") from error
    figure = formats_figure(records, folder / FIGURE_NAME)
    return [table, *([figure] if figure is not None else [])]


__all__ = ["FIGURE_NAME", "PANELS", "TABLE_NAME", "formats_figure", "why_no_bar", "write_formats_report"]
