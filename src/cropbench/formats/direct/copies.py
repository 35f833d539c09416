"""Copies: each (crop, chunk) piece from its decoded chunk into the output batch.

One copier per job: ``copy_pieces`` of the extension (C, the GIL released for the whole call) where
it is built and the arrays suit it, else :func:`copy_pieces_python` (a test runs both over the same
pieces).
"""

from __future__ import annotations

import numpy as np

import cropbench.formats.direct.native as native
from cropbench.formats.direct.records import Channels


def copy_pieces(pieces: np.ndarray, channels: Channels, chunks: dict[int, np.ndarray], out: np.ndarray) -> None:
    """Copy each piece (:data:`~.records.PIECE`; its channel group one of ``channels``) from its decoded
    chunk into ``out`` (B, C, H, W): in C with the GIL released for the whole call where the
    extension is built and the arrays suit it, else in Python."""
    copier = native.copy_pieces
    if copier is not None:
        try:
            copier(pieces, channels.table, chunks, out)
            return
        except TypeError:  # a dtype change, rows that are not contiguous, ...: checked before copying anything
            pass
    copy_pieces_python(pieces, channels, chunks, out)


def copy_pieces_python(pieces: np.ndarray, channels: Channels, chunks: dict[int, np.ndarray], out: np.ndarray) -> None:
    """:func:`copy_pieces` in Python: one numpy assignment per piece."""
    groups = channels.groups
    for key, slot, group, sy0, sy1, sx0, sx1, dy0, dy1, dx0, dx1 in pieces.tolist():
        selection = groups[group]
        out[slot, selection.positions, dy0:dy1, dx0:dx1] = chunks[key][selection.offsets, sy0:sy1, sx0:sx1]
