"""What ``cropbench advise`` measures: the model's demand, the options of each question read in whole
epochs taking turns, and the recommendation run once more as a Track 3 loop.

A question (which read path, how many workers, which batch, prefetch, pinning) is a set of options, each
a crop configuration and a DataLoader. Each option reads whole epochs: ``iter()``, every batch, the first
included, and the workers' start-up and shut-down, with the CPU time of every process beside the wall
time. The options take turns round by round (:func:`~cropbench.measure.protocol.interleaved_blocks`,
the order rotating), after one untimed epoch each, so a machine that slows down slows them all alike.
Rounds are added until every paired ratio that decides the question tells its options apart (its
quartile spread below its distance from 1; :func:`~cropbench.harness.ratios.ratio_settled`), the
question's time is up, or :data:`MAX_ROUNDS` ran.

The reader's chunk cache is :data:`CACHE_FRACTION` of the decoded plate, so an epoch reads chunks rather
than cache hits; a row whose cache still holds the plate is flagged ``cache>=plate``, as on every track.
What the rows mean for the lab is decided in :mod:`cropbench.report.advice`, from the rows alone.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from cropbench import metrics as m
from cropbench.config import CropConfig
from cropbench.data.loader import LoaderSpec, ScheduledSampler, build_loader, schedule
from cropbench.data.sampling import sampler_for
from cropbench.errors import ConfigError
from cropbench.harness.context import RunContext, usable_cores
from cropbench.harness.ratios import (
    paired_ratios,
    predicted_data_wait,
    predicted_images_per_s,
    ratio_settled,
    supply_needed,
)
from cropbench.harness.runner import Row
from cropbench.harness.validity import (
    decoded_plate_bytes,
    enough_rate_timings,
    reader_cache_bytes,
    validity,
)
from cropbench.measure.accelerator import pin_in_effect, resolve_device, synchroniser, to_device
from cropbench.measure.protocol import cpu_seconds, interleaved_blocks
from cropbench.tracks.training.cases import AU_THRESHOLD, TrainingCase
from cropbench.tracks.training.loop import compute_only, run_case
from cropbench.tracks.training.models import MODELS, check_input, is_user_model

#: The records' track.
TRACK = "advise"
#: The reader's decoded-chunk cache as a share of the decoded plate: well below the plate, so epochs read chunks.
CACHE_FRACTION = 0.25
#: Most rounds a question runs, however open it stays.
MAX_ROUNDS = 24
#: How the ratios of a question are formed (see :class:`Question`).
COMPARISONS = ("pairwise", "need", "predicted")
#: The prefix of an emulated accelerator's model name: ``emulated:MS``.
EMULATED_PREFIX = "emulated:"


def model_case(model: str, crop: CropConfig, batch_size: int, steps: int, seed: int = 0) -> TrainingCase:
    """The Track 3 case of ``model`` as ``advise --model`` names it: ``resnet18``, ``smallcnn``,
    ``emulated:MS`` (an accelerator whose step takes MS milliseconds at ``batch_size``) or
    ``path/to/file.py:factory`` (the user's own, called as ``factory(channels, classes)``)."""
    loader = LoaderSpec(batch_size=batch_size, pin_memory=True)
    common: dict[str, Any] = {"crop": crop, "loader": loader, "steps": steps, "warmup_steps": 2, "seed": seed}
    if model.startswith(EMULATED_PREFIX):
        text = model.removeprefix(EMULATED_PREFIX)
        try:
            step_ms = float(text)
        except ValueError:
            step_ms = math.nan
        if not (math.isfinite(step_ms) and 0 < step_ms <= 60_000):
            raise ConfigError(f"--model {model}: the step time must be a number of milliseconds from 0 to 60000")
        return TrainingCase(model="emulated", emulated_step_ms=step_ms, **common)
    if model in MODELS or is_user_model(model):
        return TrainingCase(model=model, **common)
    raise ConfigError(f"--model {model!r} is not one of {', '.join(MODELS)}, emulated:MS or path/to/file.py:factory")


def at_batch(case: TrainingCase, batch_size: int) -> TrainingCase:
    """``case`` at another batch; an emulated accelerator's step time scales with the batch, so its images/s
    stay what the user measured on the device."""
    loader = dataclasses.replace(case.loader, batch_size=batch_size)
    step_ms = case.emulated_step_ms * batch_size / case.loader.batch_size if case.model == "emulated" else 0.0
    return dataclasses.replace(case, loader=loader, emulated_step_ms=step_ms)


def check_model(case: TrainingCase, context: RunContext) -> None:
    """A model of the user's own must take the run's crops: one line before anything is measured."""
    if is_user_model(case.model):
        channels = len(case.crop.channels or context.metadata.channel_names)
        check_input(case.model, channels, case.classes, case.crop.output_size or case.crop.crop_size)


def advise_crop(context: RunContext, crop: CropConfig, decode: str) -> CropConfig:
    """``crop`` on the ``decode`` path with its chunk cache at :data:`CACHE_FRACTION` of the decoded plate."""
    probe = context.dataset(crop.replace(decode=decode))
    try:
        cache = int(decoded_plate_bytes(probe.reader) * CACHE_FRACTION)
    finally:
        probe.reader.close()
    return crop.replace(decode=decode, chunk_cache_bytes=cache)


@dataclass(frozen=True)
class Option:
    """One way of loading the crops: the crop configuration (read path, cache) and the DataLoader."""

    name: str
    crop: CropConfig
    loader: LoaderSpec


@dataclass(frozen=True)
class Question:
    """A question decided by its options read in whole epochs, taking turns round by round.

    ``compare`` says which paired ratios decide it: ``pairwise``, the first option's whole-epoch rate
    over each other option's; ``need``, each option's rate over the crops/s the model needs at that
    option's worker count for its data wait to stay under ``threshold`` (``demand``: the model's
    compute-only images/s, one per option); ``predicted``, the first option's predicted loop images/s
    over each other's (each from its rate and its own ``demand``). With ``demand`` every option's row also
    carries the loop it predicts. ``epoch_crops`` crops per epoch (None:
    every object once); at least ``rounds`` rounds, at most ``max_rounds``. ``demand_flags`` are the
    validity flags of the rows the demand was measured in: a prediction resting on them carries them.
    """

    name: str
    options: tuple[Option, ...]
    compare: str = "pairwise"
    demand: tuple[float, ...] = ()
    demand_flags: tuple[str, ...] = ()
    threshold: float = AU_THRESHOLD
    epoch_crops: int | None = None
    rounds: int = 3
    max_rounds: int = MAX_ROUNDS
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.options or len({option.name for option in self.options}) != len(self.options):
            raise ConfigError(f"question {self.name}: options must be distinct and at least one")
        if self.compare not in COMPARISONS:
            raise ConfigError(f"compare={self.compare!r} is not one of {', '.join(COMPARISONS)}")
        if (self.compare != "pairwise" or self.demand) and (
            len(self.demand) != len(self.options) or not all(d > 0 for d in self.demand)
        ):
            raise ConfigError(f"question {self.name}: compare={self.compare!r} needs one demand > 0 per option")
        if not 1 <= self.rounds <= self.max_rounds:
            raise ConfigError(f"rounds must be from 1 to max_rounds={self.max_rounds}, got {self.rounds}")
        if self.epoch_crops is not None and self.epoch_crops < 1:
            raise ConfigError(f"epoch_crops must be >= 1, got {self.epoch_crops}")

    @property
    def label(self) -> str:
        return self.name


@dataclass(frozen=True)
class OptionRow:
    """The case of one option's row: its question and its option."""

    question: str
    option: Option

    @property
    def label(self) -> str:
        return f"{self.question}/{self.option.name}"


@dataclass(frozen=True)
class RatioRow:
    """The case of one paired ratio's row: ``reader``'s rate over ``reference``'s (an option, or ``need``)."""

    question: str
    reader: str
    reference: str

    @property
    def label(self) -> str:
        return f"{self.question}/{self.reader}/over/{self.reference}"


#: What a ratio is formed over where it is not another option: the crops/s the model needs.
NEED = "need"


@dataclass(frozen=True)
class Demand:
    """The model's compute-only images/s (batches already on the device) at the case's batch."""

    case: TrainingCase

    @property
    def label(self) -> str:
        return f"demand/{self.case.label}"


@dataclass(frozen=True)
class Verification:
    """The recommendation run once more as a Track 3 loop: the model fed by the recommended loader."""

    case: TrainingCase

    @property
    def label(self) -> str:
        return f"verify/{self.case.label}"


Item = Demand | Question | Verification


def _workers(option: Option) -> int:
    return option.loader.num_workers


@dataclass
class _Epochs:
    """Each option's whole epochs: wall seconds (one per round) and CPU seconds."""

    seconds: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[float]] = field(default_factory=dict)


