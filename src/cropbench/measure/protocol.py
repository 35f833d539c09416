"""Clocks, interleaved timing, percentiles, thread settings and page-cache control: the parts of a
honest number.

All timings read one clock, :data:`clock_ns` (``time.perf_counter_ns``: wall clock, monotonic;
worker processes and I/O make CPU-time clocks meaningless here), directly or through
:class:`Stopwatch`; :data:`crosscheck_clock_ns` is read only to check it. Every rate under the
``samples_per_s`` key (any prefix) is :func:`samples_per_s`: samples over the wall seconds of the
timed fetches that delivered them. Whatever compares two or more ways of
reading (a tight loop and a timed one, a crop path and its reference, readers side by side) runs
them through :func:`interleaved_blocks`, taking turns block by block, so a slowdown of the machine
lands on all of them alike.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import resource
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cropbench import metrics as m
from cropbench.errors import ConfigError
from cropbench.metrics import prefixed

#: The clock of every measurement: wall time in nanoseconds, monotonic.
clock_ns = time.perf_counter_ns
#: A second, independent clock, read only to cross-check a rate timed with :data:`clock_ns`.
crosscheck_clock_ns = time.monotonic_ns


class Stopwatch:
    """Wall time (:data:`clock_ns`) of the blocks it times, summed: ``with watch: ...``, or
    ``watch.wrap(call)`` for a call timed wherever it is made. ``last_ns`` is the latest block's."""

    def __init__(self) -> None:
        self.ns = 0
        self.last_ns = 0
        self.count = 0
        self._started = 0

    def __enter__(self) -> Stopwatch:
        self._started = clock_ns()
        return self

    def __exit__(self, *exc: object) -> None:
        self.last_ns = clock_ns() - self._started
        self.ns += self.last_ns
        self.count += 1

    def wrap(self, call: Callable[..., Any]) -> Callable[..., Any]:
        """``call`` with this stopwatch around each call."""

        def timed(*args: Any, **kwargs: Any) -> Any:
            with self:
                return call(*args, **kwargs)

        return timed

    def reset(self) -> None:
        self.ns = self.last_ns = self.count = 0

    @property
    def seconds(self) -> float:
        return self.ns / 1e9


def samples_per_s(samples: float, seconds: float) -> float:
    """The one definition of ``samples_per_s``: samples delivered over the wall seconds of the timed
    fetches that delivered them (no warm-up, start-up or shut-down inside; inf for no time at all)."""
    return samples / seconds if seconds > 0 else float("inf")


#: A percentile q rests on enough samples when at least this many observations lie beyond it.
TAIL_OBSERVATIONS = 10


def min_samples_for(quantile: float) -> int:
    """Samples needed before the ``quantile`` (0–1) has ``TAIL_OBSERVATIONS`` points beyond it."""
    return int(np.ceil(TAIL_OBSERVATIONS / (1.0 - quantile)))


def summarise_ms(latencies_ns: Sequence[int] | np.ndarray, prefix: str = "") -> dict[str, Any]:
    """p50/p95/p99/mean/max in milliseconds, the count, and whether each tail is trustworthy."""
    values = np.asarray(latencies_ns, dtype=np.float64) / 1e6
    if values.size == 0:
        return {prefixed(prefix, m.COUNT): 0}
    p50, p95, p99 = np.percentile(values, [50, 95, 99])
    summary = {
        m.COUNT: int(values.size),
        m.P50_MS: float(p50),
        m.P95_MS: float(p95),
        m.P99_MS: float(p99),
        m.MEAN_MS: float(values.mean()),
        m.MAX_MS: float(values.max()),
        m.P95_RELIABLE: bool(values.size >= min_samples_for(0.95)),
        m.P99_RELIABLE: bool(values.size >= min_samples_for(0.99)),
        m.QUANTILES_MS: [round(float(q), 5) for q in np.percentile(values, np.arange(0, 101, 2))],
    }
    return {prefixed(prefix, key): value for key, value in summary.items()}


def time_each(call: Callable[[int], Any], indices: Iterable[int]) -> np.ndarray:
    """Wall-clock latency (ns) of each ``call(index)``; the result is dropped after the clock."""
    clock = clock_ns
    latencies = []
    for index in indices:
        start = clock()
        call(index)
        latencies.append(clock() - start)
    return np.asarray(latencies, dtype=np.int64)


def time_loop(call: Callable[[int], Any], indices: Sequence[int]) -> float:
    """Seconds for a tight loop of ``call(index)`` with no per-item clock reads."""
    with Stopwatch() as watch:
        for index in indices:
            call(index)
    return watch.seconds


