"""One Dataset case measured: how fast and how stable is ``Dataset.__getitem__`` for realistic access?

Track ``dataset`` (Track 1) runs its grid through it; the scale sweep reuses it for its rates.

With ``batch_size`` > 1 (the batch access mode) the same order is read ``batch_size`` indices per
call through ``__getitems__``, with the same protocol: rates count items, latencies are per call.

Per case: a cold first pass right after the store's files are evicted from the page cache, a
warm-up whose latencies are kept as a curve, then steady state: a tight loop (samples/s, no clock
reads inside) and a per-item timed loop (p50/p95/p99) taking turns over blocks of the indices, each
index read once by one of them (:func:`~cropbench.measure.protocol.steady_state`), so neither reads a
block the other has just brought into the reader's cache.
For tiers other than ``none`` the same indices are also read with tier ``none`` (the I/O share),
and the transform alone is timed on crops already in memory.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import default_collate

from cropbench import metrics as m
from cropbench.config import ACCESS_PATTERNS, CACHE_STATES, CropConfig
from cropbench.data.dataset import CropDataset, PairedViews
from cropbench.data.sampling import access_order
from cropbench.errors import ConfigError
from cropbench.formats.base import PlateReader, ReadStats, warn_missing_chunks
from cropbench.formats.direct import StageTimedChunkReader
from cropbench.harness.context import RunContext
from cropbench.harness.validity import decoded_plate_bytes, enough_rate_timings, validity
from cropbench.measure.fidelity import fidelity_hash
from cropbench.measure.protocol import (
    STEADY_LOOPS,
    Stopwatch,
    clock_overhead_ns,
    evict,
    rss_bytes,
    samples_per_s,
    steady_state,
    summarise_ms,
    time_each,
)
from cropbench.metrics import prefixed

WARMUP_CURVE_POINTS = 50
FIRST_PASS_CURVE_POINTS = 200
TRANSFORM_ONLY_ITEMS = 200
STAGE_SPLIT_ITEMS = 300
#: The stage split's parts add up to its total within this fraction (they share one loop's clocks).
STAGE_SUM_TOLERANCE = 1e-6
FIDELITY_ITEMS = 32
SMOKE_CHUNK_CACHE_BYTES = 2 * 2**20
COLLATE_BATCH = 64
#: Indices per call of the batch access mode's cases in the presets.
SMOKE_BATCH, FULL_BATCH = 32, 64


@dataclass(frozen=True)
class DatasetCase:
    """One Track 1 measurement: a crop configuration read through one access pattern."""

    crop: CropConfig = field(default_factory=CropConfig)
    access: str = "random"
    samples: int = 1000
    warmup: int = 50
    cold_samples: int = 100
    seed: int = 0
    granularity: int = 8
    cache: str = "warm"
    #: Indices per call: 1 reads through ``__getitem__``; more reads the same order in batches of
    #: this many through ``__getitems__`` (the batch access mode; latencies are then per call).
    batch_size: int = 1

    def __post_init__(self) -> None:
        for name, value, allowed in (("access", self.access, ACCESS_PATTERNS), ("cache", self.cache, CACHE_STATES)):
            if value not in allowed:
                raise ConfigError(f"{name}={value!r} is not one of {', '.join(allowed)}")
        for name in ("granularity", "batch_size", "samples"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.batch_size != 1 and self.access == "paired":
            raise ConfigError(f"access='paired' reads one object per call; batch_size must be 1, got {self.batch_size}")
        for name in ("warmup", "cold_samples"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")

    @property
    def label(self) -> str:
        c = self.crop
        channels = "all" if c.channels is None else "+".join(c.channels)
        access = f"{self.access}x{self.granularity}" if self.access == "chunk-aware" else self.access
        cache = "" if self.cache == "warm" else f"/{self.cache}"
        batch = "" if self.batch_size == 1 else f"/batch{self.batch_size}"
        threads = "" if c.decode_threads == 1 else f"/threads{c.decode_threads}"
        return f"{access}/{c.decode}/{c.tier}/{c.crop_size}px/{channels}/{c.dtype}{cache}{batch}{threads}"


def _indices(dataset: CropDataset, case: DatasetCase, needed: int) -> list[int]:
    """Enough indices in the access pattern's order, continuing into further epochs if needed."""
    return access_order(dataset, case.access, needed, case.seed, case.granularity)


