"""Convert or read in place? The plate read as it is beside its crops converted once into training formats.

Track ``formats`` (``cropbench compare-formats``), one record per reader, all on the same crops (the
same objects, windows, channels, uint16; :func:`cropbench.data.training.crop_dataset`):

- ``ome-zarr/direct`` and ``ome-zarr/zarr``: cropbench's ``CropDataset`` reading the plate in place
  (``direct`` first: the in-place reference of every later row);
- ``ome-zarr/NAME`` for each layout of ``rechunk`` (by default ``atlas``): the plate rewritten in that
  layout, an OME-Zarr plate still (the rewrite timed as a conversion), read in place by the direct path;
- each training format (HDF5, WebDataset, litdata, MosaicML MDS): the crops cut once by cropbench's
  reader and written by the library (:func:`convert_crops`: wall seconds, peak resident memory, bytes
  on disk, size against the plate), then read back through the library's own Dataset and loader.

Every reader is measured with the same two protocols. Track 1's: random ``__getitem__`` after a
warm-up, as a tight and a timed loop over the same indices (:func:`~cropbench.measure.protocol.steady_state`:
samples/s and p50/p95/p99), and, for a converted store, its random crops/s interleaved block by block
with the in-place reference on the same indices (``random_ratio_to_in_place``: a ratio that survives a
busy machine). WebDataset has no random access; its row has no random metrics. Track 2's: ``epochs``
shuffled epochs through a DataLoader (the library's own shuffling and loader where it has them), the
clock around ``iter()`` and each blocking ``next()``: first-batch latency, steady samples/s without
each epoch's first batch per worker, crops/s over whole epochs (first batch included), seconds per
epoch, and whether each epoch delivered every crop exactly once. Each row carries the fidelity hash
of the first crops by index and whether it equals the plate's.

With ``remote_latency_ms`` (``compare-formats --latency-ms``), each store is also served by the
emulated object store (:mod:`cropbench.measure.store_emulation`: nginx in its own network namespace,
that median first-byte latency with a log-normal tail, per-connection and link bandwidth) and read for
the same shuffled epochs by the libraries that stream from S3 (``remote_*``: crops/s, first batch,
requests and bytes per crop from the server's log, the server's CPU and busy shares, flagged
``server-bound`` where the server and not the model was the limit, the bytes in the library's local
cache after the first epoch and at the end, flagged ``library-cache`` where later epochs could read
from there instead of the store); the others say why not (``remote_skip_reason``). The plate is served too and read in
place by the direct path for the same epochs, and each format's ``remote_break_even_epochs`` is
against it.

``break_even_epochs`` = conversion seconds / (in-place seconds per epoch - converted seconds per
epoch), seconds per epoch being the objects over the crops/s of whole shuffled epochs (each epoch's
first batch included: a store that starts slowly pays for it every epoch): the epochs after which
converting has paid for itself. A format whose whole-epoch rate is not above the plate's in place
never pays off (``converting_pays_off`` False, no break-even). The same from whole epochs (worker start-up and
shut-down included) of the converted store and of the plate in place read in turns
(``interleaved_break_even_epochs``, ``epoch_ratio_to_in_place``) survives a busy machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, RandomSampler, Sampler

from cropbench import metrics as m
from cropbench.config import DEFAULT_CROP_SIZE, CropConfig, LayoutSpec, StoreConfig, check_workers, layout_by_name
from cropbench.data.dataset import CropDataset
from cropbench.data.loader import LoaderSpec, build_loader
from cropbench.data.sampling import ShuffledRuns, access_order
from cropbench.data.training import (
    TRAINING_FORMATS,
    CropStoreInfo,
    EpochSpec,
    FormatUnavailableError,
    S3Access,
    TrainingFormat,
    check_shard_bytes,
    crop_dataset,
    needed_bytes,
    training_format,
)
from cropbench.errors import ConfigError
from cropbench.harness.context import RunContext
from cropbench.harness.runner import Row
from cropbench.harness.validity import (
    CACHE_HOLDS_PLATE_FLAG,
    LIBRARY_CACHE_FLAG,
    cache_fraction_of_plate,
    cache_holds_plate,
)
from cropbench.harness.work import WorkFolder
from cropbench.measure.endpoints import S3_ACCESS_KEY, S3_REGION, S3_SECRET_KEY, environment_variables, remote_plate
from cropbench.measure.fidelity import fidelity_hash
from cropbench.measure.memory import PeakMemory
from cropbench.measure.protocol import (
    Stopwatch,
    exhaust,
    interleaved_blocks,
    interleaved_rates,
    per_item,
    samples_per_s,
    steady_state,
    time_each,
)
from cropbench.measure.store_emulation import (
    SERVER_BOUND_FLAG,
    ServerWindow,
    StoreModel,
    emulated_plate,
    emulated_store,
    unavailable,
)
from cropbench.objects import ObjectTable
from cropbench.plates.convert import convert_plate, pixel_bytes
from cropbench.scratch import scratch_folder

TRACK = "formats"
#: Crops hashed, by index, for the fidelity check.
FIDELITY_ITEMS = 32

#: How much slower than in place a converted format's epoch is assumed to be when a comparison is fitted to a
#: time budget: the slowest measured on 2 cores (LitData, about 5x at one worker) is rare; most read faster.
SLOWER_THAN_IN_PLACE = 2.0

#: The bucket the emulated store serves stores under.
BUCKET = "crops"


@dataclass(frozen=True)
class FormatComparison:
    """What ``compare-formats`` measures; part of every record it writes.

    ``samples`` random crops are timed per reader after ``warmup`` (Track 1), ``repeats`` interleaved
    passes give the ratio to the in-place reference; ``epochs`` shuffled epochs with ``workers``
    DataLoader workers and ``batch_size`` (Track 2). ``shard_bytes`` is each sharded format's shard or
    chunk size.
    """

    formats: tuple[str, ...] = tuple(TRAINING_FORMATS)
    crop_size: int = DEFAULT_CROP_SIZE
    channels: tuple[str, ...] | None = None
    samples: int = 2000
    warmup: int = 200
    repeats: int = 3
    workers: int = 2
    batch_size: int = 64
    epochs: int = 2
    shard_bytes: int = 64 * 2**20
    seed: int = 0
    #: With a latency, each store is also served by the emulated object store at this median first-byte
    #: latency (its tail as :meth:`StoreModel.at_median` scales it), and its epochs are read from there
    #: (formats that can).
    remote_latency_ms: float | None = None
    #: The in-place read paths measured beside the formats; the reference (the direct path) always, since
    #: every break-even is against it.
    in_place: tuple[str, ...] = tuple(m.IN_PLACE)
    #: The in-place epochs' shuffle: runs of this many consecutive objects (table order) in random order,
    #: shuffled inside (:class:`~cropbench.data.sampling.ShuffledRuns`); 1: each object on its own. On a
    #: plate with a crop atlas a run is one request, as a converted format's shard is one stream; the
    #: converted formats keep their own shuffles.
    in_place_run: int = 1
    #: Layouts the plate is re-chunked into (:func:`~cropbench.plates.convert.convert_plate`, timed as a
    #: conversion) and read in place by the direct path, each beside the formats: ``ome-zarr/NAME`` rows.
    #: A layout with a crop atlas gets one of the comparison's crop size.
    rechunk: tuple[str, ...] = ("atlas",)

    def __post_init__(self) -> None:
        for name in self.formats:
            training_format(name)
        check_shard_bytes(self.shard_bytes)
        for knob in ("crop_size", "samples", "repeats", "batch_size", "epochs", "in_place_run"):
            value = getattr(self, knob)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{knob} must be a whole number >= 1, got {value!r}")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise ConfigError(f"warmup must be a whole number >= 0, got {self.warmup!r}")
        check_workers(self.workers)
        if self.remote_latency_ms is not None and not (
            isinstance(self.remote_latency_ms, (int, float)) and 0 <= self.remote_latency_ms < 60_000
        ):
            raise ConfigError(f"remote_latency_ms must be from 0 to 60000 (or None), got {self.remote_latency_ms!r}")
        if self.channels is not None and not self.channels:
            raise ConfigError("channels must name at least one channel (or be None for all)")
        for name in self.rechunk:
            if layout_by_name(name).format != "ome-zarr":
                raise ConfigError(f"rechunk layout {name!r} is not an OME-Zarr layout (the plate is read in place)")
        if m.REFERENCE not in self.in_place or not set(self.in_place) <= set(m.IN_PLACE):
            raise ConfigError(
                f"in_place must hold {m.REFERENCE} and only in-place readers ({', '.join(m.IN_PLACE)}), "
                f"got {self.in_place!r}"
            )

    def estimated_seconds(self, epoch_seconds: float) -> float:
        """About how long the comparison takes where one shuffled epoch in place takes ``epoch_seconds``:
        each in-place reader's epochs; each format's conversion (one pass), its own epochs and its epochs
        read in turns with the plate's, at most :data:`SLOWER_THAN_IN_PLACE` times slower than in place.
        Random access is left out: ``samples`` crops are a fraction of an epoch."""
        in_place = len(self.in_place) * self.epochs
        converted = (len(self.formats) + len(self.rechunk)) * (1 + 3 * self.epochs) * SLOWER_THAN_IN_PLACE
        return epoch_seconds * (in_place + converted)

    def within(self, seconds: float, epoch_seconds: float) -> FormatComparison | None:
        """This comparison cut to fit ``seconds`` (by :meth:`estimated_seconds`): fewer epochs, down to
        two (a spread needs two), then fewer formats, the first listed kept; None when not even one format
        over two epochs fits."""
        for count in range(len(self.formats), 0, -1):
            for epochs in range(self.epochs, min(self.epochs, 2) - 1, -1):
                cut = dataclasses.replace(self, formats=self.formats[:count], epochs=epochs)
                if cut.estimated_seconds(epoch_seconds) <= seconds:
                    return cut
        return None

    def readers(self) -> list[str]:
        """In-place readers first (the reference first of all), then the re-chunked plates, then each
        format once."""
        in_place = [reader for reader in m.IN_PLACE if reader in self.in_place]
        return [*in_place, *self.rechunked(), *dict.fromkeys(self.formats)]

    def rechunked(self) -> dict[str, LayoutSpec]:
        """The re-chunked plates' readers (``ome-zarr/NAME``) and the layout each is written in: a crop
        atlas at the comparison's crop size."""
        layouts = {f"{m.RECHUNKED_PREFIX}{name}": layout_by_name(name) for name in dict.fromkeys(self.rechunk)}
        return {
            reader: dataclasses.replace(layout, crop_atlas=self.crop_size) if layout.crop_atlas else layout
            for reader, layout in layouts.items()
        }

    def epoch_spec(self) -> EpochSpec:
        """Shuffled epochs with the comparison's batch size, workers and seed."""
        return EpochSpec(batch_size=self.batch_size, workers=self.workers, shuffle=True, seed=self.seed)

    def store_model(self) -> StoreModel:
        """The emulated store the remote epochs read from."""
        return StoreModel.at_median(float(self.remote_latency_ms or 0.0))

    def crop(self, decode: str = "direct") -> CropConfig:
        return CropConfig(
            crop_size=self.crop_size, channels=self.channels, dtype="uint16", tier="none", decode=decode, seed=self.seed
        )


