"""Shard indexes: each shard's index (offset, size of every inner chunk) read once per process and
kept end to end in one int64 table, so a batch looks its chunks' byte ranges up with array indexing."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cropbench.errors import StoreError
from cropbench.formats.direct.codecs.crc32c import crc32c
from cropbench.formats.direct.keys import chunk_name, field_of
from cropbench.formats.direct.layout import ChunkLayout, FieldLayouts
from cropbench.formats.sources import ByteSource, FileSource


@dataclass(frozen=True)
class ShardEntry:
    """A shard that exists: its key under the plate, and its first row in :meth:`ShardIndex.table`."""

    key: str
    row: int


#: An empty entry of a shard index: both its offset and its size (zarr's rule).
EMPTY_ENTRY = 2**64 - 1


def check_index(entries: np.ndarray, max_encoded: int, shard_bytes: int | None, path: str) -> None:
    """A StoreError unless every (offset, size) entry of a shard index (uint64) is the empty marker
    or a range inside the shard (of ``shard_bytes``, where known) no longer than a stored chunk may be."""
    offsets, sizes = entries[:, 0], entries[:, 1]
    empty = (offsets == EMPTY_ENTRY) & (sizes == EMPTY_ENTRY)
    end = np.uint64(2**63 - 1 if shard_bytes is None else shard_bytes)
    bad = ~empty & ((sizes > max_encoded) | (offsets > end - np.minimum(sizes, end)))
    if bad.any():
        entry = int(np.flatnonzero(bad)[0])
        offset, size = int(offsets[entry]), int(sizes[entry])
        inside = "the shard" if shard_bytes is None else f"the shard's {shard_bytes:,} bytes"
        raise StoreError(
            f"shard {path} has a corrupt index: entry {entry} says {size:,} bytes at offset {offset:,}; an entry "
            f"is the empty marker or a range inside {inside} of at most {max_encoded:,} bytes (a chunk and its "
            f"codecs' overhead); {int(bad.sum())} entries are not"
        )


class ShardIndex:
    """The shard indexes read so far (per process: :meth:`forget` when the byte source is reopened).

    A batch's reads and the prefetch of the next batches look shards up from different threads: the
    lock makes each index fetched once, and the table's rows consistent with the entries given out.
    """

    def __init__(self, layouts: FieldLayouts, count_fetched: Callable[[int, int], None]) -> None:
        self.layouts = layouts
        self._count_fetched = count_fetched  # (bytes, reads): counted with the chunks' under one lock
        self._shards: dict[int, ShardEntry | None] = {}
        self._table = np.empty((0, 2), dtype=np.int64)
        self._pending: list[np.ndarray] = []
        self._lock = threading.Lock()

    def forget(self) -> None:
        """Drop every index read (a forked worker reads its own, under a lock no parent thread holds)."""
        self._lock = threading.Lock()
        self._shards.clear()
        self._table = np.empty((0, 2), dtype=np.int64)
        self._pending = []

    def table(self) -> tuple[np.ndarray, np.ndarray]:
        """Every shard index read so far, end to end: (offset, size) of each inner chunk as int64, a
        shard's entries from the row :meth:`lookup_many` gave it; -1 marks an empty entry."""
        if self._pending:
            with self._lock:
                if self._pending:
                    self._table, self._pending = np.concatenate([self._table, *self._pending]), []
        table = self._table
        return table[:, 0], table[:, 1]

    def lookup_many(self, shard_ids: list[int], source: ByteSource) -> list[ShardEntry | None]:
        """The entry of each shard (``shard_id`` packs its field and grid coordinates as a chunk key
        does), None where the shard does not exist; each index is fetched once per process, those not
        read yet all at once: a batch that first touches twenty shards waits one round trip, not twenty."""
        if all(shard_id in self._shards for shard_id in shard_ids):
            return [self._shards[shard_id] for shard_id in shard_ids]
        with self._lock:
            missing = list(dict.fromkeys(shard_id for shard_id in shard_ids if shard_id not in self._shards))
            wanted = [self._index_request(shard_id, source) for shard_id in missing]
            suffixes = [(key, size) for key, size, _, layout in wanted if layout.index_at_end]
            try:
                raws = source.get_suffixes(suffixes) if len(suffixes) > 1 else None
            except StoreError:
                raws = None  # read them one by one, so the message names the shard
            fetched = iter(raws or ())
            for shard_id, (key, size, path, layout) in zip(missing, wanted, strict=True):
                at_end = layout.index_at_end
                raw = (
                    next(fetched) if raws is not None and at_end else self._read_index(source, key, size, path, at_end)
                )
                self._store(shard_id, raw, key, size, path, source)
        return [self._shards[shard_id] for shard_id in shard_ids]

    def _index_request(self, shard_id: int, source: ByteSource) -> tuple[str, int, str, ChunkLayout]:
        """(key, bytes of its index, path for messages, layout) of a shard."""
        field_index = field_of(shard_id)
        layout = self.layouts.layouts[field_index]
        shard_key = self.layouts.object_key(field_index, *chunk_name(shard_id))
        size = layout.shard_entries * 16 + (4 if layout.index_decoders_checksum else 0)
        return shard_key, size, f"{source.location.rstrip('/')}/{shard_key}", layout

    @staticmethod
    def _read_index(source: ByteSource, key: str, size: int, path: str, at_end: bool) -> bytes | None:
        """One shard's index, at its end or its start; a short shard named as truncated."""
        try:
            return source.get_suffix(key, size) if at_end else source.get_range(key, 0, size)
        except StoreError as error:
            if "truncated" not in str(error):
                raise
            raise StoreError(f"shard {path} is truncated: its index needs {size} bytes") from error

    def _store(
        self, shard_id: int, raw: bytes | None, shard_key: str, size: int, path: str, source: ByteSource
    ) -> None:
        """Check one fetched index and keep it (under the lock); a shard that does not exist is None."""
        if raw is None:
            self._shards[shard_id] = None
            return
        layout = self.layouts.layouts[field_of(shard_id)]
        if layout.index_decoders_checksum:
            if crc32c(raw[:-4]) != int.from_bytes(raw[-4:], "little"):
                raise StoreError(f"shard {path} has a corrupt index (crc32c mismatch)")
            raw = raw[:-4]
        self._count_fetched(size, 1)
        entries = np.frombuffer(raw, dtype="<u8").reshape(-1, 2)
        descriptor = source.descriptor(shard_key) if isinstance(source, FileSource) else None
        shard_bytes = None if descriptor is None else os.fstat(descriptor).st_size
        check_index(entries, layout.max_encoded, shard_bytes, path)
        index = entries.astype(np.int64)  # the empty marker becomes -1
        row = len(self._table) + sum(len(pending) for pending in self._pending)
        self._pending.append(index)
        self._shards[shard_id] = ShardEntry(shard_key, row)
