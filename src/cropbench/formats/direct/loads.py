"""Chunk loads: fetch and decode the chunks of some reads, natively or in Python.

One loader per job: the native loads (``load_chunks`` of the extension: the reads, the decodes and
the copies of each chunk's pieces in one call without the GIL) where the plate is local, the codec
is one they know and the extension is built; the Python loads (one read call per read, the store
codecs per chunk) otherwise, and whenever a native call declines (a short read, a chunk that does
not validate): the Python path then decodes those chunks or raises what it always raised. A test
runs both over the same reads and compares bytes and counts.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

import cropbench.formats.direct.native as native
from cropbench.errors import StoreError
from cropbench.formats.direct.cache import ChunkCache, Loaded, LoadedChunk
from cropbench.formats.direct.keys import FIELD_SHIFT, chunk_name
from cropbench.formats.direct.layout import ChunkLayout, FieldLayouts
from cropbench.formats.direct.planning import PiecePlan
from cropbench.formats.direct.reads import Read
from cropbench.formats.direct.records import NATIVE_CHUNK, NATIVE_READ, NATIVE_TALLY, NO_PIECES, int64_records
from cropbench.formats.sources import ByteSource, FileSource, Request


def pieces_of(plan: PiecePlan | None, keys: list[int]) -> np.ndarray:
    """The pieces in ``plan`` of the chunks ``keys`` (distinct; those the plan lacks have none)."""
    if plan is None or not keys:
        return NO_PIECES
    runs = plan.runs
    return plan.of_chunks([key for key in keys if key in runs])


class ChunkLoader:
    """Loads chunks for one reader: the fields' layouts, where the bytes come from, what to decode into."""

    def __init__(self, layouts: FieldLayouts, cache: ChunkCache, source: Callable[[], ByteSource]) -> None:
        self.layouts = layouts
        self.cache = cache
        self.source = source

    def load(self, reads: list[Read], plan: PiecePlan | None = None, out: Any = None) -> Loaded:
        """Fetch and decode the chunks of ``reads`` (any thread), and say which pieces of those chunks
        (in ``plan``) are left to copy into ``out``: natively, the pieces of each chunk are copied
        right after it is decoded, while it is in the CPU's cache, and only the others are left."""
        if native.load_chunks is not None and reads:
            loaded = self._load_native(reads, plan, out)
            if loaded is not None:
                return loaded
        chunks, fetched, count = self._load_python(reads)
        return Loaded(chunks, fetched, count, pieces_of(plan, [key for read in reads for key, _, _ in read[3]]))

    def _load_native(self, reads: list[Read], plan: PiecePlan | None, out: np.ndarray | None) -> Loaded | None:
        """:meth:`load` in C (the reads, the decodes, the copies); None when the Python path must do it."""
        source = self.source()
        if not isinstance(source, FileSource):
            return None
        layouts, codecs, cache = self.layouts.layouts, self.layouts.native_codecs, self.cache
        runs = {} if plan is None or out is None else plan.runs
        results: list[LoadedChunk] = []
        read_rows: list[tuple[int, ...]] = []  # NATIVE_READ records, made into one array below
        chunk_rows: list[tuple[int, int, int, int]] = []  # NATIVE_CHUNK records
        paths: list[bytes] = []
        arrays: list[np.ndarray] = []  # what each chunk decodes into
        read_keys: list[list[int]] = []  # per native read: its chunks' keys
        read_starts: list[int] = []  # per native read: where its chunks start in results
        absent_keys: list[int] = []  # chunks the store lacks (the fill value), their pieces copied afterwards
        no_run = (0, 0)
        spare, getrefcount = cache.spare, sys.getrefcount
        for read in reads:
            key, start, length, entries = read
            field_index = entries[0][0] >> FIELD_SHIFT
            layout = layouts[field_index]
            codec = codecs[field_index]
            if codec is None:
                return None
            if key is None:
                results.extend((chunk_key, layout.filled_chunk(), False) for chunk_key, _, _ in entries)
                absent_keys.extend(chunk_key for chunk_key, _, _ in entries)
                continue
            if length < 0:  # a whole chunk file: the C side reads no more than the chunk may hold
                descriptor, path, length = -1, len(paths), layout.max_encoded
                paths.append(os.fsencode(source.path(key)))
            else:
                opened, path = source.descriptor(key), -1
                if opened is None:  # a shard that vanished since its index was read: the Python path says so
                    return None
                descriptor = opened
            first = len(chunk_rows)
            shape, dtype = layout.chunk_cyx, layout.dtype
            if cache.spare_kind is None:
                cache.spare_kind = shape, dtype
            reuse = spare if cache.spare_kind == (shape, dtype) else None
            for chunk_key, offset, size in entries:
                chunk = None
                if reuse:
                    try:
                        chunk = reuse.pop()
                    except IndexError:  # another thread took the last one
                        pass
                    else:
                        if getrefcount(chunk) > 2:  # still held elsewhere (a thread copying from it)
                            chunk = None
                if chunk is None:
                    chunk = np.empty(shape, dtype=dtype)
                chunk_rows.append((offset, size, *runs.get(chunk_key, no_run)))
                arrays.append(chunk)
                results.append((chunk_key, chunk, True))
            read_keys.append([chunk_key for chunk_key, _, _ in entries])
            read_starts.append(len(results) - len(entries))
            read_rows.append((descriptor, path, start, length, codec, first, len(chunk_rows)))
        native_reads, native_chunks = int64_records(read_rows, NATIVE_READ), int64_records(chunk_rows, NATIVE_CHUNK)
        copies = (plan.pieces, plan.channels.table, out) if plan is not None and runs else ()
        try:
            outcome = self._native_load(native_reads, paths, native_chunks, arrays, *copies)
        except TypeError:  # arrays the C copies leave to numpy (a dtype change, ...): found before anything ran
            copies = ()
            absent_keys.extend(chunk_key for keys in read_keys for chunk_key in keys)
            outcome = self._native_load(native_reads, paths, native_chunks, arrays)
        if outcome is None:
            return None
        fetched, absent = outcome
        for read_index in absent:  # whole chunk files that do not exist: the fill value, copied in Python
            fill_value = layouts[read_keys[read_index][0] >> FIELD_SHIFT].fill_value
            for index in range(read_starts[read_index], read_starts[read_index] + len(read_keys[read_index])):
                chunk_key, chunk, _ = results[index]
                chunk.fill(fill_value)
                results[index] = (chunk_key, chunk, False)
            if copies:
                absent_keys.extend(read_keys[read_index])
        source.count(len(native_reads) - len(absent), fetched)
        return Loaded(results, fetched, len(native_reads), pieces_of(plan, absent_keys))

    def _native_load(
        self,
        reads: np.ndarray,
        paths: list[bytes],
        chunks: np.ndarray,
        arrays: list[np.ndarray],
        pieces: np.ndarray | None = None,
        channels: np.ndarray | None = None,
        out: np.ndarray | None = None,
    ) -> tuple[int, list[int]] | None:
        """One native call: (bytes read, reads that found no file), or None when it declined."""
        tally = np.zeros(1, dtype=NATIVE_TALLY)
        absent = native.load_chunks(
            reads, paths, chunks, arrays, tally, *(() if out is None else (pieces, channels, out))
        )
        if absent is None:
            return None
        counts = tally[0]
        self.native_loaded(
            int(counts["fetch_ns"]),
            int(counts["decode_ns"]),
            int(counts["chunks_decoded"]),
            int(counts["bytes_decoded"]),
        )
        return int(counts["bytes_read"]), absent

    def native_loaded(self, fetch_ns: int, decode_ns: int, chunks: int, nbytes: int) -> None:
        """What a native call measured (ns reading, ns decoding) and decoded, for loaders with stage clocks."""

    def _load_python(self, reads: list[Read]) -> tuple[list[LoadedChunk], int, int]:
        """:meth:`load` in Python: one read call per read, one codec call per chunk."""
        results: list[LoadedChunk] = []
        fetched = count = 0
        layouts = self.layouts.layouts
        source = self.source()
        if isinstance(source, FileSource):  # whole chunk files: their size checked before they are read
            for key, _, length, entries in reads:
                if key is not None and length < 0:
                    self._check_size(source, key, entries[0][0] >> FIELD_SHIFT, _file_size(source, key))
        fetches = iter(self.fetch([(key, start, length) for key, start, length, _ in reads if key]))
        for key, _, length, entries in reads:
            field_index = entries[0][0] >> FIELD_SHIFT
            layout = layouts[field_index]
            data = None if key is None else next(fetches)
            count += key is not None
            if data is None:
                results.extend((chunk_key, layout.filled_chunk(), False) for chunk_key, _, _ in entries)
                continue
            if length < 0:
                self._check_size(source, key, field_index, len(data))  # type: ignore[arg-type]
            fetched += len(data)
            view = memoryview(data)
            for chunk_key, offset, size in entries:
                encoded = view if size < 0 else view[offset : offset + size]
                results.append((chunk_key, self.decode(field_index, layout, chunk_key, encoded), True))
        return results, fetched, count

    def _check_size(self, source: ByteSource, key: str, field_index: int, size: int | None) -> None:
        """A StoreError when a whole chunk file holds more bytes than its chunk can be stored in."""
        layout = self.layouts.layouts[field_index]
        if size is not None and size > layout.max_encoded:
            raise StoreError(
                f"chunk file {source.location.rstrip('/')}/{key} holds {size:,} bytes, more than the "
                f"{layout.max_encoded:,} a {layout.chunk_bytes:,}-byte chunk and its codecs can take: "
                "the chunk is corrupt"
            )

    def fetch(self, requests: list[Request]) -> list[bytes | None]:
        """What the reads fetch: whole chunk objects (None when absent) or byte ranges of shards."""
        return self.source().get_many(requests)

    def decode(self, field_index: int, layout: ChunkLayout, key: int, encoded: memoryview) -> np.ndarray:
        """One chunk through the store's codecs, as a (c, y, x) array; StoreError when it is corrupt."""
        data: Any = encoded
        try:
            for codec, limit in layout.codecs:
                data = codec.decode(data, limit)
            size = memoryview(data).nbytes
        except Exception as error:  # codecs raise RuntimeError, ValueError, ... on corrupt input
            raise StoreError(
                f"chunk {chunk_name(key)} of {self.layouts.field_path(field_index)} cannot be decoded "
                f"(corrupt chunk): {error}"
            ) from error
        if size != layout.chunk_bytes:
            raise StoreError(
                f"chunk {chunk_name(key)} of {self.layouts.field_path(field_index)} decoded to {size} "
                f"bytes, expected {layout.chunk_bytes}: the chunk is corrupt"
            )
        return np.frombuffer(data, dtype=layout.dtype).reshape(layout.chunk_cyx)


def _file_size(source: FileSource, key: str) -> int | None:
    """The size of a chunk file, None when there is none; a StoreError for what is not a regular file."""
    try:
        return os.stat(source.path(key)).st_size
    except FileNotFoundError:
        return None
