"""How a zarr array stores its chunks, reduced to what decoding needs: :class:`ChunkLayout`, read
from ``zarr.json`` (v3) or ``.zarray`` (v2), the store codecs as decoders, and :class:`FieldLayouts`,
each field's layout read once and checked against what the direct reader supports.

Supported: (c, y, x) or singleton-(t, z) uint arrays, zarr v3 with ``bytes`` +
``blosc``/``zstd``/``gzip``/``crc32c`` codecs, optionally inside ``sharding_indexed``, and zarr v2
with a Blosc/Zstd/GZip/Zlib compressor and no filters.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numcodecs
import numcodecs.blosc
import numpy as np

import cropbench.formats.direct.native as native
from cropbench.errors import StoreError
from cropbench.formats.base import PlateMetadata
from cropbench.formats.direct.keys import MAX_C_CHUNKS, MAX_YX_CHUNKS
from cropbench.formats.metadata import ArrayMetadata
from cropbench.formats.ngff import read_array_metadata

#: A store codec's decode: (encoded bytes, the most bytes it may give) -> decoded bytes; ValueError
#: (or a codec's own error) when the input is corrupt or would decode to more than that.
Decoder = Callable[[Any, int], Any]
BLOSC_HEADER_BYTES = 16
#: What c-blosc adds to a chunk at most (its header; an incompressible chunk is stored as is).
BLOSC_MAX_OVERHEAD = 16


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
    #: The store codecs in decode order, each with the most bytes it may give.
    decoders: tuple[tuple[Decoder, int], ...]
    index_decoders_checksum: bool
    index_at_end: bool
    fill_value: int | float
    #: The most bytes one stored chunk may hold: its decoded size plus what its codecs may add.
    max_encoded: int
    channel_axis: int = -3

    @property
    def chunk(self) -> tuple[int, ...]:
        """The unit that is decoded and cached: the inner chunk when sharded."""
        return self.inner_chunk or self.read_unit

    @functools.cached_property
    def chunk_items(self) -> int:
        return int(np.prod(self.chunk))

    @functools.cached_property
    def chunk_bytes(self) -> int:
        """Bytes of a decoded chunk."""
        return self.chunk_items * self.dtype.itemsize

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

    @property
    def geometry(self) -> Any:
        """What planning reads depends on: the shard geometry (:attr:`shard_cyx`), or None without shards."""
        return self.shard_cyx if self.inner_chunk else None

    def key(self, coords: tuple[int, ...]) -> str:
        joined = self.separator.join(map(str, coords))
        return f"c{self.separator}{joined}" if self.v3_prefix else joined


def blosc_decompress(data: Any, limit: int) -> bytes:
    """numcodecs' blosc decompression, once the chunk holds every byte its header counts (c-blosc
    does not know the buffer's length and would read past a truncated chunk's end) and the header
    promises no more than ``limit`` bytes (c-blosc allocates what it promises)."""
    view = memoryview(data)
    if len(view) < BLOSC_HEADER_BYTES:
        raise ValueError(f"truncated: {len(view)} bytes, less than a blosc header")
    decoded = int.from_bytes(view[4:8], "little")
    compressed = int.from_bytes(view[12:16], "little")
    if compressed > len(view):
        raise ValueError(f"truncated: the blosc header counts {compressed} bytes, the chunk has {len(view)}")
    if decoded > limit:
        raise ValueError(f"the blosc header promises {decoded} bytes, more than the chunk's {limit}")
    return numcodecs.blosc.decompress(view)


_ZSTD = numcodecs.Zstd()


def zstd_decompress(data: Any, limit: int) -> Any:
    """numcodecs' zstd decompression into a buffer of ``limit`` bytes: a frame that says it holds
    more is refused before anything is allocated, one that holds fewer is cut to what it holds."""
    content = zstd_content_size(data)
    if content is None:  # a frame that does not say its size (a streaming writer's): decoded whole, then checked
        decoded = _ZSTD.decode(data)
        if len(decoded) > limit:
            raise ValueError(f"the zstd frame decodes to {len(decoded)} bytes, more than the chunk's {limit}")
        return decoded
    if content > limit:
        raise ValueError(f"the zstd frame says it holds {content} bytes, more than the chunk's {limit}")
    return _ZSTD.decode(data, out=np.empty(content, dtype=np.uint8))


def zstd_content_size(data: Any) -> int | None:
    """The decoded size a zstd frame's header states, or None when it states none."""
    view = memoryview(data)
    if len(view) < 6 or bytes(view[:4]) != b"\x28\xb5\x2f\xfd":
        raise ValueError("not a zstd frame")
    descriptor = view[4]
    single_segment = descriptor >> 5 & 1
    size_bytes = (1 if single_segment else 0, 2, 4, 8)[descriptor >> 6]
    if size_bytes == 0:
        return None
    start = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[descriptor & 3]
    if len(view) < start + size_bytes:
        raise ValueError("truncated: the zstd frame header is cut short")
    return int.from_bytes(view[start : start + size_bytes], "little") + (256 if size_bytes == 2 else 0)