def _getter(dataset: CropDataset, access: str, batch_size: int = 1) -> Callable[[Any], Any]:
    if batch_size > 1:
        return dataset.__getitems__
    return PairedViews(dataset).__getitem__ if access == "paired" else dataset.__getitem__


def _calls(indices: list[int], batch_size: int) -> list[Any]:
    """The arguments of successive calls: the indices themselves, or batches of ``batch_size``."""
    if batch_size == 1:
        return indices
    return [indices[start : start + batch_size] for start in range(0, len(indices), batch_size)]


def _count_items(metrics: dict[str, Any], prefix: str, batch_size: int) -> dict[str, Any]:
    """Rates of a batched loop in items/s (``steady_state`` counts calls)."""
    metrics[prefixed(prefix, m.SAMPLES_PER_S)] *= batch_size
    return metrics


def run_case(
    context: RunContext,
    case: DatasetCase,
    evict_first: bool = True,
) -> dict[str, Any]:
    """Measure one case on the run's plate and return its metrics (the caller wraps them in a record)."""
    rss_start = rss_bytes()
    dataset = context.dataset(case.crop)
    get = _getter(dataset, case.access, case.batch_size)
    # Each steady index is read once, by the tight or the timed loop: twice ``samples`` indices give the
    # timed loop ``samples`` timings (the p99's) and read as many crops as both loops over one set did.
    total = case.cold_samples + case.warmup + STEADY_LOOPS * case.samples
    indices = _indices(dataset, case, total)
    batch = case.batch_size
    cold = _calls(indices[: case.cold_samples], batch)
    warm = _calls(indices[case.cold_samples : case.cold_samples + case.warmup], batch)
    steady = _calls(indices[case.cold_samples + case.warmup :], batch)
    metrics: dict[str, Any] = {
        m.OBJECTS: len(dataset),
        m.CACHE: case.cache,
        m.ITEMS_DRAWN: total,
        m.ITEMS_PER_CALL: batch,
    }
    # A plate in an object store has no page cache here to evict: its first pass starts with the
    # reader's caches empty and is kept as first_pass_* (the server's own cache may be warm).
    remote = dataset.reader.metadata.remote is not None
    if cold:
        eviction = evict(dataset.reader.files()) if evict_first and not remote else None
        cold_latencies = time_each(get, cold)
        verified = eviction is not None and eviction.verified
        prefix = m.COLD if verified else m.FIRST_PASS  # an unverified eviction is no cold number
        metrics.update(summarise_ms(cold_latencies, prefix))
        metrics[prefixed(prefix, m.SAMPLES_PER_S)] = samples_per_s(case.cold_samples, cold_latencies.sum() / 1e9)
        # Each item of the first pass, so the warm-up figure starts at the case's first item.
        metrics[m.FIRST_PASS_CURVE_MS] = [round(v / 1e6, 4) for v in cold_latencies[:FIRST_PASS_CURVE_POINTS]]
        metrics.update(eviction.as_metrics() if eviction else {m.EVICTION_VERIFIED: False})
    warmup_latencies = time_each(get, warm)
    dataset.reader.stats.reset()
    evictions: list[bool] = []

    def make_cold() -> None:
        dataset.reader.close()
        if not remote:
            evictions.append(evict(dataset.reader.files()).verified)

    metrics.update(
        _count_items(
            steady_state(get, steady, before_block=make_cold if case.cache == "cold" else None),
            "",
            batch,
        )
    )
    if evictions:
        metrics[m.STEADY_EVICTIONS] = len(evictions)
        metrics[m.STEADY_EVICTIONS_VERIFIED] = sum(evictions)
    if _instrumented(dataset.reader.stats):
        metrics.update(dataset.reader.stats.per_region())
    # Counted where the reader counts (None on zarr-python's path, which fills missing chunks silently).
    metrics[m.MISSING_CHUNKS] = warn_missing_chunks(dataset.reader) if _instrumented(dataset.reader.stats) else None
    overhead_ns = clock_overhead_ns()  # None when it does not resolve: never a clamped 0
    metrics[m.CLOCK_OVERHEAD_FRACTION] = (
        None if overhead_ns is None else overhead_ns / max(metrics[m.MEAN_MS] * 1e6, 1.0)
    )
    metrics[m.WARMUP_MS] = [round(v / 1e6, 4) for v in warmup_latencies[:WARMUP_CURVE_POINTS]]
    if len(warmup_latencies):
        metrics[m.WARMUP_MEAN_MS] = float(warmup_latencies.mean() / 1e6)
        metrics[m.WARMUP_OVER_STEADY] = metrics[m.WARMUP_MEAN_MS] / max(metrics[m.P50_MS], 1e-9)
    if case.crop.tier != "none":
        metrics.update(_io_and_transform_split(context, case, steady, metrics))
    if case.crop.decode == "direct" and dataset.reader.metadata.format == "ome-zarr" and batch == 1:
        metrics.update(_stage_split(context, case, steady[:STAGE_SPLIT_ITEMS]))
    metrics[m.FIDELITY_ITEMS] = FIDELITY_ITEMS
    metrics[m.FIDELITY_SHA256] = case_fidelity_hash(context, case)
    metrics[m.RSS_START_BYTES], metrics[m.RSS_END_BYTES] = rss_start, rss_bytes()
    metrics[m.DECODED_PLATE_BYTES] = decoded_plate_bytes(dataset.reader)
    metrics[m.CHUNK_CACHE_FRACTION_OF_PLATE] = case.crop.chunk_cache_bytes / metrics[m.DECODED_PLATE_BYTES]
    metrics.update(row_validity(case, metrics, dataset.reader))
    return metrics


