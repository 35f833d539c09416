"""One DataLoader case measured: throughput timed as the training loop waits for it.

Track ``loader`` (Track 2) runs its grid through it; tracks ``remote`` and ``store-layouts``, the scale
sweep and distributed runs reuse it.

Per case, for each of ``epochs`` epochs: the clock runs around ``iter(loader)`` (worker start-up)
and around each blocking ``next()``, and nothing else happens in the loop, so the numbers are the
most a consumer could get. First-batch latency is ``iter()`` plus the first ``next()``. Steady
samples/s leaves out each epoch's first ``warmup`` batches (one per worker: their start-up);
whole-run samples/s keeps everything. Every row is cross-checked: the samples actually delivered
(counted from the batch tensors) over a separate monotonic clock read once around each epoch must
agree with the samples/s built from the per-batch timings.

``source="memory"`` serves crops already read into RAM, so decode drops out and what is left is
the worker hand-over: collate into shared memory, the queue, and the page faults of fresh pages —
the uint16 versus float32 difference.

``pipeline="device"`` has the workers hand over raw uint16 batches and times, inside each ``next()``,
the device tier that makes the tier's tensors on ``device`` (:mod:`cropbench.data.device_pipeline`:
pinned staging and the copy on CUDA, synchronised before the clock is read). Every row says where
the tier ran and the image bytes per sample crossing each boundary (worker → main, host → device).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from cropbench import metrics as m
from cropbench.config import ACCESS_PATTERNS, CropConfig
from cropbench.data.dataset import CropDataset
from cropbench.data.device_pipeline import DeviceTier, boundaries, check_pipeline, loader_crop
from cropbench.data.distributed import SamplerFactory
from cropbench.data.loader import (
    LoaderSpec,
    ScheduledSampler,
    build_loader,
    memory_of,
    pickled_size,
    schedule,
    worker_pids,
)
from cropbench.data.sampling import sampler_for
from cropbench.data.transforms import TORCH_DTYPES
from cropbench.errors import ConfigError
from cropbench.harness.context import RunContext
from cropbench.harness.memory_reference import MemoryReference
from cropbench.harness.validity import cache_holds_plate, enough_rate_timings, reader_cache_bytes, validity
from cropbench.measure.accelerator import DEVICES, resolve_device, synchroniser
from cropbench.measure.protocol import Stopwatch, crosscheck_clock_ns, relative_cost, samples_per_s, summarise_ms
from cropbench.measure.remote import crop_config

SOURCES = ("plate", "memory")
#: Largest relative gap allowed between reported and independently measured samples/s.
CROSSCHECK_TOLERANCE = 0.05
#: Crops a ``memory`` source holds (cycled); enough that batches are not one cached block.
MEMORY_CROPS = 512


@dataclass(frozen=True)
class LoaderCase:
    """One Track 2 measurement: a crop configuration served by one DataLoader configuration.

    ``samples`` is per epoch; ``warmup_batches=None`` skips one batch per worker (at least one)
    at the start of each epoch for the steady window. ``pipeline`` says where the crop's tier runs:
    in the Dataset (``dataset``), or on ``device`` after the workers hand over raw uint16 batches
    (``device``; ``device`` is used by that pipeline only).
    """

    crop: CropConfig = field(default_factory=CropConfig)
    loader: LoaderSpec = field(default_factory=LoaderSpec)
    source: str = "plate"
    access: str = "random"
    samples: int = 1024
    epochs: int = 2
    warmup_batches: int | None = None
    seed: int = 0
    pipeline: str = "dataset"
    device: str = "auto"

    def __post_init__(self) -> None:
        check_pipeline(self.pipeline)
        if self.device not in DEVICES:
            raise ConfigError(f"device={self.device!r} is not one of {', '.join(DEVICES)}")
        if self.source not in SOURCES:
            raise ConfigError(f"source={self.source!r} is not one of {', '.join(SOURCES)}")
        if self.access not in ACCESS_PATTERNS or self.access == "paired":
            raise ConfigError(f"access={self.access!r} must be one of the single-view patterns of {ACCESS_PATTERNS}")
        if self.samples < self.loader.batch_size:
            raise ConfigError(f"samples={self.samples} per epoch is less than one batch of {self.loader.batch_size}")
        if self.epochs < 1:
            raise ConfigError(f"epochs must be >= 1, got {self.epochs}")
        if self.warmup_batches is not None and self.warmup_batches < 0:
            raise ConfigError(f"warmup_batches must be >= 0, got {self.warmup_batches}")

    @property
    def warmup(self) -> int:
        return self.warmup_batches if self.warmup_batches is not None else max(1, self.loader.num_workers)

    @property
    def label(self) -> str:
        c = self.crop
        threads = "" if c.decode_threads == 1 else f"/threads{c.decode_threads}"
        tier = (
            "" if self.pipeline == "dataset" else "/device-tier" + ("" if self.device == "auto" else f"-{self.device}")
        )
        return f"{self.source}/{self.access}/{c.decode}/{c.tier}/{c.dtype}/{self.loader.label}{threads}{tier}"


class MemoryCrops(Dataset[dict[str, Any]]):
    """The dataset's first ``count`` crops cut once into RAM by the in-memory reference
    (:class:`~cropbench.harness.memory_reference.MemoryReference`), served in turn for every index (through
    the tier's transform) as fresh tensors."""

    def __init__(self, dataset: CropDataset, count: int = MEMORY_CROPS) -> None:
        indices = range(min(count, len(dataset)))
        reference = MemoryReference.of_dataset(dataset, indices)
        self.raw = torch.from_numpy(np.stack([reference.cut(index) for index in indices]))
        self.plan = dataset.plan
        self.length = len(dataset)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Any]:
        raw = self.raw[index % len(self.raw)]
        image = self.plan.apply(raw, index)
        if image.data_ptr() == raw.data_ptr():
            image = image.clone()
        return {"image": image, "index": index, "object_id": index, "field_index": 0}


