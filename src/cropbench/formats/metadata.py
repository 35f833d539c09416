"""Array metadata (zarr v3 ``zarr.json``, v2 ``.zarray``) validated once, when a plate is opened,
into :class:`ArrayMetadata`: every value a reader sizes or indexes anything by (shape, chunk and
shard edges, data type, codecs, fill value, key encoding) checked here, so no reader meets a
zero or negative edge, an unknown type or an empty codec list later. A bad value is one
:class:`~cropbench.errors.StoreError` naming the file, the key, the value and what was expected.

Checked here is what any zarr reader needs; what one decode path supports (the direct reader's
codecs, say) is that path's own check.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cropbench.errors import StoreError

#: The longest axis (and chunk edge) cropbench reads: 2**31 - 1, the limit of most image tools.
MAX_EDGE = 2**31 - 1
#: The most bytes a decoded chunk may hold (c-blosc's limit, less its header), so one chunk's
#: buffer is bounded whatever the codec.
MAX_CHUNK_BYTES = 2**31 - 2**10
#: The most inner chunks one shard's index may list (16 bytes each: a 256 MiB index).
MAX_SHARD_ENTRIES = 2**24
#: Axes of a field array: (c, y, x) up to NGFF's (t, c, z, y, x).
MIN_AXES, MAX_AXES = 3, 5
#: The data types a field may have, as zarr v3 names them.
DATA_TYPES = ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64", "float32", "float64")
#: Codecs that turn the array into bytes; a v3 codec list holds exactly one.
ARRAY_TO_BYTES = ("bytes", "sharding_indexed")
#: What a shard index may be encoded with: its bytes, and a checksum.
INDEX_CODECS = ("bytes", "crc32c")
#: Fill values of floating-point arrays written as strings (zarr v3 and v2).
FLOAT_NAMES = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


@dataclass(frozen=True)
class Codec:
    """One codec of an array: its name and configuration as the document gives them."""

    name: str
    configuration: Mapping[str, Any]


@dataclass(frozen=True)
class Sharding:
    """The ``sharding_indexed`` codec: inner chunks of each shard, their codecs and the shard index."""

    chunk: tuple[int, ...]
    codecs: tuple[Codec, ...]
    index_codecs: tuple[Codec, ...]
    index_at_end: bool

    @property
    def index_checksum(self) -> bool:
        """Whether a crc32c follows the index."""
        return any(codec.name == "crc32c" for codec in self.index_codecs)


@dataclass(frozen=True)
class ArrayMetadata:
    """One zarr array's metadata, every value checked (see the module docstring)."""

    #: The document the values come from (``zarr.json`` or ``.zarray``), for messages.
    path: Path
    zarr_format: int
    shape: tuple[int, ...]
    #: The element type, with the byte order the chunks are stored in.
    dtype: np.dtype
    #: The chunk grid's chunk: a shard when :attr:`sharding` is set.
    chunk: tuple[int, ...]
    #: v3: the codec list as stored (a sharded array's inner codecs are in :attr:`sharding`);
    #: v2: the compressor, if any.
    codecs: tuple[Codec, ...]
    sharding: Sharding | None
    fill_value: int | float
    separator: str
    #: v3 default keys start with ``c`` (``c/0/1/2``).
    v3_prefix: bool
    #: v2 only: filters before the compressor, and the chunks' memory order.
    filters: tuple[Codec, ...] = ()
    order: str = "C"

    @property
    def decoded_chunk(self) -> tuple[int, ...]:
        """The unit that is decoded: the inner chunk when sharded."""
        return self.sharding.chunk if self.sharding else self.chunk


def parse_array_metadata(document: Mapping[str, Any], path: Path) -> ArrayMetadata:
    """Validate an array's metadata document (read from ``path``) into :class:`ArrayMetadata`."""
    check = _Checker(path)
    zarr_format = document.get("zarr_format")
    if zarr_format not in (2, 3) or isinstance(zarr_format, bool):
        raise check.error("zarr_format", zarr_format, "2 or 3")
    shape = check.edges("shape", document.get("shape"), minimum=1)
    if not MIN_AXES <= len(shape) <= MAX_AXES:
        raise check.error(
            "shape", document.get("shape"), f"{MIN_AXES} to {MAX_AXES} axes, (c, y, x) up to (t, c, z, y, x)"
        )
    if zarr_format == 2:
        return _parse_v2(document, check, shape)
    return _parse_v3(document, check, shape)


