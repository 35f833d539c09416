"""Read planning: which byte reads fetch a batch's missing chunks, dealt to the decode threads.

One read per chunk file (layouts without shards), or per run of chunks of one shard whose byte
ranges touch or lie within the store's coalescing gap. A read is a :data:`Read`:

    (object, start, length, entries)

``object`` is a chunk's or shard's key under the plate (``length`` -1: the whole object), or None
for chunks the store lacks (they read as the fill value); ``entries`` are its chunks as
(chunk key, offset in what was read, size or -1 for all), all of one field (:func:`read_field`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cropbench.formats.direct.keys import C_BITS, C_SHIFT, FIELD_SHIFT, X_BITS, Y_BITS, chunk_name
from cropbench.formats.direct.layout import FieldLayouts
from cropbench.formats.direct.shards import ShardIndex
from cropbench.formats.sources import ByteSource

#: A chunk of a read: (chunk key, offset in what the read returned, size or -1 for all of it).
Entry = tuple[int, int, int]
#: One read (see the module docstring).
Read = tuple[str | None, int, int, list[Entry]]
#: Shard geometry: inner chunks per shard along (c, y, x), and each axis' stride in the shard index.
Geometry = tuple[tuple[int, int, int], tuple[int, int, int]]
#: Below this many chunks to read, a read plan is made with integer arithmetic per chunk rather than
#: array calls over them (each array call costs a few microseconds however small the array).
FEW_KEYS = 48


def read_field(read: Read) -> int:
    """The field whose chunks a read fetches."""
    return read[3][0][0] >> FIELD_SHIFT


class ReadPlanner:
    """The reads that fetch chunks, in the order the chunks lie on disk, cut into stretches."""

    def __init__(self, layouts: FieldLayouts, shards: ShardIndex, coalesce_gap: int) -> None:
        self.layouts = layouts
        self.shards = shards
        self.coalesce_gap = coalesce_gap

    def plan(self, keys: list[int], source: ByteSource, parts: int = 1) -> list[list[Read]]:
        """The reads that fetch ``keys`` (one per chunk file, or per run of adjacent chunks in a shard),
        dealt to ``parts`` decode threads with as many chunks each (give or take one): the chunks in
        the order they lie on disk, cut into ``parts`` stretches, so a long run (grouped access) is cut
        between its chunks and every thread reads one stretch."""
        dealt: list[list[Read]] = [[] for _ in range(parts)]
        geometries = self.layouts.geometries
        if len(geometries) == 1:  # every field read so far is chunked alike
            geometry = next(iter(geometries))
            if geometry is None:
                self.file_reads(keys, dealt)
            elif len(keys) < FEW_KEYS:
                self.shard_reads_few(keys, geometry, source, dealt)
            else:
                array = np.array(keys, dtype=np.int64)
                self.shard_reads(array, array >> FIELD_SHIFT, geometry, source, dealt)
            return dealt
        if len(keys) < FEW_KEYS:  # a single crop's, where fields differ in chunking (a crop atlas's cells)
            layouts = self.layouts.layouts
            by_geometry: dict[Any, list[int]] = {}
            for key in keys:
                by_geometry.setdefault(layouts[key >> FIELD_SHIFT].geometry, []).append(key)
            for geometry, members in by_geometry.items():
                if geometry is None:
                    self.file_reads(members, dealt)
                else:
                    self.shard_reads_few(members, geometry, source, dealt)
            return dealt
        array = np.array(keys, dtype=np.int64)
        fields = array >> FIELD_SHIFT
        groups: dict[Any, list[int]] = {}
        for field_index in np.unique(fields).tolist():
            groups.setdefault(self.layouts.layouts[field_index].geometry, []).append(field_index)
        for geometry, members in groups.items():
            chosen = slice(None) if len(groups) == 1 else np.isin(fields, members)
            if geometry is None:
                self.file_reads(array[chosen].tolist(), dealt)
            else:
                self.shard_reads(array[chosen], fields[chosen], geometry, source, dealt)
        return dealt

    def file_reads(self, keys: list[int], dealt: list[list[Read]]) -> None:
        """One read of a whole chunk file per key (layouts without shards), in stretches to ``dealt``."""
        parts, object_key = len(dealt), self.layouts.object_key
        for index, key in enumerate(keys):
            dealt[index * parts // len(keys)].append(
                (object_key(key >> FIELD_SHIFT, *chunk_name(key)), 0, -1, [(key, 0, -1)])
            )

    def shard_reads(
        self, keys: np.ndarray, fields: np.ndarray, geometry: Geometry, source: ByteSource, dealt: list[list[Read]]
    ) -> None:
        """Reads of inner chunks of shards that share a geometry: in each shard, byte ranges that touch
        (or lie within the coalescing gap) are read as one, unless a stretch of ``dealt`` ends between
        them. Array arithmetic over the batch; Python per shard touched and per read."""
        (per_c, per_y, per_x), (stride_c, stride_y, stride_x) = geometry
        c_index = keys >> C_SHIFT & (2**C_BITS - 1)
        y_index = keys >> X_BITS & (2**Y_BITS - 1)
        x_index = keys & (2**X_BITS - 1)
        inner = c_index % per_c * stride_c + y_index % per_y * stride_y + x_index % per_x * stride_x
        shard_ids = fields << FIELD_SHIFT | c_index // per_c << C_SHIFT | y_index // per_y << X_BITS | x_index // per_x
        by_shard = np.argsort(shard_ids)  # np.unique(..., return_inverse=True) in fewer steps
        in_order = shard_ids[by_shard]
        first_of_shard = np.empty(len(keys), dtype=bool)
        first_of_shard[0] = True
        np.not_equal(in_order[1:], in_order[:-1], out=first_of_shard[1:])
        shards = in_order[first_of_shard]
        which = np.empty(len(keys), dtype=np.int64)
        which[by_shard] = np.cumsum(first_of_shard) - 1
        found = self.shards.lookup_many(shards.tolist(), source)
        shard_keys = [None if entry is None else entry.key for entry in found]
        rows = np.array([-1 if entry is None else entry.row for entry in found], dtype=np.int64)[which]
        offsets, sizes = self.shards.table()
        at = rows + inner
        starts = np.full(len(keys), -1, dtype=np.int64)  # a missing shard; an empty entry's offset is -1 too
        present = rows >= 0
        starts[present] = offsets[at[present]]
        absent = starts < 0
        if absent.any():  # the fill value, per field, to the thread that runs no Python before the batch
            for field_index in np.unique(fields[absent]).tolist():
                missing = keys[absent & (fields == field_index)].tolist()
                dealt[-1].append((None, 0, 0, [(key, 0, 0) for key in missing]))
            kept = ~absent
            keys, fields, which, starts, at = keys[kept], fields[kept], which[kept], starts[kept], at[kept]
        if len(keys) == 0:
            return
        order = np.lexsort((starts, which))
        keys, which, starts = keys[order], which[order], starts[order]
        lengths = sizes[at[order]]
        ends = starts + lengths
        stretch = np.arange(len(keys)) * len(dealt) // len(keys)
        new_run = np.ones(len(keys), dtype=bool)
        gap = self.coalesce_gap
        new_run[1:] = (which[1:] != which[:-1]) | (starts[1:] < ends[:-1]) | (starts[1:] > ends[:-1] + gap)
        new_run[1:] |= stretch[1:] != stretch[:-1]
        firsts = np.flatnonzero(new_run)
        ends_at = np.append(firsts[1:], len(keys))
        origins = starts[firsts]
        relative = starts - np.repeat(origins, ends_at - firsts)
        entries = list(zip(keys.tolist(), relative.tolist(), lengths.tolist(), strict=True))
        runs = zip(
            firsts.tolist(),
            ends_at.tolist(),
            which[firsts].tolist(),
            origins.tolist(),
            (ends[ends_at - 1] - origins).tolist(),
            stretch[firsts].tolist(),
            strict=True,
        )
        for first, end, shard, origin, length, part in runs:
            dealt[part].append((shard_keys[shard], origin, length, entries[first:end]))

    def shard_reads_few(self, keys: list[int], geometry: Geometry, source: ByteSource, dealt: list[list[Read]]) -> None:
        """:meth:`shard_reads` with integer arithmetic per key, for the few keys of a single crop,
        where each array call costs more than the loop it replaces; the same reads, in the same order."""
        (per_c, per_y, per_x), (stride_c, stride_y, stride_x) = geometry
        by_shard: dict[int, list[tuple[int, int]]] = {}
        for key in keys:
            c_index, y_index, x_index = chunk_name(key)
            shard_id = key >> FIELD_SHIFT << FIELD_SHIFT | c_index // per_c << C_SHIFT
            shard_id |= y_index // per_y << X_BITS | x_index // per_x
            inner = c_index % per_c * stride_c + y_index % per_y * stride_y + x_index % per_x * stride_x
            by_shard.setdefault(shard_id, []).append((key, inner))
        shard_ids = sorted(by_shard)
        found = dict(zip(shard_ids, self.shards.lookup_many(shard_ids, source), strict=True))
        offsets, sizes = self.shards.table()
        shard_keys = {shard_id: entry.key for shard_id, entry in found.items() if entry is not None}
        present: list[tuple[int, int, int, int]] = []  # (shard, start, size, key)
        absent: set[int] = set()
        for shard_id, entry in found.items():
            row = -1 if entry is None else entry.row
            for key, inner in by_shard[shard_id]:
                start = -1 if row < 0 else int(offsets[row + inner])
                if start < 0:
                    absent.add(key)
                else:
                    present.append((shard_id, start, int(sizes[row + inner]), key))
        if absent:  # the fill value, per field, in the order asked
            by_field: dict[int, list[int]] = {}
            for key in keys:
                if key in absent:
                    by_field.setdefault(key >> FIELD_SHIFT, []).append(key)
            for field_index in sorted(by_field):
                dealt[-1].append((None, 0, 0, [(key, 0, 0) for key in by_field[field_index]]))
        present.sort()
        parts, gap = len(dealt), self.coalesce_gap
        run: list[Entry] = []
        run_shard = run_stretch = origin = end = 0
        for index, (shard_id, start, size, key) in enumerate(present):
            stretch = index * parts // len(present)
            if run and (shard_id != run_shard or start < end or start > end + gap or stretch != run_stretch):
                dealt[run_stretch].append((shard_keys[run_shard], origin, end - origin, run))
                run = []
            if not run:
                run_shard, run_stretch, origin = shard_id, stretch, start
            run.append((key, start - origin, size))
            end = start + size
        if run:
            dealt[run_stretch].append((shard_keys[run_shard], origin, end - origin, run))