def check_plate(
    plate: str | Path,
    comparison: FormatComparison,
    objects: ObjectTable | str | Path | None = None,
    *,
    shard_chosen: bool = False,
) -> int:
    """Check the comparison against the plate before anything is measured or written: the crop fits a
    field, the channels and the object table are the plate's, and a shard size the user chose is not
    larger than the whole store (each format would write a single shard). Returns the store's bytes."""
    dataset = crop_dataset(plate, comparison.crop_size, comparison.channels, objects)
    try:
        store = needed_bytes(len(dataset), (len(dataset.channel_indices), comparison.crop_size, comparison.crop_size))
    finally:
        dataset.reader.close()
    if shard_chosen and comparison.shard_bytes > max(store, 1):
        raise ConfigError(
            f"a shard of {comparison.shard_bytes / 2**20:g} MiB is larger than the whole store "
            f"({store / 2**20:.3g} MiB of crops of {plate}): every format would write one shard; "
            f"choose at most {store / 2**20:.3g} MiB"
        )
    return store


@dataclass(frozen=True)
class Conversion:
    """One conversion: the store written, its manifest, and what writing it cost."""

    path: Path
    info: CropStoreInfo
    seconds: float
    peak_rss_bytes: int | None
    start_rss_bytes: int
    peak_reset: bool

    def metrics(self) -> dict[str, Any]:
        return {
            m.FORMAT_LIBRARY_VERSION: self.info.library_version,
            **conversion_cost(
                self.seconds, self.info.count, self.peak_rss_bytes, self.start_rss_bytes, self.peak_reset
            ),
            **stored(self.info.stored_bytes),
        }


