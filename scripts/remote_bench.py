"""Remote plates measured end to end: start a loopback store, put a plate in it, run the runner's
tracks on its URL, stop everything.

The store is the emulated object store (:mod:`cropbench.measure.store_emulation`: nginx with the
model's first-byte latency at ``--latency-ms`` median, its tail, per-connection rate and link; the
server's busy share per store setting, ``server-bound`` where it was the limit) where it runs here,
else (or with ``--server s3`` / ``http``) moto's S3 server or plain nginx behind the Python delay proxy.

For each store setting (the direct path's in-flight limit, zarr-python's client), track ``remote``
of ``cropbench run``: requests and bytes per random crop per read path (counted by the reader), and
random crops/s through Track 2's loader at ``--latency-ms`` per worker count, beside the same plate
read locally in the same run (``ratio_to_local``) and the server's own ceiling. With ``--layouts``,
instead: track ``store-layouts`` (``cropbench compare-layouts --plate URL``), each named layout in
the store next to on disk. Rows are records in OUT/results.jsonl; a table goes to stdout.

    python scripts/remote_bench.py --plate data/full-default.zarr --latency-ms 20
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

from cropbench import api
from cropbench import metrics as m
from cropbench.config import StoreConfig
from cropbench.formats.sources import upload_plate
from cropbench.measure import endpoints
from cropbench.measure.store_emulation import SERVER_BOUND_FLAG, EmulatedStore, StoreModel, emulated_plate, unavailable
from cropbench.records import Record
from cropbench.report.tables import layouts_table
from cropbench.tracks.remote import Remote
from cropbench.tracks.store_layouts import StoreLayouts

BUCKET = "bench"


@contextlib.contextmanager
def served(server: str, plate: Path, latency_ms: float) -> Iterator[tuple[str, EmulatedStore | None]]:
    """The plate in a loopback store; yields its URL and the emulated store (None for the others)."""
    if server == "emulated":
        with emulated_plate(plate, StoreModel.at_median(latency_ms)) as (store, url):
            yield url, store
        return
    if server == "s3":
        with endpoints.loopback_s3(BUCKET):
            url = f"s3://{BUCKET}/{plate.name}"
            upload_plate(plate, url)
            yield url, None
        return
    with endpoints.http_plate(plate) as url:
        yield url, None


def table(records: list[Record], busy: dict[int, tuple[float, bool]]) -> str:
    """The rows, with the server's busy share over each store setting's stretch (``busy``, by record)."""
    lines = ["requests per random crop (decoded-chunk cache off) and random crops/s at the injected latency"]
    for index, record in enumerate(records):
        row, store = record.metrics, record.config["store"]
        share, bound = busy.get(index, (None, False))
        server = "" if share is None else f" server {share:4.0%}" + (f" {SERVER_BOUND_FLAG}" if bound else "")
        lines.append(
            f"  {record.case:<16} in-flight {store['in_flight']:<3} {store['zarr_client']:<8} "
            f"{row[m.REQUESTS_PER_CROP]:6.2f} req/crop {row[m.SAMPLES_PER_S]:9.1f}/s "
            f"({row.get(m.RATIO_TO_LOCAL, float('nan')):.3f} of local){server}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plate", required=True, help="local plate (OME-Zarr, any layout) to serve and measure")
    parser.add_argument(
        "--server",
        choices=("emulated", "s3", "http"),
        default=None,
        help="the emulated store (default where it runs here), or moto's S3 server or nginx behind the delay proxy",
    )
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2, 8])
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--crops", type=int, default=256, help="timed crops per rate (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--crop-size", type=int, default=96)
    parser.add_argument("--out", default="out/remote")
    parser.add_argument(
        "--layouts", nargs="+", metavar="NAME", help="instead: each named layout in the store next to on disk"
    )
    args = parser.parse_args(argv)
    plate = Path(args.plate)
    reason = unavailable()
    if args.server == "emulated" and reason is not None:
        parser.error(f"--server emulated: {reason}")
    server = args.server or ("emulated" if reason is None else "s3")
    if args.server is None and reason is not None:
        print(f"remote_bench: moto behind the delay proxy, not the emulated store: {reason}", file=sys.stderr)
    # the emulated store injects the latency itself; the others get it from the delay proxy
    proxy_ms = 0.0 if server == "emulated" else args.latency_ms
    with served(server, plate, args.latency_ms) as (url, emulated):
        if args.layouts:
            settings = StoreLayouts(
                latency_ms=args.latency_ms,
                in_flight=max(args.in_flight),
                crops=args.crops,
                batch_size=args.batch_size,
                crop_size=args.crop_size,
            )
            print(layouts_table(api.compare_layouts_in_store(url, args.layouts, settings, args.out)))
            return 0
        track = Remote(args.workers, args.batch_size, args.crop_size)
        records: list[Record] = []
        busy: dict[int, tuple[float, bool]] = {}
        stores = [StoreConfig(in_flight=n, latency_ms=proxy_ms) for n in args.in_flight]
        stores.append(StoreConfig(in_flight=max(args.in_flight), latency_ms=proxy_ms, zarr_client="obstore"))
        for store in stores:
            window = emulated.window() if emulated is not None else contextlib.nullcontext()
            with window as stretch:
                measured = api.run(url, [track], out_dir=args.out, samples=args.crops, store=store, local_plate=plate)
            if stretch is not None:  # the stretch holds local reads too: the share is a lower bound
                busy.update(
                    {len(records) + i: (stretch.server_busy_share, stretch.server_bound) for i in range(len(measured))}
                )
            records += measured
    print(table(records, busy))
    return 0


if __name__ == "__main__":
    sys.exit(main())
