"""What a crop of a plate in a store costs, counted and timed the same way wherever it is called.

A plate in a store is paid for in requests and round trips, so the two measurements here are the
reader's own counts of requests and bytes per random crop (deterministic for a given plate, layout
and read path: the gate's numbers) and random crops/s through a DataLoader (a rate, for a table).
``scripts/remote_bench.py``, ``cropbench compare-layouts --plate URL`` and the asv remote suite
call these functions, so their numbers mean the same thing.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from cropbench import metrics as m
from cropbench.config import CropConfig
from cropbench.data.dataset import CropDataset
from cropbench.measure.protocol import summarise_ms

#: Crops read before counting, so each shard index has been fetched once (the reader caches it).
COUNT_WARMUP = 32


def crop_dataset(plate: Path, decode: str, crop_size: int, cache_bytes: int | None = None) -> CropDataset:
    """Crops of every channel as uint16 (no transform): what crosses the wire, not a training recipe."""
    config = CropConfig(crop_size=crop_size, decode=decode, dtype="uint16")
    return CropDataset(plate, config if cache_bytes is None else config.replace(chunk_cache_bytes=cache_bytes))


def random_order(dataset: CropDataset, count: int, seed: int) -> list[int]:
    """Distinct objects in a seeded random order (random access, no crop read twice)."""
    order: list[int] = np.random.default_rng(seed).permutation(len(dataset))[:count].tolist()
    return order


def requests_per_crop(
    plate: Path,
    decode: str,
    crops: int,
    crop_size: int = 96,
    cache_bytes: int | None = None,
    warmup: int = COUNT_WARMUP,
) -> dict[str, float]:
    """Requests and bytes per random crop read one at a time, counted by the reader after ``warmup``
    crops (shard indexes cached); ``cache_bytes`` 0 turns the decoded-chunk cache off, so every crop
    fetches what it needs. Counts, not times: the same plate and code give the same numbers."""
    dataset = crop_dataset(plate, decode, crop_size, cache_bytes)
    order = random_order(dataset, warmup + crops, seed=1)
    for index in order[:warmup]:
        dataset[index]
    stats = dataset.reader.stats
    first_reads, first_bytes = stats.reads, stats.bytes_fetched
    stats.reset()
    for index in order[warmup:]:
        dataset[index]
    measured = len(order) - warmup
    if measured <= 0:
        raise ValueError(f"the plate has {len(dataset)} objects: too few for {warmup} warm-up and counted crops")
    per = stats.per_region()
    return {
        m.REQUESTS_PER_CROP: stats.reads / measured,
        m.BYTES_TRANSFERRED_PER_CROP: stats.bytes_fetched / measured,
        m.BYTES_TRANSFERRED_PER_DELIVERED_BYTE: per[m.FETCH_AMPLIFICATION],
        m.WARMUP_REQUESTS_PER_CROP: first_reads / max(warmup, 1),
        m.WARMUP_BYTES_PER_CROP: first_bytes / max(warmup, 1),
    }


class _Order:
    """A sampler whose indices change between epochs (warm-up epoch, then the timed one)."""

    def __init__(self) -> None:
        self.indices: list[int] = []

    def __iter__(self) -> Any:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def crops_per_s(
    plate: Path, decode: str, workers: int, crops: int, batch_size: int, crop_size: int = 96
) -> dict[str, float]:
    """Random crops/s through a DataLoader (batches of ``batch_size``): a warm-up epoch starts the
    workers and opens the readers (persistent workers), then an epoch of ``crops`` other crops is
    timed from ``iter()`` to its last batch."""
    from torch.utils.data import DataLoader

    from cropbench.data.loader import batch_collate

    dataset = crop_dataset(plate, decode, crop_size)
    order = random_order(dataset, crops + batch_size * max(workers, 1), seed=2)
    sampler = _Order()
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        collate_fn=batch_collate,
        persistent_workers=workers > 0,
        multiprocessing_context="forkserver" if workers else None,  # obstore (zarr path) does not survive fork
        prefetch_factor=2 if workers else None,
    )
    sampler.indices = order[crops:]
    for _ in loader:  # every worker has read a batch
        pass
    sampler.indices = order[:crops]
    began = time.perf_counter()
    stamps, delivered = [], 0
    for batch in loader:
        delivered += len(batch["image"])
        stamps.append(time.perf_counter())
    if not stamps:
        raise ValueError(f"the plate has {len(dataset)} objects: no crops left to time after the warm-up")
    elapsed = stamps[-1] - began
    summary = summarise_ms(np.diff([began, *stamps]) * 1e9)
    return {
        m.SAMPLES_PER_S: delivered / elapsed,
        m.BATCH_P50_MS: summary[m.P50_MS],
        m.BATCH_P95_MS: summary[m.P95_MS],
        m.BATCH_P99_MS: summary[m.P99_MS],
    }
