"""Tables of the comparison tracks, printed and written beside their rows: one function per track
(the scale sweep's growth table is in :mod:`cropbench.report.growth`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cropbench import metrics as m
from cropbench.harness.flags import row_flags
from cropbench.harness.validity import CACHE_HOLDS_PLATE_FLAG, IMPOSSIBLE, LIBRARY_CACHE_FLAG
from cropbench.measure.remote import READ_PATHS
from cropbench.measure.store_emulation import SERVER_BOUND_FLAG
from cropbench.records import Record


def formats_table(records: Sequence[Record]) -> str:
    """The ``formats`` rows as a table: conversion cost, size, random and shuffled crops/s, break-even
    (from whole epochs), and the flags each row was written with."""
    header = (
        f"{'reader':<16} {'convert s':>9} {'+peak MiB':>9} {'MiB':>8} {'x plate':>7} {'random/s':>9} "
        f"{'random x':>8} {'epoch/s':>9} {'whole/s':>9} {'epoch x':>7} {'1st batch ms':>12} {'break-even':>10} "
        f"{'in turns':>8} same flags"
    )
    lines = [
        "convert or read in place (random: Track 1 protocol; epoch: shuffled, Track 2 protocol, steady; whole: "
        "whole epochs, first batch included, what break-even reads; x: against ome-zarr/direct, read in turns)",
        header,
    ]
    runs = {record.config.get("comparison", {}).get("in_place_run", 1) for record in records}
    if runs != {1}:
        lines.insert(
            1,
            f"in place: epochs shuffled in runs of {'/'.join(map(str, sorted(runs)))} consecutive objects (one "
            "request a run on a plate with a crop atlas); the converted formats shuffle as their libraries do",
        )

    def cell(value: Any, width: int, spec: str) -> str:
        return f"{value:{width}{spec}}" if isinstance(value, (int, float)) and value is not None else f"{'-':>{width}}"

    def epochs(row: dict[str, Any], prefix: str, width: int) -> str:
        pays_off = m.prefixed(prefix, m.CONVERTING_PAYS_OFF)
        if pays_off in row and not row[pays_off]:
            return f"{'never':>{width}}"
        return cell(row.get(m.prefixed(prefix, m.BREAK_EVEN_EPOCHS)), width, ".1f")

    for record in records:
        row = record.metrics
        if row.get(m.SKIPPED):
            lines.append(f"{record.case:<16} skipped: {row.get(m.SKIP_REASON, '')}")
            continue
        growth = row.get(m.CONVERSION_PEAK_RSS_GROWTH_BYTES)
        lines.append(
            " ".join(
                [
                    f"{record.case:<16}",
                    cell(row.get(m.CONVERSION_SECONDS), 9, ".2f"),
                    cell(growth / 2**20 if growth is not None else None, 9, ".0f"),
                    cell(row.get(m.STORED_MIB), 8, ".1f"),
                    cell(row.get(m.SIZE_RATIO_TO_PLATE), 7, ".2f"),
                    cell(row.get(m.prefixed(m.RANDOM, m.SAMPLES_PER_S)), 9, ".0f"),
                    cell(row.get(m.RANDOM_RATIO_TO_IN_PLACE), 8, ".2f"),
                    cell(row.get(m.prefixed(m.SHUFFLED, m.SAMPLES_PER_S)), 9, ".0f"),
                    cell(row.get(m.prefixed(m.SHUFFLED, m.EPOCH_SAMPLES_PER_S)), 9, ".0f"),
                    cell(row.get(m.EPOCH_RATIO_TO_IN_PLACE), 7, ".2f"),
                    cell(row.get(m.prefixed(m.SHUFFLED, m.FIRST_BATCH_MS)), 12, ".1f"),
                    epochs(row, "", 10),
                    epochs(row, m.INTERLEAVED, 8),
                    "yes " if row.get(m.IDENTICAL_TO_PLATE) else "NO  ",
                    ",".join(row_flags(record)) or "ok",
                ]
            )
        )
    remote = [
        r for r in records if m.REMOTE_SKIP_REASON in r.metrics or m.prefixed(m.REMOTE, m.SAMPLES_PER_S) in r.metrics
    ]
    if remote:
        latency = next((r.metrics[m.INJECTED_LATENCY_MS] for r in remote if m.INJECTED_LATENCY_MS in r.metrics), None)
        at = f" at {latency:g} ms median first-byte latency" if latency is not None else ""
        lines.append(f"over the emulated object store{at}")
        lines.append(
            f"{'reader':<16} {'epoch/s':>9} {'whole/s':>9} {'1st batch ms':>12} {'req/crop':>8} {'KiB/crop':>8} "
            f"{'server':>6} {'cache MiB':>9} {'break-even':>10}"
        )
        for record in remote:
            row = record.metrics
            if m.REMOTE_SKIP_REASON in row:
                lines.append(f"{record.case:<16} not read: {row[m.REMOTE_SKIP_REASON]}")
                continue
            cells = [
                cell(row[m.prefixed(m.REMOTE, m.SAMPLES_PER_S)], 9, ".0f"),
                cell(row.get(m.prefixed(m.REMOTE, m.EPOCH_SAMPLES_PER_S)), 9, ".0f"),
                cell(row[m.prefixed(m.REMOTE, m.FIRST_BATCH_MS)], 12, ".1f"),
                cell(row[m.prefixed(m.REMOTE, m.REQUESTS_PER_CROP)], 8, ".3f"),
                cell(row[m.prefixed(m.REMOTE, m.BYTES_TRANSFERRED_PER_CROP)] / 1024, 8, ".1f"),
                f"{row[m.prefixed(m.REMOTE, m.SERVER_BUSY_SHARE)]:6.0%}",
                cell(row[m.REMOTE_CACHE_BYTES] / 2**20, 9, ".1f"),
                epochs(row, m.REMOTE, 10),
            ]
            if row[m.prefixed(m.REMOTE, m.SERVER_BOUND)]:
                cells.append(SERVER_BOUND_FLAG)
            if LIBRARY_CACHE_FLAG in row_flags(record):
                cells.append(f"{LIBRARY_CACHE_FLAG} ({row.get(m.LOCAL_CACHE_BYTES, 0) / 2**20:.1f} MiB after epoch 1)")
            lines.append(" ".join([f"{record.case:<16}", *cells]))
    return "\n".join(lines)


def layouts_table(records: Sequence[Record]) -> str:
    """The store-layouts rows as a table: requests per crop and crops/s (local, through the same chunk cache,
    in parentheses) per read path."""
    lines = [
        "layouts in the store (requests per random crop; crops/s at the injected latency, no workers: steady, "
        "and over the whole pass where the row has it)"
    ]
    reasons = {
        str(r.metrics[m.STORE_EMULATION_SKIP_REASON]) for r in records if m.STORE_EMULATION_SKIP_REASON in r.metrics
    }
    if reasons:
        lines.append(f"  behind the Python delay proxy, not the emulated store: {'; '.join(sorted(reasons))}")
    for record in records:
        row = record.metrics
        cells = [f"  {row[m.LAYOUT]:<22} {row[m.STORED_MIB]:7.1f} MiB"]
        for decode, key in READ_PATHS.items():
            requests, rate = row[m.prefixed(key, m.REQUESTS_PER_CROP)], row[m.prefixed(key, m.SAMPLES_PER_S)]
            local = row[m.prefixed(key, m.LOCAL_SAMPLES_PER_S)]
            cell = f"{decode} {requests:5.2f} req/crop {rate:7.1f}/s (local {local:7.1f}/s)"
            whole, local_whole = (
                row.get(m.prefixed(key, m.RUN_SAMPLES_PER_S)),
                row.get(m.prefixed(key, m.LOCAL_RUN_SAMPLES_PER_S)),
            )
            if whole is not None and local_whole is not None:
                cell += f" whole {whole:7.1f}/s (local {local_whole:7.1f}/s)"
            busy = row.get(m.prefixed(key, m.SERVER_BUSY_SHARE))
            if busy is not None:
                bound = f" {SERVER_BOUND_FLAG}" if row.get(m.prefixed(key, m.SERVER_BOUND)) else ""
                cell += f" server {busy:4.0%}{bound}"
            cells.append(cell)
        flags = row_flags(record)
        if CACHE_HOLDS_PLATE_FLAG in flags:
            cells.append(f"{CACHE_HOLDS_PLATE_FLAG}: the chunk cache (grown to read ahead) holds the plate")
        if IMPOSSIBLE in flags:
            cells.append(f"{IMPOSSIBLE}: " + "; ".join(map(str, row.get(m.IMPOSSIBLE_REASONS) or [])))
        lines.append("  ".join(cells))
    return "\n".join(lines)


def remote_table(records: Sequence[Record], busy: dict[int, tuple[float, bool]]) -> str:
    """Track remote's rows: requests per random crop and crops/s at the injected latency per store setting,
    with the server's busy share over each setting's stretch (``busy``, by the record's position)."""
    lines = ["requests per random crop (decoded-chunk cache off) and random crops/s at the injected latency"]
    for index, record in enumerate(records):
        row, store = record.metrics, record.config["store"]
        server = ""
        if index in busy:
            share, bound = busy[index]
            server = f" server {share:4.0%}" + (f" {SERVER_BOUND_FLAG}" if bound else "")
        lines.append(
            f"  {record.case:<16} in-flight {store['in_flight']:<3} {store['zarr_client']:<8} "
            f"{row[m.REQUESTS_PER_CROP]:6.2f} req/crop {row[m.SAMPLES_PER_S]:9.1f}/s "
            f"({row.get(m.RATIO_TO_LOCAL, float('nan')):.3f} of local){server}"
        )
    return "\n".join(lines)


def out_of_memory_table(rows: list[tuple[str, dict[str, Any]]]) -> str:
    """Layouts side by side as Markdown: limit, plate, device bytes per crop, crops/s inside the limit
    and in the page cache, and the load average each ran under."""
    lines = [
        "| layout | limit MiB | mechanism | plate GiB | × limit | device kB/crop | device/reader | "
        "crops/s limited | crops/s cached | loadavg limited | loadavg cached |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in rows:
        cells = [
            name,
            f"{row[m.MEMORY_LIMIT_BYTES] / 2**20:.0f}",
            str(row.get(m.MEMORY_LIMIT_MECHANISM, "-")),
            f"{row[m.PLATE_STORED_BYTES] / 2**30:.2f}",
            f"{row[m.PLATE_OVER_LIMIT]:.1f}",
            _fixed(row.get(m.DEVICE_BYTES_PER_CROP), 1e3, 1),
            _fixed(row.get(m.DEVICE_OVER_READER), 1, 2),
            _fixed(row.get(m.CROPS_PER_S), 1, 0),
            _fixed(row.get(m.prefixed(m.CACHED_, m.CROPS_PER_S)), 1, 0)
            if m.prefixed(m.CACHED_, m.CROPS_PER_S) in row
            else row.get(m.CACHED_SKIPPED, "-"),
            f"{row.get(m.LOADAVG_BEFORE, 0):.2f}-{row.get(m.LOADAVG_AFTER, 0):.2f}",
            f"{row[m.prefixed(m.CACHED_, m.LOADAVG_BEFORE)]:.2f}-{row[m.prefixed(m.CACHED_, m.LOADAVG_AFTER)]:.2f}"
            if m.prefixed(m.CACHED_, m.LOADAVG_BEFORE) in row
            else "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _fixed(value: Any, scale: float, digits: int) -> str:
    return "-" if value is None else f"{value / scale:,.{digits}f}"
