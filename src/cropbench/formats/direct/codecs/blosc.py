"""Blosc: numcodecs' c-blosc, behind checks of the header that c-blosc trusts."""

from __future__ import annotations

from typing import Any

import numcodecs.blosc

from cropbench.formats.direct.codecs.codec import Codec

HEADER_BYTES = 16
#: What c-blosc adds to a chunk at most (its header; an incompressible chunk is stored as is).
MAX_OVERHEAD = 16


def decompress(data: Any, limit: int) -> bytes:
    """numcodecs' blosc decompression, once the chunk holds every byte its header counts (c-blosc
    does not know the buffer's length and would read past a truncated chunk's end) and the header
    promises no more than ``limit`` bytes (c-blosc allocates what it promises)."""
    view = memoryview(data)
    if len(view) < HEADER_BYTES:
        raise ValueError(f"truncated: {len(view)} bytes, less than a blosc header")
    decoded = int.from_bytes(view[4:8], "little")
    compressed = int.from_bytes(view[12:16], "little")
    if compressed > len(view):
        raise ValueError(f"truncated: the blosc header counts {compressed} bytes, the chunk has {len(view)}")
    if decoded > limit:
        raise ValueError(f"the blosc header promises {decoded} bytes, more than the chunk's {limit}")
    return numcodecs.blosc.decompress(view)


def max_encoded(size: int) -> int:
    return size + MAX_OVERHEAD


BLOSC = Codec("blosc", decompress, max_encoded)
