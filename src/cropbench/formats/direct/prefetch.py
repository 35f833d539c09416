"""Prefetch: the chunks of the batches a reader is asked for next, fetched and decoded into its chunk
cache on background threads while the current batch decodes.

Over an object store a batch waits a round trip for its chunks; the order of the next batches is
known before they are asked for (the sampler fixed it), so their reads can already be in flight.
The next batches are planned as a read plans them (:mod:`.planning`, :mod:`.reads`, shard indexes
looked up once in the shared :class:`~.shards.ShardIndex`), loaded by the reader's own loader and
kept in its cache, so a prefetched chunk is a cache hit and bytes are the bytes of a plain read.

- Bounded: at most ``bytes_in_flight`` bytes requested and not yet cached (:class:`ByteBudget`).
- Fetched once: a chunk being loaded is *claimed* (:class:`Claims`); a batch read waits for the
  chunks the prefetch is loading rather than fetching them again, and the prefetch skips the chunks
  a batch read is loading.
- Cancellable: :meth:`Prefetcher.cancel` drops what was hinted and not started and stops between
  reads; :meth:`Prefetcher.close` also joins the threads. A chunk reaches the cache decoded whole
  or not at all (:meth:`~.cache.ChunkCache.keep` of a finished load).
- Per process: a forked DataLoader worker starts with no threads and no claims of its parent.
"""

from __future__ import annotations

import functools
import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from cropbench.config import PrefetchConfig
from cropbench.formats.base import Regions
from cropbench.formats.direct.cache import ChunkCache
from cropbench.formats.direct.layout import FieldLayouts
from cropbench.formats.direct.loads import ChunkLoader
from cropbench.formats.direct.planning import PiecePlanner
from cropbench.formats.direct.reads import Read, ReadPlanner, read_field
from cropbench.formats.sources import ByteSource


class Claims:
    """The chunk keys being loaded right now, by a batch read or by the prefetch: one loader per key."""

    def __init__(self) -> None:
        self._loading: set[int] = set()
        self._changed = threading.Condition()

    def claim(self, keys: Iterable[int]) -> tuple[list[int], list[int]]:
        """(the keys claimed now, the keys someone else is loading)."""
        mine: list[int] = []
        theirs: list[int] = []
        with self._changed:
            loading = self._loading
            for key in keys:
                (theirs if key in loading else mine).append(key)
            loading.update(mine)
        return mine, theirs

    def release(self, keys: Iterable[int]) -> None:
        """Keys loaded (or given up): others waiting for them look in the cache again."""
        with self._changed:
            self._loading.difference_update(keys)
            self._changed.notify_all()

    def wait(self, keys: Sequence[int]) -> None:
        """Until none of ``keys`` is being loaded."""
        if not keys:
            return
        with self._changed:
            self._changed.wait_for(lambda: self._loading.isdisjoint(keys))

    def __len__(self) -> int:
        with self._changed:
            return len(self._loading)