def _instrumented(stats: ReadStats) -> bool:
    """Whether the reader counts what it fetches and decodes (zarr-python's path counts nothing)."""
    return stats.regions == 0 or bool(stats.chunks_touched or stats.bytes_fetched or stats.bytes_decoded)


def row_validity(case: DatasetCase, metrics: dict[str, Any], reader: PlateReader) -> dict[str, Any]:
    """The row's validity flags (:mod:`cropbench.harness.validity`), with the rate agreement they check.

    A plate in an object store has no page cache to evict, so its first pass is not flagged.
    """
    agreement = metrics[m.SAMPLES_PER_S] / case.batch_size * metrics[m.MEAN_MS] / 1e3
    return {
        m.RATE_OVER_INVERSE_MEAN: agreement,
        **validity(
            case.crop,
            reader,
            items_drawn=metrics[m.ITEMS_DRAWN],
            objects=metrics[m.OBJECTS],
            # A batched case's headline is its rate (its p95 is per call): Tracks 2 and 3's rule.
            enough_timings=metrics[m.P95_RELIABLE] if case.batch_size == 1 else enough_rate_timings(metrics[m.COUNT]),
            eviction_unverified=case.cold_samples > 0
            and not metrics.get(m.EVICTION_VERIFIED, False)
            and reader.metadata.remote is None,
            rate_over_inverse_mean=agreement,
        ),
    }


def case_fidelity_hash(context: RunContext, case: DatasetCase) -> str:
    """Hash of the first ``FIDELITY_ITEMS`` items of the case's seeded order, from a fresh dataset
    (read as the case reads them: batched items hash as the same items read one by one)."""
    dataset = context.dataset(case.crop)
    get = _getter(dataset, case.access, case.batch_size)
    calls = _calls(_indices(dataset, case, FIDELITY_ITEMS), case.batch_size)
    items = (get(call) for call in calls)
    return fidelity_hash(itertools.chain.from_iterable(items) if case.batch_size > 1 else items, dataset.channel_names)


