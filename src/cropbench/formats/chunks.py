"""The direct decode path: find the chunks a crop touches, read and decode them, assemble the crop.

zarr-python spends ~0.2–0.4 ms of Python and asyncio machinery per slicing call, which dominates
random single-cell access. This module reads the same chunk files with the store's own codecs
(numcodecs' Blosc and Zstd; on a local plate, blosc and raw chunks are read and decoded by the C
extension ``_native`` with numcodecs' own c-blosc), keeps decoded chunks in a per-process LRU
bounded in bytes, and copies the intersection of each chunk into a preallocated output. It supports the layouts
zarr-python writes for (c, y, x) or singleton-(t, z) uint arrays: zarr v3 with ``bytes`` +
``blosc``/``zstd``/``gzip``/``crc32c`` codecs, optionally inside ``sharding_indexed``, and zarr
v2 with a Blosc/Zstd/GZip/Zlib compressor and no filters.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numcodecs
import numcodecs.blosc
import numpy as np

from cropbench.errors import ConfigError, StoreError
from cropbench.formats.base import LruCache, PlateMetadata, PlateReader, Regions
from cropbench.formats.ngff import read_array_document
from cropbench.formats.sources import ByteSource, FileSource, Request, open_source

try:
    import cropbench.formats._native as _native
except ImportError:  # built without a C compiler: the same loads and copies run in Python
    _native = None
_copy_pieces_native = None if _native is None else _native.copy_pieces
_load_chunks_native = None if _native is None else _native.load_chunks
_plan_pieces_native = None if _native is None else _native.plan_pieces
#: Whether the native loads can decode blosc: they call numcodecs' own c-blosc, found in its module.
_NATIVE_BLOSC = _native is not None and _native.bind_blosc(numcodecs.blosc.__file__)
#: The codecs the native loads handle, as they name them: none (raw bytes), and blosc.
_NATIVE_RAW, _NATIVE_BLOSC_CODE = 0, 1

Decoder = Callable[[bytes], bytes]
BLOSC_HEADER_BYTES = 16


@dataclass(frozen=True)
class ChunkLayout:
    """How one zarr array stores its chunks on disk, reduced to what decoding needs."""

    shape: tuple[int, ...]
    dtype: np.dtype
    read_unit: tuple[int, ...]
    inner_chunk: tuple[int, ...] | None
    zarr_format: int
    separator: str
    v3_prefix: bool
    decoders: tuple[Decoder, ...]
    index_decoders_checksum: bool
    index_at_end: bool
    fill_value: int | float
    channel_axis: int = -3

    @property
    def chunk(self) -> tuple[int, ...]:
        """The unit that is decoded and cached: the inner chunk when sharded."""
        return self.inner_chunk or self.read_unit

    @functools.cached_property
    def chunk_items(self) -> int:
        return int(np.prod(self.chunk))

    def filled_chunk(self) -> np.ndarray:
        """A decoded chunk that holds only the fill value: what an absent chunk reads as."""
        return np.full(self.chunk_cyx, self.fill_value, dtype=self.dtype)

    @functools.cached_property
    def chunk_cyx(self) -> tuple[int, int, int]:
        """A decoded chunk as (c, y, x): singleton t/z axes (NGFF t, c, z, y, x) dropped."""
        chunk = self.chunk
        return chunk[self.channel_axis], chunk[-2], chunk[-1]

    @functools.cached_property
    def per_shard(self) -> tuple[int, ...]:
        """Inner chunks per shard along each axis (all ones when not sharded)."""
        if self.inner_chunk is None:
            return (1,) * len(self.read_unit)
        return tuple(r // i for r, i in zip(self.read_unit, self.inner_chunk, strict=True))

    def coords(self, c_index: int, y_index: int, x_index: int) -> tuple[int, ...]:
        """Grid coordinates of (c, y, x) chunk or shard indices, zeros on singleton t/z axes."""
        coords = [0] * len(self.shape)
        coords[self.channel_axis], coords[-2], coords[-1] = c_index, y_index, x_index
        return tuple(coords)

    @functools.cached_property
    def shard_cyx(self) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """Inner chunks per shard along (c, y, x), and each axis' stride in the shard index (C order)."""
        per_shard = self.per_shard
        strides = [int(np.prod(per_shard[axis + 1 :])) for axis in range(len(per_shard))]
        axes = (self.channel_axis, -2, -1)
        return (tuple(per_shard[a] for a in axes), tuple(strides[a] for a in axes))  # type: ignore[return-value]

    @functools.cached_property
    def shard_entries(self) -> int:
        return int(np.prod(self.per_shard))

    def key(self, coords: tuple[int, ...]) -> str:
        joined = self.separator.join(map(str, coords))
        return f"c{self.separator}{joined}" if self.v3_prefix else joined


def _bytes_decoder(codec: dict[str, Any]) -> Decoder | None:
    name = codec["name"]
    config = codec.get("configuration", {})
    if name == "blosc":
        return _blosc_decompress
    if name == "zstd":
        return numcodecs.Zstd(level=config.get("level", 0)).decode
    if name == "gzip":
        return numcodecs.GZip(level=config.get("level", 1)).decode
    if name == "crc32c":
        return _checked_crc32c  # type: ignore[return-value]
    raise StoreError(f"codec {name!r} is not supported by the direct decode path; use decode='zarr'")


def _blosc_decompress(data: Any) -> bytes:
    """numcodecs' blosc decompression, once the chunk holds every byte its header counts: c-blosc
    does not know the buffer's length and would read past a truncated chunk's end."""
    view = memoryview(data)
    if len(view) < BLOSC_HEADER_BYTES:
        raise ValueError(f"truncated: {len(view)} bytes, less than a blosc header")
    compressed = int.from_bytes(view[12:16], "little")
    if compressed > len(view):
        raise ValueError(f"truncated: the blosc header counts {compressed} bytes, the chunk has {len(view)}")
    return numcodecs.blosc.decompress(view)


def _checked_crc32c(data: Any) -> memoryview:
    """The chunk without its trailing crc32c, once the checksum matches (zarr-python checks it too)."""
    view = memoryview(data)
    if len(view) < 4 or _crc32c(view[:-4]) != int.from_bytes(view[-4:], "little"):  # type: ignore[arg-type]
        raise ValueError("crc32c checksum mismatch")
    return view[:-4]


def _v2_decoder(compressor: dict[str, Any] | None) -> tuple[Decoder, ...]:
    if compressor is None:
        return ()
    codec_id = compressor.get("id")
    if codec_id == "blosc":
        return (_blosc_decompress,)
    if codec_id in ("zstd", "gzip", "zlib"):
        return (numcodecs.get_codec(compressor).decode,)
    raise StoreError(f"v2 compressor {codec_id!r} is not supported by the direct decode path; use decode='zarr'")