@dataclass
class EpochTiming:
    """What one epoch's loop saw, in nanoseconds."""

    iter_ns: int
    waits_ns: list[int]
    delivered: list[int]
    collate_ns: list[int]
    independent_ns: int
    shutdown_ns: int = 0
    memory: dict[str, Any] = field(default_factory=dict)

    @property
    def first_batch_ns(self) -> int:
        return self.iter_ns + self.waits_ns[0]

    @property
    def loop_ns(self) -> int:
        return self.iter_ns + sum(self.waits_ns)


def _epoch(
    loader: Any,
    sampler: ScheduledSampler,
    epoch: int,
    sample_memory: bool,
    tier: DeviceTier | None = None,
    sync: Callable[[], None] = lambda: None,
) -> EpochTiming:
    """Iterate one epoch, timing ``iter()`` and each blocking ``next()`` and nothing else (with a
    device ``tier``: each ``next()`` and the tier's work on its batch, synchronised)."""
    sampler.set_epoch(epoch)
    batches = len(loader)
    independent_start = crosscheck_clock_ns()
    with Stopwatch() as creating:
        iterator = iter(loader)
    waits, delivered, collate = [], [], []
    fetch = Stopwatch()
    for _ in range(batches):
        with fetch:
            batch = next(iterator)
            image = batch["image"] if tier is None else tier(batch["image"], batch["index"])
            sync()
        waits.append(fetch.last_ns)
        delivered.append(int(image.shape[0]))
        if "collate_ns" in batch:
            collate.append(int(batch["collate_ns"]))
    independent_ns = crosscheck_clock_ns() - independent_start
    timing = EpochTiming(creating.ns, waits, delivered, collate, independent_ns)
    if sample_memory:
        timing.memory = memory_of(worker_pids(iterator))
    with Stopwatch() as shutdown:
        for _ in iterator:  # exhausts: non-persistent workers shut down here
            raise RuntimeError("the loader delivered more batches than len(loader)")
        del iterator
    timing.shutdown_ns = shutdown.ns
    return timing


