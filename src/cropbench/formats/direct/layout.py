"""How a zarr array stores its chunks, reduced to what decoding needs: :class:`ChunkLayout`, read
from ``zarr.json`` (v3) or ``.zarray`` (v2), with its store codecs (:mod:`.codecs`) in decode order,
and :class:`FieldLayouts`, each field's layout read once and checked against what the direct reader
supports.

Supported: (c, y, x) or singleton-(t, z) uint arrays, zarr v3 with ``bytes`` +
``blosc``/``zstd``/``gzip``/``crc32c`` codecs, optionally inside ``sharding_indexed``, and zarr v2
with a Blosc/Zstd/GZip/Zlib compressor and no filters.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import cropbench.formats.direct.native as native
from cropbench.errors import StoreError
from cropbench.formats.base import PlateMetadata
from cropbench.formats.direct.codecs import BLOSC, CODECS, Codec
from cropbench.formats.direct.keys import MAX_C_CHUNKS, MAX_YX_CHUNKS
from cropbench.formats.metadata import ArrayMetadata
from cropbench.formats.ngff import read_array_metadata


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
    codecs: tuple[tuple[Codec, int], ...]
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


def _decode_order(names: list[str], decoded_bytes: int, where: str) -> tuple[tuple[tuple[Codec, int], ...], int]:
    """The bytes-to-bytes codecs ``names`` (store order) in decode order, each with the most bytes it
    may give, and the most bytes a stored chunk may hold."""
    codecs: list[tuple[Codec, int]] = []
    size = decoded_bytes
    for name in names:
        if name not in CODECS:
            raise StoreError(f"{where}: codec {name!r} is not supported by the direct decode path; use decode='zarr'")
        codecs.append((CODECS[name], size))
        size = CODECS[name].max_encoded(size)
    return tuple(reversed(codecs)), size


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
        codecs, max_encoded = _decode_order([codec.name for codec in array.codecs], decoded_bytes, where)
        return ChunkLayout(
            shape=array.shape,
            dtype=array.dtype,
            read_unit=array.chunk,
            inner_chunk=None,
            zarr_format=2,
            separator=array.separator,
            v3_prefix=False,
            codecs=codecs,
            index_decoders_checksum=False,
            index_at_end=True,
            fill_value=array.fill_value,
            max_encoded=max_encoded,
        )
    stored = array.sharding.codecs if array.sharding else array.codecs
    if stored[0].name != "bytes":
        raise StoreError(f"{where}: codec {stored[0].name!r} is not supported by the direct decode path")
    codecs, max_encoded = _decode_order([codec.name for codec in stored[1:]], decoded_bytes, where)
    return ChunkLayout(
        shape=array.shape,
        dtype=array.dtype,
        read_unit=array.chunk,
        inner_chunk=array.sharding.chunk if array.sharding else None,
        zarr_format=3,
        separator=array.separator,
        v3_prefix=array.v3_prefix,
        codecs=codecs,
        index_decoders_checksum=bool(array.sharding and array.sharding.index_checksum),
        index_at_end=array.sharding.index_at_end if array.sharding else True,
        fill_value=array.fill_value,
        max_encoded=max_encoded,
    )


def native_codec(layout: ChunkLayout) -> int | None:
    """What the native loads call the layout's codec, or None when they cannot decode it."""
    if not layout.codecs:
        return native.RAW
    if [codec for codec, _ in layout.codecs] == [BLOSC]:
        if native.BLOSC_BOUND:
            return native.BLOSC
        if native.load_chunks is not None:
            native.warn_blosc_unbound()
    return None


class FieldLayouts:
    """Each field's :class:`ChunkLayout`, read once and checked; where its chunks live under the plate,
    the codec the native loads call it (None on a plate in an object store, or a codec they lack)."""

    def __init__(
        self, metadata: PlateMetadata, local: bool, extra: dict[int, tuple[str, ArrayMetadata]] | None = None
    ) -> None:
        self.metadata = metadata
        self.local = local
        #: Arrays read as fields past the plate's own (its crop atlases): index -> (path under the plate, metadata).
        self.extra = extra or {}
        self.layouts: dict[int, ChunkLayout] = {}
        self.bases: dict[int, str] = {}
        self.native_codecs: dict[int, int | None] = {}
        #: The geometries (:attr:`ChunkLayout.geometry`) of the fields read so far.
        self.geometries: set[Any] = set()

    def get(self, field_index: int) -> ChunkLayout:
        """The layout of one field, read (and checked) on first use."""
        layout = self.layouts.get(field_index)
        if layout is None:
            path = self.field_path(field_index)
            array_dir = self.metadata.path / path
            arrays = self.metadata.arrays
            if field_index in self.extra:
                array = self.extra[field_index][1]
            else:
                array = arrays[field_index] if arrays else read_array_metadata(array_dir)
            layout = chunk_layout(array)
            # A crop atlas is cropbench's own (c, y, x) image, whatever axes the plate's fields have.
            given = None if field_index in self.extra else self.metadata.channel_axis
            channel_axis = len(layout.shape) - 3 if given is None else given
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
            self.bases[field_index] = f"{path}/"
            self.native_codecs[field_index] = native_codec(layout) if self.local else None
            self.geometries.add(layout.geometry)
            # Last: a thread that finds the layout (a read, or the prefetch) finds the rest with it.
            self.layouts[field_index] = layout
        return layout

    def object_key(self, field_index: int, c_index: int, y_index: int, x_index: int) -> str:
        """The key (path under the plate) of a chunk or shard file of a field already read."""
        layout = self.layouts[field_index]
        return self.bases[field_index] + layout.key(layout.coords(c_index, y_index, x_index))

    def field_path(self, field_index: int) -> str:
        """The field's array under the plate."""
        extra = self.extra.get(field_index)
        return extra[0] if extra else self.metadata.fields[field_index].path