def _epoch_call(
    loader: Any, sampler: ScheduledSampler, device: torch.device, non_blocking: bool, cpu: list[float]
) -> Callable[[int], None]:
    """One whole epoch of ``loader`` (scheduled epoch ``number``); on an accelerator each batch is copied
    there as the loop would copy it (pinned memory matters only there). Its CPU seconds go to ``cpu``."""
    sync = synchroniser(device)

    def epoch(number: int) -> None:
        sampler.set_epoch(number)
        before = cpu_seconds()
        for batch in loader:
            if device.type != "cpu":
                to_device(batch["image"], device, non_blocking, floating=True)
        sync()
        cpu.append(cpu_seconds() - before)

    return epoch


def ratio_rows(
    question: Question, seconds: dict[str, list[float]], crops: int
) -> list[tuple[RatioRow, dict[str, Any]]]:
    """The paired ratios that decide ``question`` from each option's epoch seconds (one per round)."""
    names = [option.name for option in question.options]
    rounds = min(len(seconds[name]) for name in names)
    spent = {name: np.asarray(seconds[name][:rounds]) for name in names}
    found: list[tuple[RatioRow, dict[str, Any]]] = []
    if question.compare == "need":
        for option, demand in zip(question.options, question.demand, strict=True):
            need = supply_needed(demand, _workers(option), question.threshold)
            found.append(
                (
                    RatioRow(question.name, option.name, NEED),
                    paired_ratios(spent[option.name], np.full(rounds, crops / need)),
                )
            )
        return found
    if question.compare == "predicted":
        per_image = {
            option.name: 1.0
            / np.asarray([predicted_images_per_s(crops / s, demand, _workers(option)) for s in spent[option.name]])
            for option, demand in zip(question.options, question.demand, strict=True)
        }
        spent = per_image
    first = names[0]
    return [(RatioRow(question.name, first, other), paired_ratios(spent[first], spent[other])) for other in names[1:]]


