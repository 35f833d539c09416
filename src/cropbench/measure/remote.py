"""What a crop of a plate in a store costs, counted and timed the same way wherever it is called.

A plate in a store is paid for in requests and round trips, so the two measurements here are the
reader's own counts of requests and bytes per random crop (deterministic for a given plate, layout
and read path: the gate's numbers) and random crops/s through a DataLoader (a rate, for a table).
``scripts/remote_bench.py``, ``cropbench compare-layouts --plate URL`` and the asv remote suite
call these functions, so their numbers mean the same thing.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cropbench import metrics as m
from cropbench.config import CropConfig, StoreConfig
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


def crops_per_s(
    plate: Path, decode: str, workers: int, crops: int, batch_size: int, crop_size: int = 96
) -> dict[str, float]:
    """Random crops/s through a DataLoader (batches of ``batch_size``): a warm-up epoch starts the
    workers and opens the readers (persistent workers), then an epoch of ``crops`` other crops is
    timed from ``iter()`` to its last batch."""
    from torch.utils.data import DataLoader

    from cropbench.data.loader import ScheduledSampler, batch_collate

    dataset = crop_dataset(plate, decode, crop_size)
    warm = batch_size * max(workers, 1)
    crops = max(min(crops, len(dataset) - warm), 1)  # a small plate: fewer timed crops, the warm-up kept
    order = random_order(dataset, crops + warm, seed=2)
    # epoch 0 warms up (starts the workers, opens the readers), epoch 1 is timed
    sampler = ScheduledSampler([np.asarray(order[crops:]), np.asarray(order[:crops])])
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
    for _ in loader:  # every worker has read a batch
        pass
    sampler.set_epoch(1)
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


#: The key prefix of each read path's numbers in a layout row.
_PREFIX = {"direct": m.DIRECT_, "zarr": m.ZARR_}
#: Serves a local plate folder in a store for as long as the context is open; yields its URL.
Serve = Callable[[Path], AbstractContextManager[str]]


@dataclass(frozen=True)
class StoreLayouts:
    """How each layout is measured over a store: counts without injected latency (they do not depend
    on it), then random crops/s with no workers at ``latency_ms``, the direct path with ``in_flight``
    requests open, beside the same layout on local disk."""

    latency_ms: float = 20.0
    in_flight: int = 16
    count_crops: int = 200
    crops: int = 256
    zarr_crops: int = 64
    batch_size: int = 32
    crop_size: int = 96


def layout_over_store(plate: Path, name: str, serve: Serve, settings: StoreLayouts, cache: Path) -> dict[str, Any]:
    """One row: the plate ``plate`` (written in layout ``name``) put in a store by ``serve``, requests
    and bytes per random crop (decoded-chunk cache off: what a crop needs, not what a small plate
    left cached) and crops/s per read path, each rate next to the local one."""
    from cropbench.formats.sources import mirror_metadata
    from cropbench.measure.endpoints import remote_plate

    stored = sum(path.stat().st_size for path in plate.rglob("*") if path.is_file())
    row: dict[str, Any] = {m.LAYOUT: name, m.STORED_MIB: stored / 2**20}
    with serve(plate) as url:
        mirror = mirror_metadata(url, StoreConfig(), cache)
        for decode in ("direct", "zarr"):
            counts = requests_per_crop(mirror, decode, settings.count_crops, settings.crop_size, cache_bytes=0)
            row[m.prefixed(_PREFIX[decode], m.REQUESTS_PER_CROP)] = counts[m.REQUESTS_PER_CROP]
            row[m.prefixed(_PREFIX[decode], m.BYTES_TRANSFERRED_PER_CROP)] = counts[m.BYTES_TRANSFERRED_PER_CROP]
        store = StoreConfig(in_flight=settings.in_flight, latency_ms=settings.latency_ms)
        with remote_plate(url, store, cache) as delayed:  # one proxy and one mirror for both read paths
            for decode, crops in (("direct", settings.crops), ("zarr", settings.zarr_crops)):
                remote = crops_per_s(delayed, decode, 0, crops, settings.batch_size, settings.crop_size)
                local = crops_per_s(plate, decode, 0, crops, settings.batch_size, settings.crop_size)
                row[m.prefixed(_PREFIX[decode], m.SAMPLES_PER_S)] = remote[m.SAMPLES_PER_S]
                row[m.prefixed(_PREFIX[decode], m.LOCAL_SAMPLES_PER_S)] = local[m.SAMPLES_PER_S]
    return {**row, m.INJECTED_LATENCY_MS: settings.latency_ms, m.IN_FLIGHT: settings.in_flight}


#: Layouts compared over a store when none are named: sharded small chunks, unsharded tiles, planes.
STORE_LAYOUTS = ("default", "tiles", "planes")


def compare_layouts_in_store(
    url: str,
    layouts: Sequence[str],
    work: Path,
    settings: StoreLayouts,
    store: StoreConfig | None = None,
    cache: Path | None = None,
) -> list[dict[str, Any]]:
    """Which layout to publish: the plate at ``url`` rewritten in each layout under ``work`` (its pixels
    read from the store once), each served by nginx on loopback behind ``settings.latency_ms`` and
    measured by :func:`layout_over_store`. A loopback copy, not the user's bucket: nothing is written
    to the store, and every layout pays the same injected round trip."""
    from cropbench.config import layout_by_name
    from cropbench.errors import ConfigError
    from cropbench.formats.sources import mirror_metadata
    from cropbench.measure.endpoints import http_plate
    from cropbench.plates.convert import materialize_layout

    for name in layouts:
        if layout_by_name(name).format != "ome-zarr":
            raise ConfigError(f"layout {name!r} is not OME-Zarr: only OME-Zarr layouts are read from a store")
    source = mirror_metadata(url, dataclasses.replace(store or StoreConfig(), latency_ms=0.0), cache)
    rows = []
    for name in layouts:
        plate = materialize_layout(source, name, work)
        rows.append(layout_over_store(plate, name, http_plate, settings, source.parent))
    return rows


def layouts_table(rows: list[dict[str, Any]]) -> str:
    """The layout rows as a table: requests per crop and crops/s (local in parentheses) per read path."""
    lines = ["layouts in the store (requests per random crop; crops/s at the injected latency, no workers)"]
    for row in rows:
        cells = [f"  {row[m.LAYOUT]:<22} {row[m.STORED_MIB]:7.1f} MiB"]
        for decode in ("direct", "zarr"):
            key = _PREFIX[decode]
            cells.append(
                f"{decode} {row[key + m.REQUESTS_PER_CROP]:5.2f} req/crop {row[key + m.SAMPLES_PER_S]:7.1f}/s "
                f"(local {row[key + m.LOCAL_SAMPLES_PER_S]:7.1f}/s)"
            )
        lines.append("  ".join(cells))
    return "\n".join(lines)