def read_chunk_layout(array_dir: Path) -> ChunkLayout:
    """Parse the array metadata into a :class:`ChunkLayout`, or say why it is unsupported."""
    document = read_array_document(array_dir)
    if document.get("zarr_format") == 2:
        if document.get("filters"):
            raise StoreError(f"{array_dir}: v2 filters are not supported by the direct decode path")
        if document.get("order", "C") != "C":
            raise StoreError(f"{array_dir}: Fortran-ordered chunks are not supported by the direct decode path")
        return ChunkLayout(
            shape=tuple(document["shape"]),
            dtype=np.dtype(document["dtype"]),
            read_unit=tuple(document["chunks"]),
            inner_chunk=None,
            zarr_format=2,
            separator=document.get("dimension_separator", "."),
            v3_prefix=False,
            decoders=_v2_decoder(document.get("compressor")),
            index_decoders_checksum=False,
            index_at_end=True,
            fill_value=document.get("fill_value") or 0,
        )
    codecs = document["codecs"]
    inner_chunk = None
    checksum, index_at_end = False, True
    if codecs[0]["name"] == "sharding_indexed":
        sharding = codecs[0]["configuration"]
        inner_chunk = tuple(sharding["chunk_shape"])
        checksum = any(c["name"] == "crc32c" for c in sharding.get("index_codecs", []))
        index_at_end = sharding.get("index_location", "end") == "end"
        codecs = sharding["codecs"]
    if codecs[0]["name"] != "bytes":
        raise StoreError(f"{array_dir}: codec {codecs[0]['name']!r} is not supported by the direct decode path")
    endian = codecs[0].get("configuration", {}).get("endian", "little")
    dtype = np.dtype(document["data_type"]).newbyteorder("<" if endian == "little" else ">")
    decoders = tuple(d for d in (_bytes_decoder(c) for c in codecs[1:]) if d is not None)
    encoding = document.get("chunk_key_encoding", {"name": "default"})
    separator = encoding.get("configuration", {}).get("separator", "/" if encoding["name"] == "default" else ".")
    return ChunkLayout(
        shape=tuple(document["shape"]),
        dtype=dtype,
        read_unit=tuple(document["chunk_grid"]["configuration"]["chunk_shape"]),
        inner_chunk=inner_chunk,
        zarr_format=3,
        separator=separator,
        v3_prefix=encoding["name"] == "default",
        decoders=tuple(reversed(decoders)),
        index_decoders_checksum=checksum,
        index_at_end=index_at_end,
        fill_value=document.get("fill_value") or 0,
    )


#: A decoded chunk's cache key is one int: field | channel chunk | y chunk | x chunk, these many bits
#: each, so a batch's keys come from array arithmetic and are compared as plain ints.
_X_BITS = _Y_BITS = 16
_C_BITS = 12
_C_SHIFT = _X_BITS + _Y_BITS
_FIELD_SHIFT = _C_SHIFT + _C_BITS
_MAX_FIELDS = 2 ** (63 - _FIELD_SHIFT)
#: Below this many chunks to read, a read plan is made with integer arithmetic per chunk rather than
#: array calls over them (each array call costs a few microseconds however small the array).
FEW_KEYS = 48
#: Fewest (crop, chunk) pieces before copying them is split over the decode threads (below it,
#: handing work to a thread costs more than the copies).
PARALLEL_COPY_PIECES = 64
#: Parts a threaded batch (of at least :data:`FEW_KEYS` chunks to load) is cut into per decode
#: thread: the threads take them one at a time, so one that starts late (woken up, waiting for the
#: GIL) or decodes slower takes fewer, and one thread's Python runs while the others decode.
#: Interleaved in one process, 2 threads over 1 on the full plate (random; grouped by field):
#: 1.37-1.45x and 1.30-1.38x with one part per thread, 1.51-1.54x and 1.39-1.42x with 4.
SHARES_PER_THREAD = 4


#: One (crop, chunk) intersection: the chunk's key, the crop's slot in the output, the channels
#: (positions in the output, offsets inside the chunk), the rectangle inside the chunk
#: (sy0, sy1, sx0, sx1) and where it lands in the slot (dy0, dy1, dx0, dx1).
_Piece = tuple[int, int, Any, Any, int, int, int, int, int, int, int, int]


#: What loading some units gives: (key, chunk, decoded?) each, bytes read, reads, the pieces left to copy.
_Loaded = tuple[list[tuple[int, np.ndarray, bool]], int, int, list[_Piece]]

#: One read: (field, object, start, length, [(key, offset in what was read, size or -1 for all)]).
#: ``object`` is a chunk's or shard's key under the plate (``length`` -1: the whole object), or None
#: (absent: fill value).
_Unit = tuple[int, str | None, int, int, list[tuple[int, int, int]]]


