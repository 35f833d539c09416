"""The C boundary: what each function of the extension ``cropbench.formats._native`` takes and gives.

The extension runs the direct reader's hot loops with the GIL released for a whole batch. It is
optional: built without a C compiler, ``copy_pieces``, ``load_chunks`` and ``plan_pieces`` here are
None and every stage runs its Python path, which gives the same bytes and counts.

What the C functions read is typed arrays, checked with the GIL held before anything is copied; the
records are NumPy structured dtypes of int64 fields defined once in :mod:`.records` (the C side
checks each array is 1-D, C-contiguous and of the record's item size, a TypeError naming it
otherwise):

- ``pieces``: :data:`~.records.PIECE` records, one crop's part of one chunk (a batch makes
  thousands: one per (crop, chunk)); ``channels``: the ``table`` of :class:`~.records.Channels`, a
  (groups, 1 + 2 * width) int64 array whose rows a piece's ``group`` names.
- ``regions``: a C-contiguous (7, n) int64 array: field, y0, y1, x0, x1, out_y0, out_x0 (the
  columns of :class:`~cropbench.formats.base.Regions`); ``slots`` None or a 1-D int64 array of n.
- ``out``: a (B, C, H, W) array whose rows are contiguous, of the chunks' dtype.
- ``reads``: :data:`~.records.NATIVE_READ` records, with ``paths`` (a list of bytes) the whole
  files they name; ``chunks``: :data:`~.records.NATIVE_CHUNK` records, with ``arrays`` (a list of
  C-contiguous arrays, one per chunk) what each decodes into; ``tally``: a one-record
  :data:`~.records.NATIVE_TALLY` array the loads write their counts and clocks into.

Functions:

- ``plan_pieces(pieces, regions, slots, chunk_y, chunk_x, group_chunks, group_base, field_shift,
  c_shift, x_bits)`` writes each region's pieces, per channel group (its channel chunk in the int64
  array ``group_chunks``, numbered from ``group_base``), into the array ``pieces`` and gives how many
  it wrote. ValueError for an empty region or more pieces than the array holds, TypeError for
  arrays that are not int64.
- ``copy_pieces(pieces, channels, chunks, out)``: copy each piece from ``chunks[key]`` (a dict of
  (C, H, W) arrays; the pieces come chunk by chunk, one look-up per run) into ``out``. TypeError
  (before copying anything) for what it leaves to numpy: a dtype change, rows that are not
  contiguous; ValueError for a piece outside its chunk or slot.
- ``load_chunks(reads, paths, chunks, arrays, tally[, pieces, channels, out])``: read and decode
  every chunk, copying its pieces into ``out`` right after; gives the indices of reads whose file
  does not exist (what it read and measured written into ``tally``), or None when anything is
  unusual (a short read, a chunk that does not validate, a whole file that is not a regular file or
  is longer than its bound): the Python path then reads those chunks again, and says what is wrong.
- ``bind_blosc(path)``: find c-blosc's reentrant calls (``blosc_cbuffer_validate``,
  ``blosc_decompress_ctx``) in numcodecs' loaded blosc extension at ``path``; False when they are
  not there. See :func:`bind_blosc`.
"""

from __future__ import annotations

import warnings
from typing import Any

import numcodecs
import numcodecs.blosc

try:
    import cropbench.formats._native as _native
except ImportError:  # built without a C compiler: the same loads, copies and plans run in Python
    _native = None

copy_pieces: Any = None if _native is None else _native.copy_pieces
load_chunks: Any = None if _native is None else _native.load_chunks
plan_pieces: Any = None if _native is None else _native.plan_pieces

#: The codecs ``load_chunks`` decodes, as it names them: none (raw bytes), and blosc.
RAW, BLOSC = 0, 1


def bind_blosc(module_path: str | None = None) -> bool:
    """Whether ``load_chunks`` can decode blosc: it calls numcodecs' own c-blosc, which numcodecs does
    not document as an interface; the symbols are looked up in its blosc extension (``module_path``,
    numcodecs' by default). Tested with the numcodecs range pyproject.toml pins."""
    if _native is None:
        return False
    return bool(_native.bind_blosc(numcodecs.blosc.__file__ if module_path is None else module_path))


def blosc_unbound_message(module_path: str | None = None) -> str:
    """The one-line warning when numcodecs' blosc extension lacks the c-blosc calls the native loads use."""
    where = numcodecs.blosc.__file__ if module_path is None else module_path
    return (
        f"cropbench: numcodecs {numcodecs.__version__} does not export blosc_cbuffer_validate and "
        f"blosc_decompress_ctx from {where}; the direct reader decodes blosc chunks in Python "
        "(the same bytes, slower); install a numcodecs version in the range cropbench pins"
    )


#: Whether the native loads decode blosc (bound once, at import).
BLOSC_BOUND = bind_blosc()


def warn_blosc_unbound() -> None:
    """Say once per call site that blosc chunks take the Python path (the extension is built, the bind failed)."""
    warnings.warn(blosc_unbound_message(), RuntimeWarning, stacklevel=3)
