"""Remote plates measured end to end: start a loopback S3 server (moto) and a delay proxy, upload a
plate, measure, stop everything.

1. Requests per random crop (no injected latency, one process): the direct path with coalescing and
   a cached shard index, the direct path without coalescing, and zarr-python on its ObjectStore and
   FsspecStore, counted by each reader (every GET).
2. Random crops/s at ``--latency-ms`` through the proxy, per read path x DataLoader workers x
   in-flight limit (direct), each beside the same plate read locally in the same run
   (``ratio_to_local``), with batch p50/p95/p99 and the server's own ceiling (requests/s of a
   trivial client, direct and through the proxy).

3. With ``--layouts``, instead: each named layout (converted once) in the store next to on disk,
   requests per crop and crops/s per read path, so a user sees which layout to publish.

Rows go to ``--out`` (JSON lines, metric names from ``cropbench.metrics``) and a table to stdout.

    python scripts/remote_bench.py --plate data/full-default.zarr --latency-ms 20
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from cropbench import metrics as m
from cropbench.config import StoreConfig
from cropbench.formats.sources import mirror_metadata, upload_plate
from cropbench.measure import endpoints
from cropbench.measure.remote import StoreLayouts, crops_per_s, layout_over_store, layouts_table, requests_per_crop
from cropbench.plates.convert import materialize_layout

BUCKET = "bench"


@contextlib.contextmanager
def _serve(server: str, plate: Path) -> Iterator[tuple[str, str, str]]:
    """The plate in a loopback store: (endpoint, plate URL, path of a small object for the ceiling)."""
    if server == "s3":
        with endpoints.loopback_s3(BUCKET) as endpoint:
            url = f"s3://{BUCKET}/{plate.name}"
            began = time.perf_counter()
            uploaded = upload_plate(plate, url)
            print(f"uploaded {uploaded / 2**20:.1f} MiB in {time.perf_counter() - began:.1f} s", flush=True)
            yield endpoint, url, f"/{BUCKET}/{plate.name}/zarr.json"
        return
    with endpoints.http_plate(plate) as url:
        endpoint = url.removesuffix(f"/{plate.name}")
        yield endpoint, url, f"/{plate.name}/zarr.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plate", required=True, help="local plate (OME-Zarr, any layout) to upload and measure")
    parser.add_argument("--server", choices=("s3", "http"), default="s3", help="moto's S3 server or nginx")
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2, 8])
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--crops", type=int, default=256, help="timed crops per rate (default: %(default)s)")
    parser.add_argument("--zarr-crops", type=int, default=96, help="timed crops per zarr-python rate")
    parser.add_argument("--count-crops", type=int, default=200, help="crops for the request counts")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--crop-size", type=int, default=96)
    parser.add_argument("--out", default="out/remote/remote_bench.jsonl")
    parser.add_argument("--cache", default="out/remote/mirrors")
    parser.add_argument(
        "--layouts", nargs="+", metavar="NAME", help="instead: each named layout in the store next to on disk"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    plate, out, cache = Path(args.plate), Path(args.out), Path(args.cache)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []

    def emit(row: dict[str, Any]) -> None:
        rows.append(row)
        with out.open("a") as handle:
            handle.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)

    if args.layouts:
        settings = StoreLayouts(
            latency_ms=args.latency_ms,
            in_flight=max(args.in_flight),
            count_crops=args.count_crops,
            crops=args.crops,
            zarr_crops=args.zarr_crops,
            batch_size=args.batch_size,
            crop_size=args.crop_size,
        )
        serve = functools.partial(_served_url, args.server)
        for name in args.layouts:
            layout = materialize_layout(plate, name, cache / "layouts")
            emit({"kind": "layout", **layout_over_store(layout, name, serve, settings, cache)})
        print("\n" + layouts_table(rows))
        return 0
    with _serve(args.server, plate) as (endpoint, url, probe):
        server = {m.SERVER_REQUESTS_PER_S: endpoints.request_ceiling(endpoint + probe, seconds=2.0, threads=8)}
        with endpoints.delay_proxy(endpoint, args.latency_ms) as proxy:
            server["proxied_requests_per_s"] = endpoints.request_ceiling(proxy + probe, seconds=2.0, threads=8)
        emit({"kind": "server", "server": args.server, "url": url, "latency_ms": args.latency_ms, **server})

        # 1. Requests per crop, no injected latency.
        for label, decode, store, cache_bytes in (
            ("direct", "direct", StoreConfig(), None),
            ("direct-no-chunk-cache", "direct", StoreConfig(), 0),
            ("direct-no-coalescing", "direct", StoreConfig(coalesce_gap_bytes=0), 0),
            ("zarr-obstore", "zarr", StoreConfig(zarr_client="obstore"), None),
            ("zarr-fsspec", "zarr", StoreConfig(zarr_client="fsspec"), None),
        ):
            mirror = mirror_metadata(url, store, cache)
            counts = requests_per_crop(mirror, decode, args.count_crops, args.crop_size, cache_bytes)
            emit({"kind": "requests", "path": label, "store": dataclasses.asdict(store), **counts})

        # 2. Rates at the injected latency, beside the local plate.
        local_rates: dict[tuple[str, int], float] = {}
        with endpoints.delay_proxy(endpoint, args.latency_ms) as proxy:
            cases: list[tuple[str, str, StoreConfig, int]] = []
            for workers in args.workers:
                for client in ("obstore", "fsspec"):
                    store = StoreConfig(zarr_client=client, latency_ms=args.latency_ms, endpoint=proxy)
                    cases.append((f"zarr-{client}", "zarr", store, workers))
                for in_flight in args.in_flight:
                    store = StoreConfig(in_flight=in_flight, latency_ms=args.latency_ms, endpoint=proxy)
                    cases.append(("direct", "direct", store, workers))
            for label, decode, store, workers in cases:
                crops = args.zarr_crops if decode == "zarr" else args.crops
                key = (decode, workers)
                if key not in local_rates:
                    local = crops_per_s(plate, decode, workers, crops, args.batch_size, args.crop_size)
                    local_rates[key] = local[m.SAMPLES_PER_S]
                    emit({"kind": "rate", "path": f"{decode}-local", "workers": workers, **local})
                mirror = mirror_metadata(url, store, cache)
                rate = crops_per_s(mirror, decode, workers, crops, args.batch_size, args.crop_size)
                emit(
                    {
                        "kind": "rate",
                        "path": label,
                        "workers": workers,
                        m.IN_FLIGHT: store.in_flight if decode == "direct" else None,
                        m.INJECTED_LATENCY_MS: store.latency_ms,
                        **rate,
                        m.RATIO_TO_LOCAL: rate[m.SAMPLES_PER_S] / local_rates[key],
                        **server,
                    }
                )
    _print_table(rows)
    return 0


@contextlib.contextmanager
def _served_url(server: str, plate: Path) -> Iterator[str]:
    with _serve(server, plate) as (_, url, _):
        yield url


def _print_table(rows: list[dict[str, Any]]) -> None:
    print("\nrequests per random crop (no injected latency)")
    for row in rows:
        if row["kind"] == "requests":
            print(
                f"  {row['path']:<22} {row[m.REQUESTS_PER_CROP]:6.2f} req/crop  "
                f"{row[m.BYTES_TRANSFERRED_PER_CROP] / 1024:8.1f} KiB/crop  "
                f"{row[m.BYTES_TRANSFERRED_PER_DELIVERED_BYTE]:5.2f} B/B delivered"
            )
    print("\nrandom crops/s")
    for row in rows:
        if row["kind"] == "rate":
            extra = f"  in-flight {row[m.IN_FLIGHT]}" if row.get(m.IN_FLIGHT) else ""
            ratio = f"  {row[m.RATIO_TO_LOCAL]:.3f} of local" if m.RATIO_TO_LOCAL in row else ""
            print(f"  {row['path']:<14} workers {row['workers']}{extra:<14} {row[m.SAMPLES_PER_S]:9.1f}/s{ratio}")


if __name__ == "__main__":
    sys.exit(main())