def conversion_cost(
    seconds: float, crops: int, peak_rss_bytes: int | None, start_rss_bytes: int, peak_reset: bool
) -> dict[str, Any]:
    """What writing a store cost: wall seconds, crops/s, and the resident-memory peak and its growth."""
    return {
        m.CONVERSION_SECONDS: seconds,
        m.CONVERSION_CROPS_PER_S: samples_per_s(crops, seconds),
        m.CONVERSION_PEAK_RSS_BYTES: peak_rss_bytes,
        m.CONVERSION_START_RSS_BYTES: start_rss_bytes,
        m.CONVERSION_PEAK_RSS_GROWTH_BYTES: None
        if peak_rss_bytes is None
        else max(peak_rss_bytes - start_rss_bytes, 0),
        m.CONVERSION_PEAK_RSS_RESET: peak_reset,
    }


def stored(nbytes: int) -> dict[str, Any]:
    """A store's bytes on disk, and in MiB."""
    return {m.STORED_BYTES: nbytes, m.STORED_MIB: nbytes / 2**20}


def convert_crops(
    context: RunContext,
    destination: str | Path,
    format_name: str,
    *,
    crop_size: int = DEFAULT_CROP_SIZE,
    channels: tuple[str, ...] | None = None,
    shard_bytes: int = 64 * 2**20,
    overwrite: bool = False,
) -> Conversion:
    """Cut the crops of the run's plate once with cropbench's reader and write them in ``format_name`` at
    ``destination`` (into a temporary sibling, renamed into place when complete).

    The clock and the memory peak cover cutting and writing (what converting costs a lab), not
    opening the plate or importing the library.
    """
    fmt = training_format(format_name)
    fmt.library_version()  # imports the library: off the clock
    dataset = context.dataset(CropConfig(crop_size=crop_size, channels=channels, dtype="uint16"))
    with PeakMemory() as memory, Stopwatch() as clock:
        info = fmt.write(dataset, destination, shard_bytes=shard_bytes, overwrite=overwrite)
    dataset.reader.close()
    return Conversion(Path(destination), info, clock.seconds, memory.peak_bytes, memory.start_bytes, memory.reset)


