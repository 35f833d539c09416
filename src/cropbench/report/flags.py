"""A row's validity flags as every report reads them: the verdict, the tables and the figures alike."""

from __future__ import annotations

import math

from cropbench import metrics as m
from cropbench.records import Record

#: The flag of a row holding numbers that contradict each other (see cropbench.tracks.validity).
IMPOSSIBLE = "impossible"


def row_flags(record: Record) -> list[str]:
    """The flags the row was written with, and ``impossible`` for a Track 3 row whose stall reads
    negative (rows written before such rows were flagged when measured)."""
    flags = list(record.metrics.get(m.VALIDITY_FLAGS) or ())
    stall = record.metrics.get(m.STALL_CROSSCHECK)
    negative = isinstance(stall, (int, float)) and not isinstance(stall, bool) and math.isfinite(stall) and stall < 0
    if record.track == "3" and negative and IMPOSSIBLE not in flags:
        flags.append(IMPOSSIBLE)
    return flags


__all__ = ["IMPOSSIBLE", "row_flags"]