def per_item(get: Callable[[Any], Any]) -> Callable[[Sequence[Any]], None]:
    """A block call for :func:`interleaved_blocks`: ``get`` on each item of the block, no clock reads inside."""

    def read(block: Sequence[Any]) -> None:
        for item in block:
            get(item)

    return read


def exhaust(iterable: Iterable[Any]) -> Callable[[object], None]:
    """A block call for :func:`interleaved_blocks` that iterates ``iterable`` once (a DataLoader: one
    epoch, worker start-up and shutdown included); the block is ignored."""

    def run(_: object) -> None:
        for _item in iterable:
            pass

    return run


def interleaved_blocks(
    calls: Mapping[str, Callable[[Any], Any]],
    blocks: Sequence[Any],
    rounds: int = 1,
    before: Callable[[], None] | None = None,
) -> dict[str, np.ndarray]:
    """Seconds each call takes over each block, as arrays of shape ``(rounds, len(blocks))``.

    The calls take turns block by block and the turn order rotates by one at every block, so cache
    reuse and a slowdown of the machine land on all of them alike. ``before`` runs before each
    call, untimed (cold cache state uses it to evict the page cache and the reader's caches).
    """
    names = list(calls)
    seconds = {name: np.zeros((rounds, len(blocks))) for name in names}
    turn = 0
    for round_number in range(rounds):
        for number, block in enumerate(blocks):
            shift = turn % len(names)
            turn += 1
            for name in names[shift:] + names[:shift]:
                if before is not None:
                    before()
                with Stopwatch() as watch:
                    calls[name](block)
                seconds[name][round_number, number] = watch.seconds
    return seconds


@dataclass(frozen=True)
class Rates:
    """Items per second of one call of :func:`interleaved_rates`: over all rounds, and per round."""

    overall: float
    per_round: tuple[float, ...]

    @property
    def median(self) -> float:
        return float(np.median(self.per_round))


def interleaved_rates(
    calls: Mapping[str, Callable[[Sequence[Any]], Any]],
    blocks: Sequence[Sequence[Any]],
    rounds: int = 1,
) -> dict[str, Rates]:
    """Each call's items/s over ``rounds`` passes of ``blocks``, the calls taking turns block by block
    (:func:`interleaved_blocks`): its items over its own summed time, and each round's rate."""
    items = sum(len(block) for block in blocks)
    seconds = interleaved_blocks(calls, blocks, rounds)
    return {
        name: Rates(
            samples_per_s(items * rounds, float(spent.sum())),
            tuple(samples_per_s(items, float(s)) for s in spent.sum(axis=1)),
        )
        for name, spent in seconds.items()
    }


#: Items per block of :func:`steady_state`: each block is read by both loops in turn.
STEADY_BLOCK = 50
#: The loops that share a steady state's indices (:func:`steady_state`): each reads half of them.
STEADY_LOOPS = 2


