"""Validity flags: what a reader of a row must know before quoting its numbers, the same on every track.

A row carries the names of the flags that apply (``validity_flags``); the summary table prints them
and explains each under the table (:func:`flag_meaning`: in the row's track's own terms where the
track gives the flag a meaning of its own). A flagged row checks the wiring; it is not a measurement.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cropbench import metrics as m
from cropbench.config import CropConfig
from cropbench.formats import PlateReader
from cropbench.measure.protocol import TAIL_OBSERVATIONS, min_samples_for
from cropbench.measure.store_emulation import SERVER_BOUND_FLAG
from cropbench.records import LOADER_TRACK, TRAINING_TRACK

#: samples/s (tight loop) and 1 / mean latency (timed loop) read the same items; beyond this
#: relative gap the two loops did not see the same conditions (cache state, collections, preemption).
RATE_AGREEMENT_TOLERANCE = 0.25
#: Track 3: a compute-only baseline this much longer than the whole loaded step (data wait
#: included) is not noise: the machine ran at another speed while one of the two was measured.
IMPOSSIBLE_TOLERANCE = 0.05
#: The flag of a row whose numbers contradict each other.
IMPOSSIBLE = "impossible"
#: Track 3: a loaded step's p50 this much below the compute-only p50 (the same compute on batches
#: already on the device) is not noise; the medians of the same compute agree closer than that.
STEP_BELOW_COMPUTE_TOLERANCE = 0.005
#: Track 3: the data-wait fraction (timed around next()) and its cross-check (the step time compute
#: alone does not explain) measure the same stall; beyond this gap (a share of the step) they disagree.
WAIT_AGREEMENT_TOLERANCE = 0.05
#: The per-item clocks of the timed loop cannot make it faster than the loop without them: a harness
#: overhead below minus this means the two loops did not read under the same conditions.
HARNESS_OVERHEAD_TOLERANCE = 0.05
#: A rate over a ceiling or reference measured in the same run, at the same shape, beyond this
#: share above 1: the rate passed what bounds it.
CEILING_TOLERANCE = 0.05
#: No reader in one machine delivers more items (crops, images, requests) per second than this.
PLAUSIBLE_RATE_LIMIT = 1e9
#: Suffixes of rate metrics (items per second) and of the latency summaries (p50 <= p95 <= p99).
RATE_SUFFIX = "_per_s"
PERCENTILES = (m.P50_MS, m.P95_MS, m.P99_MS)

#: Timed batches (Track 2) or steps (Track 3) a rate rests on at the least before it is quoted. Their
#: headline is the rate; their batch or step p95 needs ``min_samples_for(0.95)`` timings and is shown
#: only where it has them (the row's ``*_p95_reliable`` says whether).
MIN_RATE_TIMINGS = 16


def enough_rate_timings(count: object) -> bool:
    """Whether a Track 2 or 3 rate rests on at least :data:`MIN_RATE_TIMINGS` timed batches or steps."""
    return isinstance(count, int) and not isinstance(count, bool) and count >= MIN_RATE_TIMINGS


#: The flag of a row whose reader's cache holds the whole decoded plate.
CACHE_HOLDS_PLATE_FLAG = "cache>=plate"
#: The flag of a converted store's row whose later epochs over the store could be served from the
#: library's own local disk cache (WebDataset's, MDS's, litdata's cache folder).
LIBRARY_CACHE_FLAG = "library-cache"
#: Flag → what it means.
VALIDITY_FLAGS: dict[str, str] = {
    CACHE_HOLDS_PLATE_FLAG: "the reader's cache holds the whole decoded plate: steady state measures cache hits",
    "re-reads": "more items drawn (cold + warm-up + steady) than the plate has objects: crops are read again",
    "not-evicted": "page-cache eviction not verified: no cold numbers (the first pass is kept as first_pass_*)",
    "rate!=1/mean": f"samples/s and 1 / mean latency differ by more than {RATE_AGREEMENT_TOLERANCE:.0%}",
    "few-samples": f"the p95 rests on fewer than {min_samples_for(0.95)} timings "
    f"(fewer than {TAIL_OBSERVATIONS} beyond it): a tail estimate from too few samples",
    SERVER_BOUND_FLAG: "the emulated object store's server was busy (running or waiting for a core) half the "
    "time or more: the server, not the modelled network, limited the reader",
    IMPOSSIBLE: "two of the row's numbers contradict each other (or one cannot be true), so at least one of "
    "them is wrong; the row's impossible_reasons say which",
    LIBRARY_CACHE_FLAG: "the library kept the crops of the first epoch over the store in its own local cache "
    "(local_cache_bytes): later epochs read them from local disk, not the store, so the rates over the store "
    "are not those of reading the store each epoch",
}


def _number(value: Any) -> float | None:
    """``value`` as a float when it is a number (NaN and infinities too); None for anything else."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def contradictions(track: str, metrics: Mapping[str, Any]) -> list[str]:
    """Why the numbers of one row cannot all be true (empty when nothing contradicts), each in a few words.

    Rates are numbers, finite, at least 0 and below :data:`PLAUSIBLE_RATE_LIMIT`; latency percentiles are
    finite, at least 0 and ordered p50 <= p95 <= p99; the harness overhead is not negative beyond
    :data:`HARNESS_OVERHEAD_TOLERANCE`; Track 3's step is not faster than its compute alone and its two
    measures of the data wait agree (:data:`STEP_BELOW_COMPUTE_TOLERANCE`, :data:`WAIT_AGREEMENT_TOLERANCE`);
    a layout read over a store is not faster than on local disk (:data:`CEILING_TOLERANCE`).
    """
    reasons = []
    for key, value in metrics.items():
        if not key.endswith(RATE_SUFFIX) or value is None or isinstance(value, dict):
            continue
        # A list holds one rate per epoch, per worker count, per round: each is a rate.
        for rate in map(_number, value if isinstance(value, list) else [value]):
            if rate is None:
                reasons.append(f"{key} is not a number")
            elif not math.isfinite(rate) or rate < 0 or rate > PLAUSIBLE_RATE_LIMIT:
                reasons.append(f"{key} is {rate:g}")
            else:
                continue
            break
    for key in [key for key in metrics if key.endswith(m.P50_MS)]:
        family = key.removesuffix(m.P50_MS)
        values = [(name, _number(metrics.get(family + name))) for name in PERCENTILES if family + name in metrics]
        present = [(name, value) for name, value in values if value is not None]
        for name, value in present:
            if not math.isfinite(value) or value < 0:
                reasons.append(f"{family}{name} is {value:g}")
        for (low, below), (high, above) in zip(present, present[1:], strict=False):
            if math.isfinite(below) and math.isfinite(above) and above < below:
                reasons.append(f"{family}{high} {above:g} is below {family}{low} {below:g}")
    for key, value in metrics.items():
        overhead = _number(value) if key.endswith(m.HARNESS_OVERHEAD) else None
        if overhead is not None and overhead < -HARNESS_OVERHEAD_TOLERANCE:
            reasons.append(f"{key} is {overhead:+.2f}: the timed loop ran faster than the loop without clocks")
    rules = TRACK_VALIDITY.get(track)
    if rules is not None and rules.contradictions is not None:
        reasons += rules.contradictions(metrics)
    return reasons


