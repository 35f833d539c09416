"""Samplers for realistic access patterns; every one yields each object exactly once per epoch.

- random: a seeded permutation of all objects.
- grouped: groups (fields, wells, contiguous ranges) in seeded random order, objects in order
  inside each group, as a per-site inference pass reads them.
- chunk-aware: groups are decode units (chunks); their order is shuffled and so are the objects
  inside each, so decoded chunks are reused while the epoch stays shuffled at chunk grain.
- shuffled runs (:class:`ShuffledRuns`): runs of consecutive objects, shuffled as groups, for a
  layout that stores consecutive objects together.

:class:`ReadAheadBatches` cuts any of them into batches that say which batches each DataLoader worker
reads next, so a reader that reads ahead knows the order.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import numpy as np
from torch.utils.data import Sampler

from cropbench.config import ACCESS_PATTERNS
from cropbench.data.dataset import CropDataset, UpcomingBatch
from cropbench.errors import ConfigError


class EpochSampler(Sampler[int]):
    """A seeded sampler whose order changes with :meth:`set_epoch` and only with it."""

    def __init__(self, count: int, seed: int = 0) -> None:
        if count <= 0:
            raise ConfigError(f"a sampler needs at least one object, got {count}")
        self.count = count
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.count

    def order(self) -> np.ndarray:
        raise NotImplementedError

    def __iter__(self) -> Iterator[int]:
        return iter(self.order().tolist())

    def _rng(self) -> np.random.Generator:
        return np.random.default_rng((self.seed, self.epoch))


class RandomObjectSampler(EpochSampler):
    """Every object once per epoch, in a seeded random order."""

    def order(self) -> np.ndarray:
        return self._rng().permutation(self.count)


class GroupedSampler(EpochSampler):
    """Groups in seeded random order; inside a group, objects in order or shuffled."""

    def __init__(self, group_keys: np.ndarray, seed: int = 0, shuffle_within: bool = False) -> None:
        super().__init__(len(group_keys), seed)
        self.group_keys = np.asarray(group_keys)
        self.shuffle_within = shuffle_within

    def order(self) -> np.ndarray:
        rng = self._rng()
        groups, inverse = np.unique(self.group_keys, return_inverse=True)
        group_rank = rng.permutation(len(groups))[inverse]
        within = rng.random(self.count) if self.shuffle_within else np.arange(self.count)
        return np.lexsort((within, group_rank))


class ShuffledRuns(Sampler[int]):
    """Every object once per epoch, in runs of ``run`` consecutive objects: the runs in a seeded random
    order, the objects of each run shuffled; each iteration is the next epoch, as torch's
    ``RandomSampler`` draws a new order each time. Where consecutive objects lie together on disk (a
    crop atlas, cell ``i`` the crop of object ``i``), a run is one read; a batch mixes ``batch / run``
    places of the plate, as a converted format's shuffle buffer mixes what its shards hold."""

    def __init__(self, count: int, run: int, seed: int = 0) -> None:
        self.runs = GroupedSampler(contiguous_ranges(count, run), seed, shuffle_within=True)
        self.epoch = 0

    def __len__(self) -> int:
        return self.runs.count

    def __iter__(self) -> Iterator[int]:
        self.runs.set_epoch(self.epoch)
        self.epoch += 1
        return iter(self.runs.order().tolist())


def with_upcoming(batches: Sequence[Sequence[int]], workers: int, ahead: int) -> list[UpcomingBatch]:
    """``batches`` in order, each with the next ``ahead`` batches of the process that reads it: torch's
    DataLoader deals batch ``i`` of an epoch to worker ``i % workers`` (in turn, from worker 0 each
    epoch), so those are every ``workers``-th batch after it; without workers, the next ones."""
    step = max(workers, 1)
    return [
        UpcomingBatch(batch, [list(later) for later in batches[position + step : position + step * (ahead + 1) : step]])
        for position, batch in enumerate(batches)
    ]


class ReadAheadBatches(Sampler[list[int]]):
    """A batch sampler over ``sampler`` (as torch's ``BatchSampler``, last batch kept) whose batches
    carry the next ``ahead`` batches their DataLoader worker reads (:func:`with_upcoming`): each
    epoch's order is drawn whole when the epoch starts, so the reader knows it before the first batch.
    The batches travel to the workers with their indices, so persistent and spawned workers learn
    every epoch's order too."""

    def __init__(self, sampler: Sampler[int], batch_size: int, workers: int, ahead: int) -> None:
        if batch_size < 1 or workers < 0 or ahead < 0:
            raise ConfigError(f"batch_size must be >= 1, workers and ahead >= 0; got {batch_size}, {workers}, {ahead}")
        self.sampler = sampler
        self.batch_size, self.workers, self.ahead = batch_size, workers, ahead

    def __len__(self) -> int:
        return -(-len(self.sampler) // self.batch_size)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[list[int]]:
        order = [int(index) for index in self.sampler]
        size = self.batch_size
        batches = [order[start : start + size] for start in range(0, len(order), size)]
        return iter(with_upcoming(batches, self.workers, self.ahead))


def contiguous_ranges(count: int, size: int) -> np.ndarray:
    """Group keys for contiguous index ranges of ``size`` objects."""
    if size <= 0:
        raise ConfigError(f"range size must be positive, got {size}")
    return np.arange(count) // size


def continued_order(sampler: EpochSampler, count: int) -> np.ndarray:
    """``count`` indices of ``sampler``, continuing through its epochs (0, 1, ...) as a training loop would."""
    orders = []
    for epoch in itertools.count():
        sampler.set_epoch(epoch)
        orders.append(sampler.order())
        if sum(len(order) for order in orders) >= count:
            break
    return np.concatenate(orders)[:count]


def access_order(dataset: CropDataset, access: str, count: int, seed: int = 0, granularity: int = 1) -> list[int]:
    """``count`` indices in the access pattern's order, continuing into further epochs if needed."""
    return continued_order(sampler_for(dataset, access, seed, granularity), count).tolist()


def sampler_for(dataset: CropDataset, access: str, seed: int = 0, granularity: int = 1) -> EpochSampler:
    """The sampler of an access pattern (see :data:`cropbench.config.ACCESS_PATTERNS`)."""
    if access in ("random", "paired"):
        return RandomObjectSampler(len(dataset), seed)
    if access == "grouped-field":
        return GroupedSampler(dataset.group_keys("field"), seed)
    if access == "grouped-well":
        return GroupedSampler(dataset.group_keys("well"), seed)
    if access == "chunk-aware":
        return GroupedSampler(dataset.group_keys("chunk", scale=granularity), seed, shuffle_within=True)
    raise ConfigError(f"access={access!r} is not one of {', '.join(ACCESS_PATTERNS)}")