def gzip_decompress(data: Any, limit: int) -> bytes:
    """A gzip stream (every member) inflated to at most ``limit`` bytes."""
    return _inflate(data, limit, zlib.MAX_WBITS | 16)


def zlib_decompress(data: Any, limit: int) -> bytes:
    """A zlib stream inflated to at most ``limit`` bytes."""
    return _inflate(data, limit, zlib.MAX_WBITS)


def _inflate(data: Any, limit: int, wbits: int) -> bytes:
    parts: list[bytes] = []
    remaining, left = bytes(data), limit + 1
    while remaining:
        stream = zlib.decompressobj(wbits)
        parts.append(stream.decompress(remaining, left))
        left -= len(parts[-1])
        if left <= 0:
            raise ValueError(f"the stream inflates to more than the chunk's {limit} bytes")
        if not stream.eof:
            raise ValueError("truncated: the compressed stream ends early")
        remaining = stream.unused_data if wbits & 16 else b""
    return b"".join(parts)


def checked_crc32c(data: Any, limit: int) -> memoryview:
    """The chunk without its trailing crc32c, once the checksum matches (zarr-python checks it too)."""
    view = memoryview(data)
    if len(view) < 4 or crc32c(view[:-4]) != int.from_bytes(view[-4:], "little"):  # type: ignore[arg-type]
        raise ValueError("crc32c checksum mismatch")
    return view[:-4]


def crc32c(data: bytes) -> int:
    import google_crc32c  # a zarr dependency; imported lazily, used once per shard

    return int(google_crc32c.value(bytes(data)))


def _zstd_bound(size: int) -> int:
    """ZSTD_COMPRESSBOUND, and room for a frame header and checksum."""
    return size + (size >> 8) + ((128 << 10) - size >> 11 if size < 128 << 10 else 0) + 64


def _deflate_bound(size: int) -> int:
    """zlib's deflateBound, generously: stored blocks cost 5 bytes per 64 KiB, a gzip wrapper 18."""
    return size + (size >> 10) + 1024


#: Each codec the direct path decodes: its decode, and the most bytes it may store for n decoded.
CODECS: dict[str, tuple[Decoder, Callable[[int], int]]] = {
    "blosc": (blosc_decompress, lambda size: size + BLOSC_MAX_OVERHEAD),
    "zstd": (zstd_decompress, _zstd_bound),
    "gzip": (gzip_decompress, _deflate_bound),
    "zlib": (zlib_decompress, _deflate_bound),
    "crc32c": (checked_crc32c, lambda size: size + 4),
}


def _decoders(names: list[str], decoded_bytes: int, where: str) -> tuple[tuple[tuple[Decoder, int], ...], int]:
    """The decoders of bytes-to-bytes codecs ``names`` (store order), each with the most bytes it
    may give, and the most bytes a stored chunk may hold."""
    decoders: list[tuple[Decoder, int]] = []
    size = decoded_bytes
    for name in names:
        if name not in CODECS:
            raise StoreError(f"{where}: codec {name!r} is not supported by the direct decode path; use decode='zarr'")
        decode, bound = CODECS[name]
        decoders.append((decode, size))
        size = bound(size)
    return tuple(reversed(decoders)), size


def read_chunk_layout(array_dir: Path) -> ChunkLayout:
    """Read and check the array metadata into a :class:`ChunkLayout`, or say why it is unsupported."""
    return chunk_layout(read_array_metadata(array_dir))