def with_impossible(metrics: dict[str, Any], reasons: Sequence[str]) -> dict[str, Any]:
    """``metrics`` with ``impossible`` among its validity flags and ``reasons`` added to its
    ``impossible_reasons`` (after any it holds); unchanged when there is no reason."""
    if not reasons:
        return metrics
    stored, given = metrics.get(m.VALIDITY_FLAGS), metrics.get(m.IMPOSSIBLE_REASONS)
    flags = [str(flag) for flag in stored] if isinstance(stored, list) else []
    return {
        **metrics,
        m.VALIDITY_FLAGS: flags if IMPOSSIBLE in flags else [*flags, IMPOSSIBLE],
        m.IMPOSSIBLE_REASONS: list(dict.fromkeys([*(map(str, given) if isinstance(given, list) else ()), *reasons])),
    }


def with_contradictions(track: str, metrics: dict[str, Any]) -> dict[str, Any]:
    """``metrics`` with ``impossible`` and its reasons where :func:`contradictions` finds any; unchanged otherwise."""
    return with_impossible(metrics, contradictions(track, metrics))


def store_over_local(metrics: Mapping[str, Any]) -> list[str]:
    """Track store-layouts: a layout read over the store faster than on local disk, beyond
    :data:`CEILING_TOLERANCE`."""
    reasons = []
    pairs = ((m.SAMPLES_PER_S, m.LOCAL_SAMPLES_PER_S), (m.RUN_SAMPLES_PER_S, m.LOCAL_RUN_SAMPLES_PER_S))
    for prefix in (m.DIRECT_, m.ZARR_):
        for rate, on_disk in pairs:
            store = _number(metrics.get(m.prefixed(prefix, rate)))
            local = _number(metrics.get(m.prefixed(prefix, on_disk)))
            if store is not None and local and math.isfinite(store) and store > local * (1.0 + CEILING_TOLERANCE):
                reasons.append(
                    f"{prefix}{rate} {store:,.1f} over the store is {store / local:.2f}x the same layout "
                    f"on local disk ({local:,.1f})"
                )
    return reasons


