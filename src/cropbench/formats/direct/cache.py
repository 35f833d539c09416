"""Cache use: decoded chunks kept in an LRU bounded in bytes, the arrays it lets go set aside to
decode into again, the chunks the store lacks, and the counts of what was loaded."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

from cropbench.formats.base import LruCache, ReadStats

#: A chunk loaded: (chunk key, its decoded array, whether it was decoded; False: the fill value).
LoadedChunk = tuple[int, np.ndarray, bool]


class Loaded(NamedTuple):
    """What loading some reads gave: the chunks, bytes read, read calls, and the pieces of those
    chunks left to copy (:data:`~.records.PIECE` records; the native loads copy the others while
    decoding). Made per load call: a named tuple costs half a frozen dataclass's construction."""

    chunks: list[LoadedChunk]
    fetched: int
    reads: int
    left: np.ndarray


class ChunkCache:
    """The decoded chunks of one reader (per process), and what the native loads decode into.

    ``spare`` holds chunk arrays the LRU let go, of the one (shape, dtype) in ``spare_kind``, about
    as many as a batch loads: the native loads decode into one only when nothing else holds it,
    rather than allocating (and freeing) an array per chunk.

    Decode threads and the prefetch keep chunks while a batch looks its chunks up: both go through
    :meth:`get_many` and :meth:`keep`, under one lock.
    """

    def __init__(self, budget: int, stats: ReadStats) -> None:
        self.lru: LruCache[int, np.ndarray] = LruCache(budget)
        self.stats = stats
        self.spare: list[np.ndarray] = []
        self.spare_kind: tuple[tuple[int, int, int], np.dtype] | None = None
        #: Keys of chunks the store lacks (read as the fill value).
        self.missing: set[int] = set()
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def _locked(self) -> threading.Lock:
        """The lock of this process: in a forked worker a parent's prefetch thread may have held it at the fork."""
        if self._pid != os.getpid():
            self._lock, self._pid = threading.Lock(), os.getpid()
        return self._lock

    def clear(self) -> None:
        with self._locked():
            self.lru.clear()
            self.spare.clear()
            self.missing.clear()

    def get_many(self, keys: Iterable[int]) -> dict[int, np.ndarray]:
        """The chunks held of ``keys``, each marked as just used."""
        with self._locked():
            return self.lru.get_many(keys)

    def absent(self, keys: Iterable[int]) -> list[int]:
        """Which of ``keys`` the cache does not hold (without marking the others used)."""
        with self._locked():
            held = self.lru
            return [key for key in keys if key not in held]

    def absent_keeping(self, keys: Iterable[int]) -> list[int]:
        """Which of ``keys`` the cache does not hold, marking those it holds as just used: the chunks a
        coming batch will read from the cache must outlive what is fetched before it is read."""
        wanted = list(keys)
        with self._locked():
            held = self.lru.get_many(wanted)
            return [key for key in wanted if key not in held]

    def count_fetched(self, nbytes: int, reads: int) -> None:
        """Count bytes read for something other than chunks (a shard index)."""
        with self._locked():
            self.stats.bytes_fetched += nbytes
            self.stats.reads += reads

    def keep(self, loaded: Loaded) -> None:
        """Cache the chunks loaded and count the reads and decodes."""
        with self._locked():
            self._keep(loaded)

    def _keep(self, loaded: Loaded) -> None:
        stats = self.stats
        stats.bytes_fetched += loaded.fetched
        stats.reads += loaded.reads
        results = loaded.chunks
        dropped = self.lru.put_many([(key, chunk) for key, chunk, _ in results])
        if dropped and self.spare_kind is not None:
            self._recycle(dropped, 2 * len(results))
        decoded = [chunk.nbytes for _, chunk, was_decoded in results if was_decoded]
        stats.bytes_decoded += sum(decoded)
        stats.chunks_decoded += len(decoded)
        if len(decoded) < len(results):
            self.missing.update(key for key, _, was_decoded in results if not was_decoded)

    def _recycle(self, dropped: list[np.ndarray], limit: int) -> None:
        """Set aside the chunk arrays of ``spare_kind`` that numpy owns among ``dropped``, keeping at most ``limit``."""
        shape, dtype = self.spare_kind  # type: ignore[misc]
        spare = self.spare
        spare.extend(chunk for chunk in dropped if chunk.base is None and chunk.shape == shape and chunk.dtype == dtype)
        if len(spare) > limit:
            del spare[: len(spare) - limit]

    def count_touches(self, pieces: np.ndarray) -> None:
        """Count the chunks the pieces (:data:`~.records.PIECE` records) touched, and those among them
        the store lacks."""
        self.stats.chunks_touched += len(pieces)
        if self.missing:
            absent = np.fromiter(self.missing, dtype=np.int64, count=len(self.missing))
            self.stats.missing_chunks += int(np.isin(pieces["key"], absent).sum())
