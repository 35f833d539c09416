"""A row's validity flags, decided once, by the runner, as the row is written; every output reads them.

The track sets the flags it can tell from its own case (:func:`cropbench.harness.validity.validity`);
the runner adds ``impossible`` with its reasons where the row's numbers cannot all be true, within the
row (:func:`~cropbench.harness.validity.contradictions`) or against rows of the same run measured before
it: a Track 2 row read from the plate faster than crops already in memory at the same loader shape
(:func:`ceiling_reasons`). When the run's rows are all in, each row is decided once more against every
row of the run (:func:`decide_run`), so a ceiling measured after a row counts too, and the rows whose
flags changed are rewritten in the results file before any table, page or verdict is made.
The terminal table, results.jsonl, the CSV, report.html and the verdict read the stored flags
(:func:`row_flags`); none decides a flag of its own.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

from cropbench import metrics as m
from cropbench.harness.validity import CEILING_TOLERANCE, IMPOSSIBLE, contradictions, with_impossible
from cropbench.records import LOADER_TRACK, Record


def row_flags(record: Record) -> list[str]:
    """The validity flags the row was written with (none in a row written without any)."""
    stored = record.metrics.get(m.VALIDITY_FLAGS)
    return [str(flag) for flag in stored] if isinstance(stored, list) else []


def flagged(record: Record) -> bool:
    """Whether the row carries any validity flag: then no answer (best, fastest, fewest) rests on it."""
    return bool(row_flags(record))


def impossible_reasons(record: Record) -> list[str]:
    """Why the row was flagged ``impossible``, as written with it (empty when it was not)."""
    reasons = record.metrics.get(m.IMPOSSIBLE_REASONS)
    if IMPOSSIBLE not in row_flags(record) or not isinstance(reasons, list):
        return []
    return [str(reason) for reason in reasons]


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
    where any was measured) among ``rows`` not flagged ``impossible``: the workers' hand-over alone,
    which no row of that shape passes."""
    shape = loader_shape(record)
    same = [r for r in rows if r.track == LOADER_TRACK and source(r) == "memory" and loader_shape(r) == shape]
    same = [r for r in same if crop_dtype(r) == crop_dtype(record)] or same
    rates = [value for r in same if (value := rate(r)) is not None and IMPOSSIBLE not in row_flags(r)]
    return max(rates, default=None)


def ceiling_reasons(record: Record, rows: Iterable[Record]) -> list[str]:
    """A Track 2 row read from the plate faster than crops already in memory at its shape among ``rows``."""
    if record.track != LOADER_TRACK or source(record) == "memory" or not loader_shape(record)[0]:
        return []
    value, ceiling = rate(record), memory_ceiling(record, rows)
    if value is None or not ceiling or value <= ceiling * (1.0 + CEILING_TOLERANCE):
        return []
    return [
        f"samples/s {value:,.0f} is {value / ceiling:.2f}x the in-memory ceiling at the same shape "
        f"{shape_label(*loader_shape(record))} ({ceiling:,.0f})"
    ]


def decide(record: Record, rows: Iterable[Record] = ()) -> Record:
    """``record`` as the track wrote it, with its flags decided: those its track set, and ``impossible``
    with its reasons (any the track gave first) where its numbers contradict each other or a ceiling
    among ``rows`` (the run's rows measured so far, or all of them)."""
    reasons = [*contradictions(record.track, record.metrics), *ceiling_reasons(record, rows)]
    metrics = with_impossible(record.metrics, reasons)
    return record if metrics is record.metrics else dataclasses.replace(record, metrics=metrics)


def decide_run(measured: Sequence[Record], earlier: Sequence[Record] = ()) -> list[Record]:
    """The run's rows as the track wrote them (``measured``, in order), each decided against every row of
    the run: ``earlier`` (rows of the results file a resumed run continues) and all of ``measured``."""
    everything = [*earlier, *measured]
    return [decide(record, everything) for record in measured]


__all__ = [
    "IMPOSSIBLE",
    "ceiling_reasons",
    "crop_dtype",
    "decide",
    "decide_run",
    "flagged",
    "impossible_reasons",
    "loader_shape",
    "memory_ceiling",
    "rate",
    "row_flags",
    "shape_label",
    "source",
]
