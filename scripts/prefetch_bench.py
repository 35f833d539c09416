"""The direct reader over an HTTP-served plate with injected latency, with and without prefetch, beside
the same plate on local disk: random crops/s, interleaved in one process.

nginx serves a copy of the plate behind cropbench's loopback delay proxy (``StoreConfig.latency_ms``);
each round reads the same next batches of one seeded random order through each reader (each with its
own cold chunk cache), so the three rates are measured alike. The prefetching reader's dataset is
told each round's order (:meth:`~cropbench.data.dataset.CropDataset.expect_batches`) as the round
starts, so it fetches nothing ahead while the others are timed and its first batch of a round is not
prefetched. With ``--workers``, each round's batches go through a DataLoader (fork), each worker
prefetching its own share; without, the batches are read in turn in this process.

    python scripts/prefetch_bench.py --plate data/full-default.zarr --latency-ms 20
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from torch.utils.data import BatchSampler, DataLoader

from cropbench.config import CropConfig, PrefetchConfig, StoreConfig
from cropbench.data.dataset import CropDataset
from cropbench.data.loader import batch_collate
from cropbench.data.sampling import RandomObjectSampler
from cropbench.formats import open_plate
from cropbench.measure import endpoints


def rate(dataset: CropDataset, batches: list[list[int]], workers: int) -> float:
    """Crops/s reading ``batches`` in turn; with workers, through a DataLoader, the workers' start
    included (work done before the first batch arrives is work all the same)."""
    start = time.perf_counter()
    if workers:
        loader = DataLoader(dataset, batch_sampler=batches, num_workers=workers, collate_fn=batch_collate)
        for _ in loader:
            pass
    else:
        for batch in batches:
            dataset.__getitems__(batch)
    return sum(map(len, batches)) / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plate", required=True, help="local OME-Zarr plate to serve and measure")
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--coalesce-gap-kib", type=int, default=1024, help="the store's coalescing gap")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers (0: batches read in this process)")
    parser.add_argument("--batches", type=int, default=8, help="batches per reader per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ahead", type=int, default=2, help="batches the prefetching reader reads ahead")
    parser.add_argument(
        "--chunk-cache-mib", type=int, default=128, help="each reader's chunk cache: (ahead + 1) batches' chunks"
    )
    args = parser.parse_args(argv)
    plate = Path(args.plate)
    cache = args.chunk_cache_mib * 2**20
    config = CropConfig(dtype="uint16", chunk_cache_bytes=cache)
    store = StoreConfig(
        in_flight=args.in_flight, latency_ms=args.latency_ms, coalesce_gap_bytes=args.coalesce_gap_kib * 1024
    )
    off, on = PrefetchConfig(batches=0), PrefetchConfig(batches=args.ahead)
    with endpoints.http_plate(plate) as url, endpoints.remote_plate(url, store) as mirror:
        readers = {
            "local": CropDataset(plate, config),
            "remote": CropDataset(mirror, config, reader=open_plate(mirror, chunk_cache_bytes=cache, prefetch=off)),
            "remote+prefetch": CropDataset(
                mirror, config, reader=open_plate(mirror, chunk_cache_bytes=cache, prefetch=on)
            ),
        }
        probe = readers["remote"].reader.source.object_url("zarr.json")
        ceiling = endpoints.request_ceiling(probe, seconds=1.0, threads=args.in_flight)
        count = len(readers["local"])
        order = list(BatchSampler(RandomObjectSampler(count, seed=0), args.batch_size, drop_last=True))
        rounds = min(args.rounds, len(order) // args.batches)
        rates: dict[str, list[float]] = {name: [] for name in readers}
        for index in range(rounds):
            batches = order[index * args.batches : (index + 1) * args.batches]
            # Only this round's batches: nothing is fetched ahead while the other readers are timed.
            readers["remote+prefetch"].expect_batches(batches)
            for name, dataset in readers.items():
                rates[name].append(rate(dataset, batches, args.workers))
        print(
            f"{rounds} rounds x {args.batches} batches of {args.batch_size} random crops "
            f"({config.crop_size} px), latency {args.latency_ms:g} ms, in-flight {args.in_flight}, "
            f"coalescing gap {args.coalesce_gap_kib} KiB, {args.workers} workers, "
            f"prefetch {args.ahead} batches, chunk cache {args.chunk_cache_mib} MiB; crops/s median [min-max]"
        )
        local = float(np.median(rates["local"]))
        crops = rounds * args.batches * args.batch_size
        print(f"  the proxied server's ceiling: {ceiling:.0f} requests/s ({args.in_flight} clients, 1-byte ranges)")
        for name, values in rates.items():
            median = float(np.median(values))
            source = readers[name].reader.source
            counted = (  # the workers' sources count their own requests, out of sight here
                f"  {source.requests / crops:.2f} requests/crop  {source.bytes_transferred / crops / 1e3:.0f} "
                f"kB/crop  {median * source.requests / crops:.0f} requests/s"
                if name != "local" and not args.workers
                else ""
            )
            spread = f"[{min(values):.1f}-{max(values):.1f}]"
            print(f"  {name:<16} {median:8.1f} {spread}  {median / local:.3f} of local{counted}")
        for dataset in readers.values():
            dataset.reader.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
