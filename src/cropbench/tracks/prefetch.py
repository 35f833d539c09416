"""Track ``prefetch``: read-ahead over the emulated object store, the direct reader's random crops/s with and
without reading ahead, beside the same plate on local disk, interleaved in one process.

The plate is served by the emulated store (:mod:`cropbench.measure.store_emulation`: nginx in its
own network namespace, the model's first-byte latency with its tail, per-connection rate, request
rate and link). Each round is one epoch of a seeded random order (the sampler's next epoch; its first
``batches`` batches when given) read through every reader in turn (the first reader rotating from
round to round), each through cropbench's DataLoader (:func:`~cropbench.data.loader.build_loader`,
which hands a reader that reads ahead the batches each process reads next) with its chunk cache
emptied first, so every round starts cold alike. A rate is steady crops/s: from the arrival of the
round's first batch per worker (worker start-up, and the batch no read-ahead precedes, left out, as
Track 2's steady rate) to the last; beside it the round's crops over its whole wall time
(``round_samples_per_s``), where what a reader fetched ahead before the steady clock started is not
free: on a round of few batches a deep read-ahead flatters the steady rate, never this one.

Several coalescing gaps and requests in flight may be given: every reader is then measured at each
(its own mirror of the plate, one server), interleaved in each round, the setting in its name.

One record per reader, worker count and round (``repeat``), written as soon as the round has measured
every reader at that worker count: crops/s and its ratio to the local plate's in the same round,
requests and bytes per crop and requests/s from the server's log, the server's CPU and busy shares
(``server-bound`` where the server, not the model, was the limit), the client's CPU share (this
process and its workers, in cores), and the model's requests/s at the readers' requests in flight
(:meth:`StoreModel.predicted_requests_per_s`). :func:`summary` gives the medians over the rounds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cropbench import metrics as m
from cropbench.config import MAX_IN_FLIGHT, MAX_ROUNDS, CropConfig, PrefetchConfig, StoreConfig, check_workers
from cropbench.data.dataset import CropDataset
from cropbench.data.loader import LoaderSpec, ScheduledSampler, build_loader
from cropbench.data.sampling import RandomObjectSampler
from cropbench.errors import ConfigError
from cropbench.formats import DirectChunkReader, open_plate
from cropbench.harness.validity import (
    CACHE_HOLDS_PLATE_FLAG,
    cache_fraction_of_plate,
    cache_holds_plate,
    reader_cache_bytes,
)
from cropbench.measure.endpoints import remote_plate
from cropbench.measure.environment import collect
from cropbench.measure.store_emulation import SERVER_BOUND_FLAG, ServerWindow, StoreModel, emulated_plate
from cropbench.records import Record
from cropbench.scratch import scratch_folder

TRACK = "prefetch"
MIB = 2**20
#: The readers over the store by default: read-ahead off, then depths and bytes in flight.
DEFAULT_READERS = (
    "store",
    "store+ahead1/16MiB",
    "store+ahead2/16MiB",
    "store+ahead1/64MiB",
    "store+ahead2/64MiB",
    "store+ahead4/64MiB",
)
#: A reader over the store: ``store`` (read-ahead off) or ``store+ahead<batches>/<MiB>MiB``, with
#: ``/<n>threads`` for prefetch threads other than the default (each fetches one batch at a time).
READER_SPEC = re.compile(
    r"store(?:\+ahead(?P<batches>[1-9][0-9]*)/(?P<mib>[1-9][0-9]*)MiB(?:/(?P<threads>[1-9][0-9]*)threads)?)?"
)
LOCAL = "local"


def store_reader(spec: str) -> PrefetchConfig:
    """The read-ahead of a reader named as :data:`READER_SPEC` says; ValueError naming ``spec`` otherwise."""
    match = READER_SPEC.fullmatch(spec)
    if match is None:
        raise ValueError(
            f"{spec!r} is not a reader: 'store' or 'store+ahead<batches>/<MiB>MiB[/<n>threads]' "
            "(e.g. store+ahead2/64MiB)"
        )
    if match["batches"] is None:
        return PrefetchConfig(batches=0)
    options: dict[str, int] = {"batches": int(match["batches"]), "bytes_in_flight": int(match["mib"]) * MIB}
    if match["threads"] is not None:
        options["threads"] = int(match["threads"])
    try:
        return PrefetchConfig(**options)
    except ValueError as error:
        raise ValueError(f"{spec!r}: {error}") from None


def _distinct(name: str, values: Sequence[int], low: int, high: int | None = None) -> None:
    inside = all(low <= value and (high is None or value <= high) for value in values)
    if not values or not inside or len(set(values)) < len(values):
        bound = f">= {low}" + (f" and <= {high}" if high is not None else "")
        raise ConfigError(f"{name}: distinct values {bound}, got {list(values)}")


@dataclasses.dataclass(frozen=True)
class PrefetchBench:
    """What is measured: each reader (by name, :func:`store_reader`) at each coalescing gap and requests
    in flight, beside the local plate, at each worker count, for ``rounds`` rounds of ``batches`` batches
    (None: a whole epoch), against a store at ``latency_ms`` median first-byte latency."""

    readers: tuple[str, ...] = DEFAULT_READERS
    in_flight: tuple[int, ...] = (StoreConfig().in_flight,)
    coalesce_gap_kib: tuple[int, ...] = (StoreConfig().coalesce_gap_bytes // 1024,)
    latency_ms: float = 20.0
    batch_size: int = 64
    workers: tuple[int, ...] = (0, 2)
    batches: int | None = None
    rounds: int = 3
    chunk_cache_mib: int = 128

    def __post_init__(self) -> None:
        for name in self.readers:
            try:
                store_reader(name)
            except ValueError as error:
                raise ConfigError(f"readers: {error}") from None
        if not self.readers or len(set(self.readers)) < len(self.readers):
            raise ConfigError(f"readers: distinct names, got {list(self.readers)}")
        _distinct("in_flight", self.in_flight, 1, MAX_IN_FLIGHT)
        _distinct("coalesce_gap_kib", self.coalesce_gap_kib, 0)
        _distinct("workers", self.workers, 0)
        for workers in self.workers:
            check_workers(workers)
        for name, value in (
            ("batch_size", self.batch_size),
            ("rounds", self.rounds),
            ("chunk_cache_mib", self.chunk_cache_mib),
        ):
            if value < 1:
                raise ConfigError(f"{name} must be at least 1, got {value}")
        if self.rounds > MAX_ROUNDS:
            raise ConfigError(f"rounds must be at most {MAX_ROUNDS}, got {self.rounds}")
        if self.batches is not None and self.batches <= max(*self.workers, 1):
            raise ConfigError(
                f"batches must be more than the most workers ({max(*self.workers, 1)}): the first batch of each "
                f"worker is left out of the steady rate, got {self.batches}"
            )
        self.model()  # the latency is checked as the store takes it

    def model(self) -> StoreModel:
        return StoreModel.at_median(self.latency_ms)

    def crop(self) -> CropConfig:
        return CropConfig(dtype="uint16", chunk_cache_bytes=self.chunk_cache_mib * MIB)

    def named(self) -> dict[str, tuple[PrefetchConfig, StoreConfig]]:
        """Each reader over the store by its name, with its read-ahead and store settings: the coalescing gap
        and requests in flight are in the name only where several are measured."""
        gaps, flights = self.coalesce_gap_kib, self.in_flight
        return {
            name + (f" gap{gap}KiB" if len(gaps) > 1 else "") + (f" {count}inflight" if len(flights) > 1 else ""): (
                store_reader(name),
                StoreConfig(in_flight=count, coalesce_gap_bytes=gap * 1024, layout_gap=False),
            )
            for gap in gaps
            for count in flights
            for name in self.readers
        }


def check_plate(plate: Path, bench: PrefetchBench) -> int:
    """Before a store starts: the plate opens, each reader's chunk cache holds what it reads ahead
    (the mirror over the store has the plate's chunks), and a round has more batches than the steady
    rate leaves out. Returns the crops per round; ConfigError or StoreError naming what does not fit."""
    crop = bench.crop()
    local = CropDataset(plate, crop)
    try:
        crops = len(local) if bench.batches is None else bench.batches * bench.batch_size
        batches = -(-crops // bench.batch_size)
        if batches <= max(*bench.workers, 1):
            raise ConfigError(
                f"--plate {plate}: a round of {batches} batches of {bench.batch_size} leaves nothing to time after "
                f"the first batch of each of {max(*bench.workers, 1)} workers; lower --batch-size or --workers"
            )
    finally:
        local.reader.close()
    for name, (ahead, _) in bench.named().items():
        reader = open_plate(plate, chunk_cache_bytes=crop.chunk_cache_bytes, prefetch=ahead)
        try:
            CropDataset(plate, crop, reader=reader).read_ahead_batches(bench.batch_size)
        except ConfigError as error:
            raise ConfigError(
                f"--chunk-cache-mib {bench.chunk_cache_mib} is too small for reader {name}: {error}"
            ) from None
        finally:
            reader.close()
    return crops


@dataclasses.dataclass
class Measured:
    """One reader at one worker count: each round's rates and what it cost (one entry per round)."""

    rates: list[float] = dataclasses.field(default_factory=list)
    #: Each round's crops over its whole wall time, from the loader's creation to the last batch.
    round_rates: list[float] = dataclasses.field(default_factory=list)
    delivered: list[int] = dataclasses.field(default_factory=list)
    client_cpu_s: list[float] = dataclasses.field(default_factory=list)
    wall_s: list[float] = dataclasses.field(default_factory=list)
    windows: list[ServerWindow] = dataclasses.field(default_factory=list)

    def latest(self) -> Measured:
        """The last round alone."""
        return Measured(
            self.rates[-1:],
            self.round_rates[-1:],
            self.delivered[-1:],
            self.client_cpu_s[-1:],
            self.wall_s[-1:],
            self.windows[-1:],
        )


def cpu_seconds() -> float:
    """CPU seconds of this process and of its children that have ended (the loader's workers)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def steady_rate(dataset: CropDataset, order: np.ndarray, spec: LoaderSpec) -> tuple[float, float, int]:
    """Steady crops/s of one pass over ``order`` through cropbench's loader, its crops/s over the whole
    pass (start-up and the first batches included: what reading ahead fetched before the steady clock
    started counts here), and the crops delivered."""
    created = time.perf_counter()
    loader = build_loader(dataset, spec, ScheduledSampler([order]))
    warmup = max(1, spec.num_workers)
    iterator = iter(loader)
    delivered = counted = 0
    started = ended = 0.0
    for position in range(len(loader)):
        size = int(next(iterator)["image"].shape[0])
        ended = time.perf_counter()
        delivered += size
        if position == warmup - 1:
            started = ended
        elif position >= warmup:
            counted += size
    del iterator
    return counted / (ended - started), delivered / (ended - created), delivered


def measure(
    dataset: CropDataset, order: np.ndarray, spec: LoaderSpec, window: Any, into: Measured
) -> tuple[float, int]:
    """Empty the reader's chunk cache, then :func:`steady_rate` inside ``window`` (the server's, or none)."""
    reader = dataset.reader
    if isinstance(reader, DirectChunkReader):
        if reader.prefetcher is not None:
            reader.prefetcher.wait()
        reader.cache.clear()
    cpu, wall = cpu_seconds(), time.perf_counter()
    with window as stretch:
        rate, whole, delivered = steady_rate(dataset, order, spec)
    into.client_cpu_s.append(cpu_seconds() - cpu)
    into.wall_s.append(time.perf_counter() - wall)
    into.delivered.append(delivered)
    into.rates.append(rate)
    into.round_rates.append(whole)
    if stretch is not None:
        into.windows.append(stretch)
    return rate, delivered


def merged(windows: Sequence[ServerWindow]) -> ServerWindow:
    """The stretches of one reader as one: walls, CPU and waits summed, requests together."""
    return ServerWindow(
        windows[0].store,
        sum(w.wall_s for w in windows),
        sum(w.server_cpu_s for w in windows),
        sum(w.server_runqueue_s for w in windows),
        [trace for w in windows for trace in w.requests],
        sum(w.machine_busy_s for w in windows),
        sum(w.machine_total_s for w in windows),
    )


def row(
    name: str,
    workers: int,
    measured: Measured,
    local: Measured,
    reads: tuple[PrefetchConfig, StoreConfig] | None,
    context: dict[str, Any],
    cache: tuple[int | None, float | None] = (None, None),
    repeat: int = 0,
) -> Record:
    """The record of ``measured`` (one round, or the medians of several) beside ``local`` (the same rounds)."""
    rates = np.array(measured.rates)
    ratios = rates / np.array(local.rates)
    whole = np.array(measured.round_rates)
    whole_ratios = whole / np.array(local.round_rates)
    metrics: dict[str, Any] = {
        m.SAMPLES_PER_S: float(np.median(rates)),
        "samples_per_s_rounds": [round(float(r), 1) for r in rates],
        "round_samples_per_s": float(np.median(whole)),
        "round_ratio_to_local": float(np.median(whole_ratios)),
        "round_ratio_to_local_rounds": [round(float(r), 3) for r in whole_ratios],
        m.RATIO_TO_LOCAL: float(np.median(ratios)),
        "ratio_to_local_rounds": [round(float(r), 3) for r in ratios],
        "client_core_share": sum(measured.client_cpu_s) / sum(measured.wall_s),
    }
    flags: list[str] = []
    cache_bytes, fraction = cache
    if cache_bytes is not None:
        metrics[m.READER_CACHE_BYTES] = cache_bytes
        metrics[m.CACHE_FRACTION_OF_PLATE] = fraction
        if cache_holds_plate(fraction):
            flags.append(CACHE_HOLDS_PLATE_FLAG)
    if measured.windows:
        window = merged(measured.windows)
        metrics.update(window.metrics(sum(measured.delivered)))
        metrics[m.SERVER_REQUESTS_PER_S] = len(window.requests) / window.wall_s
        mean_bytes = window.body_bytes / max(len(window.requests), 1)
        in_flight = reads[1].in_flight * max(workers, 1) if reads is not None else 1
        metrics["model_requests_per_s_at_in_flight"] = window.store.model.predicted_requests_per_s(
            in_flight, int(mean_bytes)
        )
        if window.server_bound:
            flags.append(SERVER_BOUND_FLAG)
    metrics[m.VALIDITY_FLAGS] = flags
    config = {
        "reader": name,
        "workers": workers,
        "where": LOCAL if reads is None else "emulated-store",
        "prefetch": None if reads is None else dataclasses.asdict(reads[0]),
        "coalesce_gap_bytes": None if reads is None else reads[1].coalesce_gap_bytes,
        "in_flight": None if reads is None else reads[1].in_flight,
        **{key: value for key, value in context.items() if key != "environment"},
    }
    return Record(TRACK, f"{name}, {workers} workers", config, metrics, context["environment"], repeat=repeat)


def measure_rounds(
    bench: PrefetchBench,
    readers: dict[str, CropDataset],
    window: Callable[[str], Any],
    context: dict[str, Any],
    emit: Callable[[Record], None],
    reads: dict[str, tuple[PrefetchConfig, StoreConfig]],
) -> dict[tuple[int, str], Measured]:
    """Every round over ``readers`` (:data:`LOCAL` among them), each in ``window(name)``; once a round has
    measured every reader at a worker count, their records go to ``emit`` (an interrupt keeps them)."""
    crop = bench.crop()
    sampler = RandomObjectSampler(len(readers[LOCAL]), seed=0)
    per_round = len(sampler) if bench.batches is None else bench.batches * bench.batch_size
    results = {(workers, name): Measured() for workers in bench.workers for name in readers}
    names = list(readers)
    for index in range(bench.rounds):
        sampler.set_epoch(index)
        batches = sampler.order()[:per_round]
        turn = names[index % len(names) :] + names[: index % len(names)]
        for workers in bench.workers:
            spec = LoaderSpec(num_workers=workers, batch_size=bench.batch_size)
            for name in turn:
                measure(readers[name], batches, spec, window(name), results[(workers, name)])
            local = results[(workers, LOCAL)].latest()
            for name in names:
                # The cache each reader holds (reading ahead grows it): a row whose cache held the plate says so.
                held = (
                    reader_cache_bytes(crop, readers[name].reader),
                    cache_fraction_of_plate(crop, readers[name].reader),
                )
                latest = results[(workers, name)].latest()
                emit(row(name, workers, latest, local, reads.get(name), context, held, repeat=index))
    return results


def run_prefetch(plate: Path, bench: PrefetchBench, emit: Callable[[Record], None]) -> list[Record]:
    """Serve ``plate`` from the emulated store, measure every round (records to ``emit`` as they are
    measured), and return each reader's record over all rounds (:func:`row` of the medians)."""
    crop = bench.crop()
    named = bench.named()
    context: dict[str, Any] = {
        "plate": plate.name,
        "crop_size": crop.crop_size,
        "batch_size": bench.batch_size,
        "batches_per_round": bench.batches,  # None: a whole epoch
        m.ROUNDS: bench.rounds,
        "chunk_cache_bytes": crop.chunk_cache_bytes,
        # The coalescing gap and requests in flight are the rows' own (several may be measured side by side).
        "store": dataclasses.asdict(StoreConfig()) | {"coalesce_gap_bytes": None, "in_flight": None},
        m.STORE_MODEL: dataclasses.asdict(bench.model()),
        "load_average_at_start": os.getloadavg(),
        "environment": collect(plate),
    }
    with contextlib.ExitStack() as stack:
        server, url = stack.enter_context(emulated_plate(plate, bench.model()))
        scratch = stack.enter_context(scratch_folder("prefetch"))
        mirrors = {
            store: stack.enter_context(
                remote_plate(url, store, scratch / f"mirror-gap{store.coalesce_gap_bytes}-{store.in_flight}")
            )
            for store in {store for _, store in named.values()}
        }
        readers = {LOCAL: CropDataset(plate, crop)}
        for dataset in readers.values():
            stack.callback(dataset.reader.close)
        for name, (ahead, store) in named.items():
            reader = open_plate(mirrors[store], chunk_cache_bytes=crop.chunk_cache_bytes, prefetch=ahead)
            stack.callback(reader.close)
            readers[name] = CropDataset(mirrors[store], crop, reader=reader)

        def window(name: str) -> Any:
            return server.window() if name != LOCAL else contextlib.nullcontext()

        results = measure_rounds(bench, readers, window, context, emit, named)
        held = {
            name: (reader_cache_bytes(crop, dataset.reader), cache_fraction_of_plate(crop, dataset.reader))
            for name, dataset in readers.items()
        }
    return [
        row(name, workers, results[(workers, name)], results[(workers, LOCAL)], named.get(name), context, held[name])
        for workers in bench.workers
        for name in readers
    ]


