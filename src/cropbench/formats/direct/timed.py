"""The direct reader with a clock around each stage, for the per-stage time split only."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from cropbench.config import DEFAULT_CHUNK_CACHE_BYTES
from cropbench.formats.base import PlateMetadata, Regions
from cropbench.formats.direct.cache import ChunkCache
from cropbench.formats.direct.layout import ChunkLayout, FieldLayouts
from cropbench.formats.direct.loads import ChunkLoader
from cropbench.formats.direct.reader import DirectChunkReader
from cropbench.formats.sources import ByteSource, Request


class StageTimedChunkLoader(ChunkLoader):
    """The loads with fetch and decode clocks and counters, added to under a lock by every decode
    thread; on the native loads the extension keeps the two clocks (per read, per run of decodes)
    and counts the decodes."""

    def __init__(self, layouts: FieldLayouts, cache: ChunkCache, source: Callable[[], ByteSource]) -> None:
        super().__init__(layouts, cache, source)
        self.stage_ns = {"fetch": 0, "decode": 0, "region": 0}
        self.decode_calls = 0
        self.decoded_bytes = 0
        self._lock = threading.Lock()

    def native_loaded(self, fetch_ns: int, decode_ns: int, chunks: int, nbytes: int) -> None:
        self.add(fetch_ns, decode_ns, chunks, nbytes)

    def fetch(self, requests: list[Request]) -> list[bytes | None]:
        began = time.perf_counter_ns()
        data = super().fetch(requests)
        self.add(fetch_ns=time.perf_counter_ns() - began)
        return data

    def decode(self, field_index: int, layout: ChunkLayout, key: int, encoded: memoryview) -> np.ndarray:
        began = time.perf_counter_ns()
        chunk = super().decode(field_index, layout, key, encoded)
        self.add(decode_ns=time.perf_counter_ns() - began, chunks=1, nbytes=chunk.nbytes)
        return chunk

    def add(self, fetch_ns: int = 0, decode_ns: int = 0, chunks: int = 0, nbytes: int = 0) -> None:
        """Add to the fetch and decode clocks and counters, from any decode thread."""
        with self._lock:
            self.stage_ns["fetch"] += fetch_ns
            self.stage_ns["decode"] += decode_ns
            self.decode_calls += chunks
            self.decoded_bytes += nbytes


class StageTimedChunkReader(DirectChunkReader):
    """The direct path with a clock around each stage, for the per-stage time split only.

    ``stage_ns`` accumulates fetch (file reads), decode (codecs) and region (everything in
    ``read_region`` / ``read_regions``: planning, cache lookups, fetch, decode and assembly).
    With ``decode_threads`` > 1 fetch and decode add up the time of every thread.
    ``decode_calls`` and ``decoded_bytes`` count the work the decode step did (every call, its
    output's bytes), which the stats' per-chunk counters do not see when a chunk is decoded more
    than once.
    """

    loader_class = StageTimedChunkLoader
    loader: StageTimedChunkLoader

    def __init__(
        self, metadata: PlateMetadata, chunk_cache_bytes: int = DEFAULT_CHUNK_CACHE_BYTES, decode_threads: int = 1
    ) -> None:
        super().__init__(metadata, chunk_cache_bytes, decode_threads)
        self.stage_ns = self.loader.stage_ns

    @property
    def decode_calls(self) -> int:
        return self.loader.decode_calls

    @property
    def decoded_bytes(self) -> int:
        return self.loader.decoded_bytes

    def read_region(
        self,
        field_index: int,
        y0: int,
        y1: int,
        x0: int,
        x1: int,
        channels: np.ndarray | None = None,
        out: np.ndarray | None = None,
        window: tuple[int, int] | None = None,
    ) -> np.ndarray:
        start = time.perf_counter_ns()
        result = super().read_region(field_index, y0, y1, x0, x1, channels, out, window)
        self.stage_ns["region"] += time.perf_counter_ns() - start
        return result

    def read_regions(
        self,
        regions: Regions,
        out: np.ndarray,
        channels: np.ndarray | None = None,
        meanwhile: Callable[[], Any] | None = None,
    ) -> np.ndarray:
        start = time.perf_counter_ns()
        result = super().read_regions(regions, out, channels)
        self.stage_ns["region"] += time.perf_counter_ns() - start
        if meanwhile is not None:  # after the clock: the caller's work is no stage of the reader's
            meanwhile()
        return result
