"""Clocks, percentiles, thread settings and page-cache control: the parts of a honest number.

All timings use ``time.perf_counter_ns`` (wall clock, monotonic): worker processes and I/O make
CPU-time clocks meaningless here.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: A percentile q rests on enough samples when at least this many observations lie beyond it.
TAIL_OBSERVATIONS = 10


def min_samples_for(quantile: float) -> int:
    """Samples needed before the ``quantile`` (0–1) has ``TAIL_OBSERVATIONS`` points beyond it."""
    return int(np.ceil(TAIL_OBSERVATIONS / (1.0 - quantile)))


def summarise_ms(latencies_ns: Sequence[int] | np.ndarray, prefix: str = "") -> dict[str, Any]:
    """p50/p95/p99/mean/max in milliseconds, the count, and whether each tail is trustworthy."""
    values = np.asarray(latencies_ns, dtype=np.float64) / 1e6
    if values.size == 0:
        return {f"{prefix}count": 0}
    p50, p95, p99 = np.percentile(values, [50, 95, 99])
    return {
        f"{prefix}count": int(values.size),
        f"{prefix}p50_ms": float(p50), f"{prefix}p95_ms": float(p95), f"{prefix}p99_ms": float(p99),
        f"{prefix}mean_ms": float(values.mean()), f"{prefix}max_ms": float(values.max()),
        f"{prefix}p95_reliable": bool(values.size >= min_samples_for(0.95)),
        f"{prefix}p99_reliable": bool(values.size >= min_samples_for(0.99)),
        f"{prefix}quantiles_ms": [round(float(q), 5) for q in np.percentile(values, np.arange(0, 101, 2))],
    }


def time_each(call: Callable[[int], Any], indices: Iterable[int]) -> np.ndarray:
    """Wall-clock latency (ns) of each ``call(index)``; the result is dropped after the clock."""
    clock = time.perf_counter_ns
    latencies = []
    for index in indices:
        start = clock()
        call(index)
        latencies.append(clock() - start)
    return np.asarray(latencies, dtype=np.int64)


def time_loop(call: Callable[[int], Any], indices: Sequence[int]) -> float:
    """Seconds for a tight loop of ``call(index)`` with no per-item clock reads."""
    start = time.perf_counter()
    for index in indices:
        call(index)
    return time.perf_counter() - start


def clock_overhead_ns(calls: int = 2_000, trials: int = 15) -> float | None:
    """Extra wall time per item that :func:`time_each` adds over :func:`time_loop` (no-op calls).

    Each of ``trials`` rounds times both loops back to back; the minimum per loop over the rounds
    is the least disturbed run, so a preemption in one round does not move the answer. None when
    the difference does not resolve (the timed loop's minimum is not above the tight loop's):
    a clamped 0 would read as a measured "free".
    """
    indices = list(range(calls))
    noop = int.__index__
    plain = timed = float("inf")
    for _ in range(trials):
        plain = min(plain, time_loop(noop, indices))
        start = time.perf_counter()
        time_each(noop, indices)
        timed = min(timed, time.perf_counter() - start)
    extra = (timed - plain) / calls * 1e9
    return extra if extra > 0 else None


def rss_bytes() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def configure_threads(torch_threads: int) -> dict[str, Any]:
    """Pin torch's intra-op threads and report the OpenMP settings that shape results.

    On a 2-core machine, OpenMP threads spinning while workers decode changed results 3–25×;
    one intra-op thread and ``OMP_WAIT_POLICY=PASSIVE`` (set by the CLI before torch loads) avoid it.
    """
    import torch

    if torch_threads > 0:
        torch.set_num_threads(torch_threads)
    return {
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "unset"),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "unset"),
    }


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def resident_fraction(paths: Iterable[Path]) -> float | None:
    """Fraction of the files' pages in the page cache (mincore on an mmap), or None if unknown.

    The mapping is copy-on-write so ctypes can take its address; nothing is written, so no page
    is touched by the check itself.
    """
    page = mmap.PAGESIZE
    resident = total = 0
    try:
        for path in paths:
            size = path.stat().st_size
            if size == 0:
                continue
            pages = (size + page - 1) // page
            vector = (ctypes.c_ubyte * pages)()
            with open(path, "rb") as handle, mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_COPY) as mapped:
                anchor = ctypes.c_char.from_buffer(mapped)
                status = _libc.mincore(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(size), vector)
                del anchor
            if status != 0:
                return None
            resident += sum(v & 1 for v in vector)
            total += pages
    except (OSError, ValueError, TypeError, BufferError):
        return None
    return resident / total if total else 0.0


@dataclass(frozen=True)
class Eviction:
    """What ``evict`` did: files advised, their bytes, and residency before and after."""

    files: int
    bytes: int
    resident_before: float | None
    resident_after: float | None

    @property
    def verified(self) -> bool:
        return self.resident_after is not None and self.resident_after <= 0.01

    def as_metrics(self) -> dict[str, Any]:
        return {
            "evicted_files": self.files, "evicted_bytes": self.bytes,
            "resident_before": self.resident_before, "resident_after": self.resident_after,
            "eviction_verified": self.verified,
        }


def evict(paths: Sequence[Path]) -> Eviction:
    """Drop the files from the page cache with ``posix_fadvise(DONTNEED)`` and check with mincore.

    Each file is fsynced first: the kernel does not drop dirty pages, so a plate written moments
    ago (the smoke run's) would otherwise stay resident and its "cold" pass would read memory.
    """
    before = resident_fraction(paths)
    total = 0
    for path in paths:
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())
            os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            total += os.fstat(handle.fileno()).st_size
    return Eviction(files=len(paths), bytes=total, resident_before=before, resident_after=resident_fraction(paths))


def load_into_page_cache(paths: Sequence[Path], block_bytes: int = 8 * 2**20) -> float | None:
    """Read the files once so a warm measurement starts warm; returns the resident fraction after.

    The first loader of a run otherwise pays the page faults of every later one.
    """
    for path in paths:
        with open(path, "rb", buffering=0) as handle:
            while handle.read(block_bytes):
                pass
    return resident_fraction(paths)