def _settled(ratios: Sequence[tuple[RatioRow, dict[str, Any]]]) -> bool:
    return all(ratio_settled(r[m.RATIO_MEDIAN], r[m.RATIO_Q1], r[m.RATIO_Q3]) for _, r in ratios)


#: Batches of each option read first, to tell whether whole epochs fit the question's time.
PROBE_BATCHES = 4
#: The fewest batches an epoch cut to the budget keeps.
MIN_EPOCH_BATCHES = 4


def fitted_crops(crops: int, seconds_per_crop: float, epochs: int, seconds_left: float, batch: int) -> int:
    """Crops per epoch such that ``epochs`` epochs of every option (``seconds_per_crop`` over all of them)
    end within ``seconds_left``: ``crops`` where they do, else fewer, but at least
    :data:`MIN_EPOCH_BATCHES` batches (and never more than ``crops``)."""
    if seconds_per_crop <= 0 or not math.isfinite(seconds_left) or epochs * crops * seconds_per_crop <= seconds_left:
        return crops
    fit = int(max(seconds_left, 0.0) / (epochs * seconds_per_crop))
    return min(crops, max(fit, MIN_EPOCH_BATCHES * batch))


def read_in_turns(question: Question, context: RunContext, stop_at: float) -> Iterator[Row]:
    """Measure ``question``: a probe of a few batches per option, an untimed epoch per option, then rounds
    of one whole epoch per option in turns (a whole rotation of the turn order at a time) until its ratios
    settle, ``stop_at`` (``time.monotonic()``) passes once ``question.rounds`` ran, or
    ``question.max_rounds`` ran; then a row per option and per ratio.

    Where the probe shows that ``question.rounds`` epochs and the warm-up would not end by ``stop_at``
    (a slow read path over a store), the epochs are cut to the crops that would, at least
    :data:`MIN_EPOCH_BATCHES` batches, and the rows say so (``epoch_crops_fitted_to_budget``)."""
    device = resolve_device("auto")
    datasets = [context.dataset(option.crop) for option in question.options]
    objects = len(datasets[0])
    crops = min(question.epoch_crops or objects, objects)
    warm, probe_index = question.max_rounds, question.max_rounds + 1
    orders = schedule(sampler_for(datasets[0], "random", question.seed), crops, question.max_rounds + 2)
    batch = max(option.loader.batch_size for option in question.options)
    probe = min(crops, PROBE_BATCHES * batch)
    orders[probe_index] = orders[probe_index][:probe]
    epochs = _Epochs()
    calls: dict[str, Callable[[int], None]] = {}
    samplers: list[ScheduledSampler] = []
    pinned: dict[str, bool] = {}
    for option, dataset in zip(question.options, datasets, strict=True):
        sampler = ScheduledSampler(orders)
        samplers.append(sampler)
        pin = pin_in_effect(option.loader.pin_memory, device)
        loader = build_loader(dataset, option.loader, sampler, question.seed, pin_memory=pin)
        epochs.cpu[option.name], epochs.seconds[option.name] = [], []
        calls[option.name] = _epoch_call(loader, sampler, device, pin, epochs.cpu[option.name])
        pinned[option.name] = pin
    loadavg_start = os.getloadavg()[0]
    probed = interleaved_blocks(calls, [probe_index])  # untimed: imports and workers' start-up alike
    per_crop = sum(float(seconds[0, 0]) for seconds in probed.values()) / probe
    fitted = fitted_crops(crops, per_crop, question.rounds + 1, stop_at - time.monotonic(), batch)
    cut = fitted < crops
    if cut:
        crops = fitted
        for sampler in samplers:
            sampler.orders[: warm + 1] = [order[:crops] for order in sampler.orders[: warm + 1]]
    interleaved_blocks(calls, [warm])  # untimed: page cache and the readers' caches warmed alike
    for name in calls:
        epochs.cpu[name].clear()
    turn = len(calls)
    done = 0
    budget_ended = False
    while True:
        spent = interleaved_blocks(calls, list(range(done, done + turn)))
        for name in calls:
            epochs.seconds[name].extend(float(s) for s in spent[name][0])
        done += turn
        ratios = ratio_rows(question, epochs.seconds, crops)
        if done < question.rounds:
            continue
        if _settled(ratios):
            break
        budget_ended = time.monotonic() >= stop_at
        if budget_ended or done + turn > question.max_rounds:
            break
    loadavg_end = os.getloadavg()[0]
    flags: dict[str, list[str]] = {}
    for index, (option, dataset) in enumerate(zip(question.options, datasets, strict=True)):
        metrics = _option_metrics(question, index, epochs, crops, objects, dataset, pinned[option.name], cut)
        flags[option.name] = list(metrics[m.VALIDITY_FLAGS])
        dataset.reader.close()
        config = {
            m.QUESTION: question.name,
            m.OPTION: option.name,
            "crop": dataclasses.asdict(option.crop),
            "loader": dataclasses.asdict(option.loader),
            m.EPOCH_CROPS: crops,
        }
        yield Row(OptionRow(question.name, option), config, metrics, question.seed)
    for case, ratio in ratios:
        inherited = [*flags[case.reader], *flags.get(case.reference, [])]
        metrics = {
            m.QUESTION: question.name,
            **ratio,
            m.ROUNDS: done,
            m.SETTLED: ratio_settled(ratio[m.RATIO_MEDIAN], ratio[m.RATIO_Q1], ratio[m.RATIO_Q3]),
            m.BUDGET_ENDED: budget_ended,
            m.LOADAVG_START: loadavg_start,
            m.LOADAVG_END: loadavg_end,
            # A ratio rests on its options' rows: their flags are its flags.
            m.VALIDITY_FLAGS: list(dict.fromkeys(inherited)),
        }
        config = {
            m.QUESTION: question.name,
            m.READER: case.reader,
            "reference": case.reference,
            m.CORES: usable_cores(),
        }
        yield Row(case, config, metrics, question.seed)