def _parse_v3(document: Mapping[str, Any], check: _Checker, shape: tuple[int, ...]) -> ArrayMetadata:
    grid = check.mapping("chunk_grid", document.get("chunk_grid"))
    if grid.get("name") != "regular":
        raise check.error("chunk_grid.name", grid.get("name"), "'regular'")
    configuration = check.mapping("chunk_grid.configuration", grid.get("configuration"))
    chunk = check.edges("chunk_grid.configuration.chunk_shape", configuration.get("chunk_shape"), len(shape))
    codecs = check.codecs("codecs", document.get("codecs"))
    first = next((i for i, codec in enumerate(codecs) if codec.name in ARRAY_TO_BYTES), None)
    if first is None or sum(codec.name in ARRAY_TO_BYTES for codec in codecs) != 1:
        raise check.error("codecs", document.get("codecs"), "exactly one of " + ", ".join(map(repr, ARRAY_TO_BYTES)))
    sharding = None
    unit, array_to_bytes = chunk, codecs[first]
    if array_to_bytes.name == "sharding_indexed":
        sharding = check.sharding(f"codecs[{first}].configuration", array_to_bytes.configuration, chunk)
        unit = sharding.chunk
        inner_first = next(i for i, codec in enumerate(sharding.codecs) if codec.name in ARRAY_TO_BYTES)
        array_to_bytes = sharding.codecs[inner_first]
    data_type = document.get("data_type")
    if not isinstance(data_type, str) or data_type not in DATA_TYPES:
        raise check.error("data_type", data_type, "one of " + ", ".join(DATA_TYPES))
    endian = array_to_bytes.configuration.get("endian", "little")
    dtype = np.dtype(data_type).newbyteorder("<" if endian == "little" else ">")
    unit_key = "chunk_grid.configuration" if sharding is None else f"codecs[{first}].configuration"
    check.chunk_bytes(f"{unit_key}.chunk_shape", unit, dtype)
    check.array_bytes(shape, dtype)
    encoding = document.get("chunk_key_encoding", {"name": "default"})
    encoding = check.mapping("chunk_key_encoding", encoding)
    name = encoding.get("name")
    if name not in ("default", "v2"):
        raise check.error("chunk_key_encoding.name", name, "'default' or 'v2'")
    options = check.mapping("chunk_key_encoding.configuration", encoding.get("configuration", {}))
    separator = options.get("separator", "/" if name == "default" else ".")
    if separator not in ("/", "."):
        raise check.error("chunk_key_encoding.configuration.separator", separator, "'/' or '.'")
    return ArrayMetadata(
        path=check.path,
        zarr_format=3,
        shape=shape,
        dtype=dtype,
        chunk=chunk,
        codecs=codecs,
        sharding=sharding,
        fill_value=check.fill_value("fill_value", document.get("fill_value"), dtype, 3),
        separator=separator,
        v3_prefix=name == "default",
    )


def _parse_v2(document: Mapping[str, Any], check: _Checker, shape: tuple[int, ...]) -> ArrayMetadata:
    chunk = check.edges("chunks", document.get("chunks"), len(shape))
    raw_dtype = document.get("dtype")
    try:
        dtype = np.dtype(raw_dtype) if isinstance(raw_dtype, str) else None
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in "uif" or dtype.name not in DATA_TYPES:
        raise check.error("dtype", raw_dtype, "a numeric type such as '<u2' (" + ", ".join(DATA_TYPES) + ")")
    check.chunk_bytes("chunks", chunk, dtype)
    check.array_bytes(shape, dtype)
    compressor = document.get("compressor")
    codecs: tuple[Codec, ...] = ()
    if compressor is not None:
        compressor = check.mapping("compressor", compressor)
        if not isinstance(compressor.get("id"), str):
            raise check.error("compressor.id", compressor.get("id"), "a codec name")
        codecs = (Codec(compressor["id"], compressor),)
    filters = document.get("filters") or []
    if not isinstance(filters, list) or not all(isinstance(f, dict) and isinstance(f.get("id"), str) for f in filters):
        raise check.error("filters", document.get("filters"), "null or a list of codecs with an 'id'")
    order = document.get("order", "C")
    if order not in ("C", "F"):
        raise check.error("order", order, "'C' or 'F'")
    separator = document.get("dimension_separator", ".")
    if separator not in ("/", "."):
        raise check.error("dimension_separator", separator, "'/' or '.'")
    return ArrayMetadata(
        path=check.path,
        zarr_format=2,
        shape=shape,
        dtype=dtype,
        chunk=chunk,
        codecs=codecs,
        sharding=None,
        fill_value=check.fill_value("fill_value", document.get("fill_value"), dtype, 2),
        separator=separator,
        v3_prefix=False,
        filters=tuple(Codec(f["id"], f) for f in filters),
        order=order,
    )


