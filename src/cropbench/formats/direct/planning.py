"""Piece planning: the (crop, chunk) pieces of regions, grouped by chunk key.

A piece is a :data:`~.records.PIECE` record: one crop's part of one chunk, made here (a batch's
pieces in one structured array) and read by the loads and the copies. One planner per job:
``plan_pieces`` in C for a batch where the extension is built, :func:`plan_pieces_python` otherwise
and for a single region (where one more array call costs more than the loop); both give the same
pieces in the same order (a test runs both over the same regions).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

import cropbench.formats.direct.native as native
from cropbench.formats.base import Regions
from cropbench.formats.direct.keys import C_SHIFT, FIELD_SHIFT, X_BITS
from cropbench.formats.direct.layout import ChunkLayout, FieldLayouts
from cropbench.formats.direct.records import NO_PIECES, PIECE, ChannelGroup, Channels, int64_records


@dataclass(frozen=True, slots=True)
class PiecePlan:
    """The pieces of a read (:data:`~.records.PIECE` records) in runs of one chunk's pieces (in
    planning order within a run), where each chunk key's run lies (``runs``: key -> (first, end)),
    and the channel groups the pieces name."""

    pieces: np.ndarray
    runs: dict[int, tuple[int, int]]
    channels: Channels

    @classmethod
    def grouped(cls, pieces: np.ndarray, channels: Channels) -> PiecePlan:
        """The plan of ``pieces`` in planning order: a stable sort by chunk key makes the runs."""
        keys = pieces["key"]
        if len(keys) > 1 and bool((keys[1:] < keys[:-1]).any()):
            pieces = pieces[np.argsort(keys, kind="stable")]
            keys = pieces["key"]
        distinct, starts = np.unique(keys, return_index=True)
        ends = [*starts[1:].tolist(), len(keys)]
        return cls(pieces, dict(zip(distinct.tolist(), zip(starts.tolist(), ends, strict=True), strict=True)), channels)

    def of_chunks(self, keys: list[int]) -> np.ndarray:
        """The pieces of the chunks ``keys`` (distinct keys of ``runs``), chunk by chunk."""
        if len(keys) == len(self.runs):
            return self.pieces
        if not keys:
            return NO_PIECES
        # Concatenated as plain int64 rows: numpy promotes a structured dtype field by field for
        # every part, which cost more than the copies themselves for a grouped batch's ~100 chunks.
        rows = self.pieces.view(np.int64).reshape(len(self.pieces), -1)
        parts = [rows[first:end] for first, end in map(self.runs.__getitem__, keys)]
        return np.concatenate(parts).view(PIECE).reshape(-1)


def channel_groups(channel_count: int, chunk_c: int, channels: np.ndarray | None) -> list[ChannelGroup]:
    """The channel group of each channel chunk read."""
    if channels is None and chunk_c >= channel_count:
        return [ChannelGroup(0, slice(None), slice(None))]
    wanted = np.arange(channel_count) if channels is None else np.asarray(channels)
    groups: list[ChannelGroup] = []
    for c_index in np.unique(wanted // chunk_c).tolist():
        positions = np.flatnonzero(wanted // chunk_c == c_index)
        groups.append(ChannelGroup(c_index, positions, wanted[positions] % chunk_c))
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
    table: np.ndarray,
    slots: np.ndarray | None,
    chunk_y: int,
    chunk_x: int,
    groups: Sequence[ChannelGroup],
    group_base: int = 0,
) -> np.ndarray:
    """The pieces of the regions ``table`` (the 7 columns of :meth:`Regions.table`) in ``slots``
    (None: 0..n-1), their channel groups numbered from ``group_base``: ``plan_pieces`` of the
    extension in Python, the same pieces in the same order (channel groups, then regions, then
    chunk rows, then chunk columns)."""
    slot_list = range(table.shape[1]) if slots is None else slots.tolist()
    rows = list(zip(slot_list, *(column.tolist() for column in table), strict=True))
    return _plan_rows(rows, chunk_y, chunk_x, groups, group_base)


def _plan_rows(
    rows: list[tuple[int, ...]], chunk_y: int, chunk_x: int, groups: Sequence[ChannelGroup], group_base: int = 0
) -> np.ndarray:
    """:func:`plan_pieces_python` over rows (slot, field, y0, y1, x0, x1, out_y0, out_x0)."""
    spanned = [
        (field << FIELD_SHIFT, slot, _spans(y0, y1, chunk_y, out_y0, X_BITS), _spans(x0, x1, chunk_x, out_x0, 0))
        for slot, field, y0, y1, x0, x1, out_y0, out_x0 in rows
    ]
    pieces = [
        (field_bits | group.chunk << C_SHIFT | y_bits | ix, slot, number, sy0, sy1, sx0, sx1, dy0, dy1, dx0, dx1)
        for number, group in enumerate(groups, group_base)
        for field_bits, slot, y_spans, x_spans in spanned
        for y_bits, sy0, sy1, dy0, dy1 in y_spans
        for ix, sx0, sx1, dx0, dx1 in x_spans
    ]
    return int64_records(pieces, PIECE)


def piece_counts(table: np.ndarray, chunk_y: int, chunk_x: int) -> np.ndarray:
    """How many chunks each region of ``table`` (the 7 columns of :meth:`Regions.table`) touches; 0
    for an empty region."""
    _, y0, y1, x0, x1 = table[:5]
    rows = np.where(y1 > y0, (y1 - 1) // chunk_y - y0 // chunk_y + 1, 0)
    return rows * np.where(x1 > x0, (x1 - 1) // chunk_x - x0 // chunk_x + 1, 0)


class PiecePlanner:
    """The pieces of one region or of a batch's regions, over the fields' chunk layouts."""

    def __init__(self, layouts: FieldLayouts, channel_count: int) -> None:
        self.layouts = layouts
        self.channel_count = channel_count
        self._channels: dict[tuple[int, tuple[int, ...] | None], Channels] = {}

    def channels(self, layout: ChunkLayout, channels: np.ndarray | None) -> Channels:
        """The channel groups of a layout's channel chunking, made once per selection."""
        chunk_c = layout.chunk_cyx[0]
        key = (chunk_c, None if channels is None else tuple(channels.tolist()))
        found = self._channels.get(key)
        if found is None:
            groups = channel_groups(self.channel_count, chunk_c, channels)
            found = self._channels[key] = Channels.of(groups, self.channel_count)
        return found

    def plan_region(
        self, field_index: int, y0: int, y1: int, x0: int, x1: int, channels: np.ndarray | None
    ) -> PiecePlan:
        """The pieces of one region (slot 0, landing at the slot's origin): one piece per chunk."""
        layout = self.layouts.get(field_index)
        _, chunk_y, chunk_x = layout.chunk_cyx
        selection = self.channels(layout, channels)
        pieces = _plan_rows([(0, field_index, y0, y1, x0, x1, 0, 0)], chunk_y, chunk_x, selection.groups)
        keys = pieces["key"].tolist()
        return PiecePlan(pieces, {key: (index, index + 1) for index, key in enumerate(keys)}, selection)

    def plan_regions(self, regions: Regions, channels: np.ndarray | None) -> PiecePlan:
        """The pieces of a whole batch, one pass per chunk shape among its fields, grouped by chunk
        key: planned in C where the extension is built, else in Python."""
        by_shape: dict[tuple[int, int, int], list[int]] = {}
        for field_index in np.unique(regions.field).tolist():
            by_shape.setdefault(self.layouts.get(field_index).chunk_cyx, []).append(field_index)
        planner = native.plan_pieces
        table = regions.table()  # for every chunk shape's pass
        parts: list[np.ndarray] = []
        selection: Channels | None = None
        for members in by_shape.values():
            layout = self.layouts.layouts[members[0]]
            _, chunk_y, chunk_x = layout.chunk_cyx
            chosen = None if len(by_shape) == 1 else np.flatnonzero(np.isin(regions.field, members))
            shape_channels = self.channels(layout, channels)
            group_base = 0 if selection is None else len(selection.groups)
            selection = shape_channels if selection is None else selection + shape_channels
            selected = table if chosen is None else np.ascontiguousarray(table[:, chosen])
            if planner is not None:
                group_chunks = np.array([group.chunk for group in shape_channels.groups], dtype=np.int64)
                counts = piece_counts(selected, chunk_y, chunk_x)
                pieces = np.empty(int(counts.sum()) * len(group_chunks), dtype=PIECE)
                planner(
                    pieces, selected, chosen, chunk_y, chunk_x, group_chunks, group_base, FIELD_SHIFT, C_SHIFT, X_BITS
                )
            else:
                pieces = plan_pieces_python(selected, chosen, chunk_y, chunk_x, shape_channels.groups, group_base)
            parts.append(pieces)
        if selection is None:  # no regions
            return PiecePlan(NO_PIECES, {}, Channels.every())
        return PiecePlan.grouped(parts[0] if len(parts) == 1 else np.concatenate(parts), selection)
