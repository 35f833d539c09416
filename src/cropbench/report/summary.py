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
from cropbench.records import DATASET_TRACK, LOADER_TRACK, TRAINING_TRACK, Record
from cropbench.tracks import TRACKS

#: Columns shown per track: (header, metric key, format).
SUMMARY_COLUMNS: dict[str, Sequence[tuple[str, str, str]]] = {
    DATASET_TRACK: (
        ("samples/s", m.SAMPLES_PER_S, "{:,.0f}"),
        ("p50 ms", m.P50_MS, "{:.3f}"),
        ("p95 ms", m.P95_MS, "{:.3f}"),
        ("p99 ms", m.P99_MS, "{:.3f}"),
        ("cold p50 ms", m.COLD_P50_MS, "{:.3f}"),
        ("n", m.COUNT, "{}"),
        ("objects", m.OBJECTS, "{:,}"),
        ("flags", m.VALIDITY_FLAGS, "{}"),
    ),
    LOADER_TRACK: (
        ("samples/s", m.SAMPLES_PER_S, "{:,.0f}"),
        ("run/s", m.RUN_SAMPLES_PER_S, "{:,.0f}"),
        ("first ms", m.FIRST_BATCH_MS, "{:.1f}"),
        ("batch p50 ms", m.BATCH_P50_MS, "{:.2f}"),
        ("batch p95 ms", m.BATCH_P95_MS, "{:.2f}"),
        ("epoch2 first ms", m.EPOCH2_FIRST_BATCH_MS, "{:.1f}"),
        ("persist gain", m.PERSISTENT_EPOCH2_GAIN, "{:+.0%}"),
        ("collate ms", m.COLLATE_MS_MEAN, "{:.2f}"),
        ("worker USS MiB", m.WORKER_USS_MIB_MAX, "{:.0f}"),
        ("xcheck", m.CROSSCHECK_RATIO, "{:.3f}"),
        ("flags", m.VALIDITY_FLAGS, "{}"),
    ),
    TRAINING_TRACK: (
        ("images/s", m.IMAGES_PER_S, "{:,.0f}"),
        ("step p50 ms", m.STEP_P50_MS, "{:.1f}"),
        ("step p95 ms", m.STEP_P95_MS, "{:.1f}"),
        ("compute-only p50", m.COMPUTE_ONLY_STEP_P50_MS, "{:.1f}"),
        ("data wait", m.DATA_WAIT_FRACTION, "{:.1%}"),
        ("stall xcheck", m.STALL_CROSSCHECK, "{:.1%}"),
        ("loss", m.LOSS_LAST, "{:.3f}"),
        ("min workers", m.MIN_WORKERS_ANSWER, "{}"),
        ("flags", m.VALIDITY_FLAGS, "{}"),
    ),
    "layouts": (
        ("random/s", m.access_crops_per_s_key("random"), "{:,.0f}"),
        ("× memmap", m.ratio_to_memmap("random"), "{:.2f}"),
        ("grouped/s", m.access_crops_per_s_key("grouped"), "{:,.0f}"),
        ("× memmap", m.ratio_to_memmap("grouped"), "{:.2f}"),
        ("MiB", m.STORED_MIB, "{:,.1f}"),
        ("ratio", m.COMPRESSION_RATIO, "{:.2f}"),
        ("write s", m.WRITE_SECONDS, "{:.2f}"),
        ("decode amp", m.per_crop("random", m.DECODE_AMPLIFICATION), "{:.1f}"),
        ("chunks/crop", m.per_crop("random", m.CHUNKS_TOUCHED_PER_CROP), "{:.1f}"),
    ),
    "peers": (
        ("samples/s", m.SAMPLES_PER_S, "{:,.1f}"),
        ("× direct", m.RATIO_TO_DIRECT, "{:.4f}"),
        ("direct ÷", m.DIRECT_SPEEDUP, "{:,.1f}"),
        ("p50 ms", m.P50_MS, "{:.3f}"),
        ("p95 ms", m.P95_MS, "{:.3f}"),
        ("n", m.COUNT, "{}"),
        ("flags", m.VALIDITY_FLAGS, "{}"),
        ("skipped", m.SKIPPED, "{}"),
    ),
    "targets": (
        ("crops/s", m.CROPS_PER_S, "{:,.0f}"),
        ("ratio", m.RATIO_MEDIAN, "{:.3f}"),
        ("q1", m.RATIO_Q1, "{:.3f}"),
        ("q3", m.RATIO_Q3, "{:.3f}"),
        ("blocks", m.PAIRED_BLOCKS, "{}"),
        ("ceiling threads", m.CEILING_THREADS, "{}"),
        ("same bytes", m.IDENTICAL_TO_DIRECT, "{}"),
        ("flags", m.VALIDITY_FLAGS, "{}"),
    ),
    "remote": (
        ("samples/s", m.SAMPLES_PER_S, "{:,.1f}"),
        ("× local", m.RATIO_TO_LOCAL, "{:.3f}"),
        ("req/crop", m.REQUESTS_PER_CROP, "{:.2f}"),
        ("bytes/crop", m.BYTES_TRANSFERRED_PER_CROP, "{:,.0f}"),
        ("latency ms", m.INJECTED_LATENCY_MS, "{:g}"),
        ("in flight", m.IN_FLIGHT, "{}"),
    ),
    "store-layouts": (
        ("MiB", m.STORED_MIB, "{:,.1f}"),
        *(
            column
            for path, prefix in (("direct", m.DIRECT_), ("zarr", m.ZARR_))
            for column in (
                (f"{path} req/crop", m.prefixed(prefix, m.REQUESTS_PER_CROP), "{:.2f}"),
                (f"{path}/s", m.prefixed(prefix, m.SAMPLES_PER_S), "{:,.1f}"),
                (f"{path} local/s", m.prefixed(prefix, m.LOCAL_SAMPLES_PER_S), "{:,.1f}"),
            )
        ),
        ("latency ms", m.INJECTED_LATENCY_MS, "{:g}"),
    ),
}


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
        columns = SUMMARY_COLUMNS.get(track, ())
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