def summary(bench: PrefetchBench, records: Sequence[Record]) -> str:
    """The settings in a line, then one line per reader and worker count (medians over the rounds)."""
    model = bench.model()
    lines = [
        f"{bench.rounds} rounds of {'a whole epoch' if bench.batches is None else f'{bench.batches} batches'} of "
        f"random {bench.crop().crop_size} px crops in batches of {bench.batch_size}, "
        f"store at {bench.latency_ms:g} ms median ({model.p99_latency_ms:g} ms p99), "
        f"{'/'.join(map(str, bench.in_flight))} requests in flight per process, "
        f"{'/'.join(map(str, bench.coalesce_gap_kib))} KiB coalescing gap, chunk cache {bench.chunk_cache_mib} MiB"
    ]
    width = max([30, *(len(record.config["reader"]) for record in records)])
    lines.append(
        f"{'workers':>7} {'reader':<{width}} {'crops/s':>8} {'x local':>8} {'round/s':>8} {'x local':>8} "
        f"{'req/crop':>8} {'KiB/crop':>8} {'req/s':>7} {'server':>6} {'machine':>8} {'client':>6}  flags"
    )
    for record in records:
        config, metrics = record.config, record.metrics
        store_columns = (
            f"{metrics[m.REQUESTS_PER_CROP]:8.3f} {metrics[m.BYTES_TRANSFERRED_PER_CROP] / 1024:8.1f} "
            f"{metrics[m.SERVER_REQUESTS_PER_S]:7.0f} {metrics[m.SERVER_BUSY_SHARE]:6.0%} "
            f"{metrics[m.MACHINE_BUSY_SHARE]:8.0%}"
            if m.REQUESTS_PER_CROP in metrics
            else f"{'-':>8} {'-':>8} {'-':>7} {'-':>6} {'-':>8}"
        )
        lines.append(
            f"{config['workers']:>7} {config['reader']:<{width}} {metrics[m.SAMPLES_PER_S]:8.0f} "
            f"{metrics[m.RATIO_TO_LOCAL]:8.3f} {metrics['round_samples_per_s']:8.0f} "
            f"{metrics['round_ratio_to_local']:8.3f} {store_columns} {metrics['client_core_share']:6.2f}  "
            f"{','.join(metrics[m.VALIDITY_FLAGS])}"
        )
    return "\n".join(lines)


__all__ = [
    "DEFAULT_READERS",
    "LOCAL",
    "TRACK",
    "Measured",
    "PrefetchBench",
    "check_plate",
    "measure_rounds",
    "row",
    "run_prefetch",
    "store_reader",
    "summary",
]
