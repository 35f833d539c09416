"""The records the direct reader's stages pass one another, and the C extension reads, defined once.

Many of them go to C in one call, so they are rows of NumPy structured arrays whose fields are all
int64, in the order given (the C side reads each row as a struct of that many ``int64_t``; it checks
that an array is 1-D, C-contiguous and of the record's item size). What is not a number (a channel
selection, a path, a chunk's array) travels beside the rows and a row names it by its index.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


def _int64_record(*names: str) -> np.dtype:
    return np.dtype([(name, np.int64) for name in names])


#: One (crop, chunk) piece: the chunk's key (see :mod:`.keys`), the crop's slot in the output, its
#: channel group (a row of :attr:`Channels.table`), the rectangle inside the chunk (sy0, sy1, sx0,
#: sx1) and where it lands in the slot (dy0, dy1, dx0, dx1).
PIECE = _int64_record("key", "slot", "group", "sy0", "sy1", "sx0", "sx1", "dy0", "dy1", "dx0", "dx1")
#: One read of the native loads: an open file's ``descriptor`` and byte range (``start``, ``length``),
#: or (descriptor -1) the whole regular file whose path is ``paths[path]``, ``length`` then the most
#: bytes it may hold (-1: no bound); its ``codec`` (:data:`~.native.RAW` or :data:`~.native.BLOSC`);
#: its chunks ``chunks[first:end]``, the reads' ranges following one another.
NATIVE_READ = _int64_record("descriptor", "path", "start", "length", "codec", "first", "end")
#: One chunk of the native loads: where it lies in what its read returned (``offset``, ``size`` or -1
#: for all of it), and its pieces ``pieces[first_piece:end_piece]``; it decodes into ``arrays[i]``.
NATIVE_CHUNK = _int64_record("offset", "size", "first_piece", "end_piece")
#: What one call of the native loads read and measured: bytes read, ns reading, ns decoding, chunks
#: and bytes decoded (a one-record array the call writes into).
NATIVE_TALLY = _int64_record("bytes_read", "fetch_ns", "decode_ns", "chunks_decoded", "bytes_decoded")
#: No pieces.
NO_PIECES = np.empty(0, dtype=PIECE)


def int64_records(rows: Sequence[tuple[int, ...]], dtype: np.dtype) -> np.ndarray:
    """Rows of ints as a 1-D array of the all-int64 record ``dtype`` (one array call, no per-row objects)."""
    table = np.array(rows, dtype=np.int64).reshape(-1, len(dtype.names or ()))
    return table.view(dtype).reshape(-1)


@dataclass(frozen=True, slots=True)
class ChannelGroup:
    """The channels read from one channel chunk: positions in the output and offsets inside the
    chunk, each ``slice(None)`` (all) or a 1-D int64 array of the same length."""

    chunk: int
    positions: Any
    offsets: Any


@dataclass(frozen=True, slots=True)
class Channels:
    """The channel groups of a read, as Python (``groups``, for numpy's copies) and as C takes them:
    ``table`` is a C-contiguous (groups, 1 + 2 * width) int64 array, a row per group of its channel
    count (-1: all, in order), then ``width`` positions in the output, then ``width`` offsets inside
    the chunk (the first count of each used)."""

    groups: tuple[ChannelGroup, ...]
    table: np.ndarray

    @classmethod
    def of(cls, groups: Sequence[ChannelGroup], width: int) -> Channels:
        """The groups and their table, ``width`` at least the largest group's channel count."""
        table = np.zeros((len(groups), 1 + 2 * width), dtype=np.int64)
        for row, group in zip(table, groups, strict=True):
            if isinstance(group.positions, slice):
                row[0] = -1
                continue
            count = len(group.positions)
            row[0] = count
            row[1 : 1 + count] = group.positions
            row[1 + width : 1 + width + count] = group.offsets
        return cls(tuple(groups), table)

    @classmethod
    def every(cls) -> Channels:
        """One group (0): every channel of the chunk, in order, to the same channels of the output."""
        return cls.of([ChannelGroup(0, slice(None), slice(None))], 0)

    def __add__(self, other: Channels) -> Channels:
        """Both groups, ``other``'s numbered after these."""
        width = max(self.table.shape[1], other.table.shape[1]) // 2
        return Channels.of([*self.groups, *other.groups], width)