class ByteBudget:
    """Bytes requested and not yet cached, at most ``limit`` (one larger request goes alone)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        #: The most bytes ever in flight at once (what the bound is checked against).
        self.peak = 0
        self._changed = threading.Condition()

    def acquire(self, nbytes: int, cancelled: Callable[[], bool]) -> bool:
        """Wait until ``nbytes`` fit; False (nothing taken) when ``cancelled()`` turns true first."""
        with self._changed:
            self._changed.wait_for(lambda: cancelled() or self.used == 0 or self.used + nbytes <= self.limit)
            if cancelled():
                return False
            self.used += nbytes
            self.peak = max(self.peak, self.used)
            return True

    def release(self, nbytes: int) -> None:
        with self._changed:
            self.used -= nbytes
            self._changed.notify_all()

    def wake(self) -> None:
        """Let waiters look at their ``cancelled()`` again."""
        with self._changed:
            self._changed.notify_all()


#: One batch hinted: a fingerprint of its regions (to fetch it once), the regions, the channels read.
Hint = tuple[bytes, Regions, np.ndarray | None]


class Prefetcher:
    """Reads the hinted batches' chunks into one reader's cache, ahead of the reads that need them."""

    def __init__(
        self,
        config: PrefetchConfig,
        batches: int,
        layouts: FieldLayouts,
        pieces: PiecePlanner,
        cache: ChunkCache,
        reads: ReadPlanner,
        loader: ChunkLoader,
        source: Callable[[], ByteSource],
    ) -> None:
        self.config = config
        self.threads = config.threads_for(batches)
        self.layouts = layouts
        self.pieces = pieces
        self.cache = cache
        self.reads = reads
        self.loader = loader
        self.source = source
        self._pid = -1
        self._start_process()

    def _start_process(self) -> None:
        """Fresh state for this process: no threads, nothing hinted, claimed or in flight."""
        self._pid = os.getpid()
        self.claims = Claims()
        self.budget = ByteBudget(self.config.bytes_in_flight)
        self._queue: deque[Hint] = deque()
        self._started: set[bytes] = set()  # fingerprints of the hinted batches taken by a thread
        self._generation = 0
        self._running = 0  # hinted batches being fetched now
        self._stopping = False
        self._wakeup = threading.Condition()
        self._threads: list[threading.Thread] = []
        #: The first error a prefetch met, for diagnosis: it raises nothing, as the batch read that
        #: needs those chunks fetches them itself and reports its own error.
        self.errors: list[BaseException] = []

    def _this_process(self) -> None:
        if self._pid != os.getpid():
            self._start_process()

    def hint(self, upcoming: Sequence[Regions], channels: np.ndarray | None) -> None:
        """The batches to be read next, nearest first: those no thread has taken yet are queued,
        replacing the queue (the newest hint knows the order best)."""
        self._this_process()
        hints = [(region.table().tobytes(), region, channels) for region in upcoming]
        with self._wakeup:
            if self._stopping:
                return
            self._started &= {hint[0] for hint in hints}
            fresh = [hint for hint in hints if hint[0] not in self._started]
            self._queue = deque(fresh)
            if fresh and len(self._threads) < self.threads:
                self._start_threads()
            self._wakeup.notify_all()

    def _start_threads(self) -> None:
        while len(self._threads) < self.threads:
            thread = threading.Thread(target=self._run, name=f"cropbench-prefetch-{len(self._threads)}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def before_read(self, keys: Iterable[int]) -> list[int]:
        """Claim the chunks among ``keys`` that a batch read must load itself, after waiting for those
        the prefetch is loading (then cached); the caller releases the claim with :meth:`after_read`."""
        self._this_process()
        mine, theirs = self.claims.claim(self.cache.absent(keys))
        self.claims.wait(theirs)
        return mine

    def after_read(self, claimed: list[int]) -> None:
        self.claims.release(claimed)

    def wait(self) -> None:
        """Until every batch hinted is fetched (or given up): its chunks are then in the cache."""
        if self._pid != os.getpid():
            return
        with self._wakeup:
            self._wakeup.wait_for(lambda: not self._queue and not self._running)

    def cancel(self) -> None:
        """Drop what is hinted and not started; loads running stop before their next read."""
        if self._pid != os.getpid():
            return
        with self._wakeup:
            self._generation += 1
            self._queue.clear()
            self._started = set()
        self.budget.wake()

    def close(self) -> None:
        """:meth:`cancel`, then wait for every prefetch thread to end (a read in flight completes)."""
        if self._pid != os.getpid():
            return
        self.cancel()
        with self._wakeup:
            self._stopping = True
            self._wakeup.notify_all()
        for thread in self._threads:
            thread.join()
        self._start_process()

    def _run(self) -> None:
        while True:
            with self._wakeup:
                self._wakeup.wait_for(lambda: self._stopping or bool(self._queue))
                if self._stopping:
                    return
                fingerprint, regions, channels = self._queue.popleft()
                self._started.add(fingerprint)
                generation = self._generation
                self._running += 1
            try:
                self._fetch(regions, channels, functools.partial(self._cancelled_since, generation))
            except Exception as error:  # the batch read that needs these chunks fetches them and reports
                if not self.errors:
                    self.errors.append(error)
            finally:
                with self._wakeup:
                    self._running -= 1
                    self._wakeup.notify_all()

    def _cancelled_since(self, generation: int) -> bool:
        return self._generation != generation or self._stopping

    def _fetch(self, regions: Regions, channels: np.ndarray | None, cancelled: Callable[[], bool]) -> None:
        """Load the chunks of one hinted batch that nobody holds or loads, in reads of bounded bytes."""
        plan = self.pieces.plan_regions(regions, channels)
        # The batch's chunks held already are marked used, or what is fetched now evicts them first.
        mine, _ = self.claims.claim(self.cache.absent_keeping(plan.runs))
        if not mine:
            return
        try:
            mine_now = self.cache.absent(mine)  # a batch read may have cached some since they were looked up
            self.claims.release(set(mine) - set(mine_now))
            mine = mine_now
            if not mine or cancelled():
                return
            for group, nbytes in self._groups(self.reads.plan(mine, self.source())[0]):
                if not self.budget.acquire(nbytes, cancelled):
                    return
                try:
                    self.cache.keep(self.loader.load(group))
                finally:
                    self.budget.release(nbytes)
                self.claims.release(key for read in group for key, _, _ in read[3])
        finally:
            self.claims.release(mine)

    def _groups(self, reads: list[Read]) -> Iterable[tuple[list[Read], int]]:
        """The reads in groups of at most ``bytes_in_flight`` bytes (one larger read alone), each
        fetched with the source's requests in flight at once."""
        limit, layouts = self.config.bytes_in_flight, self.layouts.layouts
        group: list[Read] = []
        total = 0
        for read in reads:
            key, _, length, _ = read
            nbytes = 0 if key is None else length if length >= 0 else layouts[read_field(read)].max_encoded
            if group and total + nbytes > limit:
                yield group, total
                group, total = [], 0
            group.append(read)
            total += nbytes
        if group:
            yield group, total
