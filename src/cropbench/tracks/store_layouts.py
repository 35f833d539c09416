"""Track ``store-layouts`` (``cropbench compare-layouts --plate URL``): which layout to publish.

The plate at the URL is rewritten in each layout under a work folder (its pixels read from the store
once), each rewrite served on loopback and measured as track ``remote`` measures, beside the same
rewrite read from local disk. A loopback copy, not the user's bucket: nothing is written to the store,
and every layout pays the same modelled store. The store is the emulated one
(:mod:`cropbench.measure.store_emulation`: nginx with the model's first-byte latency, its tail and the
link, the server's busy share per read path, ``server-bound`` where it was the limit) where it runs
here; elsewhere nginx behind the Python delay proxy (a fixed delay per request), and the row says why.
Without ``keep`` only the plates this run wrote are removed (see
:class:`~cropbench.harness.work.WorkFolder`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cropbench import metrics as m
from cropbench.config import DEFAULT_CROP_SIZE, DEFAULT_IN_FLIGHT, StoreConfig, layout_by_name
from cropbench.errors import ConfigError
from cropbench.harness.context import RunContext
from cropbench.harness.loader_case import loader_rates
from cropbench.harness.runner import Row
from cropbench.harness.validity import CACHE_HOLDS_PLATE_FLAG
from cropbench.harness.work import WorkFolder
from cropbench.measure.endpoints import http_plate, remote_plate
from cropbench.measure.remote import READ_PATHS, count_requests, crop_config
from cropbench.measure.store_emulation import SERVER_BOUND_FLAG, EmulatedStore, StoreModel, emulated_plate, unavailable
from cropbench.plates.convert import materialize_layout

#: Serves a local plate folder in a store for as long as the context is open; yields its URL.
Serve = Callable[[Path], AbstractContextManager[str]]


@dataclass(frozen=True)
class StoreLayoutComparison:
    """How each layout is measured over a store: counts without injected latency (they do not depend
    on it), then random crops/s with no workers at ``latency_ms``, the direct path with ``in_flight``
    requests open, beside the same layout on local disk. ``store`` is how every read reaches the store
    (timeouts, retries, zarr-python's client, signing); its requests in flight and latency are these
    settings' own."""

    latency_ms: float = 20.0
    in_flight: int = DEFAULT_IN_FLIGHT
    count_crops: int = 200
    crops: int = 256
    zarr_crops: int = 64
    batch_size: int = 32
    crop_size: int = DEFAULT_CROP_SIZE
    store: StoreConfig = field(default_factory=StoreConfig)

    def reads(self, latency_ms: float) -> StoreConfig:
        """The store settings of the measured reads: ``store`` with these settings' requests in flight and
        ``latency_ms`` injected by the client (0 where the emulated store injects it itself)."""
        return dataclasses.replace(self.store, in_flight=self.in_flight, latency_ms=latency_ms)

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
    settings: StoreLayoutComparison
    seed: int = 0

    @property
    def label(self) -> str:
        return self.layout_name


def layout_over_store(
    context: RunContext, plate: Path, serve: Serve | None, settings: StoreLayoutComparison, cache: Path | None
) -> dict[str, Any]:
    """Metrics of one layout: ``plate`` (the run's plate written in it) put in a store and read over it with
    the run's settings (``context``: its object table, ``--objects``, included): requests and bytes
    per random crop (decoded-chunk cache off: what a crop needs, not what a small plate left cached) and
    loader crops/s per read path, steady and over the whole pass (what reading ahead fetched during the
    first batch is free to the steady rate), each next to the local one.

    ``serve`` None: the emulated store at ``settings.latency_ms`` median where it runs here (the
    server's shares per read path), else nginx behind the delay proxy with the reason in the row; a
    ``serve`` given (a test's server) is read behind the delay proxy."""
    from cropbench.formats.sources import mirror_metadata

    stored = sum(path.stat().st_size for path in plate.rglob("*") if path.is_file())
    metrics: dict[str, Any] = {m.STORED_MIB: stored / 2**20}
    reason = unavailable() if serve is None else "a server given by the caller"
    model = StoreModel.at_median(settings.latency_ms)
    with contextlib.ExitStack() as stack:
        server: EmulatedStore | None = None
        if reason is None:
            server, url = stack.enter_context(emulated_plate(plate, model))
            store = settings.reads(0.0)  # the latency is the server's
            metrics[m.STORE_MODEL] = dataclasses.asdict(model)
        else:
            url = stack.enter_context((serve or http_plate)(plate))
            store = settings.reads(settings.latency_ms)
            metrics[m.STORE_EMULATION_SKIP_REASON] = reason
        mirror = mirror_metadata(url, settings.reads(0.0), cache)
        for decode, prefix in READ_PATHS.items():
            uncached = context.on(mirror).dataset(crop_config(decode, settings.crop_size, cache_bytes=0))
            counts = count_requests(uncached, settings.count_crops)
            metrics[m.prefixed(prefix, m.REQUESTS_PER_CROP)] = counts[m.REQUESTS_PER_CROP]
            metrics[m.prefixed(prefix, m.BYTES_TRANSFERRED_PER_CROP)] = counts[m.BYTES_TRANSFERRED_PER_CROP]
        flags: set[str] = set()
        with remote_plate(url, store, cache) as over_store:  # one mirror (and proxy) for both read paths
            for decode, crops in (("direct", settings.crops), ("zarr", settings.zarr_crops)):
                prefix, sizes = READ_PATHS[decode], (settings.batch_size, settings.crop_size)
                window = server.window() if server is not None else contextlib.nullcontext()
                with window as stretch:
                    remote = loader_rates(context.on(over_store), decode, crops, *sizes)
                metrics[m.prefixed(prefix, m.SAMPLES_PER_S)] = remote.steady
                metrics[m.prefixed(prefix, m.RUN_SAMPLES_PER_S)] = remote.whole
                if stretch is not None:
                    metrics[m.prefixed(prefix, m.SERVER_BUSY_SHARE)] = stretch.server_busy_share
                    metrics[m.prefixed(prefix, m.SERVER_BOUND)] = stretch.server_bound
                    if stretch.server_bound:
                        flags.add(SERVER_BOUND_FLAG)
                # Like for like: the local reads go through the cache the store's reader held (reading
                # ahead grows it to hold the batches fetched early: with whole-plane chunks, the plate).
                local = loader_rates(context.on(plate), decode, crops, *sizes, cache_bytes=remote.cache_bytes)
                metrics[m.prefixed(prefix, m.LOCAL_SAMPLES_PER_S)] = local.steady
                metrics[m.prefixed(prefix, m.LOCAL_RUN_SAMPLES_PER_S)] = local.whole
                if remote.cache_bytes is not None:
                    metrics[m.prefixed(prefix, m.READER_CACHE_BYTES)] = remote.cache_bytes
                    metrics[m.prefixed(prefix, m.CACHE_FRACTION_OF_PLATE)] = remote.cache_fraction
                if remote.cache_holds_plate or local.cache_holds_plate:
                    flags.add(CACHE_HOLDS_PLATE_FLAG)
    if flags:
        metrics[m.VALIDITY_FLAGS] = sorted(flags)
    return {**metrics, m.INJECTED_LATENCY_MS: settings.latency_ms, m.IN_FLIGHT: settings.in_flight}


class StoreLayouts:
    """Track ``store-layouts``: the run's plate (in a store) rewritten into each layout and measured over
    a loopback store (``serve`` None: the emulated store where it runs, see :func:`layout_over_store`).

    Args:
        layouts: The named OME-Zarr layouts to compare.
        settings: How each rewritten plate is served and read.
        work: The folder the rewritten plates are written in.
        serve: How to serve a plate; None: the emulated store.

    Raises:
        ConfigError: A layout is not OME-Zarr.
    """

    name = "store-layouts"

    def __init__(
        self,
        layouts: Sequence[str],
        settings: StoreLayoutComparison,
        work: WorkFolder,
        serve: Serve | None = None,
    ) -> None:
        for name in layouts:
            if layout_by_name(name).format != "ome-zarr":
                raise ConfigError(f"layout {name!r} is not OME-Zarr: only OME-Zarr layouts are read from a store")
        self.layouts, self.settings, self.work, self.serve = tuple(layouts), settings, work, serve

    def cases(self, preset: str, context: RunContext) -> list[StoreLayoutCase]:
        """One case per layout. ``preset`` is ignored: the comparison is the whole measurement."""
        return [StoreLayoutCase(name, self.settings) for name in self.layouts]

    def decode(self, case: StoreLayoutCase) -> None:
        """None: each case writes the plate it reads."""
        return None

    def measure(self, case: StoreLayoutCase, repeat: int, context: RunContext) -> Iterator[Row]:
        """Rewrite the plate in the case's layout, serve it on loopback and read it: one row."""
        name = case.layout_name
        context.progress(f"{name}: writing")
        destination = self.work.destination(name)
        try:
            plate = materialize_layout(context.plate, name, destination.parent)
            context.progress(f"{name}: reading over the store")
            metrics = {
                m.LAYOUT: name,
                **layout_over_store(context, plate, self.serve, case.settings, context.plate.parent),
            }
        finally:
            self.work.done(destination)
        config = {
            "layout_name": name,
            "layout": dataclasses.asdict(layout_by_name(name)),
            "settings": dataclasses.asdict(case.settings),
        }
        yield Row(case, config, metrics, case.seed + repeat)