def timed_epochs(
    loader: Iterable[dict[str, Any]],
    epochs: int,
    warmup_batches: int,
    objects: int,
    after_first: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Track 2's clocks around ``epochs`` passes of ``loader``: ``iter()`` and each blocking ``next()``.

    Steady samples/s leaves out each epoch's first ``warmup_batches`` (worker start-up); the whole-epoch
    rate (what break-even reads) counts every batch, the first included. Every epoch must deliver each of
    the ``objects`` crops exactly once (``exactly_once``). ``after_first`` is called, off the clock,
    once the first epoch is over.
    """
    first_batch_ns = 0
    steady_ns = steady_samples = 0
    epoch_seconds: list[float] = []
    waits_all: list[int] = []
    exactly_once = True
    delivered_total = 0
    for epoch in range(epochs):
        with Stopwatch() as creating:
            iterator = iter(loader)
        fetch, waits, sizes, seen = Stopwatch(), [], [], []
        while True:
            with fetch:
                batch = next(iterator, None)
            if batch is None:
                break
            waits.append(fetch.last_ns)
            sizes.append(int(batch["image"].shape[0]))
            seen.extend(torch.as_tensor(batch["index"]).tolist())
        del iterator
        if not waits:
            raise ConfigError(f"epoch {epoch} delivered no batch")
        if epoch == 0:
            first_batch_ns = creating.ns + waits[0]
        steady = slice(warmup_batches, None) if len(waits) > warmup_batches else slice(-1, None)
        steady_ns += sum(waits[steady])
        steady_samples += sum(sizes[steady])
        epoch_seconds.append((creating.ns + sum(waits)) / 1e9)
        waits_all.extend(waits[steady])
        exactly_once &= sorted(seen) == list(range(objects))
        delivered_total += len(seen)
        if epoch == 0 and after_first is not None:
            after_first()
    return {
        m.FIRST_BATCH_MS: first_batch_ns / 1e6,
        m.SAMPLES_PER_S: samples_per_s(steady_samples, steady_ns / 1e9),
        m.EPOCH_SAMPLES_PER_S: samples_per_s(delivered_total, sum(epoch_seconds)),
        m.EPOCH_SECONDS: epoch_seconds,
        m.DELIVERED_SAMPLES: delivered_total,
        m.EXPECTED_SAMPLES: objects * epochs,
        m.EXACTLY_ONCE: exactly_once,
        m.BATCH_P50_MS: float(np.median(waits_all)) / 1e6,
    }


def folder_bytes(folder: Path) -> int:
    """Bytes of the files under ``folder`` (0 when there is none)."""
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()) if folder.exists() else 0


def over_store(metrics: dict[str, Any], window: ServerWindow, cache: Path) -> dict[str, Any]:
    """A remote measurement's row: its epochs' metrics, what the server answered meanwhile (per crop
    delivered), its CPU and busy shares (``server-bound`` among the validity flags where it was the
    limit), the bytes left under ``cache`` and the store's median latency."""
    delivered = metrics[m.prefixed(m.REMOTE, m.DELIVERED_SAMPLES)]
    row = {
        **metrics,
        **_prefixed(m.REMOTE, window.metrics(delivered)),
        m.REMOTE_CACHE_BYTES: folder_bytes(cache),
        m.INJECTED_LATENCY_MS: window.store.model.median_latency_ms,
    }
    if window.server_bound:
        row[m.VALIDITY_FLAGS] = [*row.get(m.VALIDITY_FLAGS, []), SERVER_BOUND_FLAG]
    return row


def library_cache(epochs: int, local_cache_bytes: int) -> dict[str, Any]:
    """A converted store's remote row: the bytes its library's local cache held after the first epoch, and
    ``library-cache`` among its flags where later epochs could read from there instead of the store."""
    served = epochs > 1 and local_cache_bytes > 0
    return {m.LOCAL_CACHE_BYTES: local_cache_bytes, **({m.VALIDITY_FLAGS: [LIBRARY_CACHE_FLAG]} if served else {})}


def remote_epochs(
    fmt: TrainingFormat, store: Path, plate_name: str, comparison: FormatComparison, objects: int
) -> dict[str, Any]:
    """Track 2's shuffled epochs of ``store`` served by the emulated object store (at
    ``comparison.store_model()``) under ``BUCKET/FORMAT``, the library caching as it does; or why not.

    The server's log holds every request the epochs made (index and data files alike):
    ``remote_requests_per_crop`` is their count over the crops delivered.
    """
    reason = fmt.remote or unavailable()
    if reason is not None:
        return {m.REMOTE_SKIP_REASON: reason}
    with contextlib.ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f".{fmt.name}.", dir=store.parent)))
        server = stack.enter_context(emulated_store({f"{BUCKET}/{fmt.name}": store}, comparison.store_model()))
        s3 = S3Access(server.endpoint, S3_ACCESS_KEY, S3_SECRET_KEY, S3_REGION)
        cache = scratch / "cache"
        # What the library prints on stderr (litdata prints its prefetch thread's traceback there) is
        # held back: a failure is the row's one-line answer, and after a success it is passed on.
        said, before = io.StringIO(), set(threading.enumerate())
        cached_after_first: list[int] = []
        with (
            server.window() as window,
            environment_variables(fmt.remote_environment(s3)),
            contextlib.redirect_stderr(said),
        ):
            try:
                loader = fmt.remote_epoch_loader(
                    f"s3://{BUCKET}/{fmt.name}", cache, s3, plate_name, comparison.epoch_spec()
                )
                epochs = timed_epochs(
                    loader,
                    comparison.epochs,
                    max(1, comparison.workers),
                    objects,
                    after_first=lambda: cached_after_first.append(folder_bytes(cache)),
                )
                metrics = {
                    **_prefixed(m.REMOTE, epochs),
                    **library_cache(comparison.epochs, cached_after_first[0] if cached_after_first else 0),
                }
            except Exception as error:  # any failure of the library's own client is the row's answer
                # litdata's prefetch thread hands its error over before printing it: let it finish here.
                for thread in set(threading.enumerate()) - before:
                    thread.join(timeout=5)
                return {m.REMOTE_SKIP_REASON: fmt.remote_failure(error)}
        sys.stderr.write(said.getvalue())
        return over_store(metrics, window, cache)


