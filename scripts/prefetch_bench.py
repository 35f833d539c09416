"""Read-ahead over the emulated object store: the direct reader's random crops/s with and without
reading ahead, beside the same plate on local disk, interleaved in one process.

The plate is served by the emulated store (:mod:`cropbench.measure.store_emulation`: nginx in its
own network namespace, the model's first-byte latency with its tail, per-connection rate, request
rate and link). Each round is one epoch of a seeded random order (the sampler's next epoch; its first
``--batches`` batches when given) read through every reader in turn (the first reader rotating from
round to round), each through cropbench's
DataLoader (:func:`~cropbench.data.loader.build_loader`, which hands a reader that reads ahead the
batches each process reads next) with its chunk cache emptied first, so every round starts cold
alike. A rate is steady crops/s: from the arrival of the round's first batch per worker (worker
start-up, and the batch no read-ahead precedes, left out, as Track 2's steady rate) to the last;
beside it the round's crops over its whole wall time (``round/s``), where what a reader fetched ahead
before the steady clock started is not free: on a round of few batches a deep read-ahead flatters the
steady rate, never this one.

``--coalesce-gap-kib`` and ``--in-flight`` take several values: every reader is then measured at each
(its own mirror of the plate, one server), interleaved in each round, the setting in its name.

Per reader and worker count, a JSON line: crops/s per round, the median and its ratio to the local
plate's (the median of the rounds' paired ratios), requests and bytes per crop and requests/s from
the server's log, the server's CPU and busy shares (``server-bound`` where the server, not the
model, was the limit), the client's CPU share (this process and its workers, in cores), and the
model's requests/s at the readers' requests in flight (:meth:`StoreModel.predicted_requests_per_s`).
Needs root and nginx's Lua module (what :func:`~cropbench.measure.store_emulation.unavailable` says).

    python scripts/prefetch_bench.py --plate data/full.zarr --batches 40 --out results/store-emulation/prefetch.jsonl
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cropbench import metrics as m
from cropbench.config import CropConfig, PrefetchConfig, StoreConfig
from cropbench.data.dataset import CropDataset
from cropbench.data.loader import LoaderSpec, ScheduledSampler, build_loader
from cropbench.data.sampling import RandomObjectSampler
from cropbench.formats import DirectChunkReader, open_plate
from cropbench.harness.validity import (
    CACHE_HOLDS_PLATE_FLAG,
    cache_fraction_of_plate,
    cache_holds_plate,
    reader_cache_bytes,
)
from cropbench.measure.endpoints import remote_plate
from cropbench.measure.environment import collect
from cropbench.measure.store_emulation import (
    SERVER_BOUND_FLAG,
    ServerWindow,
    StoreModel,
    emulated_plate,
    unavailable,
)

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


@dataclasses.dataclass
class Measured:
    """One reader at one worker count: its rounds' rates and what it cost."""

    rates: list[float] = dataclasses.field(default_factory=list)
    #: Each round's crops over its whole wall time, from the loader's creation to the last batch.
    round_rates: list[float] = dataclasses.field(default_factory=list)
    delivered: int = 0
    client_cpu_s: float = 0.0
    wall_s: float = 0.0
    windows: list[ServerWindow] = dataclasses.field(default_factory=list)


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
    into.client_cpu_s += cpu_seconds() - cpu
    into.wall_s += time.perf_counter() - wall
    into.delivered += delivered
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
) -> dict[str, Any]:
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
        "ratio_to_local": float(np.median(ratios)),
        "ratio_to_local_rounds": [round(float(r), 3) for r in ratios],
        "client_core_share": measured.client_cpu_s / measured.wall_s,
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
        metrics.update(window.metrics(measured.delivered))
        metrics[m.SERVER_REQUESTS_PER_S] = len(window.requests) / window.wall_s
        mean_bytes = window.body_bytes / max(len(window.requests), 1)
        in_flight = reads[1].in_flight * max(workers, 1) if reads is not None else 1
        metrics["model_requests_per_s_at_in_flight"] = window.store.model.predicted_requests_per_s(
            in_flight, int(mean_bytes)
        )
        if window.server_bound:
            flags.append(SERVER_BOUND_FLAG)
    config = {
        "reader": name,
        "workers": workers,
        "where": LOCAL if reads is None else "emulated-store",
        "prefetch": None if reads is None else dataclasses.asdict(reads[0]),
        "coalesce_gap_bytes": None if reads is None else reads[1].coalesce_gap_bytes,
        "in_flight": None if reads is None else reads[1].in_flight,
        **{key: value for key, value in context.items() if key != "environment"},
    }
    return {"config": config, "metrics": metrics, "validity_flags": flags, "environment": context["environment"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plate", required=True, help="local OME-Zarr plate to serve and measure")
    parser.add_argument("--out", required=True, help="JSON lines file the rows are written to (replaced)")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="the store's median first-byte latency")
    parser.add_argument(
        "--in-flight",
        type=int,
        nargs="+",
        default=[StoreConfig().in_flight],
        help="requests each process keeps open: every reader is measured at each (interleaved in each round)",
    )
    parser.add_argument(
        "--coalesce-gap-kib",
        type=int,
        nargs="+",
        default=[StoreConfig().coalesce_gap_bytes // 1024],
        help="the store's coalescing gaps: every reader is measured at each (interleaved in each round)",
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2], help="DataLoader worker counts")
    parser.add_argument(
        "--readers",
        nargs="+",
        default=list(DEFAULT_READERS),
        help="the store's readers: 'store' (no read-ahead) or 'store+ahead<batches>/<MiB>MiB[/<n>threads]'",
    )
    parser.add_argument("--batches", type=int, default=None, help="batches per round (default: a whole epoch)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each a new epoch")
    parser.add_argument(
        "--chunk-cache-mib", type=int, default=128, help="every reader's chunk cache (must hold depth + 1 batches)"
    )
    args = parser.parse_args(argv)
    try:
        specs = {name: store_reader(name) for name in args.readers}
    except ValueError as error:
        parser.error(f"--readers: {error}")
    if min(args.coalesce_gap_kib) < 0 or len(set(args.coalesce_gap_kib)) < len(args.coalesce_gap_kib):
        parser.error(f"--coalesce-gap-kib: distinct sizes >= 0, got {args.coalesce_gap_kib}")
    if min(args.in_flight) < 1 or len(set(args.in_flight)) < len(args.in_flight):
        parser.error(f"--in-flight: distinct counts >= 1, got {args.in_flight}")
    gaps, flights = args.coalesce_gap_kib, args.in_flight
    # A reader is its read-ahead at one coalescing gap and requests in flight; each is in its name only
    # where several are measured.
    named = {
        name + (f" gap{gap}KiB" if len(gaps) > 1 else "") + (f" {count}inflight" if len(flights) > 1 else ""): (
            spec,
            StoreConfig(in_flight=count, coalesce_gap_bytes=gap * 1024),
        )
        for gap in gaps
        for count in flights
        for name, spec in specs.items()
    }
    stores = {store for _, store in named.values()}
    reason = unavailable()
    if reason is not None:
        parser.error(reason)
    plate = Path(args.plate)
    cache = args.chunk_cache_mib * MIB
    crop = CropConfig(dtype="uint16", chunk_cache_bytes=cache)
    model = StoreModel.at_median(args.latency_ms)
    context: dict[str, Any] = {
        "plate": plate.name,
        "crop_size": crop.crop_size,
        "batch_size": args.batch_size,
        "batches_per_round": args.batches,  # None: a whole epoch
        "rounds": args.rounds,
        "chunk_cache_bytes": cache,
        # The coalescing gap and requests in flight are the rows' own (several may be measured side by side).
        "store": dataclasses.asdict(StoreConfig()) | {"coalesce_gap_bytes": None, "in_flight": None},
        "store_model": dataclasses.asdict(model),
        "load_average_at_start": os.getloadavg(),
        "environment": collect(plate),
    }
    with contextlib.ExitStack() as stack:
        server, url = stack.enter_context(emulated_plate(plate, model))
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cropbench-prefetch-")))
        mirrors = {
            store: stack.enter_context(
                remote_plate(url, store, scratch / f"mirror-gap{store.coalesce_gap_bytes}-{store.in_flight}")
            )
            for store in stores
        }
        readers = {LOCAL: CropDataset(plate, crop)}
        for name, (ahead, store) in named.items():
            reader = open_plate(mirrors[store], chunk_cache_bytes=cache, prefetch=ahead)
            readers[name] = CropDataset(mirrors[store], crop, reader=reader)
        sampler = RandomObjectSampler(len(readers[LOCAL]), seed=0)
        per_round = len(sampler) if args.batches is None else args.batches * args.batch_size
        results = {(workers, name): Measured() for workers in args.workers for name in readers}
        names = list(readers)
        for index in range(args.rounds):
            sampler.set_epoch(index)
            batches = sampler.order()[:per_round]
            turn = names[index % len(names) :] + names[: index % len(names)]
            for workers in args.workers:
                spec = LoaderSpec(num_workers=workers, batch_size=args.batch_size)
                for name in turn:
                    window = server.window() if name != LOCAL else contextlib.nullcontext()
                    measure(readers[name], batches, spec, window, results[(workers, name)])
        context["load_average_at_end"] = os.getloadavg()
        # The cache each reader held (reading ahead grows it): a row whose cache held the plate says so.
        held = {
            name: (reader_cache_bytes(crop, dataset.reader), cache_fraction_of_plate(crop, dataset.reader))
            for name, dataset in readers.items()
        }
        rows = [
            row(
                name, workers, results[(workers, name)], results[(workers, LOCAL)], named.get(name), context, held[name]
            )
            for workers in args.workers
            for name in names
        ]
        for dataset in readers.values():
            dataset.reader.close()
    Path(args.out).write_text("".join(json.dumps(line) + "\n" for line in rows))
    print(
        f"{args.rounds} rounds x {per_round} random {crop.crop_size} px crops in batches of {args.batch_size}, "
        f"store at {args.latency_ms:g} ms median ({model.p99_latency_ms:g} ms p99), "
        f"{'/'.join(map(str, flights))} requests in flight per process, "
        f"{'/'.join(map(str, gaps))} KiB coalescing gap, chunk cache {args.chunk_cache_mib} MiB"
    )
    width = max([30, *(len(line["config"]["reader"]) for line in rows)])
    print(
        f"{'workers':>7} {'reader':<{width}} {'crops/s':>8} {'x local':>8} {'round/s':>8} {'x local':>8} "
        f"{'req/crop':>8} {'KiB/crop':>8} {'req/s':>7} {'server':>6} {'machine':>8} {'client':>6}  flags"
    )
    for line in rows:
        config, metrics = line["config"], line["metrics"]
        store_columns = (
            f"{metrics[m.REQUESTS_PER_CROP]:8.3f} {metrics[m.BYTES_TRANSFERRED_PER_CROP] / 1024:8.1f} "
            f"{metrics[m.SERVER_REQUESTS_PER_S]:7.0f} {metrics[m.SERVER_BUSY_SHARE]:6.0%} "
            f"{metrics[m.MACHINE_BUSY_SHARE]:8.0%}"
            if m.REQUESTS_PER_CROP in metrics
            else f"{'-':>8} {'-':>8} {'-':>7} {'-':>6} {'-':>8}"
        )
        print(
            f"{config['workers']:>7} {config['reader']:<{width}} {metrics[m.SAMPLES_PER_S]:8.0f} "
            f"{metrics['ratio_to_local']:8.3f} {metrics['round_samples_per_s']:8.0f} "
            f"{metrics['round_ratio_to_local']:8.3f} {store_columns} {metrics['client_core_share']:6.2f}  "
            f"{','.join(line['validity_flags'])}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
