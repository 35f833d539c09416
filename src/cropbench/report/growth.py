"""How each cost of the scale sweep grows with the object count: a least-squares exponent per cost on
log-log axes, the costs that grow faster than expected (construction and memory linearly, per-sample
costs not at all), and the growth table that names them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cropbench import metrics as m

#: A cost is named when its fitted exponent exceeds what is expected by more than this.
GROWTH_TOLERANCE = 0.15


@dataclass(frozen=True)
class Cost:
    """A cost the growth table follows: its metric, how it turns into a cost (rates are inverted),
    and the exponent of the object count it should grow with."""

    metric: str
    title: str
    expected: float
    inverse: bool = False


#: Costs fitted against the object count: total costs grow linearly, per-sample costs stay flat.
COSTS = (
    Cost(m.CONSTRUCTION_SECONDS, "dataset construction (s)", 1.0),
    Cost(m.CONSTRUCTION_RSS_BYTES, "dataset memory (bytes)", 1.0),
    Cost(m.GROUP_KEYS_NS_PER_SAMPLE, "field grouping per sample", 0.0),
    Cost(m.RANDOM_ORDER_NS_PER_SAMPLE, "random sampler per sample", 0.0),
    Cost(m.GROUPED_ORDER_NS_PER_SAMPLE, "grouped sampler per sample", 0.0),
    Cost(m.TRACK1_RANDOM_SAMPLES_PER_S, "Track 1 random, time per sample", 0.0, inverse=True),
    Cost(m.TRACK1_GROUPED_SAMPLES_PER_S, "Track 1 grouped, time per sample", 0.0, inverse=True),
    Cost(m.TRACK2_FIRST_BATCH_MS, "Track 2 first batch", 0.0),
)


@dataclass(frozen=True)
class Growth:
    """A cost's fitted exponent of the object count, against the one expected."""

    cost: Cost
    exponent: float

    @property
    def faster_than_expected(self) -> bool:
        return self.exponent > self.cost.expected + GROWTH_TOLERANCE

    def describe(self) -> str:
        return f"{self.cost.title} grows as N^{self.exponent:.2f} (expected N^{self.cost.expected:g})"


def growth(rows: Sequence[dict[str, Any]]) -> list[Growth]:
    """Each cost's least-squares exponent on log-log axes over the rows that have it (two counts at least)."""
    fitted = []
    for cost in COSTS:
        points = [
            (float(row[m.OBJECTS]), float(row[cost.metric]))
            for row in rows
            if isinstance(row.get(cost.metric), (int, float)) and row[cost.metric] > 0 and row.get(m.OBJECTS)
        ]
        if len({n for n, _ in points}) < 2:
            continue
        counts = np.log([n for n, _ in points])
        values = np.log([1.0 / v if cost.inverse else v for _, v in points])
        slope = float(np.polyfit(counts, values, 1)[0])
        fitted.append(Growth(cost, slope))
    return fitted


def faster_than_linear(rows: Sequence[dict[str, Any]]) -> list[Growth]:
    """The costs whose growth exceeds what is expected (the total work then grows faster than linearly)."""
    return [item for item in growth(rows) if item.faster_than_expected]


def growth_table(rows: Sequence[dict[str, Any]]) -> str:
    """The growth table as Markdown, then the costs that grow faster than expected, named."""
    header = (
        "| objects | fields | construction s | MB RAM | bytes/object (marginal) | random order ns/sample | "
        "Track 1 random samples/s | Track 1 grouped samples/s | Track 2 first batch ms | plate cached |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    previous: dict[str, Any] | None = None
    for row in sorted(rows, key=lambda r: r[m.OBJECTS]):
        lines.append(
            "| "
            + " | ".join(
                [
                    f"{row[m.OBJECTS]:,}",
                    f"{row.get(m.FIELDS, 0):,}",
                    _number(row.get(m.CONSTRUCTION_SECONDS), 3),
                    _number(_mb(row.get(m.CONSTRUCTION_RSS_BYTES)), 1),
                    _number(_marginal_bytes(previous, row), 0),
                    _number(row.get(m.RANDOM_ORDER_NS_PER_SAMPLE), 1),
                    _number(row.get(m.TRACK1_RANDOM_SAMPLES_PER_S), 0),
                    _number(row.get(m.TRACK1_GROUPED_SAMPLES_PER_S), 0),
                    _number(row.get(m.TRACK2_FIRST_BATCH_MS), 0),
                    _number(row.get(m.RESIDENT_FRACTION), 2),
                ]
            )
            + " |"
        )
        previous = row
    named = faster_than_linear(rows)
    lines.append("")
    if not named:
        lines.append("No cost grows faster than expected over these counts.")
    for item in named:
        lines.append(f"Grows faster than expected: {item.describe()}.")
    return "\n".join(lines)


def _marginal_bytes(previous: dict[str, Any] | None, row: dict[str, Any]) -> float | None:
    """Memory per object added since the previous count: what an object costs, without the fixed costs
    (imports, plate metadata) that dominate a small plate's bytes per object."""
    if previous is None or previous.get(m.CONSTRUCTION_RSS_BYTES) is None or row.get(m.CONSTRUCTION_RSS_BYTES) is None:
        return None
    added = row[m.OBJECTS] - previous[m.OBJECTS]
    return (row[m.CONSTRUCTION_RSS_BYTES] - previous[m.CONSTRUCTION_RSS_BYTES]) / added if added else None


def _mb(value: Any) -> float | None:
    return None if value is None else value / 1e6


def _number(value: Any, digits: int) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:,.{digits}f}"