def random_access(get: Any, indices: list[int], warmup: int) -> dict[str, Any]:
    """Track 1's protocol on random indices: a warm-up, then the tight and the timed loop over the rest."""
    time_each(get, indices[:warmup])
    return steady_state(get, indices[warmup:])


def random_beside_in_place(
    get: Callable[[int], Any], plate_get: Callable[[int], Any], order: list[int], comparison: FormatComparison
) -> dict[str, Any]:
    """Track 1's random protocol on a store read by index, then its crops/s block by block in turns with
    the plate read in place on the same indices (``random_ratio_to_in_place``: a ratio that survives a
    busy machine)."""
    metrics = _prefixed(m.RANDOM, random_access(get, order, comparison.warmup))
    timed = order[comparison.warmup :]
    blocks = [timed[start : start + 50] for start in range(0, len(timed), 50)]
    rates = interleaved_rates({"converted": per_item(get), "in_place": per_item(plate_get)}, blocks, comparison.repeats)
    metrics[m.RANDOM_RATIO_TO_IN_PLACE] = rates["converted"].median / rates["in_place"].median
    return metrics


def break_even(conversion_seconds: float, in_place_epoch_s: float, converted_epoch_s: float) -> dict[str, Any]:
    """Epochs after which converting pays for itself against reading in place, from the seconds of whole
    epochs (first batch included); none when the converted store's epoch is not the shorter."""
    saved = in_place_epoch_s - converted_epoch_s
    if not math.isfinite(saved) or saved <= 0:
        return {m.CONVERTING_PAYS_OFF: False}
    return {m.CONVERTING_PAYS_OFF: True, m.BREAK_EVEN_EPOCHS: conversion_seconds / saved}


def break_evens(converted: dict[str, Any], in_place: dict[str, Any], objects: int) -> dict[str, Any]:
    """The converted row's break-even against the plate read in place (``in_place``, the reference row of
    the same repeat) from the whole-epoch rates of each: on local disk (``break_even_epochs``) and, where
    both were read over the store, there (``remote_break_even_epochs``). Steady rates, which leave each
    epoch's first batch out, decide nothing: a store that starts slowly pays for it every epoch."""
    found: dict[str, Any] = {}
    for source, prefix in ((m.SHUFFLED, ""), (m.REMOTE, m.REMOTE)):
        rate = m.prefixed(source, m.EPOCH_SAMPLES_PER_S)
        if converted.get(rate) and in_place.get(rate):
            seconds = objects / in_place[rate], objects / converted[rate]
            found.update(_prefixed(prefix, break_even(converted[m.CONVERSION_SECONDS], *seconds)))
    return found


