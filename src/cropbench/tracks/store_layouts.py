"""Track ``store-layouts`` (``cropbench compare-layouts --plate URL``): which layout to publish.

The plate at the URL is rewritten in each layout under a work folder (its pixels read from the store
once), each rewrite served on loopback behind an injected latency and measured as track ``remote``
measures, beside the same rewrite read from local disk. A loopback copy, not the user's bucket: nothing
is written to the store, and every layout pays the same injected round trip. Without ``keep`` only the
plates this run wrote are removed (see :class:`~cropbench.harness.work.WorkFolder`).
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
from cropbench.errors import ConfigError
from cropbench.harness.context import RunContext
from cropbench.harness.loader_case import loader_rate
from cropbench.harness.runner import Row
from cropbench.harness.work import WorkFolder
from cropbench.measure.endpoints import http_plate, remote_plate
from cropbench.measure.remote import READ_PATHS, requests_per_crop
from cropbench.plates.convert import materialize_layout

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