class _Checker:
    """The checks of one document, each error naming it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def error(self, key: str, value: Any, expected: str) -> StoreError:
        shown = repr(value)
        shown = shown if len(shown) <= 80 else f"{shown[:77]}..."
        return StoreError(f"array metadata {self.path}: {key} is {shown}, expected {expected}")

    def mapping(self, key: str, value: Any) -> Mapping[str, Any]:
        if not isinstance(value, dict):
            raise self.error(key, value, "a JSON object")
        return value

    def edges(self, key: str, value: Any, axes: int | None = None, minimum: int = 1) -> tuple[int, ...]:
        """A list of whole numbers in ``minimum``..:data:`MAX_EDGE`, one per axis."""
        expected = f"a list of {'' if axes is None else f'{axes} '}whole numbers from {minimum} to {MAX_EDGE}"
        if not isinstance(value, list) or (axes is not None and len(value) != axes):
            raise self.error(key, value, expected)
        if not all(isinstance(v, int) and not isinstance(v, bool) and minimum <= v <= MAX_EDGE for v in value):
            raise self.error(key, value, expected)
        return tuple(value)

    def chunk_bytes(self, key: str, chunk: tuple[int, ...], dtype: np.dtype) -> None:
        size = math.prod(chunk) * dtype.itemsize
        if size > MAX_CHUNK_BYTES:
            raise self.error(
                key, list(chunk), f"a chunk of at most {MAX_CHUNK_BYTES:,} bytes decoded (this one: {size:,})"
            )

    def array_bytes(self, shape: tuple[int, ...], dtype: np.dtype) -> None:
        if math.prod(shape) * dtype.itemsize >= 2**62:
            raise self.error("shape", list(shape), "an array of fewer than 2**62 bytes")

    def codecs(self, key: str, value: Any) -> tuple[Codec, ...]:
        """A non-empty list of codecs, each ``{"name": ..., "configuration": {...}}`` (or a bare name)."""
        if not isinstance(value, list) or not value:
            raise self.error(key, value, "a non-empty list of codecs")
        codecs = []
        for index, item in enumerate(value):
            if isinstance(item, str):
                item = {"name": item}
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                raise self.error(f"{key}[{index}]", item, "a codec: an object with a 'name'")
            configuration = self.mapping(f"{key}[{index}].configuration", item.get("configuration", {}))
            codec = Codec(item["name"], configuration)
            if codec.name == "bytes" and configuration.get("endian", "little") not in ("little", "big"):
                raise self.error(f"{key}[{index}].configuration.endian", configuration["endian"], "'little' or 'big'")
            codecs.append(codec)
        return tuple(codecs)

    def sharding(self, key: str, configuration: Mapping[str, Any], shard: tuple[int, ...]) -> Sharding:
        chunk = self.edges(f"{key}.chunk_shape", configuration.get("chunk_shape"), len(shard))
        if any(s % c for s, c in zip(shard, chunk, strict=True)):
            raise self.error(f"{key}.chunk_shape", list(chunk), f"inner chunks that divide the shard {list(shard)}")
        entries = math.prod(s // c for s, c in zip(shard, chunk, strict=True))
        if entries > MAX_SHARD_ENTRIES:
            raise self.error(
                f"{key}.chunk_shape", list(chunk), f"at most {MAX_SHARD_ENTRIES:,} inner chunks per shard ({entries:,})"
            )
        codecs = self.codecs(f"{key}.codecs", configuration.get("codecs"))
        if sum(codec.name in ARRAY_TO_BYTES for codec in codecs) != 1:
            raise self.error(f"{key}.codecs", configuration.get("codecs"), "exactly one of 'bytes', 'sharding_indexed'")
        index_codecs = self.codecs(f"{key}.index_codecs", configuration.get("index_codecs", ["bytes"]))
        names = [codec.name for codec in index_codecs]
        if names not in (["bytes"], ["bytes", "crc32c"]):
            raise self.error(f"{key}.index_codecs", names, "'bytes', optionally followed by 'crc32c'")
        location = configuration.get("index_location", "end")
        if location not in ("start", "end"):
            raise self.error(f"{key}.index_location", location, "'start' or 'end'")
        return Sharding(chunk, codecs, index_codecs, location == "end")

    def fill_value(self, key: str, value: Any, dtype: np.dtype, zarr_format: int) -> int | float:
        """The fill value as a number of ``dtype``'s range. None reads as 0 in zarr v2, whose spec allows
        it (no fill value: chunks never written are undefined); zarr v3 requires a value."""
        if value is None and zarr_format == 2:
            return 0
        if dtype.kind in "ui":
            info = np.iinfo(dtype)
            if isinstance(value, int) and not isinstance(value, bool) and info.min <= value <= info.max:
                return value
            raise self.error(key, value, f"a whole number from {info.min} to {info.max} ({dtype.name})")
        if isinstance(value, str) and value in FLOAT_NAMES:
            return FLOAT_NAMES[value]
        if isinstance(value, str) and value.startswith("0x") and len(value) == 2 + 2 * dtype.itemsize:
            try:
                return float(np.frombuffer(bytes.fromhex(value[2:]), dtype=dtype.newbyteorder(">"))[0])
            except ValueError:
                pass
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:  # a whole number beyond any float
                number = math.nan
            if abs(number) <= np.finfo(dtype).max or (isinstance(value, float) and not math.isfinite(value)):
                return number
        expected = f"a number within {dtype.name}'s range, 'NaN', 'Infinity', '-Infinity' or its bits as '0x...'"
        raise self.error(key, value, expected)
