"""Track 3: an end-to-end loop of fixed steps — does the loader keep the model fed?

Each step is timed in two parts, with the device synchronised before every clock read: the data
wait (blocking ``next()`` on the DataLoader plus the host-to-device copy) and the compute (forward,
or forward, backward and optimiser step). The data-wait fraction is the summed wait over the summed
step time. A compute-only baseline runs the same loop on batches already on the device; the stall
it implies, (step − compute-only) / step, must agree with the measured data-wait fraction, and a
gap says the compute itself slowed down beside the loader (CPU contention). The compute-only time
that stall uses is never longer than the loop's own compute parts (see :func:`stall_crosscheck`),
so the stall is never negative; a baseline longer than the whole loaded step flags the row
``impossible``.

Three model kinds answer different questions (see docs/tracks.md):
- ``resnet18``: does this loader starve a standard model on this machine? (on CPU: never)
- ``smallcnn``: a light model whose steps are short enough for the loader to matter on CPU.
- ``emulated``: a fixed compute time per step with the CPU left idle, as MLPerf Storage's DLIO does:
  could this loader feed an accelerator that needs a batch every N ms?

:class:`WorkerSearch` raises ``num_workers`` until the data-wait fraction falls below 10% (MLPerf
Storage's accelerator-utilisation threshold) and reports the smallest such count. :class:`ThreadSplit`
shares one core count out as workers × decode threads per worker and reports the split that ran fastest.

Every loop is followed by the same loader alone (no model, a fresh epoch of the same schedule): its
samples/s over the compute-only images/s of the same model and batch is ``supply_over_demand``.
``pipeline="device"`` has the workers hand over raw uint16 batches and makes the tier's tensors on the
device inside the data wait (:mod:`cropbench.data.device_pipeline`); every row says where the tier ran
and the image bytes per sample crossing each boundary (worker → main, host → device).
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn import functional

from cropbench import metrics as m
from cropbench.config import ACCESS_PATTERNS, CropConfig
from cropbench.data.dataset import CropDataset
from cropbench.data.device_pipeline import DeviceTier, boundaries, check_pipeline, loader_crop
from cropbench.data.distributed import SamplerFactory
from cropbench.data.loader import LoaderSpec, ScheduledSampler, build_loader, memory_of, schedule, worker_pids
from cropbench.data.sampling import sampler_for
from cropbench.errors import ConfigError
from cropbench.measure.accelerator import (
    AMP_MODES,
    DEVICES,
    NvmlSampler,
    autocast,
    check_amp,
    cuda_memory,
    device_info,
    grad_scaler,
    pin_in_effect,
    resolve_device,
    synchroniser,
    to_device,
)
from cropbench.measure.protocol import samples_per_s, summarise_ms
from cropbench.metrics import prefixed
from cropbench.objects import MISSING_CLASS, ObjectTable
from cropbench.tracks.context import RunContext, worker_counts
from cropbench.tracks.models import MODELS, build_model, embedding_model
from cropbench.tracks.runner import Row, seeded
from cropbench.tracks.validity import IMPOSSIBLE_TOLERANCE, validity

MODEL_KINDS = (*MODELS, "emulated")
WORKLOADS = ("train", "embed")
OPTIMISERS = ("sgd", "adam")
#: Data-wait fraction under which the accelerator counts as fed (MLPerf Storage: AU >= 90%).
AU_THRESHOLD = 0.10
#: Distinct batches the compute-only baseline cycles through.
BASELINE_BATCHES = 2

Batch = tuple[torch.Tensor, torch.Tensor]
#: Wraps the model before the loop (``DistributedDataParallel`` under a distributed run).
ModelWrap = Callable[[torch.nn.Module], torch.nn.Module]


def _default_crop() -> CropConfig:
    return CropConfig(crop_size=96, tier="light")


def _default_loader() -> LoaderSpec:
    return LoaderSpec(batch_size=32, pin_memory=True)


@dataclass(frozen=True)
class Track3Case:
    """One Track 3 measurement: a model and workload fed by one loader for a fixed number of steps.

    ``loader.pin_memory`` is a request: it is in effect only on CUDA, where copies are then
    non-blocking. ``channels_last`` and ``compile`` are recorded knobs, off by default; compiling
    happens in the warm-up steps. ``emulated_step_ms`` is the per-step compute of ``model="emulated"``.
    ``compute_only`` measures only the compute-only baseline: the images/s a loader would have to supply.
    ``target`` trains on that label column of the object table (string classes as class ids; objects
    without a class are ignored) instead of the synthetic target ``index % classes``. ``pipeline`` says
    where the crop's tier runs: in the Dataset (``dataset``), or on ``device`` after the workers hand
    over raw uint16 batches (``device``).
    """

    crop: CropConfig = field(default_factory=_default_crop)
    loader: LoaderSpec = field(default_factory=_default_loader)
    model: str = "resnet18"
    workload: str = "train"
    optimizer: str = "sgd"
    steps: int = 20
    warmup_steps: int = 2
    amp: str = "off"
    device: str = "auto"
    channels_last: bool = False
    compile: bool = False
    emulated_step_ms: float = 0.0
    classes: int = 16
    access: str = "random"
    seed: int = 0
    compute_only: bool = False
    target: str | None = None
    pipeline: str = "dataset"

    def __post_init__(self) -> None:
        check_pipeline(self.pipeline)
        for name, value, allowed in (
            ("model", self.model, MODEL_KINDS),
            ("workload", self.workload, WORKLOADS),
            ("optimizer", self.optimizer, OPTIMISERS),
            ("amp", self.amp, AMP_MODES),
            ("device", self.device, DEVICES),
        ):
            if value not in allowed:
                raise ConfigError(f"{name}={value!r} is not one of {', '.join(allowed)}")
        if self.access not in ACCESS_PATTERNS or self.access == "paired":
            raise ConfigError(f"access={self.access!r} must be one of the single-view patterns of {ACCESS_PATTERNS}")
        if self.steps < 1 or self.warmup_steps < 0:
            raise ConfigError(f"steps must be >= 1 and warmup_steps >= 0, got {self.steps} and {self.warmup_steps}")
        if (self.model == "emulated") != (self.emulated_step_ms > 0):
            raise ConfigError(
                f"emulated_step_ms={self.emulated_step_ms} must be > 0 exactly when model='emulated' "
                f"(got model={self.model!r})"
            )
        if self.compile and self.warmup_steps < 1:
            raise ConfigError("compile=True needs warmup_steps >= 1 so compilation is not timed as a step")
        if self.classes < 1:
            raise ConfigError(f"classes must be >= 1, got {self.classes}")
        if self.target is not None and self.workload != "train":
            raise ConfigError(f"target={self.target!r} needs workload='train'; workload={self.workload!r} trains none")

    @property
    def label(self) -> str:
        c = self.crop
        model = f"emulated{self.emulated_step_ms:g}ms" if self.model == "emulated" else self.model
        parts = [model, self.workload, c.decode, c.tier, c.dtype, self.loader.label, f"amp-{self.amp}", self.device]
        parts += [f"threads{c.decode_threads}"] if c.decode_threads != 1 else []
        parts += ["device-tier"] if self.pipeline == "device" else []
        parts += ["channels-last"] if self.channels_last else []
        parts += ["compile"] if self.compile else []
        parts += [self.optimizer] if self.optimizer != "sgd" and self.workload == "train" else []
        parts += [self.access] if self.access != "random" else []
        parts += ["compute-only"] if self.compute_only else []
        parts += [f"target-{self.target}"] if self.target else []
        return "/".join(parts)


@dataclass(frozen=True)
class WorkerSearch:
    """The smallest ``num_workers`` (among ``candidates``, ascending) whose data wait is under ``threshold``.

    ``stop_early=False`` measures every candidate anyway, for a full curve. ``bisect`` measures the most
    workers first and then halves the range (a few loops instead of one per candidate, and the slow
    few-worker loops only when they might be fed); it assumes data wait does not rise with workers.
    ``whole_rounds`` warms up one step per worker and times whole rounds of one batch per worker:
    workers that start together deliver in lockstep, so a window of part of a round miscounts them.
    """

    case: Track3Case
    candidates: tuple[int, ...]
    threshold: float = AU_THRESHOLD
    stop_early: bool = True
    bisect: bool = False
    whole_rounds: bool = False

    def __post_init__(self) -> None:
        if not self.candidates or list(self.candidates) != sorted(set(self.candidates)) or self.candidates[0] < 0:
            raise ConfigError(f"candidates must be distinct worker counts in ascending order, got {self.candidates}")
        if not 0 < self.threshold < 1:
            raise ConfigError(f"threshold must be a fraction in (0, 1), got {self.threshold}")
        if self.bisect and not self.stop_early:
            raise ConfigError("bisect=True measures only some candidates; it cannot be combined with stop_early=False")

    def with_workers(self, workers: int) -> Track3Case:
        case = _workers(self.case, workers)
        return _in_whole_rounds(case) if self.whole_rounds else case

    @property
    def label(self) -> str:
        base = self.with_workers(0).label.split("/")
        return "/".join("w*" if part == "w0" else part for part in base) + "/min-workers"


def _in_whole_rounds(case: Track3Case) -> Track3Case:
    """One warm-up step per worker (at least the case's) and steps in whole rounds of one batch per worker."""
    workers = case.loader.num_workers
    if workers == 0:
        return case
    return dataclasses.replace(
        case, warmup_steps=max(case.warmup_steps, workers), steps=-(-case.steps // workers) * workers
    )


@dataclass(frozen=True)
class ThreadSplit:
    """Threads against workers at a fixed core count: the same loop with ``cores`` shared out as
    ``workers`` × ``decode_threads`` per worker, from no worker (the main process reading with every
    thread) and one worker of ``cores`` threads to ``cores`` workers of one thread (the divisors of
    ``cores``). ``whole_rounds`` as in :class:`WorkerSearch`.
    """

    case: Track3Case
    cores: int
    whole_rounds: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.cores, int) or isinstance(self.cores, bool) or self.cores < 1:
            raise ConfigError(f"cores must be a positive integer, got {self.cores!r}")

    @property
    def splits(self) -> tuple[tuple[int, int], ...]:
        """(workers, decode threads per worker) of each loop, fewest workers first."""
        per_worker = ((w, self.cores // w) for w in range(1, self.cores + 1) if self.cores % w == 0)
        return ((0, self.cores), *per_worker)

    def with_split(self, workers: int, threads: int) -> Track3Case:
        case = dataclasses.replace(_workers(self.case, workers), crop=self.case.crop.replace(decode_threads=threads))
        return _in_whole_rounds(case) if self.whole_rounds else case

    @property
    def label(self) -> str:
        base = _workers(self.case, 0).label.split("/")
        return "/".join("w*" if part == "w0" else part for part in base) + f"/split{self.cores}-cores"


def split_name(workers: int, threads: int) -> str:
    return f"w{workers}xt{threads}"


def split_summary(split: ThreadSplit, results: Sequence[tuple[tuple[int, int], dict[str, Any]]]) -> dict[str, Any]:
    """The split's answer: each split's images/s, data wait and supply over demand, and the fastest."""
    names = [split_name(*pair) for pair, _ in results]
    rates = [metrics[m.IMAGES_PER_S] for _, metrics in results]
    return {
        m.CORES: split.cores,
        m.SPLITS: names,
        m.IMAGES_PER_S_BY_SPLIT: rates,
        m.DATA_WAIT_FRACTION_BY_SPLIT: [metrics[m.DATA_WAIT_FRACTION] for _, metrics in results],
        m.SUPPLY_OVER_DEMAND_BY_SPLIT: [metrics.get(m.SUPPLY_OVER_DEMAND) for _, metrics in results],
        m.BEST_SPLIT: names[int(np.argmax(rates))] if rates else None,
        m.COMPUTE_ONLY_IMAGES_PER_S: results[0][1][m.COMPUTE_ONLY_IMAGES_PER_S] if results else None,
    }


class StepCompute:
    """One step of the workload on a batch already on the device; a fixed seed gives fixed weights.

    ``wrap`` wraps a training model once it is on the device (gradients then synchronise across ranks).
    """

    def __init__(self, case: Track3Case, device: torch.device, channels: int, wrap: ModelWrap | None = None) -> None:
        check_amp(case.amp, device)
        self.case = case
        self.device = device
        self.losses: list[torch.Tensor] = []
        self.model: Callable[[torch.Tensor], torch.Tensor] | None = None
        if case.model == "emulated":
            return
        torch.manual_seed(case.seed)
        model = build_model(case.model, channels, case.classes)
        if case.workload == "embed":
            model = embedding_model(model).eval()
        model = model.to(device)
        if case.channels_last:
            model = model.to(memory_format=torch.channels_last)
        if wrap is not None and case.workload == "train":
            model = wrap(model)
        if case.workload == "train":
            parameters = model.parameters()
            self.optimizer = (
                torch.optim.SGD(parameters, lr=0.01, momentum=0.9)
                if case.optimizer == "sgd"
                else torch.optim.Adam(parameters, lr=1e-3)
            )
            self.scaler = grad_scaler(case.amp, device)
        self.model = torch.compile(model) if case.compile else model

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        if self.model is None:
            time.sleep(self.case.emulated_step_ms / 1000)
            return
        if self.case.workload == "embed":
            with torch.inference_mode(), autocast(self.case.amp, self.device):
                self.model(images)
            return
        self.optimizer.zero_grad(set_to_none=True)
        with autocast(self.case.amp, self.device):
            loss = functional.cross_entropy(self.model(images), labels, ignore_index=MISSING_CLASS)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            self.optimizer.step()
        self.losses.append(loss.detach())


@dataclass
class LoopTiming:
    """Per-step nanoseconds of a loop, warm-up steps included (the first ``warmup`` entries)."""

    wait_ns: np.ndarray
    compute_ns: np.ndarray
    step_ns: np.ndarray
    warmup: int

    def steady(self, name: str) -> np.ndarray:
        return getattr(self, name)[self.warmup :]


def timed_loop(
    next_batch: Callable[[], Any],
    prepare: Callable[[Any], Batch],
    compute: Callable[[torch.Tensor, torch.Tensor], None],
    steps: int,
    warmup: int,
    sync: Callable[[], None],
) -> LoopTiming:
    """Run ``warmup + steps`` steps; the device is synchronised before every clock read.

    Data wait = from the end of the previous step until the batch is on the device (``next()``
    plus the copy); compute = from there until the step's work has finished on the device.
    """
    clock = time.perf_counter_ns
    waits, computes, totals = [], [], []
    sync()
    previous = clock()
    for _ in range(warmup + steps):
        images, labels = prepare(next_batch())
        sync()
        ready = clock()
        compute(images, labels)
        sync()
        done = clock()
        waits.append(ready - previous)
        computes.append(done - ready)
        totals.append(done - previous)
        previous = done
    as_array = lambda values: np.asarray(values, dtype=np.int64)  # noqa: E731
    return LoopTiming(as_array(waits), as_array(computes), as_array(totals), warmup)


def _preparer(
    case: Track3Case, device: torch.device, non_blocking: bool, tier: DeviceTier | None = None
) -> Callable[[Any], Batch]:
    """Batch → (images, labels) on the device: the batch copied as it is (and made float there), or
    through the device ``tier``."""

    def prepare(batch: dict[str, Any]) -> Batch:
        if tier is None:
            images = to_device(batch["image"], device, non_blocking, case.channels_last, floating=True)
        else:
            images = tier(batch["image"], batch["index"])
            images = images if images.is_floating_point() else images.to(torch.float32)
            images = images.contiguous(memory_format=torch.channels_last) if case.channels_last else images
        target = batch["labels"][case.target] if case.target else torch.as_tensor(batch["index"]) % case.classes
        labels = torch.as_tensor(target).to(device, non_blocking=non_blocking)
        return images, labels

    return prepare


def _loader(
    plate: str | Path,
    case: Track3Case,
    spec: LoaderSpec,
    samples: int,
    pin: bool,
    objects: ObjectTable | None,
    shard: SamplerFactory | None = None,
    epochs: int = 1,
) -> tuple[CropDataset, Any]:
    """The case's dataset (raw crops under the device pipeline) and a loader of ``epochs`` scheduled
    epochs of ``samples`` each (``sampler.set_epoch`` picks one)."""
    crop = loader_crop(case.crop, case.pipeline)
    dataset = CropDataset(plate, crop, objects=objects, labels=(case.target,) if case.target else ())
    if case.target:
        classes = dataset.label_classes.get(case.target)
        if classes is None or len(classes) > case.classes:
            raise ConfigError(
                f"target {case.target!r} must be a column of string classes, at most classes={case.classes} of them; "
                f"it has {'numbers' if classes is None else f'{len(classes)} classes: set classes={len(classes)}'}"
            )
    order = shard(dataset) if shard is not None else sampler_for(dataset, case.access, case.seed)
    sampler = ScheduledSampler(schedule(order, samples, epochs))
    return dataset, build_loader(dataset, spec, sampler, case.seed, pin_memory=pin)


def _loop_metrics(timing: LoopTiming, batch_size: int, prefix: str = "") -> dict[str, Any]:
    steps, waits, computes = timing.steady("step_ns"), timing.steady("wait_ns"), timing.steady("compute_ns")
    total = int(steps.sum())
    return {
        **summarise_ms(steps, prefixed(prefix, m.STEP)),
        prefixed(prefix, m.IMAGES_PER_S): batch_size * len(steps) / (total / 1e9),
        prefixed(prefix, m.DATA_WAIT_FRACTION): int(waits.sum()) / total,
        prefixed(prefix, prefixed(m.WAIT, m.P50_MS)): float(np.percentile(waits, 50) / 1e6),
        prefixed(prefix, prefixed(m.WAIT, m.P95_MS)): float(np.percentile(waits, 95) / 1e6),
        prefixed(prefix, m.COMPUTE_P50_MS): float(np.percentile(computes, 50) / 1e6),
        prefixed(prefix, m.ACCELERATOR_BUSY_FRACTION): int(computes.sum()) / total,
        prefixed(prefix, m.LOOP_SECONDS): total / 1e9,
    }


def compute_only(
    plate: str | Path,
    case: Track3Case,
    objects: ObjectTable | None = None,
    *,
    shard: SamplerFactory | None = None,
    wrap: ModelWrap | None = None,
) -> dict[str, Any]:
    """The same loop fed from ``BASELINE_BATCHES`` batches already on the device: compute alone.

    The batches are the tier's tensors as the dataset pipeline makes them (the device pipeline's are
    equal), so both pipelines share one baseline.
    """
    case = dataclasses.replace(case, pipeline="dataset")
    device = resolve_device(case.device)
    batch = case.loader.batch_size
    dataset, loader = _loader(
        plate,
        case,
        LoaderSpec(batch_size=batch, collate=case.loader.collate),
        batch * BASELINE_BATCHES,
        pin=False,
        objects=objects,
        shard=shard,
    )
    prepare = _preparer(case, device, non_blocking=False)
    prepared = [prepare(b) for b in loader]
    compute = StepCompute(case, device, len(dataset.channel_indices), wrap)
    cycle = itertools.cycle(prepared)
    timing = timed_loop(
        cycle.__next__, lambda ready: ready, compute, case.steps, case.warmup_steps, synchroniser(device)
    )
    return _loop_metrics(timing, batch, m.COMPUTE_ONLY)


def stall_crosscheck(step_mean_ms: float, compute_only_mean_ms: float, busy_fraction: float) -> tuple[float, bool]:
    """(stall, impossible): the share of the mean loaded step that compute alone does not explain.

    The compute-only time is the smaller of the baseline's mean step and the loaded loop's own mean
    compute part (``busy_fraction`` of its mean step: the same work on a batch already on the device,
    timed in the same steps). So the stall lies between the data-wait fraction and 1 by construction.
    The baseline is measured in a loop of its own: running it between the loaded steps instead would
    hand the workers free time to fill their queue and shrink the very wait being measured.
    ``impossible``: the baseline took longer than the whole loaded step, beyond
    :data:`~cropbench.tracks.validity.IMPOSSIBLE_TOLERANCE`, so the machine's speed changed between the two.
    """
    loop_compute_ms = busy_fraction * step_mean_ms
    stall = 1.0 - min(compute_only_mean_ms, loop_compute_ms) / step_mean_ms
    return max(stall, 0.0), compute_only_mean_ms > (1.0 + IMPOSSIBLE_TOLERANCE) * step_mean_ms


def compute_key(case: Track3Case) -> str:
    """Cases sharing this key share a compute-only baseline (only the loader side differs)."""
    neutral = dataclasses.replace(
        case,
        crop=case.crop.replace(decode="direct", decode_threads=1),
        access="random",
        compute_only=False,
        loader=LoaderSpec(batch_size=case.loader.batch_size, collate=case.loader.collate),
        pipeline="dataset",
    )
    return f"{neutral.label}/steps{case.steps}+{case.warmup_steps}/seed{case.seed}"


def run_case(
    plate: str | Path,
    case: Track3Case,
    baseline: dict[str, Any] | None = None,
    objects: ObjectTable | None = None,
    *,
    shard: SamplerFactory | None = None,
    wrap: ModelWrap | None = None,
) -> dict[str, Any]:
    """Measure one case (and its compute-only baseline unless one is given).

    ``shard`` builds the sampler (one rank's share) and ``wrap`` wraps the model, in both loops.
    """
    device = resolve_device(case.device)
    baseline = baseline if baseline is not None else compute_only(plate, case, objects, shard=shard, wrap=wrap)
    if case.compute_only:
        return {**baseline, **device_info(device)}
    device_tier = case.pipeline == "device"
    # The device tier pins into its own reused buffers; the DataLoader's pinning would copy twice.
    pin = pin_in_effect(case.loader.pin_memory, device) and not device_tier
    batch = case.loader.batch_size
    samples = batch * (case.steps + case.warmup_steps)
    dataset, loader = _loader(plate, case, case.loader, samples, pin, objects, shard, epochs=2)
    tier = DeviceTier.for_dataset(dataset.plan, case.crop, device) if device_tier else None
    non_blocking = pin or (tier is not None and tier.staging is not None)
    prepare = _preparer(case, device, non_blocking, tier)
    compute = StepCompute(case, device, len(dataset.channel_indices), wrap)
    sync = synchroniser(device)
    clock = time.perf_counter_ns
    start = clock()
    iterator = iter(loader)
    iter_ns = clock() - start
    with NvmlSampler(device) as nvml, cuda_memory(device) as peak:
        timing = timed_loop(iterator.__next__, prepare, compute, case.steps, case.warmup_steps, sync)
    workers = memory_of(worker_pids(iterator))
    del iterator
    supply = supply_rate(loader, prepare, case, sync)
    metrics = _loop_metrics(timing, batch)
    crossing = boundaries(case.crop, len(dataset.channel_indices), case.pipeline, case.loader.num_workers, device)
    stall, impossible = stall_crosscheck(
        metrics[m.STEP_MEAN_MS], baseline[m.COMPUTE_ONLY_STEP_MEAN_MS], metrics[m.ACCELERATOR_BUSY_FRACTION]
    )
    metrics.update(
        {
            **baseline,
            m.STALL_CROSSCHECK: stall,
            m.CROSSCHECK_GAP: stall - metrics[m.DATA_WAIT_FRACTION],
            m.MEETS_AU_THRESHOLD: metrics[m.DATA_WAIT_FRACTION] < AU_THRESHOLD,
            m.ITER_CREATE_MS: iter_ns / 1e6,
            m.FIRST_BATCH_MS: (iter_ns + int(timing.wait_ns[0])) / 1e6,
            m.PIN_MEMORY_EFFECTIVE: non_blocking,
            m.NON_BLOCKING: non_blocking,
            m.SUPPLY_SAMPLES_PER_S: supply,
            m.SUPPLY_OVER_DEMAND: supply / baseline[m.COMPUTE_ONLY_IMAGES_PER_S],
            m.TRANSFORM_DEVICE: crossing.transform_device,
            m.BYTES_WORKER_TO_MAIN_PER_SAMPLE: crossing.worker_to_main,
            m.BYTES_HOST_TO_DEVICE_PER_SAMPLE: crossing.host_to_device,
            m.OBJECTS: len(dataset),
            **validity(
                case.crop,
                dataset.reader,
                items_drawn=batch * (case.steps + case.warmup_steps),
                objects=len(dataset),
                p95_reliable=metrics[prefixed(m.STEP, m.P95_RELIABLE)],
                impossible=impossible,
            ),
            **device_info(device),
            **nvml.metrics(),
            **peak,
            **workers,
        }
    )
    if compute.losses:
        metrics[m.LOSS_FIRST] = float(compute.losses[0])
        metrics[m.LOSS_LAST] = float(compute.losses[-1])
    return metrics


def supply_rate(loader: Any, prepare: Callable[[Any], Batch], case: Track3Case, sync: Callable[[], None]) -> float:
    """Samples/s of the loader alone, as the loop would take them (``next()`` and the preparation on the
    device, synchronised), over the second scheduled epoch: fresh crops, workers started afresh."""
    loader.sampler.set_epoch(1)
    iterator = iter(loader)
    timing = timed_loop(iterator.__next__, prepare, lambda images, labels: None, case.steps, case.warmup_steps, sync)
    del iterator
    steps = timing.steady("step_ns")
    return samples_per_s(case.loader.batch_size * len(steps), int(steps.sum()) / 1e9)


def search_summary(search: WorkerSearch, results: Sequence[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    """The search's answer: the smallest worker count under the threshold, or None if none was."""
    fed = [workers for workers, metrics in results if metrics[m.DATA_WAIT_FRACTION] < search.threshold]
    tried = max((workers for workers, _ in results), default=0)
    return {
        m.MIN_WORKERS: fed[0] if fed else None,
        m.REACHED: bool(fed),
        m.THRESHOLD: search.threshold,
        m.MIN_WORKERS_ANSWER: str(fed[0]) if fed else f"not reached with <= {tried}",
        m.TRIED_WORKERS: [workers for workers, _ in results],
        m.DATA_WAIT_FRACTION_BY_WORKERS: [metrics[m.DATA_WAIT_FRACTION] for _, metrics in results],
        m.IMAGES_PER_S_BY_WORKERS: [metrics[m.IMAGES_PER_S] for _, metrics in results],
        m.COMPUTE_ONLY_IMAGES_PER_S: results[0][1][m.COMPUTE_ONLY_IMAGES_PER_S] if results else None,
    }


def iter_search(
    search: WorkerSearch,
    measure: Callable[[Track3Case], dict[str, Any]],
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(workers, metrics) of each candidate as it is measured: ascending (stopping at the first fed
    one if ``stop_early``), or bisecting."""
    candidates = search.candidates

    def fed(metrics: dict[str, Any]) -> bool:
        return bool(metrics[m.DATA_WAIT_FRACTION] < search.threshold)

    if search.bisect:
        # Invariant: candidates[high] is fed, every candidate below ``low`` is not.
        low, high = 0, len(candidates) - 1
        metrics = measure(search.with_workers(candidates[high]))
        yield candidates[high], metrics
        if fed(metrics):
            while low < high:
                middle = (low + high) // 2
                metrics = measure(search.with_workers(candidates[middle]))
                yield candidates[middle], metrics
                if fed(metrics):
                    high = middle
                else:
                    low = middle + 1
        return
    for workers in candidates:
        metrics = measure(search.with_workers(workers))
        yield workers, metrics
        if fed(metrics) and search.stop_early:
            return


def run_search(
    plate: str | Path,
    search: WorkerSearch,
    measure: Callable[[Track3Case], dict[str, Any]] | None = None,
) -> tuple[list[tuple[int, dict[str, Any]]], dict[str, Any]]:
    """Every candidate :func:`iter_search` measures, in ascending worker order, and the search's answer."""
    results = sorted(iter_search(search, measure or (lambda case: run_case(plate, case))), key=lambda r: r[0])
    return results, search_summary(search, results)


Item = Track3Case | WorkerSearch | ThreadSplit


def _workers(case: Track3Case, workers: int) -> Track3Case:
    return dataclasses.replace(case, loader=dataclasses.replace(case.loader, num_workers=workers))


def _smoke_items(crop: CropConfig) -> list[Item]:
    resnet = Track3Case(crop=crop, loader=LoaderSpec(batch_size=16, pin_memory=True), steps=3, warmup_steps=1)
    small = Track3Case(
        crop=crop, loader=LoaderSpec(batch_size=64, pin_memory=True), model="smallcnn", steps=10, warmup_steps=2
    )
    emulated = dataclasses.replace(small, model="emulated", emulated_step_ms=40.0)
    return [
        resnet,
        dataclasses.replace(resnet, workload="embed"),
        dataclasses.replace(resnet, amp="bf16"),
        small,
        dataclasses.replace(small, pipeline="device", loader=dataclasses.replace(small.loader, collate="stack")),
        WorkerSearch(emulated, (0, 1, 2)),
    ]


def _full_items(crop: CropConfig) -> list[Item]:
    resnet = Track3Case(crop=crop, loader=LoaderSpec(batch_size=32, pin_memory=True), steps=8, warmup_steps=2)
    small = Track3Case(
        crop=crop, loader=LoaderSpec(batch_size=128, pin_memory=True), model="smallcnn", steps=20, warmup_steps=3
    )
    candidates = tuple(worker_counts())
    items: list[Item] = [
        _workers(dataclasses.replace(resnet, workload=workload, amp=amp), workers)
        for workload in WORKLOADS
        for amp in ("off", "bf16")
        for workers in (0, 2)
    ]
    items += [dataclasses.replace(small, workload="embed"), WorkerSearch(small, candidates, stop_early=False)]
    for step_ms in (10.0, 40.0):
        emulated = dataclasses.replace(small, model="emulated", emulated_step_ms=step_ms)
        items += [
            WorkerSearch(dataclasses.replace(emulated, crop=crop.replace(decode=decode)), candidates)
            for decode in ("direct", "zarr")
        ]
    return items


def _gpu_base(crop: CropConfig) -> Track3Case:
    """The GPU check's model: ResNet-18, batch 256 of 96 × 96 × 5 crops, bf16, CUDA."""
    return Track3Case(
        crop=crop,
        loader=LoaderSpec(batch_size=256, pin_memory=True),
        amp="bf16",
        device="cuda",
        steps=32,
        warmup_steps=4,
    )


def _gpu_demand_items(crop: CropConfig) -> list[Item]:
    """What the GPU demands: compute-only images/s, train and embed, bf16 and fp32 (batches already there)."""
    base = dataclasses.replace(_gpu_base(crop), compute_only=True, steps=50, warmup_steps=10)
    return [dataclasses.replace(base, workload=workload, amp=amp) for workload in WORKLOADS for amp in ("bf16", "off")]


def _gpu_items(crop: CropConfig) -> list[Item]:
    """The GPU check: the fewest workers that keep the GPU >= 90% busy, the device pipeline beside the
    dataset pipeline, per workload and AMP, on the ``direct`` path.

    Bisected searches over 0-16 workers (capped by the cores) in whole rounds, the most workers first
    (so every search has a row at the most workers, with its supply over demand); then the threads-vs-
    workers split of the most workers' cores for bf16 training on the device pipeline.
    """
    gpu = _gpu_base(crop)
    candidates = tuple(worker_counts())

    def search(case: Track3Case) -> WorkerSearch:
        return WorkerSearch(case, candidates, bisect=True, whole_rounds=True)

    device = dataclasses.replace(gpu, pipeline="device", loader=dataclasses.replace(gpu.loader, collate="stack"))
    return [
        search(device),
        search(gpu),
        search(dataclasses.replace(device, workload="embed")),
        search(dataclasses.replace(gpu, workload="embed")),
        search(dataclasses.replace(device, amp="off")),
        ThreadSplit(device, candidates[-1], whole_rounds=True),
    ]


PRESETS: dict[str, Callable[[CropConfig], list[Item]]] = {
    "smoke": _smoke_items,
    "full": _full_items,
    "gpu": _gpu_items,
    "gpu-demand": _gpu_demand_items,
}


def preset_items(preset: str, samples: int | None = None) -> list[Item]:
    """The Track 3 plan of a preset: single cases and worker searches.

    ``smoke`` and ``full`` run on whatever device is there (``auto``); ``gpu`` (the loader feeding
    ResNet-18 with 96×96×5 crops, batch 256, on CUDA) and ``gpu-demand`` (the same model's compute-only
    images/s) are the GPU check and fail without a GPU.
    ``samples`` overrides the steps as ``samples // batch_size``.
    """
    if preset not in PRESETS:
        raise ConfigError(f"preset={preset!r} is not one of {', '.join(PRESETS)}")
    items = PRESETS[preset](_default_crop())
    if samples is None:
        return items

    def with_steps(case: Track3Case) -> Track3Case:
        return dataclasses.replace(case, steps=max(1, samples // case.loader.batch_size))

    return [
        dataclasses.replace(i, case=with_steps(i.case)) if isinstance(i, (WorkerSearch, ThreadSplit)) else with_steps(i)
        for i in items
    ]


class Track3:
    """Track 3 for the runner: single cases and worker searches (a row per step measured, then the answer).

    Compute-only baselines are measured once per compute configuration and shared by the rows
    that differ only in their loader (a worker sweep, say).
    """

    name = "3"

    def __init__(self) -> None:
        self.baselines: dict[str, dict[str, Any]] = {}

    def cases(self, preset: str, context: RunContext) -> list[Item]:
        return preset_items(preset, context.samples)

    def decode(self, item: Item) -> str:
        return (item.case if isinstance(item, (WorkerSearch, ThreadSplit)) else item).crop.decode

    def _run(self, case: Track3Case, context: RunContext) -> dict[str, Any]:
        key = compute_key(case)
        if key not in self.baselines:
            self.baselines[key] = compute_only(context.plate, case, context.object_table)
        return run_case(context.plate, case, self.baselines[key], context.object_table)

    def measure(self, item: Item, repeat: int, context: RunContext) -> Iterator[Row]:
        if isinstance(item, Track3Case):
            case = seeded(item, repeat)
            yield Row(item, dataclasses.asdict(case), self._run(case, context), case.seed)
            return
        if isinstance(item, ThreadSplit):
            yield from self._split(item, repeat, context)
            return
        search = dataclasses.replace(item, case=seeded(item.case, repeat))

        def measure_one(case: Track3Case) -> dict[str, Any]:
            context.progress(f"track 3 {case.label} (repeat {repeat})")
            return self._run(case, context)

        results = []
        for workers, metrics in iter_search(search, measure_one):
            results.append((workers, metrics))
            step = search.with_workers(workers)
            yield Row(item.with_workers(workers), dataclasses.asdict(step), metrics, step.seed)
        results.sort(key=lambda result: result[0])
        yield Row(item, dataclasses.asdict(search), search_summary(search, results), search.case.seed)

    def _split(self, item: ThreadSplit, repeat: int, context: RunContext) -> Iterator[Row]:
        split = dataclasses.replace(item, case=seeded(item.case, repeat))
        results = []
        for workers, threads in split.splits:
            step = split.with_split(workers, threads)
            context.progress(f"track 3 {step.label} (repeat {repeat})")
            metrics = self._run(step, context)
            results.append(((workers, threads), metrics))
            yield Row(item.with_split(workers, threads), dataclasses.asdict(step), metrics, step.seed)
        yield Row(item, dataclasses.asdict(split), split_summary(split, results), split.case.seed)
