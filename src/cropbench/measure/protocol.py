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

from cropbench.errors import ConfigError

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
        f"{prefix}p50_ms": float(p50),
        f"{prefix}p95_ms": float(p95),
        f"{prefix}p99_ms": float(p99),
        f"{prefix}mean_ms": float(values.mean()),
        f"{prefix}max_ms": float(values.max()),
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


#: Items per block of :func:`steady_state`: each block is read by both loops in turn.
STEADY_BLOCK = 50


def steady_state(
    get: Callable[[int], Any],
    indices: list[int],
    prefix: str = "",
    before_block: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Steady state: each block of indices is read by a tight loop and by a per-item timed loop.

    The two loops alternate which goes first from block to block, so cache reuse favours neither;
    the tight loops give samples/s, the timed loops the percentiles, and their ratio the cost of
    the timing itself (harness overhead). ``before_block`` runs before each loop, untimed (cold
    cache state uses it to evict the page cache and the reader's caches).
    """
    loop_seconds = timed_seconds = 0.0
    latencies = []
    for block_number, start in enumerate(range(0, len(indices), STEADY_BLOCK)):
        block = indices[start : start + STEADY_BLOCK]
        for timed_first in (True, False) if block_number % 2 else (False, True):
            if before_block is not None:
                before_block()
            if timed_first:
                started = time.perf_counter()
                latencies.append(time_each(get, block))
                timed_seconds += time.perf_counter() - started
            else:
                loop_seconds += time_loop(get, block)
    summary = summarise_ms(np.concatenate(latencies), prefix)
    return {
        **summary,
        f"{prefix}samples_per_s": len(indices) / loop_seconds,
        f"{prefix}loop_seconds": loop_seconds,
        f"{prefix}timed_loop_seconds": timed_seconds,
        f"{prefix}harness_overhead": timed_seconds / loop_seconds - 1.0,
    }


def relative_cost(
    get: Callable[[int], Any],
    reference: Callable[[int], Any],
    indices: Sequence[int],
    block: int = 32,
    trim: float = 0.1,
) -> float:
    """Trimmed mean over blocks of (time of ``get`` over a block) / (time of ``reference`` over it).

    Each block's reference is timed right beside it, so a machine-wide slowdown cancels; the two
    alternate which goes first. The reference reads each block once, as the crop path does
    (repeated passes would time a hot-cache copy, which proved bimodal). A trimmed mean (not a
    median) keeps blocks that pay for rarer work, such as loading a field, in the number, while the
    ``trim`` fraction of most extreme blocks at each end is dropped.
    """
    ratios = []
    for number, start in enumerate(range(0, len(indices) - block + 1, block)):
        items = indices[start : start + block]
        if number % 2:
            reference_seconds = time_loop(reference, items)
            get_seconds = time_loop(get, items)
        else:
            get_seconds = time_loop(get, items)
            reference_seconds = time_loop(reference, items)
        ratios.append(get_seconds / max(reference_seconds, 1e-9))
    return trimmed_mean(ratios, trim)


def trimmed_mean(values: Sequence[float], trim: float) -> float:
    """Mean of ``values`` without the ``trim`` fraction at each end (0.1: drop 10% + 10%)."""
    ordered = np.sort(np.asarray(values, dtype=np.float64))
    cut = int(len(ordered) * trim)
    return float(ordered[cut : len(ordered) - cut].mean())


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

    if not isinstance(torch_threads, int) or torch_threads < 0:
        raise ConfigError(f"--torch-threads must be an integer >= 0 (0 = torch's default), got {torch_threads!r}")
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
            "evicted_files": self.files,
            "evicted_bytes": self.bytes,
            "resident_before": self.resident_before,
            "resident_after": self.resident_after,
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
