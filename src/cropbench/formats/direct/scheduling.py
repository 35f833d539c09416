"""Scheduling: a batch's loads and copies over the decode threads.

A batch's chunks are looked up once in the cache; the missing ones are read in parts (see
:data:`SHARES_PER_THREAD`), each part reading and decoding its share, copying the pieces of the
chunks it decoded and caching what it loaded, the threads taking parts until none is left: one
thread's Python overlaps another's decoding and copying (which release the GIL). Before the parts,
a pool thread plans the reads while the calling thread copies the pieces of half the cached chunks,
so that planning (Python) overlaps copying (C) too; the other half is the last part, taken by the
thread that runs out of reads first. blosc itself runs single-threaded
(``numcodecs.blosc.use_threads = False``) so threads never multiply.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import numpy as np

from cropbench.formats.direct.cache import ChunkCache, LoadedChunk
from cropbench.formats.direct.copies import copy_pieces
from cropbench.formats.direct.loads import ChunkLoader
from cropbench.formats.direct.planning import PiecePlan
from cropbench.formats.direct.reads import FEW_KEYS, Read, ReadPlanner
from cropbench.formats.direct.records import NO_PIECES
from cropbench.formats.sources import ByteSource

#: Fewest (crop, chunk) pieces before copying them is split over the decode threads (below it,
#: handing work to a thread costs more than the copies).
PARALLEL_COPY_PIECES = 64
#: Parts a threaded batch (of at least :data:`~.reads.FEW_KEYS` chunks to load) is cut into per decode
#: thread: the threads take them one at a time, so one that starts late (woken up, waiting for the
#: GIL) or decodes slower takes fewer, and one thread's Python runs while the others decode
#: (docs/decode-paths.md has what 1 and 4 parts per thread measured).
SHARES_PER_THREAD = 4


class DecodeThreads:
    """A small pool beside the calling thread (made once per process: a forked worker has no threads)."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._executor: ThreadPoolExecutor | None = None
        self._executor_pid = 0

    def close(self) -> None:
        if self._executor is not None and self._executor_pid == os.getpid():
            self._executor.shutdown(wait=False)
        self._executor = None

    def run(
        self,
        work: Callable[[int], Any],
        parts: int,
        prepare: Callable[[], Any] | None = None,
        meanwhile: Callable[[], Any] | None = None,
    ) -> None:
        """``work(part)`` for ``part`` in 0..parts-1, shared by this thread and the pool: each thread
        takes the next part when it is done with one, so a thread that starts late takes fewer.

        ``prepare`` runs first, on a pool thread, while this thread runs ``meanwhile``; no part starts
        before ``prepare`` has returned, and none at all when it raised (its error is raised here)."""
        if self._executor is None or self._executor_pid != os.getpid():
            self._executor = ThreadPoolExecutor(self.threads - 1, thread_name_prefix="cropbench-decode")
            self._executor_pid = os.getpid()
        taken = itertools.count()
        prepared = threading.Event()
        failed: list[BaseException] = []

        def take_parts(prepares: bool) -> None:
            if prepare is not None:
                if prepares:
                    try:
                        prepare()
                    except BaseException as error:
                        failed.append(error)
                        raise
                    finally:
                        prepared.set()
                else:
                    prepared.wait()
                if failed:
                    return
            while (part := next(taken)) < parts:
                work(part)

        helpers = [self._executor.submit(take_parts, index == 0) for index in range(self.threads - 1)]
        try:
            if meanwhile is not None:
                meanwhile()
            take_parts(False)
        finally:
            wait(helpers)  # no thread may still write into the output once this returns
        for helper in helpers:
            helper.result()


class BatchScheduler:
    """Runs a read's plan: cache lookups, read planning, loads and copies, over the decode threads."""

    def __init__(
        self,
        cache: ChunkCache,
        reads: ReadPlanner,
        loader: ChunkLoader,
        threads: DecodeThreads,
        source: Callable[[], ByteSource],
    ) -> None:
        self.cache = cache
        self.reads = reads
        self.loader = loader
        self.threads = threads
        self.source = source

    def execute(
        self,
        plan: PiecePlan,
        out: np.ndarray,
        meanwhile: Callable[[], Any] | None = None,
    ) -> None:
        """Read and decode each chunk the plan's pieces need once, then copy
        every piece into ``out`` (B, C, H, W). Half the cached chunks' copies are left to the last
        part, so the thread that runs out of reads first still has work while the others decode.
        The caller's ``meanwhile`` (Python) runs on this thread after its copies, while the pool
        thread decodes."""
        runs = plan.runs
        chunks = self.cache.get_many(runs)
        missing = len(runs) - len(chunks)
        cached = list(chunks)
        threads = self.threads.threads

        def missing_keys() -> list[int]:
            return [key for key in runs if key not in chunks]

        if threads == 1 or (missing < 2 and len(plan.pieces) < PARALLEL_COPY_PIECES):
            reads = self.reads.plan(missing_keys(), self.source()) if missing else [[]]
            self._load_and_copy(reads[0], plan, cached, chunks, out)
            if meanwhile is not None:
                meanwhile()
        elif not missing:
            self.threads.run(
                lambda part: self._load_and_copy([], plan, cached[part::threads], chunks, out),
                threads,
                meanwhile=meanwhile,
            )
        else:
            loads = threads * (SHARES_PER_THREAD if missing >= FEW_KEYS else 1)
            planned: list[list[Read]] = []
            first, last = cached[: len(cached) // 2], cached[len(cached) // 2 :]

            def work(part: int) -> None:
                if part < loads:
                    self._load_and_copy(planned[part], plan, [], chunks, out)
                else:  # the last part: the other half of the cached chunks
                    self._load_and_copy([], plan, last, chunks, out)

            def copy_first() -> None:
                self._load_and_copy([], plan, first, chunks, out)
                if meanwhile is not None:
                    meanwhile()

            self.threads.run(
                work,
                loads + 1,
                prepare=lambda: planned.extend(self.reads.plan(missing_keys(), self.source(), loads)),
                meanwhile=copy_first,
            )
        self.cache.count_touches(plan.pieces)

    def _load_and_copy(
        self,
        reads: list[Read],
        plan: PiecePlan,
        cached_keys: list[int],
        cached: dict[int, np.ndarray],
        out: np.ndarray,
    ) -> None:
        """One decode thread's share of a batch: load ``reads`` (copying their chunks' pieces as each
        is decoded), copy the pieces of the cached chunks ``cached_keys``, then cache what it loaded,
        so its bookkeeping overlaps the other threads' decoding."""
        left = plan.of_chunks(cached_keys) if cached_keys else NO_PIECES
        chunks = cached
        loaded = None
        if reads:
            loaded = self.loader.load(reads, plan, out)
            if len(loaded.left):
                left = np.concatenate([left, loaded.left]) if len(left) else loaded.left
                results: list[LoadedChunk] = loaded.chunks
                chunks = dict(cached)
                chunks.update((key, chunk) for key, chunk, _ in results)
        if len(left):
            copy_pieces(left, plan.channels, chunks, out)
        if loaded is not None:
            self.cache.keep(loaded)
