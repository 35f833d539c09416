"""Zstandard: numcodecs' zstd, into a buffer no larger than the frame's stated (and allowed) size."""

from __future__ import annotations

from typing import Any

import numcodecs
import numpy as np

from cropbench.formats.direct.codecs.codec import Codec

_ZSTD = numcodecs.Zstd()
FRAME_MAGIC = b"\x28\xb5\x2f\xfd"


def decompress(data: Any, limit: int) -> Any:
    """numcodecs' zstd decompression into a buffer of ``limit`` bytes: a frame that says it holds
    more is refused before anything is allocated, one that holds fewer is cut to what it holds."""
    content = content_size(data)
    if content is None:  # a frame that does not say its size (a streaming writer's): decoded whole, then checked
        decoded = _ZSTD.decode(data)
        if len(decoded) > limit:
            raise ValueError(f"the zstd frame decodes to {len(decoded)} bytes, more than the chunk's {limit}")
        return decoded
    if content > limit:
        raise ValueError(f"the zstd frame says it holds {content} bytes, more than the chunk's {limit}")
    return _ZSTD.decode(data, out=np.empty(content, dtype=np.uint8))


def content_size(data: Any) -> int | None:
    """The decoded size a zstd frame's header states, or None when it states none."""
    view = memoryview(data)
    if len(view) < 6 or bytes(view[:4]) != FRAME_MAGIC:
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


def max_encoded(size: int) -> int:
    """ZSTD_COMPRESSBOUND, and room for a frame header and checksum."""
    return size + (size >> 8) + ((128 << 10) - size >> 11 if size < 128 << 10 else 0) + 64


ZSTD = Codec("zstd", decompress, max_encoded)