@dataclass(frozen=True)
class FormatCase:
    """One reader of a comparison: the plate in place by a decode path, or a training format."""

    reader: str
    comparison: FormatComparison

    @property
    def label(self) -> str:
        return self.reader


class Formats:
    """Track ``formats`` for the runner: the run's plate read in place, then converted into each format
    under ``work_dir`` (removed after measuring unless ``keep``) and read back.

    Args:
        comparison: The formats, the crops and how each is read (workers, batch, epochs).
        work_dir: Where the converted stores are written.
        keep: Keep the converted stores; by default each is removed once measured.
    """

    name = TRACK

    def __init__(self, comparison: FormatComparison, work_dir: str | Path, keep: bool = False) -> None:
        self.comparison = comparison
        self.work = WorkFolder(work_dir, keep)
        #: The in-place reference's metrics per repeat: each repeat's break-even is against its own.
        self.reference: dict[int, dict[str, Any]] = {}

    def cases(self, preset: str, context: RunContext) -> list[FormatCase]:
        """One case per reader: the plate in place first, then each format. ``preset`` is ignored: the
        comparison is the whole measurement."""
        return [FormatCase(reader, self.comparison) for reader in self.comparison.readers()]

    def decode(self, case: FormatCase) -> str | None:
        """The read path of an in-place reader (a re-chunked plate's: ``direct``); None for a converted format."""
        return "direct" if case.reader in case.comparison.rechunked() else m.IN_PLACE.get(case.reader)

    def measure(self, case: FormatCase, repeat: int, context: RunContext) -> Iterator[Row]:
        """Convert (for a format), then read whole epochs: one row with its rates and, against the
        in-place reference of the same repeat, its break-even."""
        comparison = dataclasses.replace(case.comparison, seed=case.comparison.seed + repeat)
        plate_dataset = context.dataset(comparison.crop())
        objects = len(plate_dataset)
        order = access_order(plate_dataset, "random", comparison.warmup + comparison.samples, comparison.seed)
        metrics: dict[str, Any] = {
            m.READER: case.reader,
            m.OBJECTS: objects,
            m.PLATE_STORED_BYTES: pixel_bytes(context.plate) if context.remote is None else None,
            m.FIDELITY_ITEMS: min(FIDELITY_ITEMS, objects),
        }
        plate_hash = fidelity_hash(
            (plate_dataset[i] for i in range(metrics[m.FIDELITY_ITEMS])), plate_dataset.channel_names
        )
        if case.reader in m.IN_PLACE:
            metrics.update(self._in_place(case.reader, comparison, context, order, objects))
        elif case.reader in comparison.rechunked():
            if context.remote is not None:
                remote = "re-chunking rewrites a local plate; this one is read from an object store"
                context.progress(f"{case.reader}: skipped ({remote})")
                yield Row(case, self._config(case, comparison), {**metrics, m.SKIPPED: True, m.SKIP_REASON: remote}, 0)
                return
            layout = comparison.rechunked()[case.reader]
            metrics.update(self._rechunked(case.reader, layout, comparison, context, plate_dataset, order, objects))
        else:
            fmt = training_format(case.reader)
            reason = fmt.available()
            if reason is not None:
                context.progress(f"{case.reader}: skipped ({reason})")
                yield Row(case, self._config(case, comparison), {**metrics, m.SKIPPED: True, m.SKIP_REASON: reason}, 0)
                return
            metrics.update(self._converted(fmt, comparison, context, plate_dataset, order, objects))
        metrics[m.IDENTICAL_TO_PLATE] = metrics[m.FIDELITY_SHA256] == plate_hash
        plate_dataset.reader.close()
        if metrics.get(m.PLATE_STORED_BYTES) and m.STORED_BYTES in metrics:
            metrics[m.SIZE_RATIO_TO_PLATE] = metrics[m.STORED_BYTES] / metrics[m.PLATE_STORED_BYTES]
        metrics[m.SECONDS_PER_EPOCH] = objects / metrics[m.prefixed(m.SHUFFLED, m.EPOCH_SAMPLES_PER_S)]
        if case.reader == m.REFERENCE:
            self.reference[repeat] = metrics
        elif m.CONVERSION_SECONDS in metrics and repeat in self.reference:
            metrics.update(break_evens(metrics, self.reference[repeat], objects))
        yield Row(case, self._config(case, comparison), metrics, comparison.seed)

    def _config(self, case: FormatCase, comparison: FormatComparison) -> dict[str, Any]:
        rechunked = comparison.rechunked().get(case.reader)
        return {
            "reader": case.reader,
            "format": "ome-zarr" if case.reader in m.IN_PLACE or rechunked else case.reader,
            "decode": self.decode(case),
            **({"layout": dataclasses.asdict(rechunked), "layout_label": rechunked.label} if rechunked else {}),
            "comparison": dataclasses.asdict(comparison),
        }

    def _loader(
        self, dataset: CropDataset, comparison: FormatComparison, start_method: str = "fork"
    ) -> DataLoader[Any]:
        """Shuffled epochs through the one loader builder (seeded workers, the watchdog)."""
        start = start_method if comparison.workers else "fork"
        spec = LoaderSpec(num_workers=comparison.workers, batch_size=comparison.batch_size, start_method=start)
        order: Sampler[int] = (
            RandomSampler(dataset, generator=torch.Generator().manual_seed(comparison.seed))
            if comparison.in_place_run == 1
            else ShuffledRuns(len(dataset), comparison.in_place_run, comparison.seed)
        )
        return build_loader(dataset, spec, order, comparison.seed)

    def _in_place_over_store(
        self, comparison: FormatComparison, context: RunContext, objects: int, plate: Path | None = None
    ) -> dict[str, Any]:
        """The plate (or ``plate``, a rewrite of it) served by the emulated object store and read in place
        by the direct path (its default store settings), for the same shuffled epochs as the converted
        stores; requests counted alike."""
        reason = unavailable()
        if reason is not None:
            return {m.REMOTE_SKIP_REASON: reason}
        with contextlib.ExitStack() as stack:
            scratch = stack.enter_context(scratch_folder("in-place"))
            server, url = stack.enter_context(emulated_plate(plate or context.plate, comparison.store_model()))
            mirror = stack.enter_context(remote_plate(url, StoreConfig(), scratch / "mirror"))
            dataset = context.dataset(comparison.crop("direct"), mirror)
            # Forked workers, as on local disk: the direct path's own HTTP client starts afresh in each
            # (a forkserver's start-up, seconds, would count in its first batch and not the plate's).
            loader = self._loader(dataset, comparison)  # grows the reader's chunk cache to hold its read-ahead
            fraction = cache_fraction_of_plate(dataset.config, dataset.reader)
            with server.window() as window:
                epochs = timed_epochs(loader, comparison.epochs, max(1, comparison.workers), objects)
            dataset.reader.close()
            row = over_store(_prefixed(m.REMOTE, epochs), window, scratch / "mirror")
            # What each process's chunk cache held, of the decoded fields: a cache that holds them all
            # measured hits, and the row says so.
            row[m.prefixed(m.REMOTE, m.CACHE_FRACTION_OF_PLATE)] = fraction
            if cache_holds_plate(fraction):
                row[m.VALIDITY_FLAGS] = [*row.get(m.VALIDITY_FLAGS, []), CACHE_HOLDS_PLATE_FLAG]
            return row

    def _in_place(
        self, reader: str, comparison: FormatComparison, context: RunContext, order: list[int], objects: int
    ) -> dict[str, Any]:
        dataset = context.dataset(comparison.crop(m.IN_PLACE[reader]))
        metrics = _prefixed(m.RANDOM, random_access(dataset.__getitem__, order, comparison.warmup))
        metrics[m.FIDELITY_SHA256] = fidelity_hash(
            (dataset[i] for i in range(min(FIDELITY_ITEMS, objects))), dataset.channel_names
        )
        loader = self._loader(dataset, comparison)
        metrics.update(
            _prefixed(m.SHUFFLED, timed_epochs(loader, comparison.epochs, max(1, comparison.workers), objects))
        )
        dataset.reader.close()
        if comparison.remote_latency_ms is not None:
            if reader == m.REFERENCE:
                context.progress(f"{reader}: reading over the loopback store")
                metrics.update(self._in_place_over_store(comparison, context, objects))
            else:
                metrics[m.REMOTE_SKIP_REASON] = (
                    f"{reader} is not read over the store here (compare-layouts --plate URL measures it)"
                )
        return metrics

    def _rechunked(
        self,
        reader: str,
        layout: LayoutSpec,
        comparison: FormatComparison,
        context: RunContext,
        plate_dataset: CropDataset,
        order: list[int],
        objects: int,
    ) -> dict[str, Any]:
        """The plate re-chunked into ``layout`` (the whole rewrite timed as a conversion: reading the
        plate, writing the fields and any crop atlas) and read in place by the direct path as the plate
        is, its random crops in turns with the plate's, its epochs beside the plate's in turns and, with
        a latency, over the store."""
        destination = self.work.destination(reader.removeprefix(m.RECHUNKED_PREFIX))
        try:
            context.progress(f"{reader}: re-chunking the plate")
            with PeakMemory() as memory, Stopwatch() as clock:
                convert_plate(context.plate, destination, layout, overwrite=True)
            metrics = {
                **conversion_cost(clock.seconds, objects, memory.peak_bytes, memory.start_bytes, memory.reset),
                **stored(pixel_bytes(destination)),
            }
            context.progress(f"{reader}: reading")
            dataset = context.dataset(comparison.crop(), plate=destination)
            metrics.update(random_beside_in_place(dataset.__getitem__, plate_dataset.__getitem__, order, comparison))
            # of the random reads alone (the loader's workers count their own; the fidelity check reads in table order)
            metrics[m.CROPS_FROM_ATLAS] = dataset.reader.stats.per_region()[m.CROPS_FROM_ATLAS]
            metrics[m.FIDELITY_SHA256] = fidelity_hash(
                (dataset[i] for i in range(min(FIDELITY_ITEMS, objects))), dataset.channel_names
            )
            loader = self._loader(dataset, comparison)
            metrics.update(
                _prefixed(m.SHUFFLED, timed_epochs(loader, comparison.epochs, max(1, comparison.workers), objects))
            )
            metrics.update(self._epochs_beside_in_place(loader, clock.seconds, comparison, context))
            dataset.reader.close()
            if comparison.remote_latency_ms is not None:
                context.progress(f"{reader}: reading over the loopback store")
                metrics.update(self._in_place_over_store(comparison, context, objects, destination))
        finally:
            self.work.done(destination)
        return metrics

    def _converted(
        self,
        fmt: TrainingFormat,
        comparison: FormatComparison,
        context: RunContext,
        plate_dataset: CropDataset,
        order: list[int],
        objects: int,
    ) -> dict[str, Any]:
        destination = self.work.destination(fmt.name)
        try:
            context.progress(f"{fmt.name}: converting")
            conversion = convert_crops(
                context,
                destination,
                fmt.name,
                crop_size=comparison.crop_size,
                channels=comparison.channels,
                shard_bytes=comparison.shard_bytes,
                overwrite=True,
            )
            metrics = conversion.metrics()
            context.progress(f"{fmt.name}: reading")
            count = min(FIDELITY_ITEMS, objects)
            if fmt.random_access:
                dataset = fmt.map_dataset(destination)
                metrics.update(
                    random_beside_in_place(dataset.__getitem__, plate_dataset.__getitem__, order, comparison)
                )
                first = [dataset[i] for i in range(count)]
            else:
                unshuffled = fmt.epoch_loader(destination, EpochSpec(batch_size=count, shuffle=False))
                first = _uncollated(next(iter(unshuffled)))
            metrics[m.FIDELITY_SHA256] = fidelity_hash(first, plate_dataset.channel_names)
            loader = fmt.epoch_loader(destination, comparison.epoch_spec())
            metrics.update(
                _prefixed(m.SHUFFLED, timed_epochs(loader, comparison.epochs, max(1, comparison.workers), objects))
            )
            metrics.update(self._epochs_beside_in_place(loader, conversion.seconds, comparison, context))
            if comparison.remote_latency_ms is not None:
                context.progress(f"{fmt.name}: reading over the loopback store")
                metrics.update(remote_epochs(fmt, destination, conversion.info.plate_name, comparison, objects))
        finally:
            self.work.done(destination)
        return metrics

    def _epochs_beside_in_place(
        self, loader: Iterable[Any], conversion_seconds: float, comparison: FormatComparison, context: RunContext
    ) -> dict[str, Any]:
        """Whole epochs (worker start-up and shut-down included) of the converted store and of the plate
        in place, taking turns, so a busy machine slows both alike; break-even from those seconds."""
        plate = context.dataset(comparison.crop())
        calls = {"converted": exhaust(loader), "in_place": exhaust(self._loader(plate, comparison))}
        seconds = interleaved_blocks(calls, [None] * comparison.epochs)
        plate.reader.close()
        converted, in_place = (float(np.median(seconds[name][0])) for name in ("converted", "in_place"))
        return {
            m.INTERLEAVED_EPOCH_SECONDS: converted,
            m.INTERLEAVED_IN_PLACE_EPOCH_SECONDS: in_place,
            m.EPOCH_RATIO_TO_IN_PLACE: in_place / converted,
            **_prefixed(m.INTERLEAVED, break_even(conversion_seconds, in_place, converted)),
        }


def _prefixed(prefix: str, metrics: dict[str, Any]) -> dict[str, Any]:
    return {m.prefixed(prefix, key): value for key, value in metrics.items()}


def _uncollated(batch: dict[str, Any]) -> list[dict[str, Any]]:
    """The samples of a collated batch, as the Dataset delivered them one by one."""
    count = int(batch["image"].shape[0])

    def item(values: Any, position: int) -> Any:
        value = values[position]
        return value.item() if isinstance(value, torch.Tensor) and value.dim() == 0 else value

    return [{key: item(values, position) for key, values in batch.items()} for position in range(count)]


__all__ = [
    "Conversion",
    "FormatCase",
    "FormatComparison",
    "Formats",
    "FormatUnavailableError",
    "break_even",
    "break_evens",
    "check_plate",
    "convert_crops",
    "timed_epochs",
]