def training_contradictions(metrics: Mapping[str, Any]) -> list[str]:
    """Track training: a step faster than its compute alone, images/s over the compute-only rate, or a data
    wait its cross-check does not confirm (:data:`STEP_BELOW_COMPUTE_TOLERANCE`, :data:`WAIT_AGREEMENT_TOLERANCE`)."""
    reasons = []
    step, compute = _number(metrics.get(m.STEP_P50_MS)), _number(metrics.get(m.COMPUTE_ONLY_STEP_P50_MS))
    if step is not None and compute is not None and step < compute * (1.0 - STEP_BELOW_COMPUTE_TOLERANCE):
        reasons.append(f"step p50 {step:.1f} ms is below its compute-only p50 {compute:.1f} ms")
    images, ceiling = _number(metrics.get(m.IMAGES_PER_S)), _number(metrics.get(m.COMPUTE_ONLY_IMAGES_PER_S))
    if images is not None and ceiling and math.isfinite(images) and images > ceiling * (1.0 + CEILING_TOLERANCE):
        reasons.append(f"images/s {images:,.1f} is {images / ceiling:.2f}x its compute-only rate {ceiling:,.1f}")
    wait, stall = _number(metrics.get(m.DATA_WAIT_FRACTION)), _number(metrics.get(m.STALL_CROSSCHECK))
    if stall is not None and math.isfinite(stall) and stall < 0:
        reasons.append(f"stall cross-check {stall:.1%} is negative")
    if wait is not None and stall is not None and abs(wait - stall) > WAIT_AGREEMENT_TOLERANCE:
        reasons.append(
            f"data wait {wait:.1%} and its cross-check {stall:.1%} differ by more than {WAIT_AGREEMENT_TOLERANCE:.0%}"
        )
    return reasons


@dataclass(frozen=True)
class TrackValidity:
    """What validity means on one track's rows beyond the rules every row follows: the flags the track
    gives a meaning of its own (flag → meaning) and the checks that find a row of it impossible
    (``contradictions``: the row's numbers → why they cannot all be true)."""

    flags: Mapping[str, str] = field(default_factory=dict)
    contradictions: Callable[[Mapping[str, Any]], list[str]] | None = None


#: Each track's own validity rules, by its name: the one place a track registers them. The harness reads
#: it as rows are written, so it lies here, below the tracks. (Track loader's rule against other rows of
#: the run, its in-memory ceiling, is :func:`cropbench.harness.flags.ceiling_reasons`.)
TRACK_VALIDITY: dict[str, TrackValidity] = {
    LOADER_TRACK: TrackValidity(
        {"few-samples": f"the rate rests on fewer than {MIN_RATE_TIMINGS} timed batches: run more samples per epoch"}
    ),
    TRAINING_TRACK: TrackValidity(
        {
            "few-samples": f"the rate rests on fewer than {MIN_RATE_TIMINGS} timed steps: run more steps",
            IMPOSSIBLE: f"the compute-only baseline, measured apart, took over {IMPOSSIBLE_TOLERANCE:.0%} longer "
            f"than the whole loaded step, the step p50 fell over {STEP_BELOW_COMPUTE_TOLERANCE:.1%} below the "
            f"compute-only p50, or the data wait and its cross-check differ by over {WAIT_AGREEMENT_TOLERANCE:.0%} "
            "of the step: the machine's speed changed between the measurements (the row's impossible_reasons say "
            "which)",
        },
        training_contradictions,
    ),
    "store-layouts": TrackValidity(
        {
            IMPOSSIBLE: "a read path over the loopback store delivered crops faster than the same layout on local "
            "disk through the same chunk cache: the store adds round trips to the same reads, so the rates rest on "
            "too few crops or the machine's speed changed between them (the row's impossible_reasons say which "
            "path)",
            CACHE_HOLDS_PLATE_FLAG: "the chunk cache the store's reader held (reading ahead grows it to hold the "
            "batches it fetches early; the local reads are given the same) holds the whole decoded plate: after the "
            "first reads both rates measure cache hits; use a larger plate or a layout with smaller chunks",
        },
        store_over_local,
    ),
    "targets": TrackValidity(
        {
            IMPOSSIBLE: "the reader's median per-block ratio to the copy ceiling at its own thread count is above "
            "1: the reader beat a ceiling no reader of the same crops can pass, so the ceiling or the timing is wrong",
        }
    ),
}


