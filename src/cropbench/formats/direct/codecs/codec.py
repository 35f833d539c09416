"""The one interface every store codec of the direct reader offers: a bounded decode and a size bound.

A codec decodes into at most the bytes its caller allows, so a corrupt or hostile chunk is refused
before it allocates more than a chunk holds; its bound says how many bytes a stored chunk may hold,
so a chunk file larger than that is refused before it is read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: A store codec's decode: (encoded bytes, the most bytes it may give) -> decoded bytes; ValueError
#: (or a codec's own error) when the input is corrupt or would decode to more than that.
Decoder = Callable[[Any, int], Any]


@dataclass(frozen=True)
class Codec:
    """A bytes-to-bytes store codec as the direct reader decodes it."""

    #: The codec's name in zarr metadata (v3 codec name, v2 compressor id).
    name: str
    decode: Decoder
    #: The most bytes the codec may store for a given number of decoded bytes.
    max_encoded: Callable[[int], int]
