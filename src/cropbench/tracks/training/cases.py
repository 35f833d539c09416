"""What Track 3 measures: a case (a model fed by one loader), a worker search and a threads-vs-workers split.

Each is a frozen, validated value that the runner records as the row's config; how one is measured
lives in :mod:`~cropbench.tracks.training.loop` and :mod:`~cropbench.tracks.training.search`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from cropbench.config import ACCESS_PATTERNS, DEFAULT_CROP_SIZE, CropConfig
from cropbench.data.device_pipeline import check_pipeline
from cropbench.data.loader import LoaderSpec
from cropbench.errors import ConfigError
from cropbench.measure.accelerator import AMP_MODES, DEVICES
from cropbench.tracks.training.models import MODELS, is_user_model

MODEL_KINDS = (*MODELS, "emulated")
WORKLOADS = ("train", "embed")
OPTIMISERS = ("sgd", "adam")
#: Data-wait fraction under which the accelerator counts as fed (MLPerf Storage: AU >= 90%).
AU_THRESHOLD = 0.10


def default_crop() -> CropConfig:
    """The crop of a case unless one is given, and of every preset: 96 px, light tier."""
    return CropConfig(crop_size=DEFAULT_CROP_SIZE, tier="light")


def _default_loader() -> LoaderSpec:
    return LoaderSpec(batch_size=32, pin_memory=True)


@dataclass(frozen=True)
class TrainingCase:
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

    crop: CropConfig = field(default_factory=default_crop)
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
        if self.model not in MODEL_KINDS and not is_user_model(self.model):
            raise ConfigError(f"model={self.model!r} is not one of {', '.join(MODEL_KINDS)} or path/to/file.py:factory")
        for name, value, allowed in (
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


def short_loop_case(model: str, num_workers: int, device: str, steps: int) -> TrainingCase:
    """A short loop of ``model`` on ``device`` (the asv suites' Track 3 case): 96 px crops at tier ``light``,
    batches of 64 from ``num_workers`` workers (pinned on CUDA), ``steps`` timed steps after two warm-up
    steps; ``emulated`` computes 40 ms a step."""
    return TrainingCase(
        crop=CropConfig(crop_size=DEFAULT_CROP_SIZE, tier="light"),
        loader=LoaderSpec(num_workers=num_workers, batch_size=64, pin_memory=device == "cuda"),
        model=model,
        device=device,
        steps=steps,
        warmup_steps=2,
        emulated_step_ms=40.0 if model == "emulated" else 0.0,
    )


def with_num_workers(case: TrainingCase, workers: int) -> TrainingCase:
    """The case with its loader's ``num_workers`` set to ``workers``."""
    return dataclasses.replace(case, loader=dataclasses.replace(case.loader, num_workers=workers))


@dataclass(frozen=True)
class WorkerSearch:
    """The smallest ``num_workers`` (among ``candidates``, ascending) whose data wait is under ``threshold``.

    ``stop_early=False`` measures every candidate anyway, for a full curve. ``bisect`` measures the most
    workers first and then halves the range (a few loops instead of one per candidate, and the slow
    few-worker loops only when they might be fed); it assumes data wait does not rise with workers.
    ``whole_rounds`` warms up one step per worker and times whole rounds of one batch per worker:
    workers that start together deliver in lockstep, so a window of part of a round miscounts them.
    """

    case: TrainingCase
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

    def with_workers(self, workers: int) -> TrainingCase:
        case = with_num_workers(self.case, workers)
        return _in_whole_rounds(case) if self.whole_rounds else case

    @property
    def label(self) -> str:
        base = self.with_workers(0).label.split("/")
        return "/".join("w*" if part == "w0" else part for part in base) + "/min-workers"


def _in_whole_rounds(case: TrainingCase) -> TrainingCase:
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

    case: TrainingCase
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

    def with_split(self, workers: int, threads: int) -> TrainingCase:
        case = dataclasses.replace(
            with_num_workers(self.case, workers), crop=self.case.crop.replace(decode_threads=threads)
        )
        return _in_whole_rounds(case) if self.whole_rounds else case

    @property
    def label(self) -> str:
        base = with_num_workers(self.case, 0).label.split("/")
        return "/".join("w*" if part == "w0" else part for part in base) + f"/split{self.cores}-cores"


Item = TrainingCase | WorkerSearch | ThreadSplit
