"""Plain-text summary tables of records, for the terminal.

Every row names its run (``run``) and carries its validity flags (``flags``), explained under the
table, so a number that measures cache hits or re-reads cannot pass for a measurement.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from cropbench import metrics as m
from cropbench.harness.flags import impossible_reasons, row_flags
from cropbench.harness.validity import flag_meaning
from cropbench.records import Record
from cropbench.report.tracks import report_of
from cropbench.tracks import TRACKS


def track_order(track: str) -> tuple[int, str]:
    """Where ``track``'s block goes: the order of :data:`~cropbench.tracks.TRACKS`, then other values by name."""
    order = list(TRACKS)
    return (order.index(track) if track in TRACKS else len(order), track)


def summary_table(records: Iterable[Record]) -> str:
    """One block per track: a row per case with its run id, the track's headline metrics and flags."""
    by_track: dict[str, list[Record]] = {}
    for record in records:
        by_track.setdefault(record.track, []).append(record)
    blocks = []
    for track, rows in sorted(by_track.items(), key=lambda item: track_order(item[0])):
        columns = report_of(track).columns
        header = [f"track {track} case", "run", *(title for title, _, _ in columns)]
        body = [
            [
                row.case + (f" #{row.repeat}" if row.repeat else ""),
                row.run_id,
                *(format_cell(cell_value(row, key), fmt) for _, key, fmt in columns),
            ]
            for row in rows
        ]
        widths = [max(len(str(line[i])) for line in [header, *body]) for i in range(len(header))]
        lines = [
            "  ".join(
                str(cell).ljust(w) if i == 0 else str(cell).rjust(w)
                for i, (cell, w) in enumerate(zip(line, widths, strict=True))
            )
            for line in [header, *body]
        ]
        lines.insert(1, "-" * len(lines[0]))
        lines += flag_legend(rows, track)
        lines += skip_legend(rows)
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def flag_legend(rows: Sequence[Record], track: str | None = None) -> list[str]:
    """One line per validity flag raised in ``rows`` (of ``track``), saying what it means on that track;
    nothing when none is raised."""
    raised = {flag for row in rows for flag in row_flags(row)}
    if not raised:
        return []
    lines = ["flags (a flagged row checks the wiring; it is not a measurement to quote):"]
    lines += [f"  {flag}: {flag_meaning(flag, track)}" for flag in sorted(raised)]
    lines += [f"    {label}: {reasons}" for label, reasons in impossible_rows(rows)]
    return lines


def skip_legend(rows: Sequence[Record]) -> list[str]:
    """Why each skipped row was skipped, under the table (a reason is a sentence: a column would widen
    every line of the table to the longest)."""
    skipped = [row for row in rows if row.metrics.get(m.SKIPPED)]
    if not skipped:
        return []
    return ["skipped (not measured here):"] + [f"  {row.case}: {row.metrics.get(m.SKIP_REASON, '')}" for row in skipped]


#: Impossible rows named with their reasons under a table; the rest are counted.
IMPOSSIBLE_NAMED = 10


def impossible_rows(rows: Sequence[Record]) -> list[tuple[str, str]]:
    """(label, reasons) of the impossible rows among ``rows``, the first :data:`IMPOSSIBLE_NAMED` of them,
    then how many more there are."""
    found = [
        (row.case + (f" #{row.repeat}" if row.repeat else ""), "; ".join(why))
        for row in rows
        if (why := impossible_reasons(row))
    ]
    more = len(found) - IMPOSSIBLE_NAMED
    return found[:IMPOSSIBLE_NAMED] + (
        [(f"{more} more impossible rows", "see impossible_reasons in each row")] if more > 0 else []
    )


def cell_value(row: Record, key: str) -> object:
    """The row's value of ``key``; its flags as :func:`row_flags` reads them (None in rows without any)."""
    if key == m.VALIDITY_FLAGS and m.VALIDITY_FLAGS in row.metrics:
        return row_flags(row)
    if key == m.SKIPPED:
        return "yes" if row.metrics.get(m.SKIPPED) else None
    for tail, reliable in ((m.P95_MS, m.P95_RELIABLE), (m.P99_MS, m.P99_RELIABLE)):
        if key.endswith(tail) and row.metrics.get(key.removesuffix(tail) + reliable) is False:
            return None  # a tail on too few timings is not shown (the row keeps it, with its *_reliable)
    return row.metrics.get(key)


def format_cell(value: object, fmt: str) -> str:
    """A table cell: ``-`` for a missing value, a list (of flags) comma-joined or ``ok`` when empty."""
    if value is None:
        return "-"
    if isinstance(value, list):
        return ",".join(str(item) for item in value) or "ok"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} (not a number to quote)"
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)
