"""Chunk keys: one int per decoded chunk (and per shard), packed from its field and grid position.

A key is ``field | channel chunk | y chunk | x chunk``, these many bits each, so a batch's keys
come from array arithmetic and are compared and hashed as plain ints. A shard id packs the shard's
grid position the same way.
"""

from __future__ import annotations

X_BITS = Y_BITS = 16
C_BITS = 12
C_SHIFT = X_BITS + Y_BITS
FIELD_SHIFT = C_SHIFT + C_BITS
#: Fields a key can name.
MAX_FIELDS = 2 ** (63 - FIELD_SHIFT)
#: Chunks a key can name along the channel axis, and along y and x.
MAX_C_CHUNKS = 2**C_BITS
MAX_YX_CHUNKS = 2**X_BITS


def chunk_key(field_index: int, c_index: int, y_index: int, x_index: int) -> int:
    """The key of chunk (or shard) (``c_index``, ``y_index``, ``x_index``) of field ``field_index``."""
    return field_index << FIELD_SHIFT | c_index << C_SHIFT | y_index << X_BITS | x_index


def field_of(key: int) -> int:
    """The field a key belongs to."""
    return key >> FIELD_SHIFT


def chunk_name(key: int) -> tuple[int, int, int]:
    """(channel chunk, y chunk, x chunk) of a key."""
    return key >> C_SHIFT & (2**C_BITS - 1), key >> X_BITS & (2**Y_BITS - 1), key & (2**X_BITS - 1)
