"""Plates in an object store as runner tracks: what a crop costs in requests, and how fast crops come.

``remote`` (``cropbench run --plate URL --track remote``): per read path and DataLoader worker
count, the reader's requests and bytes per random crop (decoded-chunk cache off, so every crop
fetches what it needs; :func:`cropbench.measure.remote.requests_per_crop`) and random crops/s
through Track 2's loader (seeded workers, the watchdog, Track 2's clocks and its ``samples_per_s``).
With ``--local-plate`` every row carries its ratio to the same case on local disk.

``store-layouts`` (``cropbench compare-layouts --plate URL``): which layout to publish. The plate
at the URL is rewritten in each layout under a work folder (its pixels read from the store once),
each rewrite served on loopback behind an injected latency and measured as ``remote`` measures,
beside the same rewrite read from local disk. A loopback copy, not the user's bucket: nothing is
written to the store, and every layout pays the same injected round trip. Without ``keep`` only the
plates this run wrote are removed (see :class:`~cropbench.tracks.layouts.WorkFolder`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cropbench import metrics as m
from cropbench.config import StoreConfig, layout_by_name
from cropbench.data.loader import LoaderSpec
from cropbench.errors import ConfigError
from cropbench.measure.endpoints import http_plate, remote_plate
from cropbench.measure.remote import crop_config, requests_per_crop
from cropbench.plates.convert import materialize_layout
from cropbench.records import Record
from cropbench.tracks.context import RunContext
from cropbench.tracks.layouts import WorkFolder
from cropbench.tracks.runner import Row
from cropbench.tracks.track2 import Track2Case, run_case

#: The read paths a plate in a store is read with, and the key prefix of each in a layout row.
READ_PATHS = {"direct": m.DIRECT_, "zarr": m.ZARR_}
#: Serves a local plate folder in a store for as long as the context is open; yields its URL.
Serve = Callable[[Path], AbstractContextManager[str]]


def loader_rate(plate: Path, decode: str, crops: int, batch_size: int, crop_size: int, workers: int = 0) -> float:
    """Random crops/s through a DataLoader: a Track 2 case (seeded workers, the watchdog, one epoch of
    ``crops`` distinct crops at most, the first batches per worker as warm-up) and its ``samples_per_s``.
    Workers start by forkserver: obstore (the zarr path's client) does not survive a fork."""
    loader = LoaderSpec(num_workers=workers, batch_size=batch_size, start_method="forkserver" if workers else "fork")
    case = Track2Case(crop=crop_config(decode, crop_size), loader=loader, samples=max(crops, 2 * batch_size), epochs=1)
    return float(run_case(plate, case)[m.SAMPLES_PER_S])


@dataclass(frozen=True)
class RemoteCase:
    """One read path of a plate in a store, at one worker count."""

    decode: str = "direct"
    workers: int = 0
    count_crops: int = 64
    crops: int = 128
    batch_size: int = 32
    crop_size: int = 96
    seed: int = 0

    def __post_init__(self) -> None:
        if self.decode not in READ_PATHS:
            raise ConfigError(f"decode={self.decode!r} is not one of {', '.join(READ_PATHS)}")
        for knob in ("count_crops", "crops", "batch_size", "crop_size"):
            if getattr(self, knob) < 1:
                raise ConfigError(f"{knob} must be >= 1, got {getattr(self, knob)}")

    @property
    def label(self) -> str:
        return f"{self.decode}/w{self.workers}/b{self.batch_size}"


class Remote:
    """Track ``remote``: requests per crop and loader crops/s of the run's plate, per read path and workers.

    The smoke preset times 128 crops per case, the full preset 512 (``--samples`` overrides both).
    """

    name = "remote"

    def __init__(self, workers: Sequence[int] = (0, 2), batch_size: int = 32, crop_size: int = 96) -> None:
        self.workers, self.batch_size, self.crop_size = tuple(workers), batch_size, crop_size

    def cases(self, preset: str, context: RunContext) -> list[RemoteCase]:
        if preset not in ("smoke", "full"):
            raise ConfigError(f"preset={preset!r} is not one of smoke, full")
        crops = context.samples or (128 if preset == "smoke" else 512)
        return [
            RemoteCase(decode, workers, min(crops, 200), crops, self.batch_size, self.crop_size)
            for decode in READ_PATHS
            for workers in self.workers
        ]

    def decode(self, case: RemoteCase) -> str:
        return case.decode

    def measure(self, case: RemoteCase, repeat: int, context: RunContext) -> Iterator[Row]:
        metrics: dict[str, Any] = dict(
            requests_per_crop(context.plate, case.decode, case.count_crops, case.crop_size, cache_bytes=0)
        )
        metrics[m.SAMPLES_PER_S] = loader_rate(
            context.plate, case.decode, case.crops, case.batch_size, case.crop_size, case.workers
        )
        yield Row(case, dataclasses.asdict(case), metrics, case.seed + repeat)


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

    def __post_init__(self) -> None:
        if self.latency_ms < 0:
            raise ConfigError(f"latency_ms must be >= 0, got {self.latency_ms}")
        for knob in ("in_flight", "count_crops", "crops", "zarr_crops", "batch_size", "crop_size"):
            if getattr(self, knob) < 1:
                raise ConfigError(f"{knob} must be >= 1, got {getattr(self, knob)}")


#: Layouts compared over a store when none are named: sharded small chunks, unsharded tiles, planes.
STORE_LAYOUTS = ("default", "tiles", "planes")


@dataclass(frozen=True)
class StoreLayoutCase:
    """One layout of a comparison over a store."""

    layout_name: str
    settings: StoreLayouts
    seed: int = 0

    @property
    def label(self) -> str:
        return self.layout_name


def layout_over_store(plate: Path, serve: Serve, settings: StoreLayouts, cache: Path | None) -> dict[str, Any]:
    """Metrics of one layout: ``plate`` (written in it) put in a store by ``serve``, requests and bytes
    per random crop (decoded-chunk cache off: what a crop needs, not what a small plate left cached) and
    loader crops/s per read path, each rate next to the local one."""
    from cropbench.formats.sources import mirror_metadata

    stored = sum(path.stat().st_size for path in plate.rglob("*") if path.is_file())
    metrics: dict[str, Any] = {m.STORED_MIB: stored / 2**20}
    with serve(plate) as url:
        mirror = mirror_metadata(url, StoreConfig(), cache)
        for decode, prefix in READ_PATHS.items():
            counts = requests_per_crop(mirror, decode, settings.count_crops, settings.crop_size, cache_bytes=0)
            metrics[m.prefixed(prefix, m.REQUESTS_PER_CROP)] = counts[m.REQUESTS_PER_CROP]
            metrics[m.prefixed(prefix, m.BYTES_TRANSFERRED_PER_CROP)] = counts[m.BYTES_TRANSFERRED_PER_CROP]
        store = StoreConfig(in_flight=settings.in_flight, latency_ms=settings.latency_ms)
        with remote_plate(url, store, cache) as delayed:  # one proxy and one mirror for both read paths
            for decode, crops in (("direct", settings.crops), ("zarr", settings.zarr_crops)):
                prefix, sizes = READ_PATHS[decode], (settings.batch_size, settings.crop_size)
                metrics[m.prefixed(prefix, m.SAMPLES_PER_S)] = loader_rate(delayed, decode, crops, *sizes)
                metrics[m.prefixed(prefix, m.LOCAL_SAMPLES_PER_S)] = loader_rate(plate, decode, crops, *sizes)
    return {**metrics, m.INJECTED_LATENCY_MS: settings.latency_ms, m.IN_FLIGHT: settings.in_flight}


class StoreLayoutsTrack:
    """Track ``store-layouts``: the run's plate (in a store) rewritten into each layout and measured over
    a loopback store (``serve``: nginx over HTTP by default)."""

    name = "store-layouts"

    def __init__(
        self,
        layouts: Sequence[str],
        settings: StoreLayouts,
        work: WorkFolder,
        serve: Serve = http_plate,
    ) -> None:
        for name in layouts:
            if layout_by_name(name).format != "ome-zarr":
                raise ConfigError(f"layout {name!r} is not OME-Zarr: only OME-Zarr layouts are read from a store")
        self.layouts, self.settings, self.work, self.serve = tuple(layouts), settings, work, serve

    def cases(self, preset: str, context: RunContext) -> list[StoreLayoutCase]:
        return [StoreLayoutCase(name, self.settings) for name in self.layouts]

    def decode(self, case: StoreLayoutCase) -> None:
        return None

    def measure(self, case: StoreLayoutCase, repeat: int, context: RunContext) -> Iterator[Row]:
        name = case.layout_name
        context.progress(f"{name}: writing")
        destination = self.work.destination(name)
        try:
            plate = materialize_layout(context.plate, name, destination.parent)
            context.progress(f"{name}: reading over the store")
            metrics = {m.LAYOUT: name, **layout_over_store(plate, self.serve, case.settings, context.plate.parent)}
        finally:
            self.work.done(destination)
        config = {
            "layout_name": name,
            "layout": dataclasses.asdict(layout_by_name(name)),
            "settings": dataclasses.asdict(case.settings),
        }
        yield Row(case, config, metrics, case.seed + repeat)


def layouts_table(records: Sequence[Record]) -> str:
    """The store-layouts rows as a table: requests per crop and crops/s (local in parentheses) per read path."""
    lines = ["layouts in the store (requests per random crop; crops/s at the injected latency, no workers)"]
    for record in records:
        row = record.metrics
        cells = [f"  {row[m.LAYOUT]:<22} {row[m.STORED_MIB]:7.1f} MiB"]
        for decode, key in READ_PATHS.items():
            cells.append(
                f"{decode} {row[key + m.REQUESTS_PER_CROP]:5.2f} req/crop {row[key + m.SAMPLES_PER_S]:7.1f}/s "
                f"(local {row[key + m.LOCAL_SAMPLES_PER_S]:7.1f}/s)"
            )
        lines.append("  ".join(cells))
    return "\n".join(lines)
