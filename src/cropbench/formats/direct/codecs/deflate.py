"""Deflate streams, gzip- and zlib-wrapped: Python's zlib, inflating no more than a chunk holds."""

from __future__ import annotations

import zlib
from typing import Any

from cropbench.formats.direct.codecs.codec import Codec


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


def max_encoded(size: int) -> int:
    """zlib's deflateBound, generously: stored blocks cost 5 bytes per 64 KiB, a gzip wrapper 18."""
    return size + (size >> 10) + 1024


GZIP = Codec("gzip", gzip_decompress, max_encoded)
ZLIB = Codec("zlib", zlib_decompress, max_encoded)