class _TimedPlan:
    """A transform plan with a stopwatch around ``apply``, so the transform is timed inside ``__getitem__``."""

    def __init__(self, plan: Any) -> None:
        self.watch = Stopwatch()
        self.apply = self.watch.wrap(plan.apply)


def _stage_split(
    context: RunContext,
    case: DatasetCase,
    indices: list[int],
) -> dict[str, Any]:
    """Per-item time in each stage of the fast path: index, fetch, decode, assemble, transform, collate.

    Every stage is clocked inside the same ``__getitem__`` calls as the total (the reader's stage
    clocks and one around the transform), so a preemption lands in one stage and in the total
    alike, never between separately timed loops. ``index`` is what is left: index math, the tensor
    wrap and the sample's dict. The stages add up to ``stage_total_ms`` within
    ``STAGE_SUM_TOLERANCE`` (rounding); a negative stage would mean two clocks overlap.
    """
    reader = StageTimedChunkReader(context.metadata, case.crop.chunk_cache_bytes)
    dataset = context.dataset(case.crop, reader=reader)
    get = _getter(dataset, case.access)
    time_each(get, indices[: case.warmup])
    timed_plan = _TimedPlan(dataset.plan)
    dataset.plan = timed_plan  # type: ignore[assignment]
    reader.stage_ns.update(fetch=0, decode=0, region=0)
    samples: list[Any] = []
    with Stopwatch() as loop:
        for index in indices:
            samples.append(get(index))
    total = loop.ns
    stage = dict(reader.stage_ns)
    batch = samples[:COLLATE_BATCH]
    collate_ns = time_each(lambda _: default_collate(batch), range(5)).min() if batch else 0
    count = max(len(indices), 1)
    stages = {
        m.stage_ms("index"): (total - stage["region"] - timed_plan.watch.ns) / count / 1e6,
        m.stage_ms("fetch"): stage["fetch"] / count / 1e6,
        m.stage_ms("decode"): stage["decode"] / count / 1e6,
        m.stage_ms("assemble"): (stage["region"] - stage["fetch"] - stage["decode"]) / count / 1e6,
        m.stage_ms("transform"): timed_plan.watch.ns / count / 1e6,
    }
    return {
        m.STAGE_ITEMS: len(indices),
        **stages,
        m.stage_ms("collate"): float(collate_ns) / max(len(batch), 1) / 1e6,
        m.STAGE_SUM_MS: sum(stages.values()),
        m.STAGE_TOTAL_MS: total / count / 1e6,
    }


def _io_and_transform_split(
    context: RunContext,
    case: DatasetCase,
    steady: list[Any],
    metrics: dict[str, Any],
) -> dict[str, Any]:
    """Same indices with tier ``none`` (I/O only), and the transform alone on in-memory crops."""
    io_dataset = context.dataset(case.crop.replace(tier="none", dtype="uint16"))
    io_get = _getter(io_dataset, case.access, case.batch_size)
    time_each(io_get, steady[: max(case.warmup // case.batch_size, 1)])
    io = _count_items(steady_state(io_get, steady, m.IO), m.IO, case.batch_size)
    views = 2 if case.access == "paired" else 1
    reference = context.dataset(case.crop)
    items = list(itertools.chain.from_iterable(steady)) if case.batch_size > 1 else steady
    raws = [torch.from_numpy(io_dataset.read_raw(i)) for i in items[:TRANSFORM_ONLY_ITEMS]]
    transform_latencies = time_each(
        lambda i: [reference.plan.apply(raws[i], i, 0, view) for view in range(views)],
        range(len(raws)),
    )
    transform_mean = float(transform_latencies.mean() / 1e6)
    return {
        **io,
        m.TRANSFORM_ONLY_MEAN_MS: transform_mean,
        m.TRANSFORM_SHARE: 1.0 - io[prefixed(m.IO, m.MEAN_MS)] / max(metrics[m.MEAN_MS], 1e-9),
    }
