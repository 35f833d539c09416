"""Validity flags: what a reader of a row must know before quoting its numbers, the same on every track.

A row carries the names of the flags that apply (``validity_flags``); the summary table prints them
and explains each under the table (:func:`flag_meaning`: in the row's track's own terms where the
track gives the flag a meaning of its own). A flagged row checks the wiring; it is not a measurement.
"""

from __future__ import annotations

import numpy as np

from cropbench import metrics as m
from cropbench.config import CropConfig
from cropbench.formats import PlateReader
from cropbench.measure.protocol import TAIL_OBSERVATIONS, min_samples_for

#: samples/s (tight loop) and 1 / mean latency (timed loop) read the same items; beyond this
#: relative gap the two loops did not see the same conditions (cache state, collections, preemption).
RATE_AGREEMENT_TOLERANCE = 0.25
#: Track 3: a compute-only baseline this much longer than the whole loaded step (data wait
#: included) is not noise: the machine ran at another speed while one of the two was measured.
IMPOSSIBLE_TOLERANCE = 0.05
#: The flag of a row whose numbers contradict each other.
IMPOSSIBLE = "impossible"

#: Flag → what it means.
VALIDITY_FLAGS: dict[str, str] = {
    "cache>=plate": "the reader's cache holds the whole decoded plate: steady state measures cache hits",
    "re-reads": "more items drawn (cold + warm-up + steady) than the plate has objects: crops are read again",
    "not-evicted": "page-cache eviction not verified: no cold numbers (the first pass is kept as first_pass_*)",
    "rate!=1/mean": f"samples/s and 1 / mean latency differ by more than {RATE_AGREEMENT_TOLERANCE:.0%}",
    "few-samples": f"the p95 rests on fewer than {min_samples_for(0.95)} timings "
    f"(fewer than {TAIL_OBSERVATIONS} beyond it): a tail estimate from too few samples",
    IMPOSSIBLE: "two of the row's numbers contradict each other, so at least one of them is wrong",
}
#: Track → flag → what the flag means on that track's rows, where the track gives it a meaning of its own.
TRACK_FLAGS: dict[str, dict[str, str]] = {
    "3": {
        IMPOSSIBLE: f"the compute-only baseline, measured apart, took over {IMPOSSIBLE_TOLERANCE:.0%} longer than "
        "the whole loaded step: the machine's speed changed between the two (the stall uses the loop's own "
        "compute time)",
    },
    "targets": {
        IMPOSSIBLE: "the reader's median per-block ratio to the copy ceiling at its own thread count is above 1: "
        "the reader beat a ceiling no reader of the same crops can pass, so the ceiling or the timing is wrong",
    },
}


def flag_meaning(flag: str, track: str | None = None) -> str:
    """What ``flag`` means on a row of ``track``: the track's own meaning where it has one, else the general one."""
    return TRACK_FLAGS.get(track or "", {}).get(flag) or VALIDITY_FLAGS.get(flag, flag)


def decoded_plate_bytes(reader: PlateReader) -> int:
    """Bytes of every field of the plate once decoded."""
    metadata = reader.metadata
    return int(np.prod(metadata.field_shape)) * np.dtype(metadata.dtype).itemsize * len(metadata.fields)


def cache_fraction_of_plate(crop: CropConfig, reader: PlateReader | None) -> float | None:
    """Bytes the reader's own cache may hold over the decoded plate; None when it keeps no cache
    (``reader`` None: the crops come from elsewhere, e.g. held in memory)."""
    if reader is None:
        return None
    if crop.decode == "field":
        return crop.field_cache_fields / max(len(reader.metadata.fields), 1)
    if crop.decode == "direct" and reader.metadata.format != "memmap":
        return crop.chunk_cache_bytes / decoded_plate_bytes(reader)
    return None


def validity(
    crop: CropConfig,
    reader: PlateReader | None,
    items_drawn: int,
    objects: int,
    p95_reliable: bool,
    eviction_unverified: bool = False,
    rate_over_inverse_mean: float | None = None,
    impossible: bool = False,
) -> dict[str, object]:
    """The row's cache fraction and the names of the flags in :data:`VALIDITY_FLAGS` that apply.

    ``items_drawn`` counts every item the case reads (cold, warm-up and steady), ``objects`` those
    the plate holds; ``p95_reliable`` says whether the p95 the row reports rests on enough timings;
    ``impossible`` says that two of the row's numbers contradict each other (see :data:`TRACK_FLAGS`).
    """
    fraction = cache_fraction_of_plate(crop, reader)
    flags = {
        "cache>=plate": fraction is not None and fraction >= 1.0,
        "re-reads": items_drawn > objects,
        "not-evicted": eviction_unverified,
        "rate!=1/mean": rate_over_inverse_mean is not None
        and abs(rate_over_inverse_mean - 1.0) > RATE_AGREEMENT_TOLERANCE,
        "few-samples": not p95_reliable,
        IMPOSSIBLE: impossible,
    }
    return {
        m.CACHE_FRACTION_OF_PLATE: fraction,
        m.VALIDITY_FLAGS: [name for name, raised in flags.items() if raised],
    }
