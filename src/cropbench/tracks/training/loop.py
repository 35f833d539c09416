"""Track 3's timed loop: one case measured against its compute-only baseline, then its loader alone.

Each step is timed in two parts, with the device synchronised before every clock read: the data
wait (blocking ``next()`` on the DataLoader plus the host-to-device copy) and the compute (forward,
or forward, backward and optimiser step). The data-wait fraction is the summed wait over the summed
step time. A compute-only baseline runs the same loop on batches already on the device; the stall
it implies, (step − compute-only) / step, must agree with the measured data-wait fraction, and a
gap says the compute itself slowed down beside the loader (CPU contention). The compute-only time
that stall uses is never longer than the loop's own compute parts (see :func:`stall_crosscheck`),
so the stall is never negative; a baseline longer than the whole loaded step flags the row
``impossible``.

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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from cropbench import metrics as m
from cropbench.data.dataset import CropDataset
from cropbench.data.device_pipeline import DeviceTier, boundaries, loader_crop
from cropbench.data.distributed import SamplerFactory
from cropbench.data.loader import LoaderSpec, ScheduledSampler, build_loader, memory_of, schedule, worker_pids
from cropbench.data.sampling import sampler_for
from cropbench.errors import ConfigError
from cropbench.harness.context import RunContext
from cropbench.harness.validity import IMPOSSIBLE_TOLERANCE, enough_rate_timings, validity
from cropbench.measure.accelerator import (
    NvmlSampler,
    cuda_memory,
    device_info,
    pin_in_effect,
    resolve_device,
    synchroniser,
    to_device,
)
from cropbench.measure.protocol import samples_per_s, summarise_ms
from cropbench.metrics import prefixed
from cropbench.tracks.training.cases import AU_THRESHOLD, TrainingCase
from cropbench.tracks.training.compute import ModelWrap, StepCompute

#: Distinct batches the compute-only baseline cycles through.
BASELINE_BATCHES = 2

Batch = tuple[torch.Tensor, torch.Tensor]


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
    case: TrainingCase, device: torch.device, non_blocking: bool, tier: DeviceTier | None = None
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
    context: RunContext,
    case: TrainingCase,
    spec: LoaderSpec,
    samples: int,
    pin: bool,
    shard: SamplerFactory | None = None,
    epochs: int = 1,
) -> tuple[CropDataset, Any]:
    """The case's dataset (raw crops under the device pipeline) and a loader of ``epochs`` scheduled
    epochs of ``samples`` each (``sampler.set_epoch`` picks one)."""
    crop = loader_crop(case.crop, case.pipeline)
    dataset = context.dataset(crop, labels=(case.target,) if case.target else ())
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
    context: RunContext,
    case: TrainingCase,
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
        context,
        case,
        LoaderSpec(batch_size=batch, collate=case.loader.collate),
        batch * BASELINE_BATCHES,
        pin=False,
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
    :data:`~cropbench.harness.validity.IMPOSSIBLE_TOLERANCE`, so the machine's speed changed between the two.
    """
    loop_compute_ms = busy_fraction * step_mean_ms
    stall = 1.0 - min(compute_only_mean_ms, loop_compute_ms) / step_mean_ms
    return max(stall, 0.0), compute_only_mean_ms > (1.0 + IMPOSSIBLE_TOLERANCE) * step_mean_ms


def compute_key(case: TrainingCase) -> str:
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


def step_over_compute(metrics: dict[str, Any]) -> float:
    """Mean step time over the compute-only mean step time, from one :func:`run_case` answer: how far
    the loader stretches each step beyond its compute."""
    return float(metrics[m.STEP_MEAN_MS] / metrics[m.COMPUTE_ONLY_STEP_MEAN_MS])


def run_case(
    context: RunContext,
    case: TrainingCase,
    baseline: dict[str, Any] | None = None,
    *,
    shard: SamplerFactory | None = None,
    wrap: ModelWrap | None = None,
) -> dict[str, Any]:
    """Measure one case (and its compute-only baseline unless one is given).

    ``shard`` builds the sampler (one rank's share) and ``wrap`` wraps the model, in both loops.
    """
    device = resolve_device(case.device)
    baseline = baseline if baseline is not None else compute_only(context, case, shard=shard, wrap=wrap)
    if case.compute_only:
        return {**baseline, **device_info(device)}
    device_tier = case.pipeline == "device"
    # The device tier pins into its own reused buffers; the DataLoader's pinning would copy twice.
    pin = pin_in_effect(case.loader.pin_memory, device) and not device_tier
    batch = case.loader.batch_size
    samples = batch * (case.steps + case.warmup_steps)
    dataset, loader = _loader(context, case, case.loader, samples, pin, shard, epochs=2)
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
                enough_timings=enough_rate_timings(metrics[prefixed(m.STEP, m.COUNT)]),
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


def supply_rate(loader: Any, prepare: Callable[[Any], Batch], case: TrainingCase, sync: Callable[[], None]) -> float:
    """Samples/s of the loader alone, as the loop would take them (``next()`` and the preparation on the
    device, synchronised), over the second scheduled epoch: fresh crops, workers started afresh."""
    loader.batch_sampler.sampler.set_epoch(1)
    iterator = iter(loader)
    timing = timed_loop(iterator.__next__, prepare, lambda images, labels: None, case.steps, case.warmup_steps, sync)
    del iterator
    steps = timing.steady("step_ns")
    return samples_per_s(case.loader.batch_size * len(steps), int(steps.sum()) / 1e9)
