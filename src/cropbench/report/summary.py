"""Plain-text summary tables of records, for the terminal.

Every row names its run (``run``) and carries its validity flags (``flags``), explained under the
table, so a number that measures cache hits or re-reads cannot pass for a measurement.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from cropbench.records import Record
from cropbench.tracks.track1 import VALIDITY_FLAGS

#: Columns shown per track: (header, metric key, format).
SUMMARY_COLUMNS: dict[str, Sequence[tuple[str, str, str]]] = {
    "1": (("samples/s", "samples_per_s", "{:,.0f}"), ("p50 ms", "p50_ms", "{:.3f}"),
          ("p95 ms", "p95_ms", "{:.3f}"), ("p99 ms", "p99_ms", "{:.3f}"), ("cold p50 ms", "cold_p50_ms", "{:.3f}"),
          ("n", "count", "{}"), ("objects", "objects", "{:,}"), ("flags", "validity_flags", "{}")),
    "2": (("samples/s", "samples_per_s", "{:,.0f}"), ("run/s", "run_samples_per_s", "{:,.0f}"),
          ("first ms", "first_batch_ms", "{:.1f}"), ("batch p50 ms", "batch_p50_ms", "{:.2f}"),
          ("batch p95 ms", "batch_p95_ms", "{:.2f}"), ("epoch2 first ms", "epoch2_first_batch_ms", "{:.1f}"),
          ("persist gain", "persistent_epoch2_gain", "{:+.0%}"), ("collate ms", "collate_ms_mean", "{:.2f}"),
          ("worker USS MiB", "worker_uss_mib_max", "{:.0f}"), ("xcheck", "crosscheck_ratio", "{:.3f}")),
    "3": (("images/s", "images_per_s", "{:,.0f}"), ("step p50 ms", "step_p50_ms", "{:.1f}"),
          ("step p95 ms", "step_p95_ms", "{:.1f}"), ("compute-only p50", "compute_only_step_p50_ms", "{:.1f}"),
          ("data wait", "data_wait_fraction", "{:.1%}"), ("stall xcheck", "stall_crosscheck", "{:.1%}"),
          ("loss", "loss_last", "{:.3f}"), ("min workers", "min_workers_answer", "{}")),
    "layouts": (("random/s", "random_crops_per_s", "{:,.0f}"), ("× memmap", "random_ratio_to_memmap", "{:.2f}"),
                ("grouped/s", "grouped_crops_per_s", "{:,.0f}"), ("× memmap", "grouped_ratio_to_memmap", "{:.2f}"),
                ("MiB", "stored_mib", "{:,.1f}"), ("ratio", "compression_ratio", "{:.2f}"),
                ("write s", "write_seconds", "{:.2f}"), ("decode amp", "random_decode_amplification", "{:.1f}"),
                ("chunks/crop", "random_chunks_touched_per_crop", "{:.1f}")),
    "peers": (("samples/s", "samples_per_s", "{:,.1f}"), ("× direct", "ratio_to_direct", "{:.4f}"),
              ("direct ÷", "direct_speedup", "{:,.1f}"), ("p50 ms", "p50_ms", "{:.3f}"), ("p95 ms", "p95_ms", "{:.3f}"),
              ("n", "count", "{}"), ("skipped", "skip_reason", "{}")),
}


def summary_table(records: Iterable[Record]) -> str:
    """One block per track: a row per case with its run id, the track's headline metrics and flags."""
    by_track: dict[str, list[Record]] = {}
    for record in records:
        by_track.setdefault(record.track, []).append(record)
    blocks = []
    for track, rows in sorted(by_track.items()):
        columns = SUMMARY_COLUMNS.get(track, ())
        header = [f"track {track} case", "run", *(title for title, _, _ in columns)]
        body = [
            [row.case + (f" #{row.repeat}" if row.repeat else ""), row.run_id,
             *(_format(row.metrics.get(key), fmt) for _, key, fmt in columns)]
            for row in rows
        ]
        widths = [max(len(str(line[i])) for line in [header, *body]) for i in range(len(header))]
        lines = ["  ".join(str(cell).ljust(w) if i == 0 else str(cell).rjust(w)
                           for i, (cell, w) in enumerate(zip(line, widths, strict=True)))
                 for line in [header, *body]]
        lines.insert(1, "-" * len(lines[0]))
        lines += flag_legend(rows)
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def flag_legend(rows: Sequence[Record]) -> list[str]:
    """One line per validity flag raised in ``rows``, saying what it means; nothing when none is."""
    raised = {flag for row in rows for flag in row.metrics.get("validity_flags") or ()}
    if not raised:
        return []
    lines = ["flags (a flagged row checks the wiring; it is not a measurement to quote):"]
    lines += [f"  {flag}: {VALIDITY_FLAGS.get(flag, flag)}" for flag in sorted(raised)]
    return lines


def _format(value: object, fmt: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ",".join(str(item) for item in value) or "ok"
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)
