"""The direct decode path: find the chunks a crop touches, read and decode them, assemble the crop.

zarr-python spends ~0.2–0.4 ms of Python and asyncio machinery per slicing call, which dominates
random single-cell access. This module reads the same chunk files with the store's own codecs
(numcodecs' Blosc and Zstd), keeps decoded chunks in a per-process LRU bounded in bytes, and
copies the intersection of each chunk into a preallocated output. It supports the layouts
zarr-python writes for (c, y, x) or singleton-(t, z) uint arrays: zarr v3 with ``bytes`` +
``blosc``/``zstd``/``gzip``/``crc32c`` codecs, optionally inside ``sharding_indexed``, and zarr
v2 with a Blosc/Zstd/GZip/Zlib compressor and no filters.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numcodecs
import numcodecs.blosc
import numpy as np

from cropbench.errors import StoreError
from cropbench.formats.base import ByteBudgetCache, PlateMetadata, PlateReader
from cropbench.formats.ngff import read_array_document

Decoder = Callable[[bytes], bytes]
EMPTY_SHARD_ENTRY = 2**64 - 1


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

    @functools.cached_property
    def chunk_cyx(self) -> tuple[int, int, int]:
        """A decoded chunk as (c, y, x): singleton t/z axes (NGFF t, c, z, y, x) dropped."""
        chunk = self.chunk
        return chunk[self.channel_axis], chunk[-2], chunk[-1]

    @functools.cached_property
    def decoded_shape(self) -> tuple[int, ...]:
        """Shape of a cached chunk: the chunk itself, or (c, y, x) when t/z sit between c and y."""
        return self.chunk_cyx if self.channel_axis >= 0 else self.chunk

    def coords(self, c_index: int, y_index: int, x_index: int) -> tuple[int, ...]:
        """Chunk grid coordinates of (c, y, x) chunk indices, zeros on singleton t/z axes."""
        coords = [0] * len(self.shape)
        coords[self.channel_axis], coords[-2], coords[-1] = c_index, y_index, x_index
        return tuple(coords)

    @functools.cached_property
    def per_shard(self) -> tuple[int, ...]:
        """Inner chunks per shard along each axis (all ones when not sharded)."""
        if self.inner_chunk is None:
            return (1,) * len(self.read_unit)
        return tuple(r // i for r, i in zip(self.read_unit, self.inner_chunk, strict=True))

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
        return numcodecs.blosc.decompress  # type: ignore[no-any-return]
    if name == "zstd":
        return numcodecs.Zstd(level=config.get("level", 0)).decode  # type: ignore[no-any-return]
    if name == "gzip":
        return numcodecs.GZip(level=config.get("level", 1)).decode  # type: ignore[no-any-return]
    if name == "crc32c":
        return lambda data: memoryview(data)[:-4]  # type: ignore[return-value]
    raise StoreError(f"codec {name!r} is not supported by the direct decode path; use decode='zarr'")


def _v2_decoder(compressor: dict[str, Any] | None) -> tuple[Decoder, ...]:
    if compressor is None:
        return ()
    codec_id = compressor.get("id")
    if codec_id == "blosc":
        return (numcodecs.blosc.decompress,)
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
            shape=tuple(document["shape"]), dtype=np.dtype(document["dtype"]),
            read_unit=tuple(document["chunks"]), inner_chunk=None, zarr_format=2,
            separator=document.get("dimension_separator", "."), v3_prefix=False,
            decoders=_v2_decoder(document.get("compressor")), index_decoders_checksum=False,
            index_at_end=True, fill_value=document.get("fill_value") or 0,
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
        shape=tuple(document["shape"]), dtype=dtype,
        read_unit=tuple(document["chunk_grid"]["configuration"]["chunk_shape"]),
        inner_chunk=inner_chunk, zarr_format=3, separator=separator,
        v3_prefix=encoding["name"] == "default", decoders=tuple(reversed(decoders)),
        index_decoders_checksum=checksum, index_at_end=index_at_end,
        fill_value=document.get("fill_value") or 0,
    )


class DirectChunkReader(PlateReader):
    """Decode path ``direct``: chunk math, direct file reads, store codecs, LRU of decoded chunks.

    The hot path avoids per-chunk object churn: file descriptors and shard indexes are opened once
    per process and kept, shard indexes are plain lists, and paths are built as strings.
    """

    decode = "direct"

    def __init__(self, metadata: PlateMetadata, chunk_cache_bytes: int = 64 * 2**20) -> None:
        super().__init__(metadata)
        self.chunk_cache_bytes = chunk_cache_bytes
        self._cache = ByteBudgetCache(chunk_cache_bytes)
        self._layouts: dict[int, ChunkLayout] = {}
        self._bases: dict[int, str] = {}
        self._shards: dict[tuple[int, tuple[int, ...]], tuple[int, list[int], list[int]] | None] = {}
        numcodecs.blosc.use_threads = False

    def _config_state(self) -> dict[str, Any]:
        return {"chunk_cache_bytes": self.chunk_cache_bytes}

    def close(self) -> None:
        self._cache.clear()
        for entry in self._shards.values():
            if entry is not None:
                os.close(entry[0])
        self._shards.clear()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: os may already be gone
            self.close()

    def grain(self) -> tuple[int, int]:
        chunk = self._layout(0).chunk
        return chunk[-2], chunk[-1]

    def _layout(self, field_index: int) -> ChunkLayout:
        layout = self._layouts.get(field_index)
        if layout is None:
            array_dir = self.metadata.path / self.metadata.fields[field_index].path
            layout = read_chunk_layout(array_dir)
            channel_axis = int(self.metadata.extra.get("channel_axis", len(layout.shape) - 3))
            if channel_axis != len(layout.shape) - 3:
                spare = [c for i, c in enumerate(layout.chunk[:-2]) if i != channel_axis]
                if any(c != 1 for c in spare):
                    raise StoreError(f"{array_dir}: chunks {layout.chunk} span more than one t/z plane")
                layout = dataclasses.replace(layout, channel_axis=channel_axis)
            self._layouts[field_index] = layout
            self._bases[field_index] = f"{array_dir}{os.sep}"
        return layout

    def read_region(
        self, field_index: int, y0: int, y1: int, x0: int, x1: int,
        channels: np.ndarray | None = None, out: np.ndarray | None = None,
    ) -> np.ndarray:
        self._check_window(field_index, y0, y1, x0, x1)
        layout = self._layout(field_index)
        channel_count = self.metadata.field_shape[0]
        result = self._output(channel_count if channels is None else len(channels), y0, y1, x0, x1, out)
        chunk_c, chunk_y, chunk_x = layout.chunk_cyx
        leading = (0,) * (len(layout.shape) - 3)
        coords_of = layout.coords if layout.channel_axis != len(layout.shape) - 3 else None
        groups = _channel_groups(channel_count, chunk_c, channels)
        get_chunk = self._chunk
        for c_index, (out_positions, in_offsets) in groups.items():
            for y_index in range(y0 // chunk_y, (y1 - 1) // chunk_y + 1):
                cy0 = y_index * chunk_y
                sy0, sy1 = max(y0, cy0), min(y1, cy0 + chunk_y)
                for x_index in range(x0 // chunk_x, (x1 - 1) // chunk_x + 1):
                    cx0 = x_index * chunk_x
                    sx0, sx1 = max(x0, cx0), min(x1, cx0 + chunk_x)
                    chunk = get_chunk(field_index, layout, coords_of(c_index, y_index, x_index) if coords_of
                                      else (*leading, c_index, y_index, x_index))
                    source = chunk[..., in_offsets, sy0 - cy0:sy1 - cy0, sx0 - cx0:sx1 - cx0]
                    result[out_positions, sy0 - y0:sy1 - y0, sx0 - x0:sx1 - x0] = (
                        source if not leading else source.reshape(source.shape[-3:])
                    )
        self.stats.regions += 1
        self.stats.bytes_delivered += result.nbytes
        return result

    def _chunk(self, field_index: int, layout: ChunkLayout, coords: tuple[int, ...]) -> np.ndarray:
        self.stats.chunks_touched += 1
        key = (field_index, coords)
        chunk = self._cache.get(key)
        if chunk is None:
            chunk = self._decode(field_index, layout, coords)
            self._cache.put(key, chunk)
        return chunk

    def _decode(self, field_index: int, layout: ChunkLayout, coords: tuple[int, ...]) -> np.ndarray:
        encoded = self._fetch(field_index, layout, coords)
        if encoded is None:
            return np.full(layout.decoded_shape, layout.fill_value, dtype=layout.dtype)
        data: Any = encoded
        try:
            for decoder in layout.decoders:
                data = decoder(data)
        except Exception as error:  # codecs raise RuntimeError, ValueError, ... on corrupt input
            raise StoreError(
                f"chunk {coords} of {self.metadata.fields[field_index].path} cannot be decoded "
                f"(corrupt chunk): {error}"
            ) from error
        chunk = np.frombuffer(data, dtype=layout.dtype)
        if chunk.size != layout.chunk_items:
            raise StoreError(
                f"chunk {coords} of {self.metadata.fields[field_index].path} decoded to {chunk.size} values, "
                f"expected {layout.chunk_items}: the chunk is corrupt"
            )
        self.stats.bytes_decoded += chunk.nbytes
        self.stats.chunks_decoded += 1
        return chunk.reshape(layout.decoded_shape)

    def _fetch(self, field_index: int, layout: ChunkLayout, coords: tuple[int, ...]) -> bytes | None:
        if layout.inner_chunk is None:
            try:
                with open(self._bases[field_index] + layout.key(coords), "rb", buffering=0) as handle:
                    data = handle.readall()
            except FileNotFoundError:
                return None
            self.stats.bytes_fetched += len(data)
            return data
        per_shard = layout.per_shard
        shard_coords = tuple(c // p for c, p in zip(coords, per_shard, strict=True))
        shard = self._shard(field_index, layout, shard_coords)
        if shard is None:
            return None
        descriptor, offsets, sizes = shard
        inner = 0
        for c, p in zip(coords, per_shard, strict=True):
            inner = inner * p + c % p
        offset = offsets[inner]
        if offset == EMPTY_SHARD_ENTRY:
            return None
        data = os.pread(descriptor, sizes[inner], offset)
        self.stats.bytes_fetched += len(data)
        return data

    def _shard(
        self, field_index: int, layout: ChunkLayout, shard_coords: tuple[int, ...],
    ) -> tuple[int, list[int], list[int]] | None:
        """(open descriptor, inner-chunk offsets, sizes) of one shard file, cached per process."""
        key = (field_index, shard_coords)
        if key in self._shards:
            return self._shards[key]
        path = self._bases[field_index] + layout.key(shard_coords)
        size = layout.shard_entries * 16 + (4 if layout.index_decoders_checksum else 0)
        try:
            descriptor = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            self._shards[key] = None
            return None
        offset = os.fstat(descriptor).st_size - size if layout.index_at_end else 0
        raw = os.pread(descriptor, size, max(offset, 0))
        if len(raw) != size or offset < 0:
            os.close(descriptor)
            raise StoreError(f"shard {path} is truncated: its index needs {size} bytes")
        if layout.index_decoders_checksum:
            if _crc32c(raw[:-4]) != int.from_bytes(raw[-4:], "little"):
                os.close(descriptor)
                raise StoreError(f"shard {path} has a corrupt index (crc32c mismatch)")
            raw = raw[:-4]
        self.stats.bytes_fetched += size
        index = np.frombuffer(raw, dtype="<u8").reshape(-1, 2)
        entry = (descriptor, index[:, 0].tolist(), index[:, 1].tolist())
        self._shards[key] = entry
        return entry


def _crc32c(data: bytes) -> int:
    import google_crc32c  # a zarr dependency; imported lazily, used once per shard

    return int(google_crc32c.value(bytes(data)))


def _channel_groups(
    channel_count: int, chunk_c: int, channels: np.ndarray | None,
) -> dict[int, tuple[Any, Any]]:
    """Map each channel chunk to (positions in the output, offsets inside the chunk)."""
    if channels is None and chunk_c >= channel_count:
        return {0: (slice(None), slice(None))}
    wanted = np.arange(channel_count) if channels is None else np.asarray(channels)
    groups: dict[int, tuple[Any, Any]] = {}
    for c_index in np.unique(wanted // chunk_c):
        positions = np.flatnonzero(wanted // chunk_c == c_index)
        groups[int(c_index)] = (positions, wanted[positions] % chunk_c)
    return groups


class StageTimedChunkReader(DirectChunkReader):
    """The direct path with a clock around each stage, for the per-stage time split only.

    ``stage_ns`` accumulates fetch (file reads), decode (codecs, excluding fetch) and region
    (everything in ``read_region``: chunk math, cache lookups, fetch, decode and assembly).
    """

    def __init__(self, metadata: PlateMetadata, chunk_cache_bytes: int = 64 * 2**20) -> None:
        super().__init__(metadata, chunk_cache_bytes)
        self.stage_ns = {"fetch": 0, "decode": 0, "region": 0}

    def read_region(
        self, field_index: int, y0: int, y1: int, x0: int, x1: int,
        channels: np.ndarray | None = None, out: np.ndarray | None = None,
    ) -> np.ndarray:
        start = time.perf_counter_ns()
        result = super().read_region(field_index, y0, y1, x0, x1, channels, out)
        self.stage_ns["region"] += time.perf_counter_ns() - start
        return result

    def _fetch(self, field_index: int, layout: ChunkLayout, coords: tuple[int, ...]) -> bytes | None:
        start = time.perf_counter_ns()
        data = super()._fetch(field_index, layout, coords)
        self.stage_ns["fetch"] += time.perf_counter_ns() - start
        return data

    def _decode(self, field_index: int, layout: ChunkLayout, coords: tuple[int, ...]) -> np.ndarray:
        start, fetched = time.perf_counter_ns(), self.stage_ns["fetch"]
        chunk = super()._decode(field_index, layout, coords)
        self.stage_ns["decode"] += time.perf_counter_ns() - start - (self.stage_ns["fetch"] - fetched)
        return chunk