class DirectChunkReader(PlateReader):
    """Decode path ``direct``: chunk math, direct file reads, store codecs, LRU of decoded chunks.

    Every read, one region or a batch, goes through one planner: list the (crop, chunk) pieces,
    look each needed chunk up once in the cache, read the missing ones with adjacent byte ranges of
    a shard coalesced into one read, decode each once, then copy every piece into the output.
    Bytes come from a :class:`~cropbench.formats.sources.ByteSource`: ``os.pread`` on local files,
    or range GETs on a plate in an object store (ranges closer than the store's
    ``coalesce_gap_bytes`` merged, the requests of a batch kept ``in_flight`` at once). On a local
    plate the reads, decodes and copies of a batch run in C without the GIL, each chunk's pieces
    copied right after its decode. With ``decode_threads`` > 1, the batch's chunks in disk order
    are cut into stretches (a few per thread of a small pool), each thread taking the next stretch
    when done with one, reading and decoding it and copying the pieces of those chunks (before
    that, a pool thread plans the reads while the calling thread copies half the cached chunks'
    pieces; the other half comes last); blosc itself runs single-threaded
    (``numcodecs.blosc.use_threads = False``) so threads never multiply. The byte source and the
    shard indexes are opened once per process and kept. The native loads decode into arrays the
    cache evicted (about a batch's worth is set aside, and one is reused only when nothing else
    holds it) rather than allocating and freeing one per chunk.
    """

    decode = "direct"

    def __init__(
        self,
        metadata: PlateMetadata,
        chunk_cache_bytes: int = 64 * 2**20,
        decode_threads: int = 1,
    ) -> None:
        super().__init__(metadata)
        if not isinstance(decode_threads, int) or decode_threads < 1:
            raise ConfigError(f"decode_threads must be an integer >= 1, got {decode_threads!r}")
        if len(metadata.fields) > _MAX_FIELDS:
            raise StoreError(
                f"the direct decode path reads at most {_MAX_FIELDS} fields, the plate has "
                f"{len(metadata.fields)}; use decode='zarr'"
            )
        self.chunk_cache_bytes = chunk_cache_bytes
        self.decode_threads = decode_threads
        self._cache: LruCache[int, np.ndarray] = LruCache(chunk_cache_bytes)
        #: Chunk arrays the cache let go, to decode into again instead of allocating (and freeing) one per
        #: chunk: of the one (shape, dtype) in ``_spare_kind``, about as many as a batch loads.
        self._spare: list[np.ndarray] = []
        self._spare_kind: tuple[tuple[int, int, int], np.dtype] | None = None
        self._missing: set[int] = set()  # keys of chunks the store lacks (read as the fill value)
        self._layouts: dict[int, ChunkLayout] = {}
        self._geometries: set[Any] = set()  # of the fields' layouts read so far
        self._native_codecs: dict[int, int | None] = {}  # per field: what load_chunks calls its codec, or None
        self._bases: dict[int, str] = {}
        self._shards: dict[int, tuple[str, int] | None] = {}  # shard id -> (key, first row in the index table)
        self._index_table = np.empty((0, 2), dtype=np.int64)
        self._index_pending: list[np.ndarray] = []
        self._remote = metadata.remote
        self._coalesce_gap = int(self._remote["store"]["coalesce_gap_bytes"]) if self._remote else 0
        self._byte_source: ByteSource | None = None
        self._source_pid = 0
        self._channel_group_cache: dict[tuple[int, tuple[int, ...] | None], list[tuple[int, Any, Any]]] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._executor_pid = 0
        self._keep_lock = threading.Lock()  # decode threads cache and count what they loaded
        numcodecs.blosc.use_threads = False

    def _config_state(self) -> dict[str, Any]:
        return {"chunk_cache_bytes": self.chunk_cache_bytes, "decode_threads": self.decode_threads}

    def close(self) -> None:
        self._cache.clear()
        self._spare.clear()
        self._missing.clear()
        self._forget_shards()
        if self._byte_source is not None and self._source_pid == os.getpid():
            self._byte_source.close()
        self._byte_source = None
        if self._executor is not None and self._executor_pid == os.getpid():
            self._executor.shutdown(wait=False)
        self._executor = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: os may already be gone
            self.close()

    def _forget_shards(self) -> None:
        self._shards.clear()
        self._index_table = np.empty((0, 2), dtype=np.int64)
        self._index_pending = []

    def grain(self) -> tuple[int, int]:
        chunk = self._layout(0).chunk
        return chunk[-2], chunk[-1]

    def files(self) -> list[Path]:
        return [] if self._remote else super().files()

    @property
    def source(self) -> ByteSource:
        """Where the bytes come from, opened once per process (a forked worker opens its own)."""
        if self._byte_source is None or self._source_pid != os.getpid():
            self._byte_source = open_source(self.metadata.path, self._remote)
            self._source_pid = os.getpid()
            self._forget_shards()
        return self._byte_source

    def _layout(self, field_index: int) -> ChunkLayout:
        layout = self._layouts.get(field_index)
        if layout is None:
            array_dir = self.metadata.path / self.metadata.fields[field_index].path
            layout = read_chunk_layout(array_dir)
            channel_axis = len(layout.shape) - 3 if self.metadata.channel_axis is None else self.metadata.channel_axis
            spare = [c for i, c in enumerate(layout.chunk[:-2]) if i != channel_axis]
            if any(c != 1 for c in spare):
                raise StoreError(f"{array_dir}: chunks {layout.chunk} span more than one t/z plane")
            if channel_axis != len(layout.shape) - 3:
                layout = dataclasses.replace(layout, channel_axis=channel_axis)
            grid = [-(-s // c) for s, c in zip(layout.shape, layout.chunk, strict=True)]
            if grid[layout.channel_axis] > 2**_C_BITS or max(grid[-2:]) > 2**_X_BITS:
                raise StoreError(
                    f"{array_dir}: a chunk grid of {grid} is beyond the direct decode path "
                    f"(at most {2**_C_BITS} channel and {2**_X_BITS} y/x chunks); use decode='zarr'"
                )
            self._layouts[field_index] = layout
            self._bases[field_index] = f"{self.metadata.fields[field_index].path}/"
            self._native_codecs[field_index] = _native_codec(layout) if self._remote is None else None
            self._geometries.add(self._geometry(layout))
        return layout

    def _fill(
        self, out: np.ndarray, field_index: int, y0: int, y1: int, x0: int, x1: int, channels: np.ndarray | None
    ) -> None:
        self._execute(self._plan_region(field_index, y0, y1, x0, x1, channels), out[None])

    def read_regions(
        self,
        regions: Regions,
        out: np.ndarray,
        channels: np.ndarray | None = None,
        meanwhile: Callable[[], Any] | None = None,
    ) -> np.ndarray:
        self._check_regions(regions, out)
        by_chunk: dict[int, list[_Piece]] = {}
        self._execute(self._plan_regions(regions, channels, by_chunk), out, by_chunk, meanwhile)
        self.stats.regions += len(regions)
        areas = (regions.y1 - regions.y0) * (regions.x1 - regions.x0)
        self.stats.bytes_delivered += int(areas.sum()) * out.shape[1] * out.itemsize
        return out

    def _channel_groups(self, layout: ChunkLayout, channels: np.ndarray | None) -> list[tuple[int, Any, Any]]:
        """(channel chunk, positions in the output, offsets inside the chunk) per channel chunk read."""
        chunk_c = layout.chunk_cyx[0]
        key = (chunk_c, None if channels is None else tuple(channels.tolist()))
        groups = self._channel_group_cache.get(key)
        if groups is None:
            groups = self._channel_group_cache[key] = _channel_groups(
                self.metadata.field_shape[0],
                chunk_c,
                channels,
            )
        return groups

    def _plan_region(
        self,
        field_index: int,
        y0: int,
        y1: int,
        x0: int,
        x1: int,
        channels: np.ndarray | None,
    ) -> list[_Piece]:
        """The pieces of one region (slot 0, landing at the slot's origin), with plain integer arithmetic."""
        layout = self._layout(field_index)
        _, chunk_y, chunk_x = layout.chunk_cyx
        y_spans = [
            (
                iy << _X_BITS,
                max(y0, iy * chunk_y) - iy * chunk_y,
                min(y1, (iy + 1) * chunk_y) - iy * chunk_y,
                max(y0, iy * chunk_y) - y0,
            )
            for iy in range(y0 // chunk_y, (y1 - 1) // chunk_y + 1)
        ]
        x_spans = [
            (
                ix,
                max(x0, ix * chunk_x) - ix * chunk_x,
                min(x1, (ix + 1) * chunk_x) - ix * chunk_x,
                max(x0, ix * chunk_x) - x0,
            )
            for ix in range(x0 // chunk_x, (x1 - 1) // chunk_x + 1)
        ]
        return [
            (
                field_index << _FIELD_SHIFT | c_index << _C_SHIFT | y_bits | ix,
                0,
                positions,
                offsets,
                sy0,
                sy1,
                sx0,
                sx1,
                dy0,
                dy0 + sy1 - sy0,
                dx0,
                dx0 + sx1 - sx0,
            )
            for c_index, positions, offsets in self._channel_groups(layout, channels)
            for y_bits, sy0, sy1, dy0 in y_spans
            for ix, sx0, sx1, dx0 in x_spans
        ]

    def _plan_regions(
        self, regions: Regions, channels: np.ndarray | None, by_chunk: dict[int, list[_Piece]] | None = None
    ) -> list[_Piece]:
        """The pieces of a whole batch, one pass per chunk shape among its fields, also grouped by chunk
        key into ``by_chunk`` when given: in C where the extension is built, else with array arithmetic."""
        pieces: list[_Piece] = []
        by_shape: dict[tuple[int, int, int], list[int]] = {}
        for field_index in np.unique(regions.field).tolist():
            by_shape.setdefault(self._layout(field_index).chunk_cyx, []).append(field_index)
        planner = _plan_pieces_native
        if planner is not None:  # the regions as one (7, n) int64 table, for every chunk shape's pass
            table = np.stack(regions.columns()).astype(np.int64, copy=False)
        for members in by_shape.values():
            layout = self._layouts[members[0]]
            _, chunk_y, chunk_x = layout.chunk_cyx
            if planner is not None:
                chosen = None if len(by_shape) == 1 else np.flatnonzero(np.isin(regions.field, members))
                planner(
                    pieces,
                    {} if by_chunk is None else by_chunk,
                    table if chosen is None else np.ascontiguousarray(table[:, chosen]),
                    chosen,
                    chunk_y,
                    chunk_x,
                    self._channel_groups(layout, channels),
                    _FIELD_SHIFT,
                    _C_SHIFT,
                    _X_BITS,
                )
                continue
            slots = np.arange(len(regions)) if len(by_shape) == 1 else np.flatnonzero(np.isin(regions.field, members))
            field, y0, y1, x0, x1, out_y0, out_x0 = (
                column[slots]
                for column in (
                    regions.field,
                    regions.y0,
                    regions.y1,
                    regions.x0,
                    regions.x1,
                    regions.out_y0,
                    regions.out_x0,
                )
            )
            first_y, first_x = y0 // chunk_y, x0 // chunk_x
            count_x = (x1 - 1) // chunk_x - first_x + 1
            counts = ((y1 - 1) // chunk_y - first_y + 1) * count_x
            region = np.repeat(np.arange(len(slots)), counts)
            within = np.arange(len(region)) - np.repeat(np.cumsum(counts) - counts, counts)
            iy = first_y[region] + within // count_x[region]
            ix = first_x[region] + within % count_x[region]
            chunk_y0, chunk_x0 = iy * chunk_y, ix * chunk_x
            ry0, rx0 = y0[region], x0[region]
            sy0 = np.maximum(ry0, chunk_y0) - chunk_y0
            sy1 = np.minimum(y1[region], chunk_y0 + chunk_y) - chunk_y0
            sx0 = np.maximum(rx0, chunk_x0) - chunk_x0
            sx1 = np.minimum(x1[region], chunk_x0 + chunk_x) - chunk_x0
            dy0 = chunk_y0 + sy0 - ry0 + out_y0[region]
            dx0 = chunk_x0 + sx0 - rx0 + out_x0[region]
            base = field[region] << _FIELD_SHIFT | iy << _X_BITS | ix
            columns = [slots[region], sy0, sy1, sx0, sx1, dy0, dy0 + sy1 - sy0, dx0, dx0 + sx1 - sx0]
            listed = [column.tolist() for column in columns]
            for c_index, positions, offsets in self._channel_groups(layout, channels):
                keys = (base | c_index << _C_SHIFT).tolist()
                pieces.extend(
                    zip(
                        keys,
                        listed[0],
                        itertools.repeat(positions),
                        itertools.repeat(offsets),
                        *listed[1:],
                        strict=False,
                    )
                )
        if by_chunk is not None and planner is None:
            _group_by_chunk(pieces, by_chunk)
        return pieces

    def _execute(
        self,
        pieces: list[_Piece],
        out: np.ndarray,
        by_chunk: dict[int, list[_Piece]] | None = None,
        meanwhile: Callable[[], Any] | None = None,
    ) -> None:
        """Read and decode each chunk the pieces need once, then copy every piece into ``out`` (B, C, H, W).

        With decode threads, the reads are cut into parts (see :data:`SHARES_PER_THREAD`); each part
        reads and decodes its share, copies the pieces of the chunks it decoded, and caches what it
        loaded, the threads taking parts until none is left: one thread's Python overlaps another's
        decoding and copying (which release the GIL). Before the parts, a pool thread plans the reads
        while this thread copies the pieces of half the cached chunks, so that planning (Python)
        overlaps copying (C) too; the other half is the last part, taken by the thread that runs out
        of reads first. Interleaved in one process, grouped batches (3/4 of their chunks cached) ran
        1.42-1.43x over one thread with half left to the last part, 1.34-1.36x with none. The caller's
        ``meanwhile`` (Python) runs on this thread after its copies, while the pool thread decodes.
        """
        if by_chunk is None:
            by_chunk = _group_by_chunk(pieces, {})
        chunks = self._cache.get_many(by_chunk)
        missing = len(by_chunk) - len(chunks)
        cached = list(chunks)
        threads = self.decode_threads

        def missing_keys() -> list[int]:
            return [key for key in by_chunk if key not in chunks]

        if threads == 1 or (missing < 2 and len(pieces) < PARALLEL_COPY_PIECES):
            units = self._units(missing_keys()) if missing else [[]]
            self._load_and_copy(units[0], by_chunk, cached, chunks, out)
            if meanwhile is not None:
                meanwhile()
        elif not missing:
            self._in_threads(
                lambda part: self._load_and_copy([], by_chunk, cached[part::threads], chunks, out),
                threads,
                meanwhile=meanwhile,
            )
        else:
            loads = threads * (SHARES_PER_THREAD if missing >= FEW_KEYS else 1)
            planned: list[list[_Unit]] = []
            first, last = cached[: len(cached) // 2], cached[len(cached) // 2 :]

            def work(part: int) -> None:
                if part < loads:
                    self._load_and_copy(planned[part], by_chunk, [], chunks, out)
                else:  # the last part: the other half of the cached chunks
                    self._load_and_copy([], by_chunk, last, chunks, out)

            def copy_first() -> None:
                self._load_and_copy([], by_chunk, first, chunks, out)
                if meanwhile is not None:
                    meanwhile()

            self._in_threads(
                work,
                loads + 1,
                prepare=lambda: planned.extend(self._units(missing_keys(), loads)),
                meanwhile=copy_first,
            )
        self._count_touches(pieces)

    def _load_and_copy(
        self,
        units: list[_Unit],
        by_chunk: dict[int, list[_Piece]],
        cached_keys: list[int],
        cached: dict[int, np.ndarray],
        out: np.ndarray,
    ) -> None:
        """One decode thread's share of a batch: load ``units`` (copying their chunks' pieces as
        each is decoded), copy the pieces of the cached chunks ``cached_keys``, then cache what it
        loaded, so its bookkeeping overlaps the other threads' decoding."""
        results: list[tuple[int, np.ndarray, bool]] = []
        left = [piece for key in cached_keys for piece in by_chunk[key]]
        chunks = cached
        if units:
            results, fetched, reads, loaded_left = self._load_units(units, by_chunk, out)
            left.extend(loaded_left)
            if loaded_left:
                chunks = dict(cached)
                chunks.update((key, chunk) for key, chunk, _ in results)
        copy_pieces(left, chunks, out)
        if units:
            with self._keep_lock:
                self._keep(results, fetched, reads)

    def _keep(self, results: list[tuple[int, np.ndarray, bool]], fetched: int, reads: int) -> None:
        """Cache the chunks loaded and count the reads and decodes."""
        stats = self.stats
        stats.bytes_fetched += fetched
        stats.reads += reads
        dropped = self._cache.put_many([(key, chunk) for key, chunk, _ in results])
        if dropped and self._spare_kind is not None:
            self._recycle(dropped, 2 * len(results))
        decoded = [chunk.nbytes for _, chunk, was_decoded in results if was_decoded]
        stats.bytes_decoded += sum(decoded)
        stats.chunks_decoded += len(decoded)
        if len(decoded) < len(results):
            self._missing.update(key for key, _, was_decoded in results if not was_decoded)

    def _recycle(self, dropped: list[np.ndarray], limit: int) -> None:
        """Set aside the chunk arrays of :attr:`_spare_kind` that numpy owns among ``dropped``, keeping
        at most ``limit``. :meth:`_load_units_native` decodes into one only when nothing else holds it."""
        shape, dtype = self._spare_kind  # type: ignore[misc]
        spare = self._spare
        spare.extend(chunk for chunk in dropped if chunk.base is None and chunk.shape == shape and chunk.dtype == dtype)
        if len(spare) > limit:
            del spare[: len(spare) - limit]

    def _count_touches(self, pieces: list[_Piece]) -> None:
        self.stats.chunks_touched += len(pieces)
        if self._missing:
            absent = self._missing
            self.stats.missing_chunks += sum(piece[0] in absent for piece in pieces)

    def _in_threads(
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
        if self._executor is None or self._executor_pid != os.getpid():  # a forked worker has no threads
            self._executor = ThreadPoolExecutor(self.decode_threads - 1, thread_name_prefix="cropbench-decode")
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

        helpers = [self._executor.submit(take_parts, index == 0) for index in range(self.decode_threads - 1)]
        try:
            if meanwhile is not None:
                meanwhile()
            take_parts(False)
        finally:
            wait(helpers)  # no thread may still write into the output once this returns
        for helper in helpers:
            helper.result()

    def _units(self, keys: list[int], parts: int = 1) -> list[list[_Unit]]:
        """The reads that fetch ``keys`` (one per chunk file, or per run of adjacent chunks in a shard),
        dealt to ``parts`` decode threads with as many chunks each (give or take one): the chunks in
        the order they lie on disk, cut into ``parts`` stretches, so a long run (grouped access) is cut
        between its chunks and every thread reads one stretch."""
        dealt: list[list[_Unit]] = [[] for _ in range(parts)]
        _ = self.source  # a forked worker forgets the parent's shard rows here, before any is looked up
        if len(self._geometries) == 1:  # every field read so far is chunked alike
            geometry = next(iter(self._geometries))
            if geometry is None:
                self._file_units(keys, dealt)
            elif len(keys) < FEW_KEYS:
                self._shard_units_few(keys, geometry, dealt)
            else:
                array = np.array(keys, dtype=np.int64)
                self._shard_units(array, array >> _FIELD_SHIFT, geometry, dealt)
            return dealt
        array = np.array(keys, dtype=np.int64)
        fields = array >> _FIELD_SHIFT
        groups: dict[Any, list[int]] = {}
        for field_index in np.unique(fields).tolist():
            groups.setdefault(self._geometry(self._layouts[field_index]), []).append(field_index)
        for geometry, members in groups.items():
            chosen = slice(None) if len(groups) == 1 else np.isin(fields, members)
            if geometry is None:
                self._file_units(array[chosen].tolist(), dealt)
            else:
                self._shard_units(array[chosen], fields[chosen], geometry, dealt)
        return dealt

    @staticmethod
    def _geometry(layout: ChunkLayout) -> Any:
        """What planning reads depends on: the shard geometry, or None without shards."""
        return layout.shard_cyx if layout.inner_chunk else None

    def _file_units(self, keys: list[int], dealt: list[list[_Unit]]) -> None:
        """One read of a whole chunk file per key (layouts without shards), in stretches to ``dealt``."""
        parts = len(dealt)
        for index, key in enumerate(keys):
            field_index = key >> _FIELD_SHIFT
            layout = self._layouts[field_index]
            path = self._bases[field_index] + layout.key(layout.coords(*_chunk_name(key)))
            dealt[index * parts // len(keys)].append((field_index, path, 0, -1, [(key, 0, -1)]))

    def _shard_units(
        self,
        keys: np.ndarray,
        fields: np.ndarray,
        geometry: tuple[tuple[int, int, int], tuple[int, int, int]],
        dealt: list[list[_Unit]],
    ) -> None:
        """Reads of inner chunks of shards that share a geometry: in each shard, byte ranges that touch
        (or lie within the coalescing gap) are read as one, unless a stretch of ``dealt`` ends between
        them. Array arithmetic over the batch; Python per shard touched and per read."""
        (per_c, per_y, per_x), (stride_c, stride_y, stride_x) = geometry
        c_index = keys >> _C_SHIFT & (2**_C_BITS - 1)
        y_index = keys >> _X_BITS & (2**_Y_BITS - 1)
        x_index = keys & (2**_X_BITS - 1)
        inner = c_index % per_c * stride_c + y_index % per_y * stride_y + x_index % per_x * stride_x
        shard_ids = (
            fields << _FIELD_SHIFT | c_index // per_c << _C_SHIFT | y_index // per_y << _X_BITS | x_index // per_x
        )
        by_shard = np.argsort(shard_ids)  # np.unique(..., return_inverse=True) in fewer steps
        in_order = shard_ids[by_shard]
        first_of_shard = np.empty(len(keys), dtype=bool)
        first_of_shard[0] = True
        np.not_equal(in_order[1:], in_order[:-1], out=first_of_shard[1:])
        shards = in_order[first_of_shard]
        which = np.empty(len(keys), dtype=np.int64)
        which[by_shard] = np.cumsum(first_of_shard) - 1
        found = [self._shard(shard_id) for shard_id in shards.tolist()]
        shard_keys = [None if entry is None else entry[0] for entry in found]
        rows = np.array([-1 if entry is None else entry[1] for entry in found], dtype=np.int64)[which]
        offsets, sizes = self._shard_index_table()
        at = rows + inner
        starts = np.full(len(keys), -1, dtype=np.int64)  # a missing shard; an empty entry's offset is -1 too
        present = rows >= 0
        starts[present] = offsets[at[present]]
        absent = starts < 0
        if absent.any():  # the fill value, per field, to the thread that runs no Python before the batch
            for field_index in np.unique(fields[absent]).tolist():
                missing = keys[absent & (fields == field_index)].tolist()
                dealt[-1].append((field_index, None, 0, 0, [(key, 0, 0) for key in missing]))
            kept = ~absent
            keys, fields, which, starts, at = keys[kept], fields[kept], which[kept], starts[kept], at[kept]
        if len(keys) == 0:
            return
        order = np.lexsort((starts, which))
        keys, fields, which, starts = keys[order], fields[order], which[order], starts[order]
        lengths = sizes[at[order]]
        ends = starts + lengths
        stretch = np.arange(len(keys)) * len(dealt) // len(keys)
        new_run = np.ones(len(keys), dtype=bool)
        gap = self._coalesce_gap
        new_run[1:] = (which[1:] != which[:-1]) | (starts[1:] < ends[:-1]) | (starts[1:] > ends[:-1] + gap)
        new_run[1:] |= stretch[1:] != stretch[:-1]
        firsts = np.flatnonzero(new_run)
        ends_at = np.append(firsts[1:], len(keys))
        origins = starts[firsts]
        relative = starts - np.repeat(origins, ends_at - firsts)
        entries = list(zip(keys.tolist(), relative.tolist(), lengths.tolist(), strict=True))
        runs = zip(
            firsts.tolist(),
            ends_at.tolist(),
            fields[firsts].tolist(),
            which[firsts].tolist(),
            origins.tolist(),
            (ends[ends_at - 1] - origins).tolist(),
            stretch[firsts].tolist(),
            strict=True,
        )
        for first, end, field_index, shard, origin, length, part in runs:
            dealt[part].append((field_index, shard_keys[shard], origin, length, entries[first:end]))

    def _shard_units_few(
        self, keys: list[int], geometry: tuple[tuple[int, int, int], tuple[int, int, int]], dealt: list[list[_Unit]]
    ) -> None:
        """:meth:`_shard_units` with integer arithmetic per key, for the few keys of a single crop,
        where each array call costs more than the loop it replaces; the same reads, in the same order."""
        (per_c, per_y, per_x), (stride_c, stride_y, stride_x) = geometry
        by_shard: dict[int, list[tuple[int, int]]] = {}
        for key in keys:
            c_index, y_index, x_index = _chunk_name(key)
            shard_id = key >> _FIELD_SHIFT << _FIELD_SHIFT | c_index // per_c << _C_SHIFT
            shard_id |= y_index // per_y << _X_BITS | x_index // per_x
            inner = c_index % per_c * stride_c + y_index % per_y * stride_y + x_index % per_x * stride_x
            by_shard.setdefault(shard_id, []).append((key, inner))
        found = {shard_id: self._shard(shard_id) for shard_id in sorted(by_shard)}
        offsets, sizes = self._shard_index_table()
        shard_keys = {shard_id: entry[0] for shard_id, entry in found.items() if entry is not None}
        present: list[tuple[int, int, int, int]] = []  # (shard, start, size, key)
        absent: set[int] = set()
        for shard_id, entry in found.items():
            row = -1 if entry is None else entry[1]
            for key, inner in by_shard[shard_id]:
                start = -1 if row < 0 else int(offsets[row + inner])
                if start < 0:
                    absent.add(key)
                else:
                    present.append((shard_id, start, int(sizes[row + inner]), key))
        if absent:  # the fill value, per field, in the order asked
            by_field: dict[int, list[int]] = {}
            for key in keys:
                if key in absent:
                    by_field.setdefault(key >> _FIELD_SHIFT, []).append(key)
            for field_index in sorted(by_field):
                dealt[-1].append((field_index, None, 0, 0, [(key, 0, 0) for key in by_field[field_index]]))
        present.sort()
        parts, gap = len(dealt), self._coalesce_gap
        run: list[tuple[int, int, int]] = []
        run_shard = run_stretch = origin = end = 0
        for index, (shard_id, start, size, key) in enumerate(present):
            stretch = index * parts // len(present)
            if run and (shard_id != run_shard or start < end or start > end + gap or stretch != run_stretch):
                dealt[run_stretch].append((run_shard >> _FIELD_SHIFT, shard_keys[run_shard], origin, end - origin, run))
                run = []
            if not run:
                run_shard, run_stretch, origin = shard_id, stretch, start
            run.append((key, start - origin, size))
            end = start + size
        if run:
            dealt[run_stretch].append((run_shard >> _FIELD_SHIFT, shard_keys[run_shard], origin, end - origin, run))

    def _shard_index_table(self) -> tuple[np.ndarray, np.ndarray]:
        """Every shard index read so far, end to end: (offset, size) of each inner chunk as int64, a
        shard's entries from the row :meth:`_shard` gave it; -1 marks an empty entry."""
        if self._index_pending:
            table = np.concatenate([self._index_table, *self._index_pending])
            self._index_table, self._index_pending = table, []
        return self._index_table[:, 0], self._index_table[:, 1]

    def _load_units(
        self, units: list[_Unit], by_chunk: dict[int, list[_Piece]] | None = None, out: np.ndarray | None = None
    ) -> _Loaded:
        """Fetch and decode the chunks of ``units`` (any thread): (key, chunk, decoded?) each, bytes,
        reads, and which pieces of those chunks (``by_chunk``, by chunk key) are left to copy into ``out``.

        Natively, in one call without the GIL, when the plate is local, the codec is one the native
        loads know and the extension is built; there the pieces of each chunk are copied right after
        it is decoded, while it is in the CPU's cache, and only the others are left. In Python
        otherwise, and whenever the native call declines (a short read, a chunk that does not
        validate): the Python path then decodes those chunks or raises what it always raised.
        """
        by_chunk = by_chunk or {}
        if _load_chunks_native is not None and units:
            loaded = self._load_units_native(units, by_chunk, out)
            if loaded is not None:
                return loaded
        return (*self._load_units_python(units), _pieces_of(units, by_chunk))

    def _load_units_native(
        self, units: list[_Unit], by_chunk: dict[int, list[_Piece]], out: np.ndarray | None
    ) -> _Loaded | None:
        """:meth:`_load_units` in C (the reads, the decodes, the copies); None when the Python path must do it."""
        source = self.source
        if not isinstance(source, FileSource):
            return None
        results: list[tuple[int, np.ndarray, bool]] = []
        reads: list[tuple[int, bytes | None, int, int, int, int, int]] = []
        targets: list[tuple[int, int, np.ndarray, int, int]] = []
        read_results: list[tuple[int, int]] = []  # per read: its field, where its chunks start in results
        ordered: list[_Piece] = []  # the pieces of the chunks read here, chunk by chunk
        left: list[_Piece] = []  # the pieces of absent chunks (the fill value), copied afterwards
        no_pieces: list[_Piece] = []
        spare, getrefcount = self._spare, sys.getrefcount
        for unit in units:
            field_index, key, start, length, entries = unit
            layout = self._layouts[field_index]
            codec = self._native_codecs[field_index]
            if codec is None:
                return None
            if key is None:
                results.extend((chunk_key, layout.filled_chunk(), False) for chunk_key, _, _ in entries)
                left.extend(_pieces_of([unit], by_chunk))
                continue
            if length < 0:
                descriptor, path = -1, os.fsencode(source.path(key))
            else:
                opened, path = source.descriptor(key), None
                if opened is None:  # a shard that vanished since its index was read: the Python path says so
                    return None
                descriptor = opened
            read_results.append((field_index, len(results)))
            first = len(targets)
            shape, dtype = layout.chunk_cyx, layout.dtype
            if self._spare_kind is None:
                self._spare_kind = shape, dtype
            reuse = spare if self._spare_kind == (shape, dtype) else None
            for chunk_key, offset, size in entries:
                chunk = None
                if reuse:
                    try:
                        chunk = reuse.pop()
                    except IndexError:  # another thread took the last one
                        pass
                    else:
                        if getrefcount(chunk) > 2:  # still held elsewhere (a thread copying from it)
                            chunk = None
                if chunk is None:
                    chunk = np.empty(shape, dtype=dtype)
                first_piece = len(ordered)
                ordered.extend(by_chunk.get(chunk_key, no_pieces))
                targets.append((offset, size, chunk, first_piece, len(ordered)))
                results.append((chunk_key, chunk, True))
            reads.append((descriptor, path, start, length, codec, first, len(targets)))
        copies = (ordered, out) if out is not None else ()
        try:
            outcome = self._native_load(reads, targets, *copies)
        except TypeError:  # arrays the C copies leave to numpy (a dtype change, ...): found before anything ran
            copies = ()
            left.extend(ordered)
            outcome = self._native_load(reads, targets)
        if outcome is None:
            return None
        fetched, absent = outcome
        for read_index in absent:  # whole chunk files that do not exist: the fill value, copied in Python
            field_index, first = read_results[read_index]
            fill_value = self._layouts[field_index].fill_value
            for index in range(first, first + reads[read_index][6] - reads[read_index][5]):
                chunk_key, chunk, _ = results[index]
                chunk.fill(fill_value)
                results[index] = (chunk_key, chunk, False)
            if copies:
                left.extend(ordered[targets[reads[read_index][5]][3] : targets[reads[read_index][6] - 1][4]])
        source.count(len(reads) - len(absent), fetched)
        return results, fetched, len(reads), left

    def _native_load(
        self,
        reads: list[tuple[int, bytes | None, int, int, int, int, int]],
        targets: list[tuple[int, int, np.ndarray, int, int]],
        pieces: list[_Piece] | None = None,
        out: np.ndarray | None = None,
    ) -> tuple[int, list[int]] | None:
        """One native call: (bytes read, reads that found no file), or None when it declined."""
        outcome = _load_chunks_native(reads, targets, *(() if out is None else (pieces, out)))  # type: ignore[misc]
        if outcome is None:
            return None
        fetched, absent, *work = outcome
        self._native_loaded(*work)
        return fetched, absent

    def _native_loaded(self, fetch_ns: int, decode_ns: int, chunks: int, nbytes: int) -> None:
        """What a native call measured (ns reading, ns decoding) and decoded, for readers with stage clocks."""

    def _load_units_python(self, units: list[_Unit]) -> tuple[list[tuple[int, np.ndarray, bool]], int, int]:
        """:meth:`_load_units` in Python: one read call per unit, one codec call per chunk."""
        results: list[tuple[int, np.ndarray, bool]] = []
        fetched = reads = 0
        fetches = iter(self._fetch_units([(key, start, length) for _, key, start, length, _ in units if key]))
        for field_index, source, _, _, entries in units:
            layout = self._layouts[field_index]
            data = None if source is None else next(fetches)
            reads += source is not None
            if data is None:
                results.extend((key, layout.filled_chunk(), False) for key, _, _ in entries)
                continue
            fetched += len(data)
            view = memoryview(data)
            for key, offset, size in entries:
                encoded = view if size < 0 else view[offset : offset + size]
                results.append((key, self._decode(field_index, layout, key, encoded), True))
        return results, fetched, reads

    def _fetch_units(self, requests: list[Request]) -> list[bytes | None]:
        """What the units read: whole chunk objects (None when absent) or byte ranges of shards."""
        return self.source.get_many(requests)

    def _decode(self, field_index: int, layout: ChunkLayout, key: int, encoded: memoryview) -> np.ndarray:
        data: Any = encoded
        try:
            for decoder in layout.decoders:
                data = decoder(data)
        except Exception as error:  # codecs raise RuntimeError, ValueError, ... on corrupt input
            raise StoreError(
                f"chunk {_chunk_name(key)} of {self.metadata.fields[field_index].path} cannot be decoded "
                f"(corrupt chunk): {error}"
            ) from error
        chunk = np.frombuffer(data, dtype=layout.dtype)
        if chunk.size != layout.chunk_items:
            raise StoreError(
                f"chunk {_chunk_name(key)} of {self.metadata.fields[field_index].path} decoded to {chunk.size} "
                f"values, expected {layout.chunk_items}: the chunk is corrupt"
            )
        return chunk.reshape(layout.chunk_cyx)

    def _shard(self, shard_id: int) -> tuple[str, int] | None:
        """(shard key, its first row in :meth:`_shard_index_table`) of one shard (``shard_id`` packs its
        field and grid coordinates as a chunk key does), its index fetched once per process; None when
        the shard does not exist."""
        if shard_id in self._shards:
            return self._shards[shard_id]
        field_index = shard_id >> _FIELD_SHIFT
        layout = self._layouts[field_index]
        source = self.source
        shard_key = self._bases[field_index] + layout.key(layout.coords(*_chunk_name(shard_id)))
        path = f"{source.location.rstrip('/')}/{shard_key}"
        size = layout.shard_entries * 16 + (4 if layout.index_decoders_checksum else 0)
        try:
            raw = source.get_suffix(shard_key, size) if layout.index_at_end else source.get_range(shard_key, 0, size)
        except StoreError as error:
            if "truncated" not in str(error):
                raise
            raise StoreError(f"shard {path} is truncated: its index needs {size} bytes") from error
        if raw is None:
            self._shards[shard_id] = None
            return None
        if layout.index_decoders_checksum:
            if _crc32c(raw[:-4]) != int.from_bytes(raw[-4:], "little"):
                raise StoreError(f"shard {path} has a corrupt index (crc32c mismatch)")
            raw = raw[:-4]
        self.stats.bytes_fetched += size
        self.stats.reads += 1
        index = np.frombuffer(raw, dtype="<u8").reshape(-1, 2).astype(np.int64)  # the empty marker becomes -1
        row = len(self._index_table) + sum(len(pending) for pending in self._index_pending)
        self._index_pending.append(index)
        entry = (shard_key, row)
        self._shards[shard_id] = entry
        return entry


def _native_codec(layout: ChunkLayout) -> int | None:
    """What the native loads call the layout's codec, or None when they cannot decode it."""
    if not layout.decoders:
        return _NATIVE_RAW
    if layout.decoders == (_blosc_decompress,) and _NATIVE_BLOSC:
        return _NATIVE_BLOSC_CODE
    return None


def _group_by_chunk(pieces: list[_Piece], by_chunk: dict[int, list[_Piece]]) -> dict[int, list[_Piece]]:
    """``by_chunk`` with each piece appended to its chunk key's list."""
    for piece in pieces:
        by_chunk.setdefault(piece[0], []).append(piece)
    return by_chunk


def _pieces_of(units: list[_Unit], by_chunk: dict[int, list[_Piece]]) -> list[_Piece]:
    """The pieces (``by_chunk``, by chunk key) of the chunks ``units`` read."""
    return [piece for unit in units for key, _, _ in unit[4] for piece in by_chunk.get(key, ())]


def copy_pieces(pieces: list[_Piece], chunks: dict[int, np.ndarray], out: np.ndarray) -> None:
    """Copy each piece from its decoded chunk into ``out`` (B, C, H, W): in C with the GIL released
    for the whole call where the extension is built and the arrays suit it, else in Python."""
    if _copy_pieces_native is not None:
        try:
            _copy_pieces_native(pieces, chunks, out)
            return
        except TypeError:  # a dtype change, rows that are not contiguous, ...: checked before copying anything
            pass
    _copy_pieces_python(pieces, chunks, out)


def _copy_pieces_python(pieces: list[_Piece], chunks: dict[int, np.ndarray], out: np.ndarray) -> None:
    """:func:`copy_pieces` in Python: one numpy assignment per piece."""
    for key, slot, positions, offsets, sy0, sy1, sx0, sx1, dy0, dy1, dx0, dx1 in pieces:
        out[slot, positions, dy0:dy1, dx0:dx1] = chunks[key][offsets, sy0:sy1, sx0:sx1]


def _chunk_name(key: int) -> tuple[int, int, int]:
    """(channel chunk, y chunk, x chunk) of a cache key, for messages."""
    return key >> _C_SHIFT & (2**_C_BITS - 1), key >> _X_BITS & (2**_Y_BITS - 1), key & (2**_X_BITS - 1)


def _crc32c(data: bytes) -> int:
    import google_crc32c  # a zarr dependency; imported lazily, used once per shard

    return int(google_crc32c.value(bytes(data)))


def _channel_groups(
    channel_count: int,
    chunk_c: int,
    channels: np.ndarray | None,
) -> list[tuple[int, Any, Any]]:
    """(channel chunk, positions in the output, offsets inside the chunk) of each channel chunk read."""
    if channels is None and chunk_c >= channel_count:
        return [(0, slice(None), slice(None))]
    wanted = np.arange(channel_count) if channels is None else np.asarray(channels)
    groups: list[tuple[int, Any, Any]] = []
    for c_index in np.unique(wanted // chunk_c).tolist():
        positions = np.flatnonzero(wanted // chunk_c == c_index)
        groups.append((c_index, positions, wanted[positions] % chunk_c))
    return groups


class StageTimedChunkReader(DirectChunkReader):
    """The direct path with a clock around each stage, for the per-stage time split only.

    ``stage_ns`` accumulates fetch (file reads), decode (codecs) and region (everything in
    ``read_region`` / ``read_regions``: planning, cache lookups, fetch, decode and assembly).
    With ``decode_threads`` > 1 fetch and decode add up the time of every thread (each adds under a
    lock). On the native loads the extension keeps the two clocks (per read, per run of decodes)
    and counts the decodes. ``decode_calls`` and ``decoded_bytes`` count the work the decode step
    did (every call, its output's bytes), which the stats' per-chunk counters do not see when a
    chunk is decoded more than once.
    """

    def __init__(
        self,
        metadata: PlateMetadata,
        chunk_cache_bytes: int = 64 * 2**20,
        decode_threads: int = 1,
    ) -> None:
        super().__init__(metadata, chunk_cache_bytes, decode_threads)
        self.stage_ns = {"fetch": 0, "decode": 0, "region": 0}
        self.decode_calls = 0
        self.decoded_bytes = 0
        self._stage_lock = threading.Lock()

    def read_region(
        self,
        field_index: int,
        y0: int,
        y1: int,
        x0: int,
        x1: int,
        channels: np.ndarray | None = None,
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        start = time.perf_counter_ns()
        result = super().read_region(field_index, y0, y1, x0, x1, channels, out)
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

    def _native_loaded(self, fetch_ns: int, decode_ns: int, chunks: int, nbytes: int) -> None:
        self._add(fetch_ns, decode_ns, chunks, nbytes)

    def _fetch_units(self, requests: list[Request]) -> list[bytes | None]:
        began = time.perf_counter_ns()
        data = super()._fetch_units(requests)
        self._add(fetch_ns=time.perf_counter_ns() - began)
        return data

    def _decode(self, field_index: int, layout: ChunkLayout, key: int, encoded: memoryview) -> np.ndarray:
        began = time.perf_counter_ns()
        chunk = super()._decode(field_index, layout, key, encoded)
        self._add(decode_ns=time.perf_counter_ns() - began, chunks=1, nbytes=chunk.nbytes)
        return chunk

    def _add(self, fetch_ns: int = 0, decode_ns: int = 0, chunks: int = 0, nbytes: int = 0) -> None:
        """Add to the fetch and decode clocks and counters, from any decode thread."""
        with self._stage_lock:
            self.stage_ns["fetch"] += fetch_ns
            self.stage_ns["decode"] += decode_ns
            self.decode_calls += chunks
            self.decoded_bytes += nbytes