def crosscheck(
    reported_samples_per_s: float, delivered: int, independent_seconds: float, expected: int
) -> dict[str, Any]:
    """Compare a reported rate with delivered samples over an independently clocked wall time.

    The row is trusted only when every expected sample arrived and the two rates agree within
    :data:`CROSSCHECK_TOLERANCE` — a rate timed over the wrong region (say, ``batch.shape`` after
    the batch arrived) fails by orders of magnitude.
    """
    independent = delivered / independent_seconds if independent_seconds > 0 else float("inf")
    ratio = reported_samples_per_s / independent if independent > 0 else float("inf")
    return {
        m.DELIVERED_SAMPLES: delivered,
        m.EXPECTED_SAMPLES: expected,
        m.INDEPENDENT_SAMPLES_PER_S: independent,
        m.CROSSCHECK_RATIO: ratio,
        m.CROSSCHECK_OK: bool(delivered == expected and abs(ratio - 1.0) <= CROSSCHECK_TOLERANCE),
    }


def _metrics(case: LoaderCase, epochs: list[EpochTiming], batch_bytes: int) -> dict[str, Any]:
    warmup = case.warmup
    steady_waits = [w for e in epochs for w in (e.waits_ns[warmup:] or e.waits_ns[-1:])]
    steady_samples = sum(n for e in epochs for n in (e.delivered[warmup:] or e.delivered[-1:]))
    delivered = sum(sum(e.delivered) for e in epochs)
    loop_seconds = sum(e.loop_ns for e in epochs) / 1e9
    # The reported whole-run rate counts what the schedule promised, timed by the per-batch clocks;
    # the cross-check counts what arrived, timed by a different clock read once per epoch.
    run_samples_per_s = case.samples * len(epochs) / loop_seconds
    steady_seconds = sum(steady_waits) / 1e9
    first = epochs[0]
    metrics: dict[str, Any] = {
        m.FIRST_BATCH_MS: first.first_batch_ns / 1e6,
        m.ITER_CREATE_MS: first.iter_ns / 1e6,
        m.SAMPLES_PER_S: samples_per_s(steady_samples, steady_seconds),
        m.RUN_SAMPLES_PER_S: run_samples_per_s,
        m.STEADY_BATCHES: len(steady_waits),
        m.LOOP_SECONDS: loop_seconds,
        m.EPOCH_SECONDS: [e.loop_ns / 1e9 for e in epochs],
        m.EPOCH_SAMPLES_PER_S: [sum(e.delivered) / (e.loop_ns / 1e9) for e in epochs],
        m.SHUTDOWN_MS: [e.shutdown_ns / 1e6 for e in epochs],
        m.BATCH_MIB: batch_bytes / 2**20,
        m.STEADY_MIB_PER_S: steady_samples * batch_bytes / case.loader.batch_size / steady_seconds / 2**20,
        **summarise_ms(steady_waits, m.BATCH),
        **crosscheck(
            run_samples_per_s, delivered, sum(e.independent_ns for e in epochs) / 1e9, case.samples * len(epochs)
        ),
        **epochs[-1].memory,
    }
    collate = [ns for e in epochs for ns in e.collate_ns]
    if collate:
        metrics[m.COLLATE_MS_MEAN] = float(np.mean(collate) / 1e6)
        metrics[m.COLLATE_SHARE] = sum(collate) / max(sum(e.loop_ns for e in epochs), 1)
    if len(epochs) > 1:
        second = epochs[1]
        metrics.update(
            {
                m.EPOCH2_FIRST_BATCH_MS: second.first_batch_ns / 1e6,
                m.EPOCH2_ITER_CREATE_MS: second.iter_ns / 1e6,
                m.EPOCH2_SPEEDUP: first.loop_ns / second.loop_ns,
            }
        )
    return metrics


