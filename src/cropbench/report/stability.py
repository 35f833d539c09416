"""Repeats: median, a confidence interval, and warnings when a number is not stable enough to use.

A configuration repeated with fresh seeds gives one row per repeat (``Record.repeat``). The
summary reports the median with a seeded bootstrap 95 % interval, the coefficient of variation,
and warns when CV exceeds 5 % or when a tail percentile rests on too few samples.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cropbench import metrics as m
from cropbench.harness.flags import IMPOSSIBLE, row_flags
from cropbench.records import Record

CV_LIMIT = 0.05
BOOTSTRAP_RESAMPLES = 2000


@dataclass(frozen=True)
class RepeatSummary:
    """One configuration's metric over its repeats."""

    track: str
    case: str
    metric: str
    repeats: int
    median: float
    ci_low: float
    ci_high: float
    cv: float
    warnings: tuple[str, ...]


def bootstrap_median_interval(values: Sequence[float], seed: int = 0) -> tuple[float, float]:
    """Seeded percentile-bootstrap 95 % interval of the median."""
    data = np.asarray(values, dtype=np.float64)
    if data.size < 2:
        return float(data[0]), float(data[0])
    rng = np.random.default_rng(seed)
    medians = np.median(rng.choice(data, size=(BOOTSTRAP_RESAMPLES, data.size), replace=True), axis=1)
    low, high = np.percentile(medians, [2.5, 97.5])
    return float(low), float(high)


def summarise_repeats(
    records: Iterable[Record],
    metric: str = m.SAMPLES_PER_S,
    cv_limit: float = CV_LIMIT,
) -> list[RepeatSummary]:
    """Group records by (track, case identity) and summarise ``metric`` over the repeats.

    The identity (``Record.case_id``) holds the config, plate and layout, so repeats measured on
    different plates never pool; rows written before it existed fall back to the label.
    """
    groups: dict[tuple[str, str], list[Record]] = {}
    for record in records:
        if metric in record.metrics and record.metrics[metric] is not None:
            groups.setdefault((record.track, record.case_id or f"label:{record.case}"), []).append(record)
    summaries = []
    for (track, _), every in groups.items():
        case = every[0].case
        # A value that is not a finite number (text, NaN, infinity) is no measurement: left out, and said.
        rows = [r for r in every if _finite(r.metrics[metric]) is not None]
        if not rows:
            continue
        values = [float(r.metrics[metric]) for r in rows]
        mean = float(np.mean(values))
        cv = float(np.std(values, ddof=1) / mean) if len(values) > 1 and mean else 0.0
        warnings = []
        if len(rows) < len(every):
            warnings.append(f"{len(every) - len(rows)} row(s) not a finite number left out")
        impossible = sum(IMPOSSIBLE in row_flags(r) for r in rows)
        if impossible:
            warnings.append(f"{impossible} impossible row(s)")
        if cv > cv_limit:
            warnings.append(f"CV {cv:.1%} > {cv_limit:.0%}")
        for tail, reliable in (("p95", m.P95_RELIABLE), ("p99", m.P99_RELIABLE)):
            if any(r.metrics.get(reliable) is False for r in rows):
                counts = sorted({int(_finite(r.metrics.get(m.COUNT)) or 0) for r in rows})
                warnings.append(f"{tail} rests on {counts[0]} samples")
        if len(values) < 3:
            warnings.append(f"only {len(values)} repeat(s)")
        low, high = bootstrap_median_interval(values)
        summaries.append(
            RepeatSummary(
                track=track,
                case=case,
                metric=metric,
                repeats=len(values),
                median=float(np.median(values)),
                ci_low=low,
                ci_high=high,
                cv=cv,
                warnings=tuple(warnings),
            )
        )
    return summaries


def _finite(value: Any) -> float | None:
    """``value`` when it is a finite number (not text, a bool, NaN or an infinity); else None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def numeric_metrics(records: Iterable[Record]) -> list[str]:
    """Names of the metrics that hold a number in at least one record, sorted."""
    return sorted(
        {
            key
            for r in records
            for key, value in r.metrics.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)
        }
    )


def format_repeat_summary(summaries: Sequence[RepeatSummary]) -> str:
    """A plain-text table: case, repeats, median [95 % CI], CV, warnings.

    With one repeat there is no interval and no spread to show: both columns print "-".
    """
    if not summaries:
        return "no row holds this metric"
    lines = [f"{'track/case':60s} {'n':>3s} {'median':>12s} {'95% CI':>25s} {'CV':>7s}  warnings"]
    for s in summaries:
        several = s.repeats > 1
        interval = f"[{s.ci_low:,.1f}, {s.ci_high:,.1f}]" if several else "-"
        cv = f"{s.cv:7.1%}" if several else f"{'-':>7s}"
        lines.append(
            f"{(s.track + ' ' + s.case)[:60]:60s} {s.repeats:3d} {s.median:12,.1f} {interval:>25s} "
            f"{cv}  {'; '.join(s.warnings)}"
        )
    return "\n".join(lines)
