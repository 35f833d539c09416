"""Track ``loader`` (Track 2, ``--track 2``): the preset grids of DataLoader cases, each measured by
:func:`cropbench.harness.loader_case.run_case`, and the overhead cases that time the loader against the
same crops read in batches in the main process, block by block in turns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from cropbench import metrics as m
from cropbench.config import ACCESS_PATTERNS, DEFAULT_CROP_SIZE, CropConfig
from cropbench.data.device_pipeline import PIPELINES, boundaries
from cropbench.data.distributed import SamplerFactory, per_rank
from cropbench.data.loader import (
    LoaderSpec,
    ScheduledSampler,
    build_loader,
)
from cropbench.data.sampling import continued_order, sampler_for
from cropbench.errors import ConfigError
from cropbench.harness.context import RunContext, worker_counts
from cropbench.harness.loader_case import LoaderCase, run_case
from cropbench.harness.ranks import RankShare
from cropbench.harness.ratios import paired_ratios
from cropbench.harness.runner import Row, seeded
from cropbench.measure.protocol import Stopwatch, samples_per_s
from cropbench.records import LOADER_TRACK

FULL_SAMPLES_PER_EPOCH = 4096


def preset_cases(preset: str, samples: int | None = None, objects: int | None = None) -> list[LoaderCase]:
    """The Track 2 grid: crops already in memory (the ceilings), then the workers × batch-size sweep,
    then one knob at a time around a base.

    The ceilings come first, so each row read from the plate is judged against the ceiling at its
    shape as it is written (:func:`cropbench.harness.flags.ceiling_reasons`). Non-persistent cases come
    before their persistent twin so the runner can report the epoch-2 gain of persistence on the
    twin's row. With ``objects`` (the plate's), the full preset's epochs
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
    crop = CropConfig(crop_size=DEFAULT_CROP_SIZE)

    def case(loader: LoaderSpec, crop: CropConfig = crop, **changes: Any) -> LoaderCase:
        # At least two batches per epoch, so a steady window exists whatever ``samples`` says.
        return LoaderCase(crop=crop, loader=loader, samples=max(per_epoch, 2 * loader.batch_size), **changes)

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
    return [c for c in cases if c.source == "memory"] + [c for c in cases if c.source != "memory"]


#: Steady batches a ``gpu`` case times at least (more with workers: whole rounds, see :func:`gpu_cases`).
GPU_STEADY_BATCHES = 8
#: The batch a GPU step consumes in the GPU check (ResNet-18 on 96 × 96 × 5 crops).
GPU_BATCH = 256


def gpu_cases(samples: int | None = None) -> list[LoaderCase]:
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
    crop = CropConfig(crop_size=DEFAULT_CROP_SIZE)

    def sized(crop: CropConfig, workers: int, pipeline: str = "dataset", **knobs: Any) -> LoaderCase:
        collate = "stack" if pipeline == "device" else "default"
        loader = LoaderSpec(num_workers=workers, batch_size=GPU_BATCH, pin_memory=True, collate=collate, **knobs)
        steady = max(2, -(-least // workers)) * workers if workers else least
        return LoaderCase(
            crop=crop,
            loader=loader,
            samples=(max(workers, 1) + steady) * GPU_BATCH,
            epochs=2 if workers == counts[-1] else 1,
            pipeline=pipeline,
        )

    def sweep(tier: str) -> list[LoaderCase]:
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

    crop: CropConfig = field(default_factory=lambda: CropConfig(crop_size=DEFAULT_CROP_SIZE, dtype="uint16"))
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


def run_overhead(context: RunContext, case: OverheadCase) -> dict[str, Any]:
    """Measure one :class:`OverheadCase`: both rates, their ratio overall and paired per block."""
    batch = case.loader.batch_size
    loaded = context.dataset(case.crop)
    reader = context.dataset(case.crop.replace(decode_threads=case.reader_threads))
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


def _persistent_twin(case: LoaderCase) -> str | None:
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


class Loader:
    """Track ``loader`` for the runner; a persistent case's row also gets the gain over its measured twin."""

    name = LOADER_TRACK

    def __init__(self) -> None:
        self.measured: dict[tuple[str, int], dict[str, Any]] = {}

    def cases(self, preset: str, context: RunContext) -> list[LoaderCase] | list[OverheadCase]:
        """The preset's DataLoader cases: workers, batch size, pinning, persistence and prefetch.

        Args:
            preset: The preset's name: ``smoke``, ``full``, ``gpu``, or ``overhead`` (the loader's
                own cost beside a plain loop).
            context: The run's plate; its ``samples`` overrides each case's sample count, and
                ``full`` sizes epochs to its object count.

        Returns:
            The cases in the order they run.

        Raises:
            ConfigError: An unknown preset.
        """
        if preset == "overhead":
            return overhead_cases(context.samples)
        return preset_cases(preset, context.samples, context.object_count if preset == "full" else None)

    def decode(self, case: LoaderCase | OverheadCase) -> str:
        """The read path ``case`` needs; the runner skips a case whose path the plate's layout lacks."""
        return case.crop.decode

    def on_ranks(self, case: LoaderCase | OverheadCase) -> LoaderCase | None:
        """A loader case as it runs across ranks: the ranks' sampler replaces its access pattern; an
        overhead case, which times the main process's reads beside the loader's, does not split."""
        return dataclasses.replace(case, access="random") if isinstance(case, LoaderCase) else None

    def measure_share(
        self,
        case: LoaderCase,
        ranks: int,
        balance: str,
        context: RunContext,
        shard: SamplerFactory,
        wrap: Callable[[torch.nn.Module], torch.nn.Module],
    ) -> RankShare:
        """This rank's share of the case's epoch (``case.samples`` over all ranks) through the loader."""
        share = per_rank(case.samples, ranks, balance)
        ran = dataclasses.replace(case, samples=share)
        metrics = run_case(context, ran, shard=shard)
        seconds = float(metrics[m.LOOP_SECONDS])
        samples = share * ran.epochs
        return RankShare(ran, metrics, samples, seconds, seconds, samples, ran.loader.num_workers)

    def measure(self, case: LoaderCase | OverheadCase, repeat: int, context: RunContext) -> Iterator[Row]:
        """Measure one case: whole epochs through a DataLoader, first batch and steady rate apart.

        Args:
            case: One case of :meth:`cases`.
            repeat: The repeat's number; it is added to the case's seed.
            context: The run's plate.

        Yields:
            One row; a persistent-workers case's row also carries its gain over its measured twin.
        """
        if isinstance(case, OverheadCase):
            ran = seeded(case, repeat)
            yield Row(case, dataclasses.asdict(ran), run_overhead(context, ran), ran.seed)
            return
        repeated = seeded(case, repeat)
        metrics = run_case(context, repeated)
        self.measured[(case.label, repeat)] = metrics
        twin = _persistent_twin(case)
        if twin is not None and (twin, repeat) in self.measured:
            metrics.update(persistent_gain(metrics, self.measured[(twin, repeat)]))
        yield Row(case, dataclasses.asdict(repeated), metrics, repeated.seed)