def chunk_layout(array: ArrayMetadata) -> ChunkLayout:
    """The :class:`ChunkLayout` of validated array metadata, or why the direct path cannot read it."""
    where = str(array.path.parent)
    decoded_bytes = math.prod(array.decoded_chunk) * array.dtype.itemsize
    if array.zarr_format == 2:
        if array.filters:
            raise StoreError(f"{where}: v2 filters are not supported by the direct decode path")
        if array.order != "C":
            raise StoreError(f"{where}: Fortran-ordered chunks are not supported by the direct decode path")
        decoders, max_encoded = _decoders([codec.name for codec in array.codecs], decoded_bytes, where)
        return ChunkLayout(
            shape=array.shape,
            dtype=array.dtype,
            read_unit=array.chunk,
            inner_chunk=None,
            zarr_format=2,
            separator=array.separator,
            v3_prefix=False,
            decoders=decoders,
            index_decoders_checksum=False,
            index_at_end=True,
            fill_value=array.fill_value,
            max_encoded=max_encoded,
        )
    codecs = array.sharding.codecs if array.sharding else array.codecs
    if codecs[0].name != "bytes":
        raise StoreError(f"{where}: codec {codecs[0].name!r} is not supported by the direct decode path")
    decoders, max_encoded = _decoders([codec.name for codec in codecs[1:]], decoded_bytes, where)
    return ChunkLayout(
        shape=array.shape,
        dtype=array.dtype,
        read_unit=array.chunk,
        inner_chunk=array.sharding.chunk if array.sharding else None,
        zarr_format=3,
        separator=array.separator,
        v3_prefix=array.v3_prefix,
        decoders=decoders,
        index_decoders_checksum=bool(array.sharding and array.sharding.index_checksum),
        index_at_end=array.sharding.index_at_end if array.sharding else True,
        fill_value=array.fill_value,
        max_encoded=max_encoded,
    )


def native_codec(layout: ChunkLayout) -> int | None:
    """What the native loads call the layout's codec, or None when they cannot decode it."""
    if not layout.decoders:
        return native.RAW
    if [decoder for decoder, _ in layout.decoders] == [blosc_decompress]:
        if native.BLOSC_BOUND:
            return native.BLOSC
        if native.load_chunks is not None:
            native.warn_blosc_unbound()
    return None


class FieldLayouts:
    """Each field's :class:`ChunkLayout`, read once and checked; where its chunks live under the plate,
    the codec the native loads call it (None on a plate in an object store, or a codec they lack)."""

    def __init__(self, metadata: PlateMetadata, local: bool) -> None:
        self.metadata = metadata
        self.local = local
        self.layouts: dict[int, ChunkLayout] = {}
        self.bases: dict[int, str] = {}
        self.native_codecs: dict[int, int | None] = {}
        #: The geometries (:attr:`ChunkLayout.geometry`) of the fields read so far.
        self.geometries: set[Any] = set()

    def get(self, field_index: int) -> ChunkLayout:
        """The layout of one field, read (and checked) on first use."""
        layout = self.layouts.get(field_index)
        if layout is None:
            array_dir = self.metadata.path / self.metadata.fields[field_index].path
            arrays = self.metadata.arrays
            layout = chunk_layout(arrays[field_index] if arrays else read_array_metadata(array_dir))
            channel_axis = len(layout.shape) - 3 if self.metadata.channel_axis is None else self.metadata.channel_axis
            spare = [c for i, c in enumerate(layout.chunk[:-2]) if i != channel_axis]
            if any(c != 1 for c in spare):
                raise StoreError(f"{array_dir}: chunks {layout.chunk} span more than one t/z plane")
            if channel_axis != len(layout.shape) - 3:
                layout = dataclasses.replace(layout, channel_axis=channel_axis)
            grid = [-(-s // c) for s, c in zip(layout.shape, layout.chunk, strict=True)]
            if grid[layout.channel_axis] > MAX_C_CHUNKS or max(grid[-2:]) > MAX_YX_CHUNKS:
                raise StoreError(
                    f"{array_dir}: a chunk grid of {grid} is beyond the direct decode path "
                    f"(at most {MAX_C_CHUNKS} channel and {MAX_YX_CHUNKS} y/x chunks); use decode='zarr'"
                )
            self.layouts[field_index] = layout
            self.bases[field_index] = f"{self.metadata.fields[field_index].path}/"
            self.native_codecs[field_index] = native_codec(layout) if self.local else None
            self.geometries.add(layout.geometry)
        return layout

    def object_key(self, field_index: int, c_index: int, y_index: int, x_index: int) -> str:
        """The key (path under the plate) of a chunk or shard file of a field already read."""
        layout = self.layouts[field_index]
        return self.bases[field_index] + layout.key(layout.coords(c_index, y_index, x_index))

    def field_path(self, field_index: int) -> str:
        """The field's array under the plate, for messages."""
        return self.metadata.fields[field_index].path
