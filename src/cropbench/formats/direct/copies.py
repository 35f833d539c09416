"""Copies: each (crop, chunk) piece from its decoded chunk into the output batch.

One copier per job: ``copy_pieces`` of the extension (C, the GIL released for the whole call) where
it is built and the arrays suit it, else :func:`copy_pieces_python` (a test runs both over the same
pieces).
"""

from __future__ import annotations

import numpy as np

import cropbench.formats.direct.native as native
from cropbench.formats.direct.planning import Piece
from cropbench.formats.direct.reads import Read


def copy_pieces(pieces: list[Piece], chunks: dict[int, np.ndarray], out: np.ndarray) -> None:
    """Copy each piece from its decoded chunk into ``out`` (B, C, H, W): in C with the GIL released
    for the whole call where the extension is built and the arrays suit it, else in Python."""
    copier = native.copy_pieces
    if copier is not None:
        try:
            copier(pieces, chunks, out)
            return
        except TypeError:  # a dtype change, rows that are not contiguous, ...: checked before copying anything
            pass
    copy_pieces_python(pieces, chunks, out)


def copy_pieces_python(pieces: list[Piece], chunks: dict[int, np.ndarray], out: np.ndarray) -> None:
    """:func:`copy_pieces` in Python: one numpy assignment per piece."""
    for key, slot, positions, offsets, sy0, sy1, sx0, sx1, dy0, dy1, dx0, dx1 in pieces:
        out[slot, positions, dy0:dy1, dx0:dx1] = chunks[key][offsets, sy0:sy1, sx0:sx1]


def pieces_of(reads: list[Read], by_chunk: dict[int, list[Piece]]) -> list[Piece]:
    """The pieces (``by_chunk``, by chunk key) of the chunks ``reads`` fetch."""
    return [piece for read in reads for key, _, _ in read[3] for piece in by_chunk.get(key, ())]
