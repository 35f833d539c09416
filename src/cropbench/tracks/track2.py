"""Track 2: DataLoader throughput, timed as the training loop waits for it.

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

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from cropbench import metrics as m
from cropbench.config import ACCESS_PATTERNS, CropConfig
from cropbench.data.dataset import CropDataset
from cropbench.data.device_pipeline import PIPELINES, DeviceTier, boundaries, check_pipeline, loader_crop
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
from cropbench.data.sampling import continued_order, sampler_for
from cropbench.data.transforms import TORCH_DTYPES
from cropbench.errors import ConfigError
from cropbench.measure.accelerator import DEVICES, resolve_device, synchroniser
from cropbench.measure.protocol import Stopwatch, crosscheck_clock_ns, samples_per_s, summarise_ms
from cropbench.objects import ObjectTable
from cropbench.tracks.context import RunContext, worker_counts
from cropbench.tracks.runner import Row, seeded
from cropbench.tracks.targets import paired_ratios
from cropbench.tracks.validity import enough_rate_timings, validity

SOURCES = ("plate", "memory")
#: Largest relative gap allowed between reported and independently measured samples/s.
CROSSCHECK_TOLERANCE = 0.05
#: Crops a ``memory`` source holds (cycled); enough that batches are not one cached block.
MEMORY_CROPS = 512


@dataclass(frozen=True)
class Track2Case:
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
    """Crops read once into RAM, served (through the tier's transform) as fresh tensors."""

    def __init__(self, dataset: CropDataset, count: int = MEMORY_CROPS) -> None:
        count = min(count, len(dataset))
        self.raw = torch.from_numpy(np.stack([dataset.read_raw(i) for i in range(count)]))
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


def _metrics(case: Track2Case, epochs: list[EpochTiming], batch_bytes: int) -> dict[str, Any]:
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
    plate: str | Path,
    case: Track2Case,
    objects: ObjectTable | str | Path | None = None,
    *,
    shard: SamplerFactory | None = None,
) -> dict[str, Any]:
    """Measure one case; a fresh dataset each time so no cache warmed by an earlier case leaks in.

    ``shard`` builds the sampler instead of the case's access pattern (one rank's share of a distributed epoch).
    """
    base = CropDataset(plate, loader_crop(case.crop, case.pipeline), objects=objects)
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
            **validity(
                case.crop,
                None if case.source == "memory" else base.reader,  # crops held in memory: no reader cache in play
                items_drawn=case.samples * case.epochs,
                objects=len(base),
                enough_timings=enough_rate_timings(metrics[m.prefixed(m.BATCH, m.COUNT)]),
            ),
        }
    )
    return metrics


#: Samples per epoch of the full preset, on a plate that holds two epochs of them or more.
FULL_SAMPLES_PER_EPOCH = 4096


