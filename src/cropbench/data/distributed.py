"""Samplers that split one epoch of objects across the ranks of a distributed job.

- ``distributed``: torch's own :class:`~torch.utils.data.DistributedSampler` over the object index,
  what training scripts write today. Rank ``r`` takes every ``world``-th index of a seeded
  permutation, so every rank touches (and decodes) chunks all over the plate.
- ``chunk-local``: objects are laid out region by region (field, then groups of chunks in raster
  order) and the sequence is cut into ``world`` contiguous, equal slices. Each rank keeps the same
  slice every epoch, so its chunk cache holds its own regions and no two ranks decode the same chunk
  except where a region straddles a cut (at most ``world - 1`` regions). Inside the slice, regions
  come in a seeded random order and so do the objects inside each region; :meth:`set_epoch`
  reshuffles both.

Both are balanced, as torch's sampler is: with ``balance="pad"`` every rank gets ``ceil(N / world)``
indices and the ranks short of that repeat the first of theirs (at most ``world - 1`` repeats in all);
with ``balance="drop"`` every rank gets ``floor(N / world)`` and the last ``N mod world`` objects of
the layout are left out. Without padding, every object comes exactly once per epoch across ranks.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from torch.utils.data import Dataset, DistributedSampler

from cropbench.data.dataset import CropDataset
from cropbench.data.sampling import EpochSampler
from cropbench.errors import ConfigError

#: Samplers across ranks, by name.
RANK_SAMPLERS = ("distributed", "chunk-local")
#: What a sampler does with ``N mod world`` objects: repeat some on the short ranks, or leave them out.
BALANCES = ("pad", "drop")
#: Decode units (per side) in one chunk-local region: 1 = a single chunk.
REGION_CHUNKS = 1

#: Builds the sampler of one rank for a dataset (the tracks open the dataset, the caller picks the split).
SamplerFactory = Callable[[CropDataset], EpochSampler]


def _check_rank(rank: int, world: int, balance: str) -> None:
    if world < 1 or not 0 <= rank < world:
        raise ConfigError(f"rank={rank} must be in [0, world={world}) and world >= 1")
    if balance not in BALANCES:
        raise ConfigError(f"balance={balance!r} is not one of {', '.join(BALANCES)}")


def per_rank(count: int, world: int, balance: str) -> int:
    """Indices each rank gets per epoch: ``ceil`` (pad) or ``floor`` (drop) of ``count / world``."""
    share = -(-count // world) if balance == "pad" else count // world
    if share < 1:
        raise ConfigError(f"{count} objects cannot give each of {world} ranks one with balance={balance!r}")
    return share


def balance_extra(count: int, world: int, balance: str) -> dict[str, int]:
    """Samples padded (repeated) or dropped in all, over all ranks, per epoch."""
    share = per_rank(count, world, balance)
    return {"padded_samples": share * world - count} if balance == "pad" else {"dropped_samples": count - share * world}


class _ObjectIndex(Dataset[int]):
    """The object index 0..count-1: all torch's sampler needs of a dataset is its length."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> int:
        return index


class TorchDistributedSampler(EpochSampler):
    """torch's ``DistributedSampler`` (shuffled, seeded) as an epoch sampler: the same indices, epoch by epoch."""

    def __init__(self, count: int, rank: int, world: int, seed: int = 0, balance: str = "pad") -> None:
        _check_rank(rank, world, balance)
        super().__init__(count, seed)
        self.inner: DistributedSampler[int] = DistributedSampler(
            _ObjectIndex(count), num_replicas=world, rank=rank, shuffle=True, seed=seed, drop_last=balance == "drop"
        )

    def __len__(self) -> int:
        return len(self.inner)

    def order(self) -> np.ndarray:
        self.inner.set_epoch(self.epoch)
        return np.fromiter(iter(self.inner), dtype=np.int64, count=len(self.inner))


class ChunkLocalSampler(EpochSampler):
    """One rank's contiguous share of the plate's regions, regions and objects shuffled per epoch.

    ``region_keys`` is each object's region (a field, or a group of chunks); regions are laid out in
    key order, so a share is a run of neighbouring regions.
    """

    def __init__(self, region_keys: np.ndarray, rank: int, world: int, seed: int = 0, balance: str = "pad") -> None:
        _check_rank(rank, world, balance)
        keys = np.asarray(region_keys)
        super().__init__(len(keys), seed)
        self.rank, self.world, self.balance = rank, world, balance
        share = per_rank(len(keys), world, balance)
        layout = np.argsort(keys, kind="stable")
        cut = np.array_split(layout, world) if balance == "pad" else np.split(layout[: share * world], world)
        self.share = share
        self.indices = cut[rank]
        self.keys = keys[self.indices]

    def __len__(self) -> int:
        return self.share

    def order(self) -> np.ndarray:
        rng = np.random.default_rng((self.seed, self.epoch, self.rank))
        regions, inverse = np.unique(self.keys, return_inverse=True)
        region_rank = rng.permutation(len(regions))[inverse]
        order = self.indices[np.lexsort((rng.random(len(self.indices)), region_rank))]
        missing = self.share - len(order)
        return np.concatenate([order, order[:missing]]) if missing > 0 else order


def rank_sampler(
    dataset: CropDataset, name: str, rank: int, world: int, seed: int = 0, balance: str = "pad"
) -> EpochSampler:
    """The sampler ``name`` (see :data:`RANK_SAMPLERS`) of ``rank`` out of ``world`` over ``dataset``."""
    if name == "distributed":
        return TorchDistributedSampler(len(dataset), rank, world, seed, balance)
    if name == "chunk-local":
        return ChunkLocalSampler(dataset.group_keys("chunk", scale=REGION_CHUNKS), rank, world, seed, balance)
    raise ConfigError(f"sampler={name!r} is not one of {', '.join(RANK_SAMPLERS)}")


__all__ = [
    "BALANCES",
    "RANK_SAMPLERS",
    "ChunkLocalSampler",
    "SamplerFactory",
    "TorchDistributedSampler",
    "balance_extra",
    "per_rank",
    "rank_sampler",
]
