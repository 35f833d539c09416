"""The direct decode path's reader: the stages of this package composed behind the reader interface.

zarr-python's Python and asyncio machinery per slicing call, not the decoding, dominates the cost of
random single-cell access. This reader reads the same chunk files with the store's own codecs
(numcodecs' Blosc and Zstd; on a local plate, blosc and raw chunks are read and decoded by the C
extension with numcodecs' own c-blosc), keeps decoded chunks in a per-process LRU bounded in bytes,
and copies the intersection of each chunk into a preallocated output.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Self

import numcodecs.blosc
import numpy as np

from cropbench.config import DEFAULT_CHUNK_CACHE_BYTES, PrefetchConfig, ReaderOptions, coalesce_gap
from cropbench.errors import ConfigError, StoreError
from cropbench.formats.atlas import FieldRun, find_atlases
from cropbench.formats.base import PlateMetadata, PlateReader, Regions
from cropbench.formats.direct.cache import ChunkCache
from cropbench.formats.direct.keys import FIELD_SHIFT, MAX_FIELDS
from cropbench.formats.direct.layout import ChunkLayout, FieldLayouts
from cropbench.formats.direct.loads import ChunkLoader
from cropbench.formats.direct.planning import PiecePlanner
from cropbench.formats.direct.prefetch import Prefetcher
from cropbench.formats.direct.reads import ReadPlanner
from cropbench.formats.direct.scheduling import BatchScheduler, DecodeThreads
from cropbench.formats.direct.shards import ShardIndex
from cropbench.formats.sources import ByteSource, open_source


class ProcessSource:
    """The plate's byte source, opened once per process (a forked worker opens its own, and forgets
    what the parent read of the shard indexes: ``on_open``)."""

    def __init__(self, metadata: PlateMetadata, on_open: Callable[[], Any]) -> None:
        self.metadata = metadata
        self._on_open = on_open
        self._source: ByteSource | None = None
        self._pid = 0

    def __call__(self) -> ByteSource:
        if self._source is None or self._pid != os.getpid():
            self._source = open_source(self.metadata.path, self.metadata.remote)
            self._pid = os.getpid()
            self._on_open()
        return self._source

    def close(self) -> None:
        if self._source is not None and self._pid == os.getpid():
            self._source.close()
        self._source = None


class DirectChunkReader(PlateReader):
    """Decode path ``direct``: chunk math, direct file reads, store codecs, LRU of decoded chunks.

    Every read, one region or a batch, goes through the same stages: plan the (crop, chunk) pieces
    (:mod:`.planning`), look each needed chunk up once in the cache (:mod:`.cache`), plan the reads
    of the missing ones, adjacent byte ranges of a shard coalesced into one (:mod:`.reads`,
    :mod:`.shards`), load each chunk once (:mod:`.loads`), then copy every piece into the output
    (:mod:`.copies`), over ``decode_threads`` threads (:mod:`.scheduling`). Bytes come from a
    :class:`~cropbench.formats.sources.ByteSource`: ``os.pread`` on local files, or range GETs on a
    plate in an object store (ranges closer than the store's ``coalesce_gap_bytes`` merged, the
    requests of a batch kept ``in_flight`` at once; no wider a gap than the plate's layout names,
    :func:`~cropbench.config.coalesce_gap`). The byte source and the shard indexes are opened once
    per process and kept.

    Told the batches it will be asked for next (:meth:`prefetch`), it reads their chunks into its
    cache while the current batch decodes (:mod:`.prefetch`; ``prefetch.batches`` of them, by
    default over an object store only).
    """

    decode = "direct"
    #: The loads stage; a reader with stage clocks swaps in its own.
    loader_class: type[ChunkLoader] = ChunkLoader

    def __init__(
        self,
        metadata: PlateMetadata,
        chunk_cache_bytes: int = DEFAULT_CHUNK_CACHE_BYTES,
        decode_threads: int = 1,
        prefetch: PrefetchConfig | None = None,
    ) -> None:
        super().__init__(metadata)
        if not isinstance(decode_threads, int) or decode_threads < 1:
            raise ConfigError(f"decode_threads must be an integer >= 1, got {decode_threads!r}")
        #: The plate's crop atlases, read as the fields after its own (:mod:`cropbench.formats.atlas`).
        self.atlases = find_atlases(metadata)
        #: The run of one field this reader has just read: a long one reads the fields, not the atlases.
        self.field_run = FieldRun()
        if len(metadata.fields) + len(self.atlases) > MAX_FIELDS:
            raise StoreError(
                f"the direct decode path reads at most {MAX_FIELDS} fields, the plate has "
                f"{len(metadata.fields)}; use decode='zarr'"
            )
        self.chunk_cache_bytes = chunk_cache_bytes
        self.decode_threads = decode_threads
        self.prefetch_config = prefetch or PrefetchConfig()
        remote = metadata.remote
        #: Batches read ahead of the one asked for, once told which come next (0: none).
        self.prefetch_batches = self.prefetch_config.batches_for(remote is not None)
        first_atlas = len(metadata.fields)
        self.layouts = FieldLayouts(
            metadata,
            local=remote is None,
            extra={first_atlas + k: (atlas.array_path, atlas.array) for k, atlas in enumerate(self.atlases)},
        )
        self.cache = ChunkCache(chunk_cache_bytes, self.stats)
        self.shards = ShardIndex(self.layouts, self.cache.count_fetched)
        self._source = ProcessSource(metadata, self.shards.forget)
        self.pieces = PiecePlanner(self.layouts, metadata.field_shape[0])
        #: Byte ranges of a shard at most this far apart are read as one (over a store; 0 on a local plate).
        self.coalesce_gap = coalesce_gap(remote["store"], metadata.attributes.get("layout")) if remote else 0
        self.reads = ReadPlanner(self.layouts, self.shards, self.coalesce_gap)
        self.loader = self.loader_class(self.layouts, self.cache, self._source)
        self.threads = DecodeThreads(decode_threads)
        self.scheduler = BatchScheduler(self.cache, self.reads, self.loader, self.threads, self._source)
        self.prefetcher = (
            Prefetcher(
                self.prefetch_config,
                self.prefetch_batches,
                self.layouts,
                self.pieces,
                self.cache,
                self.reads,
                self.loader,
                self._source,
            )
            if self.prefetch_batches
            else None
        )
        numcodecs.blosc.use_threads = False

    @classmethod
    def from_options(cls, metadata: PlateMetadata, options: ReaderOptions) -> Self:
        return cls(
            metadata,
            chunk_cache_bytes=options.chunk_cache_bytes,
            decode_threads=options.decode_threads,
            prefetch=options.prefetch,
        )

    def _config_state(self) -> dict[str, Any]:
        return {
            "chunk_cache_bytes": self.chunk_cache_bytes,
            "decode_threads": self.decode_threads,
            "prefetch": self.prefetch_config,
        }

    def close(self) -> None:
        if self.prefetcher is not None:  # first: no prefetch thread may cache into what is cleared
            self.prefetcher.close()
        self.cache.clear()
        self.shards.forget()
        self._source.close()
        self.threads.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: os may already be gone
            self.close()

    def grain(self) -> tuple[int, int]:
        chunk = self.layouts.get(0).chunk
        return chunk[-2], chunk[-1]

    def files(self) -> list[Path]:
        return [] if self.metadata.remote else super().files()

    @property
    def source(self) -> ByteSource:
        """Where the bytes come from, opened once per process (a forked worker opens its own)."""
        return self._source()

    def routed(self, regions: Regions, count: bool = False, run: FieldRun | None = None) -> tuple[Regions, FieldRun]:
        """``regions``, read after ``run`` (the reader's own by default), with those a crop atlas holds
        whole read from there (the same pixels, fewer bytes) unless they are read in a grouped run of
        their field (:meth:`~cropbench.formats.atlas.FieldRun.in_fields`); and the run after them. A read
        (``count``) counts them in ``stats.atlas_regions`` and keeps the run."""
        if not self.atlases:
            return regions, FieldRun()
        stay, after = (run or self.field_run).in_fields(regions.field)
        regions, moved = self._to_atlases(regions, stay)
        if count:
            self.stats.atlas_regions += moved
            self.field_run = after
        return regions, after

    def _to_atlases(self, regions: Regions, stay: np.ndarray | None) -> tuple[Regions, int]:
        """``regions`` with those an atlas holds whole moved there, but the ``stay`` ones; how many moved."""
        moved = 0
        for k, atlas in enumerate(self.atlases):
            regions, into = atlas.route(regions, len(self.metadata.fields) + k, stay)
            moved += into
        return regions, moved

    def _fill(
        self, out: np.ndarray, field_index: int, y0: int, y1: int, x0: int, x1: int, channels: np.ndarray | None
    ) -> None:
        self._fill_crop(out, field_index, y0, y1, x0, x1, channels, (y0, x0))

    def _fill_crop(
        self,
        out: np.ndarray,
        field_index: int,
        y0: int,
        y1: int,
        x0: int,
        x1: int,
        channels: np.ndarray | None,
        window: tuple[int, int],
    ) -> None:
        """One region, from a crop atlas where a cell holds it whole and no grouped run reads its field."""
        if self.atlases:
            self.field_run = self.field_run.extend_one(field_index)
        for k, atlas in enumerate([] if self.field_run.grouped else self.atlases):
            moved = atlas.route_one(field_index, y0, y1, x0, x1, window)
            if moved is not None:
                self.stats.atlas_regions += 1
                field_index, (y0, y1, x0, x1) = len(self.metadata.fields) + k, moved
                break
        self.scheduler.execute(self.pieces.plan_region(field_index, y0, y1, x0, x1, channels), out[None])

    def read_regions(
        self,
        regions: Regions,
        out: np.ndarray,
        channels: np.ndarray | None = None,
        meanwhile: Callable[[], Any] | None = None,
    ) -> np.ndarray:
        """Fill ``out`` (B, channels, H, W) with the regions of a batch, planned and read together.

        ``meanwhile`` is the caller's own work for the batch, which may write into ``out`` only outside
        the regions (a crop's padding): with decode threads it runs on the calling thread while the
        threads decode, with one thread after the reads."""
        self._check_regions(regions, out)
        plan = self.pieces.plan_regions(self.routed(regions, count=True)[0], channels)
        if self.prefetcher is None:
            self.scheduler.execute(plan, out, meanwhile)
        else:
            claimed = self.prefetcher.before_read(plan.runs)
            try:
                self.scheduler.execute(plan, out, meanwhile)
            finally:
                self.prefetcher.after_read(claimed)
        self.stats.regions += len(regions)
        areas = (regions.y1 - regions.y0) * (regions.x1 - regions.x0)
        self.stats.bytes_delivered += int(areas.sum()) * out.shape[1] * out.itemsize
        return out

    def prefetch(self, upcoming: Sequence[Regions], channels: np.ndarray | None = None) -> None:
        """The regions of the batches this process reads next, nearest first: their chunks are fetched
        into the cache in the background (a hint: a no-op when prefetch is off, and the reads give the
        same bytes whatever was prefetched)."""
        if self.prefetcher is not None and upcoming:
            run, hinted = self.field_run, []
            for regions in upcoming:  # each batch after the ones before it
                routed, run = self.routed(regions, run=run)
                hinted.append(routed)
            self.prefetcher.hint(hinted, channels)

    def region_chunks(self, regions: Regions, grouped: bool = False) -> list[np.ndarray]:
        """The keys of the chunks each region needs (every channel), as the reader plans it read alone,
        or in a grouped run of its field (``grouped``: the field's chunks, never an atlas's): what
        decoding the region costs, whatever the cache holds."""
        routed = regions if grouped else self._to_atlases(regions, None)[0]
        pieces = self.pieces.plan_regions(routed, None).pieces
        by_slot = np.argsort(pieces["slot"], kind="stable")
        slots, keys = pieces["slot"][by_slot], pieces["key"][by_slot]
        bounds = np.searchsorted(slots, np.arange(len(regions) + 1))
        return [np.unique(keys[start:end]) for start, end in zip(bounds[:-1], bounds[1:], strict=True)]

    def stored_chunks(self, keys: Sequence[int]) -> dict[int, tuple[bytes, ChunkLayout]]:
        """The bytes each chunk of ``keys`` is stored as (before its codecs), read once, with its
        array's layout; chunks the store lacks (they read as the fill value) are left out. For
        measurements that decode the same chunks without the reader (nothing is cached or counted)."""
        wanted = sorted({int(key) for key in keys})
        for field_index in sorted({key >> FIELD_SHIFT for key in wanted}):
            self.layouts.get(field_index)
        reads = [
            (key, start, length, entries)
            for key, start, length, entries in self.reads.plan(wanted, self.source)[0]
            if key
        ]
        fetched = self.loader.fetch([(key, start, length) for key, start, length, _ in reads])
        stored: dict[int, tuple[bytes, ChunkLayout]] = {}
        for (_, _, _, entries), data in zip(reads, fetched, strict=True):
            if data is None:
                continue
            for key, offset, size in entries:
                layout = self.layouts.layouts[key >> FIELD_SHIFT]
                stored[key] = (data if size < 0 else data[offset : offset + size], layout)
        return stored

    def region_chunk_bytes(self, height: int, width: int, channels: np.ndarray | None = None) -> int:
        """The most decoded chunk bytes one ``height`` x ``width`` region of ``channels`` may touch,
        wherever it lies on the chunk grid (the plate's fields share one layout)."""
        layout = self.layouts.get(0)
        _, chunk_y, chunk_x = layout.chunk_cyx
        _, field_height, field_width = self.metadata.field_shape
        rows = min(-(-(height - 1) // chunk_y) + 1, -(-field_height // chunk_y))
        columns = min(-(-(width - 1) // chunk_x) + 1, -(-field_width // chunk_x))
        return rows * columns * len(self.pieces.channels(layout, channels).groups) * layout.chunk_bytes

    def hold_read_ahead(self, batch_chunk_bytes: int) -> int:
        """The batches read ahead, with the chunk cache holding their chunks and the batch being read
        (``batch_chunk_bytes`` each, at most), or prefetched chunks would be evicted before they are
        read. Read-ahead asked for (``prefetch.batches``) that does not fit is refused; by default
        (over an object store) the cache grows to hold it."""
        ahead = self.prefetch_batches
        needed = (ahead + 1) * batch_chunk_bytes
        if not ahead or needed <= self.chunk_cache_bytes:
            return ahead
        if self.prefetch_config.batches is not None:
            raise ConfigError(
                f"chunk_cache_bytes={self.chunk_cache_bytes} cannot hold the chunks of {ahead + 1} batches "
                f"(prefetch batches={ahead} read ahead and the one read: up to {needed} bytes); raise "
                f"chunk_cache_bytes to {needed} or lower PrefetchConfig(batches=...) (0: no read-ahead)"
            )
        self.chunk_cache_bytes = self.cache.lru.budget = needed
        return ahead

    def cancel_prefetch(self) -> None:
        """Drop the batches hinted and not yet fetched (the order changed: a new epoch)."""
        if self.prefetcher is not None:
            self.prefetcher.cancel()
