"""Samplers: seeded, every object once per epoch, groups kept together."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import BatchSampler

from cropbench.config import CropConfig
from cropbench.data.dataset import CropDataset
from cropbench.data.sampling import (
    GroupedSampler,
    RandomObjectSampler,
    ReadAheadBatches,
    contiguous_ranges,
    sampler_for,
)
from cropbench.errors import ConfigError


def test_random_sampler_is_a_seeded_permutation_that_changes_per_epoch() -> None:
    sampler = RandomObjectSampler(100, seed=4)
    first = list(sampler)
    assert sorted(first) == list(range(100)) and first == list(RandomObjectSampler(100, seed=4))
    sampler.set_epoch(1)
    assert list(sampler) != first and sorted(sampler) == list(range(100))
    assert list(RandomObjectSampler(100, seed=5)) != first


@pytest.mark.parametrize("shuffle_within", [False, True])
def test_grouped_sampler_keeps_groups_contiguous(shuffle_within: bool) -> None:
    keys = np.repeat(np.arange(7), 9)[np.random.default_rng(0).permutation(63)]
    order = GroupedSampler(keys, seed=1, shuffle_within=shuffle_within).order()
    assert sorted(order.tolist()) == list(range(63))
    runs = [k for i, k in enumerate(keys[order]) if i == 0 or k != keys[order][i - 1]]
    assert len(runs) == 7, "each group appears as one contiguous run"
    if not shuffle_within:
        for group in range(7):
            members = order[keys[order] == group]
            assert (np.diff(members) > 0).all()


def test_group_order_is_seeded() -> None:
    keys = contiguous_ranges(60, 10)
    assert list(GroupedSampler(keys, seed=2)) == list(GroupedSampler(keys, seed=2))
    assert list(GroupedSampler(keys, seed=2)) != list(GroupedSampler(keys, seed=3))
    with pytest.raises(ConfigError):
        contiguous_ranges(5, 0)


@pytest.mark.parametrize("access", ["random", "grouped-field", "grouped-well", "chunk-aware", "paired"])
def test_every_access_pattern_yields_each_object_once(tiny_plate: Path, access: str) -> None:
    dataset = CropDataset(tiny_plate, CropConfig(crop_size=16))
    order = list(sampler_for(dataset, access, seed=0))
    assert sorted(order) == list(range(len(dataset)))


def test_grouped_by_field_visits_fields_one_at_a_time(tiny_plate: Path) -> None:
    dataset = CropDataset(tiny_plate, CropConfig(crop_size=16))
    fields = dataset.field_index[list(sampler_for(dataset, "grouped-field", seed=0))]
    assert int((np.diff(fields) != 0).sum()) == 3


def test_unknown_access_pattern_is_refused(tiny_plate: Path) -> None:
    with pytest.raises(ConfigError, match="access"):
        sampler_for(CropDataset(tiny_plate), "sequential")


@pytest.mark.parametrize("workers", [0, 1, 3])
def test_read_ahead_batches_are_the_batch_samplers_with_what_each_worker_reads_next(workers: int) -> None:
    """The same batches as torch's BatchSampler (last one kept), the epoch the sampler is set to; each
    carries the next two batches dealt to its worker (every ``workers``-th one)."""
    sampler = RandomObjectSampler(50, seed=2)
    sampler.set_epoch(1)
    batches = list(ReadAheadBatches(sampler, 8, workers, 2))
    assert batches == list(BatchSampler(sampler, 8, drop_last=False))
    assert len(ReadAheadBatches(sampler, 8, workers, 2)) == len(batches) == 7
    step = max(workers, 1)
    for position, batch in enumerate(batches):
        expected = [batches[later] for later in (position + step, position + 2 * step) if later < len(batches)]
        assert batch.upcoming == tuple(expected)  # type: ignore[attr-defined]
    again = pickle.loads(pickle.dumps(batches[0]))  # as it travels to a spawned or persistent worker
    assert again == batches[0] and again.upcoming == batches[0].upcoming


def test_read_ahead_batches_refuse_bad_knobs() -> None:
    with pytest.raises(ConfigError, match="batch_size"):
        ReadAheadBatches(RandomObjectSampler(5), 0, 0, 1)