def run_case(
    context: RunContext,
    case: LoaderCase,
    *,
    shard: SamplerFactory | None = None,
) -> dict[str, Any]:
    """Measure one case; a fresh dataset each time so no cache warmed by an earlier case leaks in.

    ``shard`` builds the sampler instead of the case's access pattern (one rank's share of a distributed epoch).
    """
    base = context.dataset(loader_crop(case.crop, case.pipeline))
    dataset: Dataset[dict[str, Any]] = MemoryCrops(base) if case.source == "memory" else base
    order = shard(base) if shard is not None else sampler_for(base, case.access, case.seed)
    orders = schedule(order, case.samples, case.epochs)
    sampler = ScheduledSampler(orders)
    device = resolve_device(case.device) if case.pipeline == "device" else torch.device("cpu")
    tier = DeviceTier.for_dataset(base.plan, case.crop, device) if case.pipeline == "device" else None
    # The device tier pins into its own reused buffers; the DataLoader's pinning would copy twice.
    pin = case.loader.pin_memory and torch.cuda.is_available() and tier is None
    loader = build_loader(dataset, case.loader, sampler, case.seed, timed_collate=True, pin_memory=pin)
    pickle_bytes = pickled_size(dataset)
    sync = synchroniser(device)
    epochs = [_epoch(loader, sampler, epoch, True, tier, sync) for epoch in range(case.epochs)]
    channels = len(base.channel_indices)
    crossing = boundaries(case.crop, channels, case.pipeline, case.loader.num_workers, device)
    size = case.crop.output_size or case.crop.crop_size
    item_bytes = channels * size * size * TORCH_DTYPES[case.crop.dtype].itemsize
    metrics = _metrics(case, epochs, item_bytes * case.loader.batch_size)
    reader = None if case.source == "memory" else base.reader  # crops held in memory: no reader cache in play
    metrics.update(
        {
            m.OBJECTS: len(base),
            m.DATASET_PICKLE_BYTES: pickle_bytes,
            m.PIN_MEMORY_EFFECTIVE: pin or (tier is not None and tier.staging is not None),
            m.TRANSFORM_DEVICE: crossing.transform_device,
            m.BYTES_WORKER_TO_MAIN_PER_SAMPLE: crossing.worker_to_main,
            m.BYTES_HOST_TO_DEVICE_PER_SAMPLE: crossing.host_to_device,
            m.WARMUP_BATCHES: case.warmup,
            m.BATCHES_PER_EPOCH: len(loader),
            m.READER_CACHE_BYTES: reader_cache_bytes(case.crop, reader),
            **validity(
                case.crop,
                reader,
                items_drawn=case.samples * case.epochs,
                objects=len(base),
                enough_timings=enough_rate_timings(metrics[m.prefixed(m.BATCH, m.COUNT)]),
            ),
        }
    )
    return metrics


@dataclass(frozen=True)
class LoaderRates:
    """:func:`loader_rates`' answer: steady and whole-pass crops/s, and the cache they were read through."""

    steady: float
    whole: float
    #: The reader's chunk cache in bytes (grown where it reads ahead); None where the path keeps none.
    cache_bytes: int | None
    #: ``cache_bytes`` over the decoded plate; None where the path keeps no cache.
    cache_fraction: float | None

    @property
    def cache_holds_plate(self) -> bool:
        return cache_holds_plate(self.cache_fraction)