def flag_meaning(flag: str, track: str | None = None) -> str:
    """What ``flag`` means on a row of ``track``: the track's own meaning where it has one, else the general one."""
    rules = TRACK_VALIDITY.get(track or "")
    return (rules.flags.get(flag) if rules is not None else None) or VALIDITY_FLAGS.get(flag, flag)


def decoded_plate_bytes(reader: PlateReader) -> int:
    """Bytes of every field of the plate once decoded."""
    metadata = reader.metadata
    return int(np.prod(metadata.field_shape)) * np.dtype(metadata.dtype).itemsize * len(metadata.fields)


def cache_holds_plate(fraction: float | None) -> bool:
    """Whether a cache of ``fraction`` of the decoded plate (:func:`cache_fraction_of_plate`; None: no
    cache) holds all of it: the row then measured cache hits (:data:`CACHE_HOLDS_PLATE_FLAG`)."""
    return fraction is not None and fraction >= 1.0


def cache_fraction_of_plate(crop: CropConfig, reader: PlateReader | None) -> float | None:
    """Bytes the reader's own cache may hold (:func:`reader_cache_bytes`) over the decoded plate; None when
    it keeps no cache (``reader`` None: the crops come from elsewhere, e.g. held in memory)."""
    if reader is None:
        return None
    if crop.decode == "field":
        return crop.field_cache_fields / max(len(reader.metadata.fields), 1)
    cache = reader_cache_bytes(crop, reader)
    return None if cache is None else cache / decoded_plate_bytes(reader)


def reader_cache_bytes(crop: CropConfig, reader: PlateReader | None) -> int | None:
    """The chunk cache the direct path's reader holds: the configured one, or more where reading ahead
    over a store grew it to hold the batches it fetches early
    (:meth:`~cropbench.formats.direct.DirectChunkReader.hold_read_ahead`); None where the path keeps
    no chunk cache (``reader`` None, another decode path, a memory-mapped plate)."""
    if reader is None or crop.decode != "direct" or reader.metadata.format == "memmap":
        return None
    return int(getattr(reader, "chunk_cache_bytes", crop.chunk_cache_bytes))


def validity(
    crop: CropConfig,
    reader: PlateReader | None,
    items_drawn: int,
    objects: int,
    enough_timings: bool,
    eviction_unverified: bool = False,
    rate_over_inverse_mean: float | None = None,
    impossible: bool = False,
) -> dict[str, object]:
    """The row's cache fraction and the names of the flags in :data:`VALIDITY_FLAGS` that apply.

    ``items_drawn`` counts every item the case reads (cold, warm-up and steady), ``objects`` those
    the plate holds; ``enough_timings`` says whether the row's headline rests on enough timings (Track 1
    and the peers: their p95; Tracks 2 and 3, whose headline is a rate: :func:`enough_rate_timings`);
    ``impossible`` says that two of the row's numbers contradict each other (see :data:`TRACK_VALIDITY`).
    """
    fraction = cache_fraction_of_plate(crop, reader)
    flags = {
        CACHE_HOLDS_PLATE_FLAG: cache_holds_plate(fraction),
        "re-reads": items_drawn > objects,
        "not-evicted": eviction_unverified,
        "rate!=1/mean": rate_over_inverse_mean is not None
        and abs(rate_over_inverse_mean - 1.0) > RATE_AGREEMENT_TOLERANCE,
        "few-samples": not enough_timings,
        IMPOSSIBLE: impossible,
    }
    return {
        m.CACHE_FRACTION_OF_PLATE: fraction,
        m.VALIDITY_FLAGS: [name for name, raised in flags.items() if raised],
    }
