"""Calibrate the emulated object store: what a trivial client gets from it beside what its model predicts.

For each response size and number of requests in flight, one keep-alive connection per thread asks
for the same byte range again and again for ``--seconds`` (after a short warm-up): requests/s and
MB/s measured, the model's prediction (:meth:`StoreModel.predicted_requests_per_s`), the server's
CPU and busy shares over the stretch (a row whose server was busy half the time or more is flagged
``server-bound``), the client process's CPU share (``client-bound`` at 90 % of a core or more: one
Python process cannot ask faster), and the latency nginx measured per request (p50, p99).

    python scripts/store_calibration.py --out results/store-emulation/calibration.json
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from cropbench.measure.store_emulation import EmulatedStore, StoreModel, emulated_store, unavailable

#: Share of one core the client process may use before its row is ``client-bound``.
CLIENT_BOUND_SHARE = 0.9
OBJECT = "object"


def _hammer(store: EmulatedStore, in_flight: int, size: int, seconds: float) -> int:
    """``in_flight`` threads, each one keep-alive connection asking for ``size`` bytes until the deadline."""
    parts = urlsplit(store.endpoint)
    deadline = time.monotonic() + seconds
    start = threading.Barrier(in_flight)

    def client(_: int) -> int:
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port or 80, timeout=60)
        start.wait()
        done = 0
        while time.monotonic() < deadline:
            connection.request("GET", f"/{OBJECT}", headers={"Range": f"bytes=0-{size - 1}"})
            response = connection.getresponse()
            if len(response.read()) != size or response.status != 206:
                raise RuntimeError(f"the store answered {response.status} with a short body")
            done += 1
        connection.close()
        return done

    with ThreadPoolExecutor(in_flight) as pool:
        return sum(pool.map(client, range(in_flight)))


def calibrate(store: EmulatedStore, in_flight: int, size: int, seconds: float) -> dict[str, Any]:
    """One row: a warm-up (connections opened), then the measured stretch."""
    _hammer(store, in_flight, size, min(0.5, seconds))
    client_before = os.times()
    with store.window() as window:
        _hammer(store, in_flight, size, seconds)
    client_after = os.times()
    client_cpu = (client_after.user - client_before.user) + (client_after.system - client_before.system)
    answered = [trace for trace in window.requests if trace.status == 206]
    latencies = np.array([trace.end_s - trace.start_s for trace in answered]) * 1e3
    rate = len(answered) / window.wall_s
    predicted = store.model.predicted_requests_per_s(in_flight, size)
    client_share = client_cpu / window.wall_s
    flags = [
        name
        for name, bound in (("server-bound", window.server_bound), ("client-bound", client_share >= CLIENT_BOUND_SHARE))
        if bound
    ]
    return {
        "in_flight": in_flight,
        "response_bytes": size,
        "seconds": window.wall_s,
        "requests": len(answered),
        "requests_per_s": rate,
        "mb_per_s": rate * size / 1e6,
        "predicted_requests_per_s": predicted,
        "ratio_to_prediction": rate / predicted,
        "server_core_share": window.server_core_share,
        "server_busy_share": window.server_busy_share,
        "client_core_share": client_share,
        "server_latency_p50_ms": float(np.percentile(latencies, 50)) if len(latencies) else None,
        "server_latency_p99_ms": float(np.percentile(latencies, 99)) if len(latencies) >= 100 else None,
        "flags": flags,
    }


def table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a Markdown table."""
    lines = [
        "| in flight | response | req/s | MB/s | predicted req/s | x predicted | server CPU | server busy | "
        "client CPU | p50 ms | p99 ms | flags |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        p99 = row["server_latency_p99_ms"]
        lines.append(
            f"| {row['in_flight']} | {row['response_bytes'] // 1024} KiB | {row['requests_per_s']:,.0f} | "
            f"{row['mb_per_s']:,.1f} | {row['predicted_requests_per_s']:,.0f} | {row['ratio_to_prediction']:.2f} | "
            f"{row['server_core_share']:.0%} | {row['server_busy_share']:.0%} | {row['client_core_share']:.0%} | "
            f"{row['server_latency_p50_ms']:.1f} | {'-' if p99 is None else f'{p99:.1f}'} | "
            f"{', '.join(row['flags']) or '-'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the rows, the model and the machine's load here (JSON)")
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--sizes-kib", type=int, nargs="+", default=[40, 1024])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--median-ms", type=float, default=20.0)
    parser.add_argument("--p99-ms", type=float, default=100.0)
    args = parser.parse_args(argv)
    reason = unavailable()
    if reason is not None:
        print(f"store_calibration: {reason}", file=sys.stderr)
        return 2
    model = StoreModel(median_latency_ms=args.median_ms, p99_latency_ms=args.p99_ms)
    load = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="cropbench-calibration-") as folder:
        (Path(folder) / OBJECT).write_bytes(os.urandom(max(args.sizes_kib) * 1024))
        with emulated_store(Path(folder), model) as store:
            for size in args.sizes_kib:
                for in_flight in args.in_flight:
                    rows.append(calibrate(store, in_flight, size * 1024, args.seconds))
                    print(table(rows[-1:]).splitlines()[-1], flush=True)
    print(table(rows))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        document = {
            "model": model.__dict__,
            "load_average_at_start": load,
            "load_average_at_end": os.getloadavg(),
            "machine": f"{os.cpu_count()}-core {platform.machine()}, {platform.platform()}",
            "rows": rows,
        }
        args.out.write_text(json.dumps(document, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