def _option_metrics(
    question: Question, index: int, epochs: _Epochs, crops: int, objects: int, dataset: Any, pinned: bool, cut: bool
) -> dict[str, Any]:
    option = question.options[index]
    seconds, cpu = epochs.seconds[option.name], epochs.cpu[option.name]
    rate = crops / float(np.median(seconds))
    batches = -(-crops // option.loader.batch_size) * len(seconds)
    metrics: dict[str, Any] = {
        m.QUESTION: question.name,
        m.OPTION: option.name,
        m.EPOCH_CROPS: crops,
        m.EPOCH_CROPS_FITTED: cut,
        m.OBJECTS: objects,
        m.ROUNDS: len(seconds),
        m.WHOLE_EPOCH_SECONDS: seconds,
        m.WHOLE_EPOCH_SAMPLES_PER_S: rate,
        m.CPU_SECONDS: cpu,
        m.CORES_BUSY: sum(cpu) / sum(seconds),
        m.PIN_MEMORY_EFFECTIVE: pinned,
        m.READER_CACHE_BYTES: reader_cache_bytes(option.crop, dataset.reader),
        # An epoch reads each crop once; epochs after it read them again, as training does.
        **validity(
            option.crop,
            dataset.reader,
            items_drawn=crops,
            objects=objects,
            enough_timings=enough_rate_timings(batches),
        ),
    }
    if question.demand:
        flags = list(dict.fromkeys([*metrics[m.VALIDITY_FLAGS], *question.demand_flags]))
        demand, workers = question.demand[index], _workers(option)
        metrics.update(
            {
                m.COMPUTE_ONLY_IMAGES_PER_S: demand,
                m.NEED_SAMPLES_PER_S: supply_needed(demand, workers, question.threshold),
                m.PREDICTED_IMAGES_PER_S: predicted_images_per_s(rate, demand, workers),
                m.PREDICTED_DATA_WAIT_FRACTION: predicted_data_wait(rate, demand, workers),
                m.THRESHOLD: question.threshold,
                m.VALIDITY_FLAGS: flags,
            }
        )
    return metrics


def measure_demand(item: Demand, context: RunContext) -> dict[str, Any]:
    """The model's compute-only images/s at the case's batch, flagged as any rate is when its steps are few."""
    metrics = compute_only(context, item.case)
    steps = metrics[m.COMPUTE_ONLY_STEP_COUNT]
    return {
        **metrics,
        **validity(item.case.crop, None, items_drawn=0, objects=1, enough_timings=enough_rate_timings(steps)),
    }


class Advise:
    """The items of one step of ``cropbench advise`` for the runner; questions stop adding rounds at
    ``stop_at`` (``time.monotonic()``) once their least rounds ran.

    Args:
        items: The questions, demand measurements and verification loops of the step.
        stop_at: When questions stop adding rounds (``time.monotonic()``); default never.
    """

    name = TRACK

    def __init__(self, items: Sequence[Item], stop_at: float = math.inf) -> None:
        self.items = list(items)
        self.stop_at = stop_at

    def cases(self, preset: str, context: RunContext) -> list[Item]:
        """The step's items, as given. ``preset`` is ignored."""
        return self.items

    def decode(self, item: Item) -> str | None:
        """The read path a single loop needs; None for a question (its options carry their own)."""
        return None if isinstance(item, Question) else item.case.crop.decode

    def measure(self, item: Item, repeat: int, context: RunContext) -> Iterator[Row]:
        """A question's rows (its options read whole epochs in turns), or one loop's row."""
        if isinstance(item, Question):
            yield from read_in_turns(item, context, self.stop_at)
        elif isinstance(item, Demand):
            yield Row(item, dataclasses.asdict(item.case), measure_demand(item, context), item.case.seed)
        else:
            yield Row(item, dataclasses.asdict(item.case), run_case(context, item.case), item.case.seed)


__all__ = [
    "CACHE_FRACTION",
    "MAX_ROUNDS",
    "NEED",
    "TRACK",
    "Advise",
    "Demand",
    "Option",
    "OptionRow",
    "Question",
    "RatioRow",
    "Verification",
    "advise_crop",
    "at_batch",
    "check_model",
    "model_case",
    "ratio_rows",
    "read_in_turns",
]
