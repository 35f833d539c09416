"""Track ``training`` for the runner: the presets' plans, and the rows each case, search or split yields."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch

from cropbench import metrics as m
from cropbench.config import CropConfig
from cropbench.data.distributed import SamplerFactory
from cropbench.data.loader import LoaderSpec
from cropbench.errors import ConfigError
from cropbench.harness.context import RunContext, worker_counts
from cropbench.harness.ranks import RankShare
from cropbench.harness.runner import Row, seeded
from cropbench.harness.validity import with_contradictions
from cropbench.records import TRAINING_TRACK
from cropbench.tracks.training.cases import (
    WORKLOADS,
    Item,
    ThreadSplit,
    TrainingCase,
    WorkerSearch,
    default_crop,
    with_num_workers,
)
from cropbench.tracks.training.loop import compute_key, compute_only, run_case
from cropbench.tracks.training.search import iter_search, search_summary, split_summary


def _smoke_items(crop: CropConfig) -> list[Item]:
    resnet = TrainingCase(crop=crop, loader=LoaderSpec(batch_size=16, pin_memory=True), steps=3, warmup_steps=1)
    small = TrainingCase(
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
    # 16 timed steps: the fewest a quoted rate rests on (validity.MIN_RATE_TIMINGS).
    resnet = TrainingCase(crop=crop, loader=LoaderSpec(batch_size=32, pin_memory=True), steps=16, warmup_steps=2)
    small = TrainingCase(
        crop=crop, loader=LoaderSpec(batch_size=128, pin_memory=True), model="smallcnn", steps=20, warmup_steps=3
    )
    candidates = tuple(worker_counts())
    items: list[Item] = [
        with_num_workers(dataclasses.replace(resnet, workload=workload, amp=amp), workers)
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


def _gpu_base(crop: CropConfig) -> TrainingCase:
    """The GPU check's model: ResNet-18, batch 256 of 96 × 96 × 5 crops, bf16, CUDA."""
    return TrainingCase(
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

    def search(case: TrainingCase) -> WorkerSearch:
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
    items = PRESETS[preset](default_crop())
    if samples is None:
        return items

    def with_steps(case: TrainingCase) -> TrainingCase:
        return dataclasses.replace(case, steps=max(1, samples // case.loader.batch_size))

    return [
        dataclasses.replace(i, case=with_steps(i.case)) if isinstance(i, (WorkerSearch, ThreadSplit)) else with_steps(i)
        for i in items
    ]


class Training:
    """Track ``training`` for the runner: single cases and worker searches (a row per step measured, then the answer).

    Compute-only baselines are measured once per compute configuration and shared by the rows
    that differ only in their loader (a worker sweep, say).
    """

    name = TRAINING_TRACK

    def __init__(self) -> None:
        self.baselines: dict[str, dict[str, Any]] = {}

    def cases(self, preset: str, context: RunContext) -> list[Item]:
        """The preset's plan: single training-loop cases, worker searches and thread splits.

        Args:
            preset: The preset's name: ``smoke``, ``full``, ``gpu`` or ``gpu-demand``.
            context: The run's plate; its ``samples`` sets each case's steps (``samples // batch_size``).

        Returns:
            The cases in the order they run.

        Raises:
            ConfigError: An unknown preset.
        """
        return preset_items(preset, context.samples)

    def decode(self, item: Item) -> str:
        """The read path ``item`` needs; the runner skips an item whose path the plate's layout lacks."""
        return (item.case if isinstance(item, (WorkerSearch, ThreadSplit)) else item).crop.decode

    def on_ranks(self, item: Item) -> TrainingCase | None:
        """A single case trains across ranks under DDP; a worker search or thread split, which picks
        among loops by their rates, does not split."""
        return item if isinstance(item, TrainingCase) else None

    def measure_share(
        self,
        case: TrainingCase,
        ranks: int,
        balance: str,
        context: RunContext,
        shard: SamplerFactory,
        wrap: Callable[[torch.nn.Module], torch.nn.Module],
    ) -> RankShare:
        """This rank's ``case.steps`` steps (a global batch of ranks × batch), the model under ``wrap``
        unless the case emulates its step."""
        metrics = run_case(context, case, None, shard=shard, wrap=wrap if case.model != "emulated" else None)
        seconds = float(metrics[m.LOOP_SECONDS])
        batch = case.loader.batch_size
        return RankShare(
            case,
            metrics,
            samples=batch * case.steps,
            seconds=seconds,
            data_wait_seconds=float(metrics[m.DATA_WAIT_FRACTION]) * seconds,
            consumed=batch * (case.steps + case.warmup_steps),
            workers=case.loader.num_workers,
        )

    def _run(self, case: TrainingCase, context: RunContext) -> dict[str, Any]:
        """One loop's row, ``impossible`` among its flags where its numbers contradict each other (as the
        runner writes it), so a search or split never answers from such a row."""
        key = compute_key(case)
        if key not in self.baselines:
            self.baselines[key] = compute_only(context, case)
        return with_contradictions(self.name, run_case(context, case, self.baselines[key]))

    def measure(self, item: Item, repeat: int, context: RunContext) -> Iterator[Row]:
        """Measure one item: a training loop, or a search or split as the loops it is made of.

        Args:
            item: One item of :meth:`cases`.
            repeat: The repeat's number; it is added to the case's seed.
            context: The run's plate.

        Yields:
            A case's row; for a search or split, a row per loop measured, then the row of its answer.
        """
        if isinstance(item, TrainingCase):
            case = seeded(item, repeat)
            yield Row(item, dataclasses.asdict(case), self._run(case, context), case.seed)
            return
        if isinstance(item, ThreadSplit):
            yield from self._split(item, repeat, context)
            return
        search = dataclasses.replace(item, case=seeded(item.case, repeat))

        def measure_one(case: TrainingCase) -> dict[str, Any]:
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
