"""Piece planning: the (crop, chunk) pieces of regions, grouped by chunk key.

A piece is the C side's record (see :mod:`.native`): one crop's part of one chunk, as a 12-tuple
made here and read by the loads and the copies. One planner per job: ``plan_pieces`` in C for a
batch where the extension is built, :func:`plan_pieces_python` otherwise and for a single region
(where making the C planner's int64 table costs more than the loop); both give the same pieces in
the same order (a test runs both over the same regions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

import cropbench.formats.direct.native as native
from cropbench.formats.base import Regions
from cropbench.formats.direct.keys import C_SHIFT, FIELD_SHIFT, X_BITS
from cropbench.formats.direct.layout import ChunkLayout, FieldLayouts

#: One (crop, chunk) intersection: (key, slot, positions, offsets, sy0, sy1, sx0, sx1, dy0, dy1,
#: dx0, dx1), the fields :data:`~.native.PIECE_FIELDS` names.
Piece = tuple[int, int, Any, Any, int, int, int, int, int, int, int, int]
#: The channels read from one channel chunk: (channel chunk, positions in the output, offsets inside the chunk).
ChannelGroup = tuple[int, Any, Any]


@dataclass(frozen=True)
class PiecePlan:
    """The pieces of a read, in planning order, and the same pieces grouped by chunk key."""

    pieces: list[Piece]
    by_chunk: dict[int, list[Piece]]


def group_by_chunk(pieces: list[Piece], by_chunk: dict[int, list[Piece]]) -> dict[int, list[Piece]]:
    """``by_chunk`` with each piece appended to its chunk key's list."""
    for piece in pieces:
        by_chunk.setdefault(piece[0], []).append(piece)
    return by_chunk


def channel_groups(channel_count: int, chunk_c: int, channels: np.ndarray | None) -> list[ChannelGroup]:
    """(channel chunk, positions in the output, offsets inside the chunk) of each channel chunk read."""
    if channels is None and chunk_c >= channel_count:
        return [(0, slice(None), slice(None))]
    wanted = np.arange(channel_count) if channels is None else np.asarray(channels)
    groups: list[ChannelGroup] = []
    for c_index in np.unique(wanted // chunk_c).tolist():
        positions = np.flatnonzero(wanted // chunk_c == c_index)
        groups.append((c_index, positions, wanted[positions] % chunk_c))
    return groups


def _spans(start: int, stop: int, step: int, landing: int, shift: int) -> list[tuple[int, int, int, int, int]]:
    """(chunk index << shift, start and end inside the chunk, start and end in the output) of each
    chunk of edge ``step`` that [start, stop) touches, the region landing at ``landing``."""
    spans = []
    for index in range(start // step, (stop - 1) // step + 1):
        origin = index * step
        inside0, inside1 = max(start, origin) - origin, min(stop, origin + step) - origin
        to = origin + inside0 - start + landing
        spans.append((index << shift, inside0, inside1, to, to + inside1 - inside0))
    return spans


def plan_pieces_python(
    pieces: list[Piece], rows: list[tuple[int, ...]], chunk_y: int, chunk_x: int, groups: list[ChannelGroup]
) -> None:
    """Append the pieces of ``rows`` (slot, field, y0, y1, x0, x1, out_y0, out_x0) to ``pieces``:
    ``plan_pieces`` of the extension in Python, the same pieces in the same order (channel groups,
    then regions, then chunk rows, then chunk columns)."""
    spanned = [
        (field << FIELD_SHIFT, slot, _spans(y0, y1, chunk_y, out_y0, X_BITS), _spans(x0, x1, chunk_x, out_x0, 0))
        for slot, field, y0, y1, x0, x1, out_y0, out_x0 in rows
    ]
    for c_index, positions, offsets in groups:
        for field_bits, slot, y_spans, x_spans in spanned:
            base = field_bits | c_index << C_SHIFT
            pieces.extend(
                [
                    (base | y_bits | ix, slot, positions, offsets, sy0, sy1, sx0, sx1, dy0, dy1, dx0, dx1)
                    for y_bits, sy0, sy1, dy0, dy1 in y_spans
                    for ix, sx0, sx1, dx0, dx1 in x_spans
                ]
            )


class PiecePlanner:
    """The pieces of one region or of a batch's regions, over the fields' chunk layouts."""

    def __init__(self, layouts: FieldLayouts, channel_count: int) -> None:
        self.layouts = layouts
        self.channel_count = channel_count
        self._groups: dict[tuple[int, tuple[int, ...] | None], list[ChannelGroup]] = {}

    def channel_groups(self, layout: ChunkLayout, channels: np.ndarray | None) -> list[ChannelGroup]:
        """:func:`channel_groups` of a layout's channel chunking, made once per selection."""
        chunk_c = layout.chunk_cyx[0]
        key = (chunk_c, None if channels is None else tuple(channels.tolist()))
        groups = self._groups.get(key)
        if groups is None:
            groups = self._groups[key] = channel_groups(self.channel_count, chunk_c, channels)
        return groups

    def plan_region(
        self, field_index: int, y0: int, y1: int, x0: int, x1: int, channels: np.ndarray | None
    ) -> list[Piece]:
        """The pieces of one region (slot 0, landing at the slot's origin)."""
        layout = self.layouts.get(field_index)
        _, chunk_y, chunk_x = layout.chunk_cyx
        pieces: list[Piece] = []
        plan_pieces_python(
            pieces, [(0, field_index, y0, y1, x0, x1, 0, 0)], chunk_y, chunk_x, self.channel_groups(layout, channels)
        )
        return pieces

    def plan_regions(self, regions: Regions, channels: np.ndarray | None) -> PiecePlan:
        """The pieces of a whole batch, one pass per chunk shape among its fields, grouped by chunk
        key as they are made: in C where the extension is built, else in Python."""
        pieces: list[Piece] = []
        by_chunk: dict[int, list[Piece]] = {}
        by_shape: dict[tuple[int, int, int], list[int]] = {}
        for field_index in np.unique(regions.field).tolist():
            by_shape.setdefault(self.layouts.get(field_index).chunk_cyx, []).append(field_index)
        planner = native.plan_pieces
        table = regions.table()  # for every chunk shape's pass
        for members in by_shape.values():
            layout = self.layouts.layouts[members[0]]
            _, chunk_y, chunk_x = layout.chunk_cyx
            chosen = None if len(by_shape) == 1 else np.flatnonzero(np.isin(regions.field, members))
            groups = self.channel_groups(layout, channels)
            if planner is not None:
                selected = table if chosen is None else np.ascontiguousarray(table[:, chosen])
                planner(pieces, by_chunk, selected, chosen, chunk_y, chunk_x, groups, FIELD_SHIFT, C_SHIFT, X_BITS)
                continue
            slots = np.arange(len(regions)) if chosen is None else chosen
            rows = list(zip(slots.tolist(), *(column.tolist() for column in table[:, slots]), strict=True))
            plan_pieces_python(pieces, rows, chunk_y, chunk_x, groups)
        if planner is None:
            group_by_chunk(pieces, by_chunk)
        return PiecePlan(pieces, by_chunk)
