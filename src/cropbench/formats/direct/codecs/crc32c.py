"""The crc32c checksum codec: a chunk's (or a shard index's) trailing 4 bytes, checked and cut off."""

from __future__ import annotations

from typing import Any

from cropbench.formats.direct.codecs.codec import Codec

CHECKSUM_BYTES = 4


def checked(data: Any, limit: int) -> memoryview:
    """The chunk without its trailing crc32c, once the checksum matches (zarr-python checks it too)."""
    view = memoryview(data)
    if len(view) < CHECKSUM_BYTES or crc32c(view[:-CHECKSUM_BYTES]) != int.from_bytes(view[-CHECKSUM_BYTES:], "little"):
        raise ValueError("crc32c checksum mismatch")
    return view[:-CHECKSUM_BYTES]


def crc32c(data: Any) -> int:
    import google_crc32c  # a zarr dependency; imported lazily, used once per shard

    return int(google_crc32c.value(bytes(data)))


def max_encoded(size: int) -> int:
    return size + CHECKSUM_BYTES


CRC32C = Codec("crc32c", checked, max_encoded)