def read_ahead_cache_bytes(
    context: RunContext, decode: str, batch_size: int, crop_size: int, cache_bytes: int | None = None
) -> int | None:
    """The chunk cache (``cache_bytes``, None: the default) the run's reader holds once it reads ahead
    through batches of ``batch_size`` (over a store it grows to hold them; on local disk it reads none
    ahead and stays as configured); None where the path keeps no chunk cache. Read from the plate's
    metadata, no chunk fetched: given to a read of the same plate on local disk, it makes the two like
    for like."""
    crop = crop_config(decode, crop_size, cache_bytes)
    if crop.decode != "direct":
        return None  # no chunk cache to grow (:func:`reader_cache_bytes`): nothing opened
    dataset = context.dataset(crop)
    try:
        dataset.read_ahead_batches(batch_size)
        return reader_cache_bytes(crop, dataset.reader)
    finally:
        dataset.reader.close()


def loader_rates(
    context: RunContext,
    decode: str,
    crops: int,
    batch_size: int,
    crop_size: int,
    workers: int = 0,
    cache_bytes: int | None = None,
) -> LoaderRates:
    """Random crops/s of the run's plate through a DataLoader, over the run's datasets (its object table,
    ``--objects``, included): a Track 2 case (seeded workers, the watchdog, one epoch of
    ``crops`` distinct crops at most, the first batches per worker as warm-up; the direct path's
    workers fork, whose HTTP client starts afresh in each, the zarr path's start by forkserver, since
    obstore, a client it may use, does not survive a fork): its steady
    ``samples_per_s`` and its rate over the whole pass, first batch included (``run_samples_per_s``).

    Over a store a reader that reads ahead fetches, while the first batch is awaited, what the next
    batches need: over a few batches only the whole pass counts that time. ``cache_bytes`` sets the
    chunk cache (None: the default); reading ahead may grow it, and the answer says what it held, so a
    read on local disk can be given the same."""
    start = "forkserver" if workers and decode == "zarr" else "fork"
    loader = LoaderSpec(num_workers=workers, batch_size=batch_size, start_method=start)
    crop = crop_config(decode, crop_size, cache_bytes)
    case = LoaderCase(crop=crop, loader=loader, samples=max(crops, 2 * batch_size), epochs=1)
    metrics = run_case(context, case)
    return LoaderRates(
        float(metrics[m.SAMPLES_PER_S]),
        float(metrics[m.RUN_SAMPLES_PER_S]),
        metrics[m.READER_CACHE_BYTES],
        metrics.get(m.CACHE_FRACTION_OF_PLATE),
    )


#: Plate/memory epoch pairs behind one :meth:`LoaderEpochs.relative_epoch`.
EPOCH_PAIRS = 5
#: Pairs dropped at each end (by ratio) before averaging: 1 of 5.
EPOCH_TRIM = 0.2


def drain(loader: Any) -> None:
    """One epoch, worker start-up and shutdown included."""
    for _ in loader:
        pass


class LoaderEpochs:
    """Epochs of ``samples`` random crops of ``plate`` through one DataLoader configuration (``loader``),
    and the same loader serving the dataset's crops from memory (:class:`MemoryCrops`)."""

    def __init__(self, plate: str | Path, crop: CropConfig, loader: LoaderSpec, samples: int) -> None:
        self.plate, self.spec = str(plate), loader
        self.dataset = CropDataset(plate, crop)
        self.orders = schedule(sampler_for(self.dataset, "random", 0), samples, 1)
        self.loader = self.build(self.dataset)

    def build(self, dataset: Dataset[Any]) -> Any:
        """A loader of ``dataset`` in the plate loader's order."""
        return build_loader(dataset, self.spec, ScheduledSampler(self.orders), 0)

    def epoch(self) -> None:
        """One epoch from the plate."""
        drain(self.loader)

    def relative_epoch(self) -> float:
        """Plate epochs over memory epochs, taking turns pair by pair; trimmed mean of the pairs' ratios."""
        memory_loader = self.build(MemoryCrops(self.dataset))
        return float(
            relative_cost(
                lambda _: drain(self.loader), lambda _: drain(memory_loader), range(EPOCH_PAIRS), 1, EPOCH_TRIM
            )
        )
