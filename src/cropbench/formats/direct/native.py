"""The C boundary: what each function of the extension ``cropbench.formats._native`` takes and gives.

The extension runs the direct reader's hot loops with the GIL released for a whole batch. It is
optional: built without a C compiler, ``copy_pieces``, ``load_chunks`` and ``plan_pieces`` here are
None and every stage runs its Python path, which gives the same bytes and counts.

Records the C functions read (every field is checked with the GIL held before anything is copied):

- a **piece** (one crop's part of one chunk) is a 12-tuple, the C side's own representation, made
  by ``plan_pieces`` or the Python planner and read by ``copy_pieces`` and ``load_chunks``; its
  fields are :data:`PIECE_FIELDS`: the chunk's key (an int, see :mod:`.keys`), the crop's slot in the
  output, the channels as (positions in the output, offsets inside the chunk), each ``slice(None)``
  (all) or a C-contiguous 1-D int64 array, the rectangle inside the chunk and where it lands in the
  slot. Pieces stay tuples because a batch makes thousands of them: one per (crop, chunk).
- ``regions`` is a C-contiguous (7, n) int64 array: field, y0, y1, x0, x1, out_y0, out_x0 (the
  columns of :class:`~cropbench.formats.base.Regions`); ``slots`` None or a 1-D int64 array of n.
- ``out`` is a (B, C, H, W) array whose rows are contiguous, of the chunks' dtype.
- a **native read** is a 7-tuple (descriptor or -1, path as bytes or None, start, length, codec,
  first chunk, end chunk): a byte range of an open file, or (descriptor -1) a whole regular file
  by path, ``length`` then the most bytes it may hold (-1: no bound), opened without blocking;
  ``codec`` is :data:`RAW` or :data:`BLOSC`; its chunks are ``chunks[first:end]``, the reads' ranges
  following one another.
- a **native chunk** is a 5-tuple (offset, size or -1 for all, array, first piece, end piece): where
  the chunk lies in what its read returned, the C-contiguous array it decodes into, and its pieces
  ``pieces[first:end]`` (the ranges following one another).

Functions:

- ``plan_pieces(pieces, by_chunk, regions, slots, chunk_y, chunk_x, groups, field_shift, c_shift,
  x_bits)`` appends each region's pieces, per channel group ``(chunk, positions, offsets)`` in
  ``groups``, to the list ``pieces`` and to ``by_chunk[key]``. ValueError for an empty region,
  TypeError for arrays that are not int64.
- ``copy_pieces(pieces, chunks, out)``: copy each piece from ``chunks[key]`` (a dict of (C, H, W)
  arrays) into ``out``. TypeError (before copying anything) for what it leaves to numpy: a dtype
  change, rows that are not contiguous, channel indices that are not int64; ValueError for a
  piece outside its chunk or slot.
- ``load_chunks(reads, chunks[, pieces, out])``: read and decode every chunk, copying its pieces
  into ``out`` right after; gives (bytes read, indices of reads whose file does not exist, fetch
  ns, decode ns, chunks decoded, bytes decoded), or None when anything is unusual (a short read, a
  chunk that does not validate, a whole file that is not a regular file or is longer than its
  bound): the Python path then reads those chunks again, and says what is wrong.
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

#: The fields of a piece, in order (see the module docstring).
PIECE_FIELDS = ("key", "slot", "positions", "offsets", "sy0", "sy1", "sx0", "sx1", "dy0", "dy1", "dx0", "dx1")
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
