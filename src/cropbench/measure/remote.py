"""What a crop of a plate in a store costs in requests: counted the same way wherever it is called.

A plate in a store is paid for in requests and round trips. :func:`requests_per_crop` is the
reader's own count of requests and bytes per random crop (deterministic for a given plate, layout
and read path: the gate's numbers). Rates are measured by the runner's tracks
(:mod:`cropbench.tracks.remote`), through Track 2's loader and clocks, never here.
"""

from __future__ import annotations

from pathlib import Path

from cropbench import metrics as m
from cropbench.config import DEFAULT_CROP_SIZE, CropConfig
from cropbench.data.dataset import CropDataset
from cropbench.data.sampling import access_order

#: Crops read before counting, so each shard index has been fetched once (the reader caches it).
COUNT_WARMUP = 32
#: The seed of the counted order: a count is the same on every call.
COUNT_SEED = 1

#: The read paths a plate in a store is read with, and the key prefix of each in a layout row.
READ_PATHS = {"direct": m.DIRECT_, "zarr": m.ZARR_}


def crop_config(decode: str, crop_size: int, cache_bytes: int | None = None) -> CropConfig:
    """Crops of every channel as uint16 (no transform): what crosses the wire, not a training recipe."""
    config = CropConfig(crop_size=crop_size, decode=decode, dtype="uint16")
    return config if cache_bytes is None else config.replace(chunk_cache_bytes=cache_bytes)


def requests_per_crop(
    plate: Path,
    decode: str,
    crops: int,
    crop_size: int = DEFAULT_CROP_SIZE,
    cache_bytes: int | None = None,
    warmup: int = COUNT_WARMUP,
) -> dict[str, float]:
    """Requests and bytes per random crop of ``plate`` with its own object table
    (:func:`count_requests` over a dataset opened here)."""
    return count_requests(CropDataset(plate, crop_config(decode, crop_size, cache_bytes)), crops, warmup)


def count_requests(dataset: CropDataset, crops: int, warmup: int = COUNT_WARMUP) -> dict[str, float]:
    """Requests and bytes per random crop of ``dataset`` read one at a time, counted by the reader after
    ``warmup`` crops (shard indexes cached); a crop config with ``cache_bytes`` 0 turns the decoded-chunk
    cache off, so every crop fetches what it needs. Counts, not times: the same plate, objects and code
    give the same numbers."""
    order = access_order(dataset, "random", min(warmup + crops, len(dataset)), COUNT_SEED)
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
