"""Calibrate the emulated object store: what a trivial client gets from it beside what its model predicts.

For each response size and number of requests in flight, one keep-alive connection per thread asks
for the same byte range again and again for ``seconds`` (after a short warm-up): requests/s and
MB/s measured, the model's prediction (:meth:`StoreModel.predicted_requests_per_s`), the server's
CPU and busy shares over the stretch (a row whose server was busy half the time or more is flagged
``server-bound``), the client process's CPU share (``client-bound`` at 90 % of a core or more: one
Python process cannot ask faster), and the latency nginx measured per request (p50, p99). A stretch in
which the store answered no request is a row flagged ``no-request-answered``, its latencies None.
"""

from __future__ import annotations

import http.client
import json
import os
import platform
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from cropbench import metrics as m
from cropbench.config import MAX_IN_FLIGHT, MAX_RESPONSE_KIB, MAX_TIMEOUT_S
from cropbench.errors import ConfigError, StoreError
from cropbench.measure.store_emulation import EmulatedStore, StoreModel, emulated_store
from cropbench.scratch import scratch_folder

#: Share of one core the client process may use before its row is ``client-bound``.
CLIENT_BOUND_SHARE = 0.9
#: A row whose stretch got no answer from the store (too many connections for it, say).
NO_ANSWER_FLAG = "no-request-answered"
OBJECT = "object"


@dataclass(frozen=True)
class Calibration:
    """What is measured: every response size at every number of requests in flight, each for ``seconds``,
    against a store injecting ``model``."""

    in_flight: tuple[int, ...] = (1, 16, 64, 256)
    sizes_kib: tuple[int, ...] = (40, 1024)
    seconds: float = 4.0
    model: StoreModel = field(default_factory=StoreModel)

    def __post_init__(self) -> None:
        for name, values, high in (
            ("in_flight", self.in_flight, MAX_IN_FLIGHT),
            ("sizes_kib", self.sizes_kib, MAX_RESPONSE_KIB),
        ):
            if not values or not all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= high for v in values):
                raise ConfigError(f"{name} must be whole numbers from 1 to {high}, got {list(values)!r}")
        if not (isinstance(self.seconds, (int, float)) and 0 < self.seconds <= MAX_TIMEOUT_S):
            raise ConfigError(f"seconds must be above 0 and at most {MAX_TIMEOUT_S:g}, got {self.seconds!r}")


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
                raise StoreError(f"the emulated store answered {response.status} with a short body")
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
    bounds = (
        ("server-bound", window.server_bound),
        ("client-bound", client_share >= CLIENT_BOUND_SHARE),
        (NO_ANSWER_FLAG, not answered),
    )
    return {
        m.IN_FLIGHT: in_flight,
        "response_bytes": size,
        "seconds": window.wall_s,
        "requests": len(answered),
        "requests_per_s": rate,
        "mb_per_s": rate * size / 1e6,
        "predicted_requests_per_s": predicted,
        "ratio_to_prediction": rate / predicted,
        m.SERVER_CORE_SHARE: window.server_core_share,
        m.SERVER_BUSY_SHARE: window.server_busy_share,
        "client_core_share": client_share,
        "server_latency_p50_ms": float(np.percentile(latencies, 50)) if len(latencies) else None,
        "server_latency_p99_ms": float(np.percentile(latencies, 99)) if len(latencies) >= 100 else None,
        "flags": [name for name, bound in bounds if bound],
    }


def run_calibration(calibration: Calibration, on_row: Callable[[dict[str, Any]], None]) -> None:
    """Serve one object from the emulated store (in a scratch folder) and hand each row to ``on_row`` as it
    is measured: every size at every number of requests in flight."""
    with scratch_folder("calibration") as folder:
        (folder / OBJECT).write_bytes(os.urandom(max(calibration.sizes_kib) * 1024))
        with emulated_store(folder, calibration.model) as store:
            for size in calibration.sizes_kib:
                for in_flight in calibration.in_flight:
                    on_row(calibrate(store, in_flight, size * 1024, calibration.seconds))


def document(model: StoreModel, load_at_start: Sequence[float], rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What a calibration file holds: the model, the machine and its load, and the rows measured so far."""
    return {
        "model": asdict(model),
        "load_average_at_start": list(load_at_start),
        "load_average_at_end": list(os.getloadavg()),
        "machine": f"{os.cpu_count()}-core {platform.machine()}, {platform.platform()}",
        "rows": list(rows),
    }


def is_calibration_file(path: Path) -> bool:
    """Whether ``path`` holds a calibration :func:`document` (what a calibration may replace)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(data, dict) and {"model", "rows", "machine"} <= data.keys()


def _fixed(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a Markdown table."""
    lines = [
        "| in flight | response | req/s | MB/s | predicted req/s | x predicted | server CPU | server busy | "
        "client CPU | p50 ms | p99 ms | flags |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['in_flight']} | {row['response_bytes'] // 1024} KiB | {row['requests_per_s']:,.0f} | "
            f"{row['mb_per_s']:,.1f} | {row['predicted_requests_per_s']:,.0f} | {row['ratio_to_prediction']:.2f} | "
            f"{row[m.SERVER_CORE_SHARE]:.0%} | {row[m.SERVER_BUSY_SHARE]:.0%} | {row['client_core_share']:.0%} | "
            f"{_fixed(row['server_latency_p50_ms'], 1)} | {_fixed(row['server_latency_p99_ms'], 1)} | "
            f"{', '.join(row['flags']) or '-'} |"
        )
    return "\n".join(lines)


__all__ = [
    "CLIENT_BOUND_SHARE",
    "NO_ANSWER_FLAG",
    "Calibration",
    "calibrate",
    "document",
    "is_calibration_file",
    "run_calibration",
    "table",
]