def paired_blocks(indices: Sequence[int], size: int) -> list[list[int]]:
    """``indices`` in blocks of at most ``size``, of near-equal sizes and an even number of them (given two
    items or more). The loops of :func:`interleaved_blocks` take turns going first, so with an odd number
    of blocks one of two loops goes first once more, paying the first reads of a block's items alone: the
    timed loop then reads faster than the tight one, a negative harness overhead."""
    count = -(-len(indices) // size) if indices else 0
    count += count % 2 if len(indices) > 1 else 0
    blocks, start = [], 0
    for number in range(count):
        length = len(indices) // count + (number < len(indices) % count)
        blocks.append(list(indices[start : start + length]))
        start += length
    return blocks


def steady_state(
    get: Callable[[int], Any],
    indices: list[int],
    prefix: str = "",
    before_block: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Steady state: the blocks of indices are shared out between a tight loop and a per-item timed loop,
    each index read once, by one of them.

    Had both loops read every block, whichever came second would find the block's chunks in the
    reader's cache the first had just filled: a rate of first and repeated reads mixed. Here the
    blocks go in pairs, one to each loop, and which loop reads (and goes) first alternates from pair to
    pair, so position in the run and a slowdown of the machine land on both alike. The tight loops
    give samples/s, the timed loops the percentiles, and the median over pairs of their per-item
    times' ratio the cost of the timing itself (harness overhead). ``before_block`` runs before each
    block, untimed (cold cache state uses it to evict the page cache and the reader's caches). A single
    item is read by both loops (there is nothing to share out).
    """
    blocks = paired_blocks(indices, STEADY_BLOCK)
    if len(blocks) < 2:
        blocks = blocks * 2
    latencies: list[np.ndarray] = []
    loop_seconds = timed_seconds = 0.0
    loop_items = timed_items = 0
    pair_ratios = []
    tight = per_item(get)
    for number in range(0, len(blocks) - 1, 2):
        first, second = blocks[number], blocks[number + 1]
        turns = [("loop", first), ("timed", second)]
        if (number // 2) % 2:
            turns = [("timed", first), ("loop", second)]
        per_item_s = {}
        for name, block in turns:
            if before_block is not None:
                before_block()
            with Stopwatch() as watch:
                if name == "loop":
                    tight(block)
                else:
                    latencies.append(time_each(get, block))
            per_item_s[name] = watch.seconds / max(len(block), 1)
            if name == "loop":
                loop_seconds, loop_items = loop_seconds + watch.seconds, loop_items + len(block)
            else:
                timed_seconds, timed_items = timed_seconds + watch.seconds, timed_items + len(block)
        pair_ratios.append(per_item_s["timed"] / max(per_item_s["loop"], 1e-12))
    summary = summarise_ms(np.concatenate(latencies), prefix)
    return {
        **summary,
        prefixed(prefix, m.SAMPLES_PER_S): samples_per_s(loop_items, loop_seconds),
        prefixed(prefix, m.LOOP_SECONDS): loop_seconds,
        prefixed(prefix, m.TIMED_LOOP_SECONDS): timed_seconds,
        prefixed(prefix, m.HARNESS_OVERHEAD): float(np.median(pair_ratios)) - 1.0,
    }


def alternating_ratios(
    measured: Callable[[Any], Any], reference: Callable[[Any], Any], blocks: Sequence[Any]
) -> np.ndarray:
    """Per block, the seconds of ``measured`` over those of ``reference`` timed right beside it.

    The two take turns going first (:func:`interleaved_blocks`), so a machine-wide slowdown cancels.
    Whole DataLoader epochs compare with :func:`exhaust` calls and one (ignored) block per pair.
    """
    seconds = interleaved_blocks({"measured": measured, "reference": reference}, blocks)
    return seconds["measured"][0] / np.maximum(seconds["reference"][0], 1e-9)


def relative_cost(
    get: Callable[[int], Any],
    reference: Callable[[int], Any],
    indices: Sequence[int],
    block: int = 32,
    trim: float = 0.1,
) -> float:
    """Trimmed geometric mean over blocks of (time of ``get`` over a block) / (time of ``reference`` over it).

    Each block's reference is timed right beside it (:func:`alternating_ratios`). The reference
    reads each block once, as the crop path does (repeated passes would time a hot-cache copy,
    which proved bimodal). Whichever of the two reads a block first pays for cold CPU caches, so
    the per-block ratios of identical paths swing between r and 1/r as the turn order rotates: an
    arithmetic mean of them reads above 1 (2.35 on a loaded 2-core VM), their geometric mean is 1.
    The mean is trimmed in log space (the ``trim`` fraction of most extreme blocks at each end) and
    not a median, so blocks that pay for rarer work, such as loading a field, stay in the number.
    Both calls first read the first block once, untimed, so first-call costs (imports, allocations,
    opening a store) are in neither.
    """
    blocks = [indices[start : start + block] for start in range(0, len(indices) - block + 1, block)]
    if not blocks:
        raise ConfigError(f"relative_cost needs at least one block of {block} indices, got {len(indices)}")
    measured, baseline = per_item(get), per_item(reference)
    measured(blocks[0])
    baseline(blocks[0])
    ratios = alternating_ratios(measured, baseline, blocks)
    return float(np.exp(trimmed_mean(np.log(np.maximum(ratios, 1e-12)).tolist(), trim)))


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
        with Stopwatch() as watch:
            time_each(noop, indices)
        timed = min(timed, watch.seconds)
    extra = (timed - plain) / calls * 1e9
    return extra if extra > 0 else None


def cpu_seconds() -> float:
    """CPU seconds (user and system) this process and its reaped children have used so far.

    Read around a whole DataLoader epoch, whose workers have exited and been reaped by its end, the
    difference is the epoch's CPU time in every process: beside the wall time it says how many cores the
    epoch kept busy. It is never a rate's clock (:data:`clock_ns` is).
    """
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def rss_bytes() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def configure_threads(torch_threads: int) -> dict[str, Any]:
    """Pin torch's intra-op threads and report the OpenMP settings that shape results.

    On a small machine, OpenMP threads spinning while workers decode change results several-fold;
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
            m.EVICTED_FILES: self.files,
            m.EVICTED_BYTES: self.bytes,
            m.RESIDENT_BEFORE: self.resident_before,
            m.RESIDENT_AFTER: self.resident_after,
            m.EVICTION_VERIFIED: self.verified,
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
