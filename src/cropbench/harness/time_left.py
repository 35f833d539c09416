"""The time a run has left, from what its cases cost so far.

Cases differ a hundredfold (a Track 1 case on the direct path takes a second, a ResNet-18 loop half a
minute), so counting cases says little. Each planned case gets a prior cost, in seconds of a 2-core
machine, from what it reads and computes (:func:`prior_seconds`); as cases finish, the priors are scaled
by what the finished ones actually took, per track and read path (a training loop on the zarr path costs
what its reads cost, not what the track's ResNet loops did), shrunk towards the whole run's scale while
a group has few finished cases. A busy or fast machine, or a slow layout, moves the scale, not the plan.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

from cropbench.config import DEFAULT_CROP_SIZE

#: Milliseconds to read and cut one crop of the default size, per decode path, on one core (the field
#: path's random reads decode a whole field per crop; grouped and chunk-aware reads share it, as the
#: direct path's cost).
READ_MS = {"direct": 0.7, "zarr": 3.0, "field": 7.0, "as-py": 3.0}
#: What a crop's transform tier multiplies the read by.
TIER_FACTOR = {"none": 1.0, "light": 1.2, "typical": 2.0}
#: Accesses that read crops in field order (the field path decodes each field once for them).
GROUPED = ("grouped-field", "chunk-aware", "paired-grouped")
#: Milliseconds of model compute per image on 2 CPU cores, per (model, workload); other models: DEFAULT_MODEL_MS.
MODEL_MS = {
    ("resnet18", "train"): 20.0,
    ("resnet18", "embed"): 7.0,
    ("smallcnn", "train"): 4.0,
    ("smallcnn", "embed"): 1.5,
}
DEFAULT_MODEL_MS = 10.0
#: What mixed precision multiplies a model's compute by (bfloat16 on a CPU with AVX-512 halves ResNet-18's).
AMP_FACTOR = {"off": 1.0}
AMP_DEFAULT_FACTOR = 0.6
#: What a DataLoader case's reads cost against the same reads one at a time: the direct path's batches
#: overlap in workers; the slower paths are bound by the cores either way.
LOADER_FACTOR = {"direct": 0.5}
#: What a training loop's reads cost against Track 1's: the model competes with the workers for the cores.
TRAINING_READ_FACTOR = 1.85
#: DataLoader workers' start: per worker, and a forkserver's start-up on top.
WORKER_START_S = 0.3
FORKSERVER_START_S = 12.0
#: A case the table knows nothing about (another track's): its prior, before the track's own scale.
UNKNOWN_CASE_S = 5.0
#: Seconds of prior a group's own scale must gather before it outweighs the run's (a track's first cases
#: carry its one-off costs: a model's baseline, a plate's first open).
SHRINK_S = 120.0
#: Seconds of prior the run's scale must gather before it outweighs the priors themselves.
RUN_SHRINK_S = 30.0


def _read_ms(fields: dict[str, Any]) -> float:
    crop = fields.get("crop") or {}
    decode = str(crop.get("decode", "direct"))
    ms = READ_MS.get(decode, READ_MS["zarr"])
    if decode == "field" and fields.get("access") in GROUPED:
        ms = READ_MS["direct"]
    size = float(crop.get("crop_size") or DEFAULT_CROP_SIZE)
    return ms * TIER_FACTOR.get(str(crop.get("tier", "none")), 1.0) * max(1.0, (size / DEFAULT_CROP_SIZE) ** 2)


def _worker_start_s(loader: dict[str, Any]) -> float:
    workers = int(loader.get("num_workers") or 0)
    start = WORKER_START_S * workers
    if workers and loader.get("start_method") == "forkserver":
        start += FORKSERVER_START_S
    return start


def _fields(case: Any) -> dict[str, Any]:
    return dataclasses.asdict(case) if dataclasses.is_dataclass(case) and not isinstance(case, type) else {}


def _inner(case: Any) -> tuple[Any, int]:
    """A search's case and how many runs of it (its ``candidates``); any other case once."""
    inner = getattr(case, "case", None)
    if dataclasses.is_dataclass(inner) and not isinstance(inner, type):
        return inner, max(1, len(getattr(case, "candidates", None) or (1,)))
    return case, 1


