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
from cropbench.formats.ngff import read_array_document

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

    @property
    def geometry(self) -> Any:
        """What planning reads depends on: the shard geometry (:attr:`shard_cyx`), or None without shards."""
        return self.shard_cyx if self.inner_chunk else None

    def key(self, coords: tuple[int, ...]) -> str:
        joined = self.separator.join(map(str, coords))
        return f"c{self.separator}{joined}" if self.v3_prefix else joined


def _bytes_decoder(codec: dict[str, Any]) -> Decoder | None:
    name = codec["name"]
    config = codec.get("configuration", {})
    if name == "blosc":
        return blosc_decompress
    if name == "zstd":
        return numcodecs.Zstd(level=config.get("level", 0)).decode
    if name == "gzip":
        return numcodecs.GZip(level=config.get("level", 1)).decode
    if name == "crc32c":
        return _checked_crc32c  # type: ignore[return-value]
    raise StoreError(f"codec {name!r} is not supported by the direct decode path; use decode='zarr'")


def blosc_decompress(data: Any) -> bytes:
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
    if len(view) < 4 or crc32c(view[:-4]) != int.from_bytes(view[-4:], "little"):  # type: ignore[arg-type]
        raise ValueError("crc32c checksum mismatch")
    return view[:-4]


def crc32c(data: bytes) -> int:
    import google_crc32c  # a zarr dependency; imported lazily, used once per shard

    return int(google_crc32c.value(bytes(data)))


def _v2_decoder(compressor: dict[str, Any] | None) -> tuple[Decoder, ...]:
    if compressor is None:
        return ()
    codec_id = compressor.get("id")
    if codec_id == "blosc":
        return (blosc_decompress,)
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


def native_codec(layout: ChunkLayout) -> int | None:
    """What the native loads call the layout's codec, or None when they cannot decode it."""
    if not layout.decoders:
        return native.RAW
    if layout.decoders == (blosc_decompress,):
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
            layout = read_chunk_layout(array_dir)
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