def preset_cases(preset: str, samples: int | None = None, objects: int | None = None) -> list[Track2Case]:
    """The Track 2 grid: the workers × batch-size sweep, then one knob at a time around a base.

    Non-persistent cases come before their persistent twin so the runner can report the epoch-2
    gain of persistence on the twin's row. With ``objects`` (the plate's), the full preset's epochs
    draw no crop twice: both epochs together read at most every object once (unless ``samples`` says
    otherwise).
    """
    if preset == "gpu":
        return gpu_cases(samples)
    pin_rows = torch.cuda.is_available()
    sizes: tuple[int, ...]
    tiers: tuple[str, ...]
    if preset == "smoke":
        per_epoch, sizes, workers, tiers = samples or 1024, (16, 64), [0, 1, 2], ("none",)
    elif preset == "full":
        fits = FULL_SAMPLES_PER_EPOCH if objects is None else min(FULL_SAMPLES_PER_EPOCH, objects // 2)
        per_epoch, sizes, workers, tiers = samples or fits, (16, 64, 256), worker_counts(), ("none", "typical")
    else:
        raise ConfigError(f"preset={preset!r} is not one of smoke, full, gpu, overhead (Track 2 only)")
    crop = CropConfig(crop_size=96)

    def case(loader: LoaderSpec, crop: CropConfig = crop, **changes: Any) -> Track2Case:
        # At least two batches per epoch, so a steady window exists whatever ``samples`` says.
        return Track2Case(crop=crop, loader=loader, samples=max(per_epoch, 2 * loader.batch_size), **changes)

    cases = [
        case(LoaderSpec(num_workers=w, batch_size=b), crop.replace(tier=tier))
        for tier in tiers
        for b in sizes
        for w in workers
    ]
    loader = LoaderSpec(num_workers=2, batch_size=64)
    cases += [
        case(dataclasses.replace(loader, persistent_workers=True)),
        case(dataclasses.replace(loader, collate="stack")),
        case(loader, crop.replace(dtype="uint16")),
        case(loader, crop.replace(decode="zarr")),
        case(dataclasses.replace(loader, collate="stack"), crop.replace(tier="typical"), pipeline="device"),
    ]
    # Crops already in memory at the knob rows' loader, with either collate: the ceilings the verdict
    # sets those rows against.
    cases += [case(loader, crop.replace(dtype=dtype), source="memory") for dtype in ("uint16", "float32")]
    cases.append(case(dataclasses.replace(loader, collate="stack"), source="memory"))
    if preset == "smoke":
        cases.append(case(loader, crop.replace(tier="typical")))
    else:
        cases += [
            case(dataclasses.replace(loader, prefetch_factor=4)),
            case(dataclasses.replace(loader, start_method="forkserver")),
            case(loader, crop.replace(decode="field")),
            case(loader, access="chunk-aware"),
            case(loader, crop.replace(tier="typical", dtype="bfloat16")),
        ]
        memory = LoaderSpec(num_workers=2, batch_size=256)
        cases += [case(memory, crop.replace(dtype=dtype), source="memory") for dtype in ("uint16", "float32")]
    if pin_rows:
        cases.append(case(dataclasses.replace(loader, pin_memory=True)))
    return cases


#: Steady batches a ``gpu`` case times at least (more with workers: whole rounds, see :func:`gpu_cases`).
GPU_STEADY_BATCHES = 8
#: The batch a GPU step consumes in the GPU check (ResNet-18 on 96 × 96 × 5 crops).
GPU_BATCH = 256


def gpu_cases(samples: int | None = None) -> list[Track2Case]:
    """What a GPU host's loader supplies at the GPU's batch of 256 on the ``direct`` path, per pipeline,
    tier and worker count: the dataset pipeline (float32 tensors made in the workers, pinned by the
    DataLoader) beside the device pipeline (raw uint16 from the workers, the tier on the GPU).

    Each case is one epoch: one batch per worker of warm-up, then whole rounds of one batch per worker
    (at least two rounds and :data:`GPU_STEADY_BATCHES` batches, or ``samples`` worth). Workers that start
    together deliver in lockstep, so a steady window of part of a round would miscount them. The most
    workers also run a second epoch (epoch-2 start-up), and once more persistent. Sizes stay small: the
    whole grid must fit a few minutes of GPU time. zarr-python's path is left out (a sixth of ``direct``
    on one H200 with 16 cores: docs/results/gpu.md).
    """
    least = -(-samples // GPU_BATCH) if samples else GPU_STEADY_BATCHES
    counts = worker_counts()
    crop = CropConfig(crop_size=96)

    def sized(crop: CropConfig, workers: int, pipeline: str = "dataset", **knobs: Any) -> Track2Case:
        collate = "stack" if pipeline == "device" else "default"
        loader = LoaderSpec(num_workers=workers, batch_size=GPU_BATCH, pin_memory=True, collate=collate, **knobs)
        steady = max(2, -(-least // workers)) * workers if workers else least
        return Track2Case(
            crop=crop,
            loader=loader,
            samples=(max(workers, 1) + steady) * GPU_BATCH,
            epochs=2 if workers == counts[-1] else 1,
            pipeline=pipeline,
        )

    def sweep(tier: str) -> list[Track2Case]:
        return [sized(crop.replace(tier=tier), w, pipeline) for pipeline in PIPELINES for w in counts]

    return [*sweep("none"), sized(crop, counts[-1], persistent_workers=True), *sweep("typical")]


#: The loader overhead the overhead preset checks against: delivered batches/s at least this share of
#: Track 1's batched rate at the same thread count.
OVERHEAD_TARGET = 0.8


@dataclass(frozen=True)
class OverheadCase:
    """What the DataLoader costs on raw uint16 batches: its delivered batches/s over Track 1's batched
    rate (``CropDataset.__getitems__`` called in this process) at the same thread count, interleaved.

    The reader side reads with :attr:`reader_threads` decode threads (``crop.decode_threads`` per
    worker, times the workers); the loader side runs ``loader.num_workers`` workers of
    ``crop.decode_threads`` threads each (no workers: the DataLoader in this process). The two take
    turns block by block, the order alternating, over ``blocks`` blocks after an untimed warm-up block
    each. A loader block is one epoch of persistent workers (idle while the reader's block runs, so
    neither side's work lands in the other's clock); it skips one batch per worker, as Track 2's
    steady window does, then times ``batches`` batches; the reader's block reads those same batches.
    """

    crop: CropConfig = field(default_factory=lambda: CropConfig(crop_size=96, dtype="uint16"))
    loader: LoaderSpec = field(default_factory=lambda: LoaderSpec(batch_size=64, collate="stack"))
    access: str = "random"
    batches: int = 8
    blocks: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        if self.crop.tier != "none" or self.crop.dtype != "uint16":
            raise ConfigError(
                f"the loader overhead is measured on raw crops (tier='none', dtype='uint16'), "
                f"got tier={self.crop.tier!r}, dtype={self.crop.dtype!r}"
            )
        if self.access not in ACCESS_PATTERNS or self.access == "paired":
            raise ConfigError(f"access={self.access!r} must be one of the single-view patterns of {ACCESS_PATTERNS}")
        for name in ("batches", "blocks"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")

    @property
    def reader_threads(self) -> int:
        return max(1, self.loader.num_workers) * self.crop.decode_threads

    @property
    def warmup(self) -> int:
        return max(1, self.loader.num_workers)

    @property
    def label(self) -> str:
        c = self.crop
        return (
            f"overhead/{self.access}/{c.decode}/{c.crop_size}px/{self.loader.label}/"
            f"threads{c.decode_threads}-vs-batched-threads{self.reader_threads}"
        )


def run_overhead(
    plate: str | Path, case: OverheadCase, objects: ObjectTable | str | Path | None = None
) -> dict[str, Any]:
    """Measure one :class:`OverheadCase`: both rates, their ratio overall and paired per block."""
    batch = case.loader.batch_size
    loaded = CropDataset(plate, case.crop, objects=objects)
    reader = CropDataset(plate, case.crop.replace(decode_threads=case.reader_threads), objects=objects)
    per_block = (case.warmup + case.batches) * batch
    flat = continued_order(sampler_for(loaded, case.access, case.seed), per_block * (case.blocks + 1))
    orders = [flat[block * per_block : (block + 1) * per_block] for block in range(case.blocks + 1)]
    sampler = ScheduledSampler(orders)
    spec = dataclasses.replace(case.loader, persistent_workers=case.loader.num_workers > 0)
    loader = build_loader(loaded, spec, sampler, case.seed)
    # Each delivered batch is counted and dropped, as a training step drops it: a worker fills a
    # batch segment again only once the main process has let go of it.
    delivered: list[tuple[int, torch.dtype]] = []

    def through_loader(block: int) -> float:
        sampler.set_epoch(block)
        iterator = iter(loader)
        for _ in range(case.warmup):
            next(iterator)
        with Stopwatch() as watch:
            for _ in range(case.batches):
                image = next(iterator)["image"]
                delivered.append((int(image.shape[0]), image.dtype))
                del image
        for _ in iterator:
            raise RuntimeError("the loader delivered more batches than its block holds")
        return watch.seconds

    def batched(block: int) -> float:
        steady = orders[block][case.warmup * batch :].tolist()
        calls = [steady[start : start + batch] for start in range(0, len(steady), batch)]
        with Stopwatch() as watch:
            for call in calls:
                reader.__getitems__(call)
        return watch.seconds

    sides = {"loader": through_loader, "batched": batched}
    for call in sides.values():
        call(0)  # the warm-up block: workers started, caches and page cache warmed on both sides
    delivered.clear()
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    for block in range(1, case.blocks + 1):
        for name in list(sides)[block % 2 :] + list(sides)[: block % 2]:
            seconds[name].append(sides[name](block))
    samples = sum(count for count, _ in delivered)
    if samples != case.blocks * case.batches * batch or any(dtype != torch.uint16 for _, dtype in delivered):
        raise RuntimeError(
            f"the loader delivered {samples} samples, not {case.blocks * case.batches * batch} uint16 ones"
        )
    batches = case.blocks * case.batches
    loader_rate = samples_per_s(batches, sum(seconds["loader"]))
    batched_rate = samples_per_s(batches, sum(seconds["batched"]))
    channels = len(loaded.channel_indices)
    crossing = boundaries(case.crop, channels, "dataset", case.loader.num_workers, torch.device("cpu"))
    return {
        m.LOADER_BATCHES_PER_S: loader_rate,
        m.BATCHED_BATCHES_PER_S: batched_rate,
        m.LOADER_OVER_BATCHED: loader_rate / batched_rate,
        **paired_ratios(np.asarray(seconds["loader"]), np.asarray(seconds["batched"])),
        m.SAMPLES_PER_S: loader_rate * batch,
        m.READER_THREADS: case.reader_threads,
        m.DELIVERED_SAMPLES: samples,
        m.BYTES_WORKER_TO_MAIN_PER_SAMPLE: crossing.worker_to_main,
        m.OBJECTS: len(loaded),
    }


def overhead_cases(samples: int | None = None) -> list[OverheadCase]:
    """The overhead preset: uint16 batches of 64 crops of 96 px, per workers × decode threads a 2-core
    machine can run, each against Track 1's batched rate at the same thread count."""
    base = OverheadCase()
    batches = max(2, samples // base.loader.batch_size) if samples else base.batches
    splits = ((0, 1), (0, 2), (1, 1), (1, 2), (2, 1))
    return [
        dataclasses.replace(
            base,
            crop=base.crop.replace(decode_threads=threads),
            loader=dataclasses.replace(base.loader, num_workers=workers),
            batches=batches,
        )
        for workers, threads in splits
    ]


def _persistent_twin(case: Track2Case) -> str | None:
    if not case.loader.persistent_workers:
        return None
    return dataclasses.replace(case, loader=dataclasses.replace(case.loader, persistent_workers=False)).label


def persistent_gain(metrics: dict[str, Any], twin: dict[str, Any]) -> dict[str, Any]:
    """Epoch-2 gain of persistent workers over the otherwise identical non-persistent case."""
    if m.EPOCH2_FIRST_BATCH_MS not in metrics or m.EPOCH2_FIRST_BATCH_MS not in twin:
        return {}
    return {
        m.PERSISTENT_EPOCH2_GAIN: twin[m.EPOCH_SECONDS][1] / metrics[m.EPOCH_SECONDS][1] - 1.0,
        m.PERSISTENT_FIRST_BATCH_SAVING_MS: twin[m.EPOCH2_FIRST_BATCH_MS] - metrics[m.EPOCH2_FIRST_BATCH_MS],
    }


class Track2:
    """Track 2 for the runner; a persistent case's row also gets the gain over its measured twin."""

    name = "2"

    def __init__(self) -> None:
        self.measured: dict[tuple[str, int], dict[str, Any]] = {}

    def cases(self, preset: str, context: RunContext) -> list[Track2Case] | list[OverheadCase]:
        if preset == "overhead":
            return overhead_cases(context.samples)
        return preset_cases(preset, context.samples, context.object_count if preset == "full" else None)

    def decode(self, case: Track2Case | OverheadCase) -> str:
        return case.crop.decode

    def measure(self, case: Track2Case | OverheadCase, repeat: int, context: RunContext) -> Iterator[Row]:
        if isinstance(case, OverheadCase):
            ran = seeded(case, repeat)
            yield Row(case, dataclasses.asdict(ran), run_overhead(context.plate, ran, context.object_table), ran.seed)
            return
        repeated = seeded(case, repeat)
        metrics = run_case(context.plate, repeated, objects=context.object_table)
        self.measured[(case.label, repeat)] = metrics
        twin = _persistent_twin(case)
        if twin is not None and (twin, repeat) in self.measured:
            metrics.update(persistent_gain(metrics, self.measured[(twin, repeat)]))
        yield Row(case, dataclasses.asdict(repeated), metrics, repeated.seed)