def _images_and_model_ms(fields: dict[str, Any]) -> tuple[int, float]:
    """A training loop's images (warm-up steps included) and its model's milliseconds per image."""
    loader = fields.get("loader") or {}
    batch = max(1, int(loader.get("batch_size") or 1))
    images = (int(fields["steps"]) + int(fields.get("warmup_steps") or 0)) * batch
    model = str(fields["model"])
    if model == "emulated":
        return images, float(fields.get("emulated_step_ms") or 0.0) / batch
    amp = AMP_FACTOR.get(str(fields.get("amp", "off")), AMP_DEFAULT_FACTOR)
    return images, amp * MODEL_MS.get((model, str(fields.get("workload", "train"))), DEFAULT_MODEL_MS)


def prior_seconds(case: Any) -> float:
    """What ``case`` costs on a quiet 2-core machine, roughly: its crop reads and model steps. Known by
    their fields: a training loop (``steps``), a DataLoader case (``epochs`` and ``loader``), a
    ``__getitem__`` case (``samples`` and ``warmup``), a search over its ``candidates`` (each a run of
    its ``case``); anything else :data:`UNKNOWN_CASE_S`."""
    case, runs = _inner(case)
    fields = _fields(case)
    loader = fields.get("loader") or {}
    if "steps" in fields and "model" in fields:
        images, model_ms = _images_and_model_ms(fields)
        read = 0.0 if fields.get("compute_only") else TRAINING_READ_FACTOR * _read_ms(fields)
        return runs * (images * (model_ms + read) / 1000.0 + _worker_start_s(loader))
    if "epochs" in fields and loader:
        reads = int(fields.get("samples") or 0) * int(fields["epochs"])
        factor = LOADER_FACTOR.get(str((fields.get("crop") or {}).get("decode", "direct")), 1.0)
        return runs * (factor * reads * _read_ms(fields) / 1000.0 + _worker_start_s(loader))
    if "samples" in fields and "warmup" in fields:
        reads = int(fields["warmup"]) + 2 * int(fields["samples"]) + int(fields.get("cold_samples") or 0)
        return runs * reads * _read_ms(fields) / 1000.0
    return runs * UNKNOWN_CASE_S


def baseline(case: Any) -> tuple[tuple[Any, ...], float] | None:
    """A training loop's compute-only baseline, which the first loop of its model, workload, precision and
    batch measures and the later ones share: its key and its seconds. None for other cases."""
    fields = _fields(_inner(case)[0])
    if "steps" not in fields or "model" not in fields:
        return None
    images, model_ms = _images_and_model_ms(fields)
    loader = fields.get("loader") or {}
    key = tuple(fields.get(k) for k in ("model", "workload", "amp", "device", "emulated_step_ms", "steps"))
    return (*key, loader.get("batch_size"), str(fields.get("crop"))), images * model_ms / 1000.0


class TimeLeft:
    """Priors of the planned cases, scaled by what the finished ones took (see the module)."""

    def __init__(self, planned: list[tuple[str, Any]]) -> None:
        self.planned: list[tuple[str, float]] = []
        shared: set[tuple[Any, ...]] = set()
        for track, case in planned:
            decode = (_fields(_inner(case)[0]).get("crop") or {}).get("decode")
            group = f"{track}/{decode}" if decode else track
            prior, first = prior_seconds(case), baseline(case)
            if first is not None and first[0] not in shared:
                shared.add(first[0])
                prior += first[1]
            self.planned.append((group, prior))
        self.prior_done: dict[str, float] = defaultdict(float)
        self.actual_done: dict[str, float] = defaultdict(float)
        self.finished = 0

    def finish(self, seconds: float) -> None:
        """The next planned case took ``seconds``."""
        group, prior = self.planned[self.finished]
        self.prior_done[group] += prior
        self.actual_done[group] += seconds
        self.finished += 1

    def scale(self, group: str) -> float:
        """Actual over prior seconds: the group's own (``TRACK/DECODE``), shrunk towards the run's while it
        has little."""
        prior, actual = sum(self.prior_done.values()), sum(self.actual_done.values())
        run = (actual + RUN_SHRINK_S) / (prior + RUN_SHRINK_S)
        return (self.actual_done[group] + run * SHRINK_S) / (self.prior_done[group] + SHRINK_S)

    def current(self) -> float | None:
        """Seconds the next unfinished case should take; None before any case finished or after the last."""
        if not self.finished or self.finished >= len(self.planned):
            return None
        group, prior = self.planned[self.finished]
        return prior * self.scale(group)

    def seconds(self) -> float | None:
        """Seconds the unfinished cases should take; None before any case finished (nothing measured)."""
        if not self.finished:
            return None
        return sum(prior * self.scale(group) for group, prior in self.planned[self.finished :])
