"""A row's validity flags as every report reads them: the verdict, the tables and the figures alike.

Rows are judged once when read (:func:`judge_rows`): besides the flags a row was written with, a row
whose numbers cannot all be true is flagged ``impossible`` with its reasons, whether the contradiction
lies within the row (:func:`cropbench.harness.validity.contradictions`) or between rows of the same shape
(a Track 2 rate above the in-memory ceiling at the same loader shape).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Any

from cropbench import metrics as m
from cropbench.harness.validity import CEILING_TOLERANCE, IMPOSSIBLE, contradictions
from cropbench.records import Record


def stored_reasons(record: Record) -> list[str]:
    """The impossible reasons the row carries (written with it, or added by :func:`judge_rows`)."""
    reasons = record.metrics.get(m.IMPOSSIBLE_REASONS)
    return [str(reason) for reason in reasons] if isinstance(reasons, list) else []


def impossible_reasons(record: Record) -> list[str]:
    """Why the row's numbers cannot all be true: what it carries and what the row itself contradicts."""
    reasons = stored_reasons(record)
    stall = record.metrics.get(m.STALL_CROSSCHECK)
    negative = isinstance(stall, (int, float)) and not isinstance(stall, bool) and math.isfinite(stall) and stall < 0
    if record.track == "3" and negative:
        reasons.append(f"stall cross-check {stall:.1%} is negative")
    return list(dict.fromkeys([*reasons, *contradictions(record.track, record.metrics)]))


def row_flags(record: Record) -> list[str]:
    """The flags the row was written with, and ``impossible`` where :func:`impossible_reasons` finds any."""
    stored = record.metrics.get(m.VALIDITY_FLAGS)
    flags = [str(flag) for flag in stored] if isinstance(stored, list) else []
    if IMPOSSIBLE not in flags and impossible_reasons(record):
        flags.append(IMPOSSIBLE)
    return flags


def source(record: Record) -> str:
    """Where a Track 2 row's crops came from: ``plate`` or ``memory`` (held in memory: the ceiling)."""
    return str(record.config.get("source", "plate"))


def loader_shape(record: Record) -> tuple[int, int | None, str]:
    """A Track 2 row's worker count, batch size and collate."""
    loader = record.config.get("loader")
    loader = loader if isinstance(loader, dict) else {}
    workers, batch = loader.get("num_workers"), loader.get("batch_size")
    return (
        workers if isinstance(workers, int) else 0,
        batch if isinstance(batch, int) else None,
        str(loader.get("collate", "default")),
    )


def shape_label(workers: int, batch: int | None, collate: str) -> str:
    return f"w{workers}/b{batch}" + ("" if collate == "default" else f"/{collate}-collate")


def crop_dtype(record: Record) -> object:
    crop = record.config.get("crop")
    return crop.get("dtype") if isinstance(crop, dict) else None


def rate(record: Record, metric: str = m.SAMPLES_PER_S) -> float | None:
    """``metric`` of the row when it is a finite number at least 0; else None."""
    value = record.metrics.get(metric)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return float(value)
    return None


def memory_ceiling(record: Record, rows: Iterable[Record]) -> float | None:
    """The best samples/s of Track 2 crops already in memory at the row's loader shape (and its dtype,
    where any was measured): the workers' hand-over alone, which no row of that shape passes."""
    shape = loader_shape(record)
    same = [r for r in rows if r.track == "2" and source(r) == "memory" and loader_shape(r) == shape]
    same = [r for r in same if crop_dtype(r) == crop_dtype(record)] or same
    rates = [value for r in same if (value := rate(r)) is not None and not impossible_reasons(r)]
    return max(rates, default=None)


def _ceiling_reasons(record: Record, rows: Sequence[Record]) -> list[str]:
    """A Track 2 row read from the plate faster than crops already in memory at its shape."""
    if record.track != "2" or source(record) == "memory" or not loader_shape(record)[0]:
        return []
    value, ceiling = rate(record), memory_ceiling(record, rows)
    if value is None or not ceiling or value <= ceiling * (1.0 + CEILING_TOLERANCE):
        return []
    return [
        f"samples/s {value:,.0f} is {value / ceiling:.2f}x the in-memory ceiling at the same shape "
        f"{shape_label(*loader_shape(record))} ({ceiling:,.0f})"
    ]


def judge_rows(records: Iterable[Record]) -> list[Record]:
    """The rows with ``impossible`` and its reasons added wherever a row's numbers cannot all be true;
    rows with nothing to add are returned as they are. Judging judged rows changes nothing."""
    rows = list(records)
    judged = []
    for record in rows:
        reasons = list(dict.fromkeys([*impossible_reasons(record), *_ceiling_reasons(record, rows)]))
        if not reasons or (reasons == stored_reasons(record) and IMPOSSIBLE in row_flags(record)):
            judged.append(record)
            continue
        flags = row_flags(record)
        metrics: dict[str, Any] = {
            **record.metrics,
            m.VALIDITY_FLAGS: flags if IMPOSSIBLE in flags else [*flags, IMPOSSIBLE],
            m.IMPOSSIBLE_REASONS: reasons,
        }
        judged.append(dataclasses.replace(record, metrics=metrics))
    return judged


__all__ = [
    "IMPOSSIBLE",
    "crop_dtype",
    "impossible_reasons",
    "judge_rows",
    "loader_shape",
    "memory_ceiling",
    "rate",
    "row_flags",
    "shape_label",
    "source",
]
