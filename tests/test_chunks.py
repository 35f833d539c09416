"""The direct chunk reader's planner: a batch reads and decodes each chunk once, coalesces touching
byte ranges of a shard into one read, and gives the bytes of region-by-region reads whatever the
thread count."""

from __future__ import annotations

import dataclasses
import json
import shutil
import threading
import time
from pathlib import Path

import google_crc32c
import numpy as np
import pytest
import zarr
from conftest import TEST_LAYOUTS, TINY_SPEC

from cropbench.errors import ConfigError, StoreError
from cropbench.formats import DirectChunkReader, Regions, open_plate, read_plate_metadata
from cropbench.formats.base import warn_missing_chunks
from cropbench.formats.direct import StageTimedChunkReader, copy_pieces, native
from cropbench.formats.direct.copies import copy_pieces_python
from cropbench.formats.direct.keys import FIELD_SHIFT
from cropbench.formats.direct.records import (
    NATIVE_CHUNK,
    NATIVE_READ,
    NATIVE_TALLY,
    PIECE,
    ChannelGroup,
    Channels,
    int64_records,
)
from cropbench.formats.direct.scheduling import SHARES_PER_THREAD
from cropbench.plates.generate import generate_plate

NOT_BUILT = "the C extension is not built: install a C compiler and Python's headers, then pip install -e ."
needs_native_copies = pytest.mark.skipif(native.copy_pieces is None, reason=NOT_BUILT)
needs_native_loads = pytest.mark.skipif(native.load_chunks is None, reason=NOT_BUILT)
#: The test layouts whose chunks the native loads decode (the zstd one stays on the Python path).
NATIVE_LAYOUTS = ("planes-raw", "sharded", "tiles")


def _regions(count: int, seed: int, size: int = 40) -> Regions:
    rng = np.random.default_rng(seed)
    field = rng.integers(0, 4, count)
    y0, x0 = rng.integers(0, 200 - size, count), rng.integers(0, 240 - size, count)
    zeros = np.zeros(count, dtype=np.int64)
    return Regions(field, y0, y0 + size, x0, x0 + size, zeros, zeros)


def _one_by_one(reader: DirectChunkReader, regions: Regions, channels: np.ndarray | None) -> np.ndarray:
    return np.stack([reader.read_region(f, y0, y1, x0, x1, channels) for f, y0, y1, x0, x1, _, _ in regions.rows()])


@pytest.mark.parametrize("channels", [None, np.array([4, 0, 2])])
@pytest.mark.parametrize("threads", [1, 3])
def test_a_batch_gives_the_bytes_of_single_regions(
    layout_plate: Path, channels: np.ndarray | None, threads: int
) -> None:
    metadata = read_plate_metadata(layout_plate)
    regions = _regions(48, seed=2)
    expected = _one_by_one(DirectChunkReader(metadata), regions, channels)
    for cache_bytes in (0, 50_000, 2**30):  # no cache, evictions inside one batch, everything cached
        reader = DirectChunkReader(metadata, chunk_cache_bytes=cache_bytes, decode_threads=threads)
        out = np.zeros(expected.shape, dtype=expected.dtype)
        reader.read_regions(regions, out, channels)
        np.testing.assert_array_equal(out, expected)
        reader.read_regions(regions, out, channels)  # again, from whatever the cache kept
        np.testing.assert_array_equal(out, expected)
        assert reader.stats.regions == 2 * len(regions)


@needs_native_loads
@pytest.mark.parametrize("threads", [1, 2])
def test_evicted_chunks_are_decoded_into_again_only_when_nothing_else_holds_them(
    layout_plate: Path, threads: int
) -> None:
    metadata = read_plate_metadata(layout_plate)
    batches = [_regions(16, seed=seed) for seed in range(6)]
    expected = [_one_by_one(DirectChunkReader(metadata), regions, None) for regions in batches]
    reader = DirectChunkReader(metadata, chunk_cache_bytes=60_000, decode_threads=threads)  # evicts every batch
    out = np.zeros(expected[0].shape, dtype=expected[0].dtype)
    reader.read_regions(batches[0], out)
    held = list(reader.cache.spare)  # someone else now holds these: they must not be decoded into
    assert bool(held) == (layout_plate.stem in NATIVE_LAYOUTS)  # the Python path decodes into new arrays
    snapshots = [chunk.copy() for chunk in held]
    for regions, want in zip(batches, expected, strict=True):
        reader.read_regions(regions, out)
        np.testing.assert_array_equal(out, want)
    for chunk, snapshot in zip(held, snapshots, strict=True):
        np.testing.assert_array_equal(chunk, snapshot)
    assert len(reader.cache.spare) <= 2 * reader.stats.chunks_decoded


@pytest.mark.parametrize("threads", [2, 3])
def test_decode_threads_run_every_part_once(layout_plate: Path, threads: int) -> None:
    reader = DirectChunkReader(read_plate_metadata(layout_plate), decode_threads=threads)
    for parts in (1, 2, 5, 12):
        done: list[int] = []
        reader.threads.run(done.append, parts)
        assert sorted(done) == list(range(parts))


@pytest.mark.parametrize("threads", [2, 3])
def test_decode_threads_prepare_on_a_pool_thread_before_any_part(layout_plate: Path, threads: int) -> None:
    reader = DirectChunkReader(read_plate_metadata(layout_plate), decode_threads=threads)
    caller = threading.get_ident()
    events: list[tuple[str, int]] = []
    ready: list[int] = []

    def prepare() -> None:
        time.sleep(0.05)  # parts that did not wait for it would come first
        ready.extend(range(7))
        events.append(("prepare", threading.get_ident()))

    def work(part: int) -> None:
        events.append(("part", ready[part]))

    reader.threads.run(work, 7, prepare=prepare, meanwhile=lambda: events.append(("meanwhile", threading.get_ident())))
    prepared = events.index(next(event for event in events if event[0] == "prepare"))
    assert events[prepared][1] != caller
    assert ("meanwhile", caller) in events
    assert sorted(part for name, part in events if name == "part") == list(range(7))
    assert all(name != "part" for name, _ in events[:prepared])


@pytest.mark.parametrize("threads", [2, 3])
def test_decode_threads_raise_what_prepare_or_meanwhile_raised(layout_plate: Path, threads: int) -> None:
    reader = DirectChunkReader(read_plate_metadata(layout_plate), decode_threads=threads)
    done: list[int] = []

    def broken() -> None:
        raise StoreError("shard index unreadable")

    with pytest.raises(StoreError, match="shard index unreadable"):
        reader.threads.run(done.append, 5, prepare=broken, meanwhile=lambda: None)
    assert done == []  # no part ran on a plan that failed

    def slow_part(part: int) -> None:
        time.sleep(0.01)
        done.append(part)

    with pytest.raises(ValueError, match="copy failed"):
        reader.threads.run(slow_part, 5, prepare=lambda: None, meanwhile=lambda: int("copy failed"))
    assert sorted(done) == list(range(5))  # the pool's parts all ended before the error came back


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_batch_runs_the_callers_meanwhile_once_on_the_calling_thread(layout_plate: Path, threads: int) -> None:
    metadata = read_plate_metadata(layout_plate)
    regions = _regions(32, seed=8)
    expected = _one_by_one(DirectChunkReader(metadata), regions, None)
    readers = [
        DirectChunkReader(metadata, chunk_cache_bytes=cache_bytes, decode_threads=threads)
        for cache_bytes in (0, 50_000, 2**30)  # nothing cached, some chunks cached, all cached the second time
    ]
    for reader in readers:
        for _ in range(2):
            calls: list[int] = []
            out = np.zeros(expected.shape, dtype=expected.dtype)
            reader.read_regions(regions, out, meanwhile=lambda calls=calls: calls.append(threading.get_ident()))
            assert calls == [threading.get_ident()]
            np.testing.assert_array_equal(out, expected)
    with pytest.raises(TypeError, match="meanwhile"):  # an option of the direct reader only
        open_plate(layout_plate, decode="zarr").read_regions(regions, out, meanwhile=lambda: None)  # type: ignore[call-arg]


@pytest.mark.parametrize("threads", [2, 3])
def test_a_run_cut_between_threads_gives_the_same_bytes(layout_plate: Path, threads: int) -> None:
    metadata = read_plate_metadata(layout_plate)
    regions = _regions(24, seed=5)
    regions.field[:] = 1  # one field: in a sharded layout the batch's chunks coalesce into one long run
    expected = _one_by_one(DirectChunkReader(metadata, chunk_cache_bytes=0), regions, None)
    single = DirectChunkReader(metadata, chunk_cache_bytes=0)
    threaded = DirectChunkReader(metadata, chunk_cache_bytes=0, decode_threads=threads)
    for reader in (single, threaded):
        out = np.zeros(expected.shape, dtype=expected.dtype)
        reader.read_regions(regions, out)
        np.testing.assert_array_equal(out, expected)
    assert threaded.stats.chunks_decoded == single.stats.chunks_decoded
    if "sharded" in layout_plate.name:  # the run was cut: one read per part instead of one in all
        assert single.stats.reads < threaded.stats.reads <= single.stats.reads + threads * SHARES_PER_THREAD - 1


def _random_pieces(
    rng: np.random.Generator, count: int
) -> tuple[np.ndarray, Channels, dict[int, np.ndarray], tuple[int, ...]]:
    """Pieces over 6 chunks of (4, 20, 24) into 5 slots of (4, 30, 30), every channel (group 0) or
    two of them (groups 1-5)."""
    chunks = {key: rng.integers(0, 60_000, (4, 20, 24), dtype=np.uint16) for key in range(6)}
    groups = [ChannelGroup(0, slice(None), slice(None))] + [
        ChannelGroup(0, np.sort(rng.choice(4, 2, replace=False)), rng.choice(4, 2, replace=False)) for _ in range(5)
    ]
    rows = []
    for _ in range(count):
        h, w = int(rng.integers(1, 21)), int(rng.integers(1, 25))
        sy0, sx0 = int(rng.integers(0, 21 - h)), int(rng.integers(0, 25 - w))
        dy0, dx0 = int(rng.integers(0, 31 - h)), int(rng.integers(0, 31 - w))
        group = 0 if rng.random() < 0.5 else int(rng.integers(1, 6))
        slot, key = int(rng.integers(0, 5)), int(rng.integers(0, 6))
        rows.append((key, slot, group, sy0, sy0 + h, sx0, sx0 + w, dy0, dy0 + h, dx0, dx0 + w))
    return int64_records(rows, PIECE), Channels.of(groups, 4), chunks, (5, 4, 30, 30)


@needs_native_copies
@pytest.mark.parametrize("channels", [None, np.array([4, 0, 2])])
def test_the_c_planner_gives_the_pieces_of_the_python_planner(
    layout_plate: Path, channels: np.ndarray | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    reader = DirectChunkReader(read_plate_metadata(layout_plate))
    regions = _regions(40, seed=9)
    regions.out_y0[::3] = 7  # some regions land off their slot's origin
    for field_index in range(4):
        reader.layouts.get(field_index)
    odd = reader.layouts.layouts[2]  # one field chunked otherwise: a second pass with its own chunk shape
    reader.layouts.layouts[2] = dataclasses.replace(odd, inner_chunk=None, read_unit=(*odd.chunk[:-2], 17, 23))
    planned = reader.pieces.plan_regions(regions, channels)
    zero = np.zeros(1, dtype=np.int64)
    singles = [  # each region alone in slot 0 at its origin, as a single crop is read
        reader.pieces.plan_regions(
            Regions(*(column[slot : slot + 1] for column in regions.columns()[:5]), zero, zero), channels
        )
        for slot in range(len(regions))
    ]
    monkeypatch.setattr(native, "plan_pieces", None)
    expected = reader.pieces.plan_regions(regions, channels)
    assert planned.pieces.dtype == PIECE
    np.testing.assert_array_equal(planned.pieces, expected.pieces)
    assert planned.runs == expected.runs
    np.testing.assert_array_equal(planned.channels.table, expected.channels.table)
    for (field_index, y0, y1, x0, x1, _, _), single in zip(regions.rows(), singles, strict=True):
        alone = reader.pieces.plan_region(field_index, y0, y1, x0, x1, channels)
        np.testing.assert_array_equal(np.sort(single.pieces, order="key"), np.sort(alone.pieces, order="key"))
    assert set((planned.pieces["key"] >> FIELD_SHIFT).tolist()) == set(regions.field.tolist())
    for key, (first, end) in planned.runs.items():  # each chunk's pieces are one run
        assert (planned.pieces["key"][first:end] == key).all()
    assert sum(end - first for first, end in planned.runs.values()) == len(planned.pieces)
    table = np.stack(regions.columns())
    one_group = np.zeros(1, dtype=np.int64)
    room = np.empty(10_000, dtype=PIECE)
    with pytest.raises(ValueError, match="region 0 is empty"):
        bad = table.copy()
        bad[2, 0] = bad[1, 0]  # y1 == y0
        native._native.plan_pieces(room, bad, None, 8, 8, one_group, 0, 44, 32, 16)
    with pytest.raises(TypeError, match="int64"):
        native._native.plan_pieces(room, table.astype(np.int32), None, 8, 8, one_group, 0, 44, 32, 16)
    with pytest.raises(ValueError, match="more pieces than the pieces array holds"):
        native._native.plan_pieces(room[:3], table, None, 8, 8, one_group, 0, 44, 32, 16)
    with pytest.raises(TypeError, match="88-byte records"):
        native._native.plan_pieces(np.empty(100, dtype=np.int64), table, None, 8, 8, one_group, 0, 44, 32, 16)


@needs_native_copies
def test_the_c_copies_give_the_bytes_of_numpy_assignment() -> None:
    pieces, channels, chunks, shape = _random_pieces(np.random.default_rng(7), 400)
    expected, copied = np.zeros(shape, dtype=np.uint16), np.zeros(shape, dtype=np.uint16)
    copy_pieces_python(pieces, channels, chunks, expected)
    native.copy_pieces(pieces, channels.table, chunks, copied)
    np.testing.assert_array_equal(copied, expected)
    strided = np.zeros((5, 4, 30, 40), dtype=np.uint16)[..., 5:35]  # rows contiguous, the slot is not
    native.copy_pieces(pieces, channels.table, chunks, strided)
    np.testing.assert_array_equal(strided, expected)
    by_chunk = np.sort(pieces, order="key", kind="stable")  # runs of one chunk's pieces share its buffer
    expected[:], copied[:] = 0, 0
    copy_pieces_python(by_chunk, channels, chunks, expected)
    native.copy_pieces(by_chunk, channels.table, chunks, copied)
    np.testing.assert_array_equal(copied, expected)


@needs_native_copies
def test_the_c_copies_refuse_a_piece_outside_its_chunk_or_slot_and_leave_odd_arrays_to_numpy() -> None:
    pieces, channels, chunks, shape = _random_pieces(np.random.default_rng(8), 20)
    out = np.zeros(shape, dtype=np.uint16)
    outside = Channels.of([*channels.groups, ChannelGroup(0, np.array([0, 4]), np.array([0, 1]))], 4)
    for field, value in (
        ("slot", 5),  # no slot 5
        ("sy1", 21),  # past the chunk's 20 rows
        ("dy1", pieces[0]["dy1"] + 1),  # sizes differ
        ("group", 6),  # no channel 4 in the output (group 6 of outside), no group 6 in channels
    ):
        bad = pieces.copy()
        bad[-1][field] = value
        if field == "sy1":
            bad[-1]["sy0"], bad[-1]["dy0"], bad[-1]["dy1"] = 0, 0, 21
        with pytest.raises(ValueError):
            native.copy_pieces(bad, (outside if field == "group" else channels).table, chunks, out)
        if field == "group":
            with pytest.raises(ValueError, match="channel group 6 of 6"):
                native.copy_pieces(bad, channels.table, chunks, out)
    with pytest.raises(KeyError):
        strange = pieces.copy()
        strange["key"] = 99
        native.copy_pieces(strange, channels.table, chunks, out)
    with pytest.raises(TypeError, match="records"):
        native.copy_pieces(pieces.view(np.int64), channels.table, chunks, out)
    with pytest.raises(TypeError, match="records"):
        native.copy_pieces(pieces[::2], channels.table, chunks, out)
    as_float = np.zeros(shape, dtype=np.float32)  # a dtype change: numpy casts, the C copies do not
    with pytest.raises(TypeError):
        native.copy_pieces(pieces, channels.table, chunks, as_float)
    expected = np.zeros(shape, dtype=np.float32)
    copy_pieces_python(pieces, channels, chunks, expected)
    copy_pieces(pieces, channels, chunks, as_float)
    np.testing.assert_array_equal(as_float, expected)


@pytest.mark.parametrize("parts", [1, 2, 3])
def test_reads_are_dealt_to_threads_in_stretches_of_as_many_chunks(layout_plate: Path, parts: int) -> None:
    reader = DirectChunkReader(read_plate_metadata(layout_plate), chunk_cache_bytes=0)
    regions = _regions(24, seed=5)
    regions.field[:] = 1  # one field: in a sharded layout its chunks coalesce into one long run
    keys = list(reader.pieces.plan_regions(regions, None).runs)
    dealt = reader.reads.plan(keys, reader.source, parts)
    assert len(dealt) == parts
    dealt_keys = [key for share in dealt for read in share for key, _, _ in read[3]]
    assert sorted(dealt_keys) == sorted(keys)
    counts = [sum(len(read[3]) for read in share) for share in dealt]
    assert max(counts) - min(counts) <= 1, counts
    whole = reader.reads.plan(keys, reader.source, 1)[0]
    for share in dealt:
        for source, start, length, entries in share:
            assert source is not None
            if length >= 0:  # a byte range of a shard: every chunk inside it, the first at its start
                assert entries[0][1] == 0 and all(
                    offset >= 0 and offset + size <= length for _, offset, size in entries
                )
                assert start >= 0
    if "sharded" in layout_plate.name:
        assert len(whole) < len(keys)  # coalesced
        assert len(whole) <= sum(len(share) for share in dealt) <= len(whole) + parts - 1  # cut once per stretch
    else:
        assert sum(len(share) for share in dealt) == len(whole) == len(keys)


@pytest.mark.parametrize("parts", [1, 2, 3])
def test_few_chunks_are_planned_per_key_into_the_same_reads(tmp_path: Path, parts: int) -> None:
    """The per-key planner (a single crop's few chunks) and the array one (a batch's) agree, empty
    shard entries included."""
    plate = tmp_path / "sharded.zarr"
    generate_plate(plate, TINY_SPEC, TEST_LAYOUTS["sharded"], progress=False)
    _drop_first_chunk(plate / read_plate_metadata(plate).fields[2].path)
    reader = DirectChunkReader(read_plate_metadata(plate), chunk_cache_bytes=0)
    regions = _regions(30, seed=9)
    every = list(reader.pieces.plan_regions(regions, None).runs)
    rng = np.random.default_rng(parts)
    for count in (1, 2, 5, 17, 40):
        keys = [every[i] for i in rng.choice(len(every), count, replace=False)]
        keys += [] if 2 << FIELD_SHIFT in keys else [2 << FIELD_SHIFT]  # field 2's first chunk: an empty entry
        per_key: list[list] = [[] for _ in range(parts)]
        reader.reads.shard_reads_few(keys, reader.layouts.layouts[0].shard_cyx, reader.source, per_key)
        by_array: list[list] = [[] for _ in range(parts)]
        array = np.array(keys, dtype=np.int64)
        reader.reads.shard_reads(
            array, array >> FIELD_SHIFT, reader.layouts.layouts[0].shard_cyx, reader.source, by_array
        )
        assert per_key == by_array, count
        assert (None, 0, 0, [(2 << FIELD_SHIFT, 0, 0)]) in per_key[-1]


def test_regions_land_at_their_offsets_and_leave_the_rest_alone(tiny_plate: Path) -> None:
    reader = open_plate(tiny_plate, "direct")
    one = np.ones(1, dtype=np.int64)
    regions = Regions(one * 2, one * 0, one * 10, one * 230, one * 240, one * 6, one * 3)
    out = np.full((1, 5, 16, 16), 7, dtype=np.uint16)
    reader.read_regions(regions, out)
    np.testing.assert_array_equal(out[0, :, 6:16, 3:13], reader.read_region(2, 0, 10, 230, 240))
    assert (out[0, :, :6] == 7).all() and (out[0, :, :, :3] == 7).all() and (out[0, :, :, 13:] == 7).all()


def test_a_batch_decodes_each_chunk_once_and_coalesces_touching_reads(tiny_plate: Path) -> None:
    metadata = read_plate_metadata(tiny_plate)  # default layout: one shard per field, 64 x 64 chunks
    reader = DirectChunkReader(metadata, chunk_cache_bytes=0)
    count = 8
    zeros, field = np.zeros(count, dtype=np.int64), np.zeros(count, dtype=np.int64)
    y0 = np.arange(count) * 4 + 10
    regions = Regions(field, y0, y0 + 100, y0, y0 + 100, zeros, zeros)  # together they cover chunks (0..2, 0..2)
    reader.read_regions(regions, np.empty((count, 5, 100, 100), dtype=np.uint16))
    assert reader.stats.chunks_decoded == 9, "a 3 x 3 block of chunks, each decoded once for the batch"
    assert reader.stats.chunks_touched > 9
    assert reader.stats.reads < 9, "chunks stored next to each other in the shard are read together"
    single = DirectChunkReader(metadata, chunk_cache_bytes=0)
    for f, a, b, c, d, _, _ in regions.rows():
        single.read_region(f, a, b, c, d)
    assert single.stats.chunks_decoded > reader.stats.chunks_decoded


def test_bad_batches_and_thread_counts_are_refused(tiny_plate: Path) -> None:
    reader = open_plate(tiny_plate, "direct")
    one = np.ones(1, dtype=np.int64)
    with pytest.raises(ConfigError, match="region 0"):
        reader.read_regions(
            Regions(one, one * 190, one * 210, one, one * 9, one * 0, one * 0), np.empty((1, 5, 20, 8), dtype=np.uint16)
        )
    with pytest.raises(ConfigError, match="out has shape"):
        reader.read_regions(
            Regions(one, one, one * 9, one, one * 9, one * 0, one * 0), np.empty((2, 5, 8, 8), dtype=np.uint16)
        )
    with pytest.raises(ConfigError, match="decode_threads"):
        DirectChunkReader(read_plate_metadata(tiny_plate), decode_threads=0)


def _drop_first_chunk(array_dir: Path) -> None:
    """Delete the array's first chunk file or, when sharded, empty its first shard-index entry."""
    codecs = json.loads((array_dir / "zarr.json").read_text())["codecs"]
    first = sorted(path for path in (array_dir / "c").rglob("*") if path.is_file())[0]
    if codecs[0]["name"] != "sharding_indexed":
        first.unlink()
        return
    data = bytearray(first.read_bytes())
    shard = json.loads((array_dir / "zarr.json").read_text())["chunk_grid"]["configuration"]["chunk_shape"]
    inner = codecs[0]["configuration"]["chunk_shape"]
    entries = int(np.prod([s // i for s, i in zip(shard, inner, strict=True)]))
    start = len(data) - entries * 16 - 4  # the index (offset, size per entry) and its crc32c, at the end
    data[start : start + 16] = b"\xff" * 16
    data[-4:] = google_crc32c.value(bytes(data[start:-4])).to_bytes(4, "little")
    first.write_bytes(bytes(data))


def test_a_missing_chunk_is_counted_and_read_as_the_fill_value(layout_plate: Path, tmp_path: Path) -> None:
    plate = tmp_path / layout_plate.name
    shutil.copytree(layout_plate, plate)
    array_dir = plate / read_plate_metadata(plate).fields[1].path
    _drop_first_chunk(array_dir)
    expected = zarr.open_array(str(array_dir), mode="r")[...]
    assert (expected[0, :16, :16] == 0).all(), "zarr reads a missing chunk as the fill value"
    for decode in ("direct", "field"):
        reader = open_plate(plate, decode)
        np.testing.assert_array_equal(reader.read_field(0), open_plate(layout_plate, decode).read_field(0))
        assert reader.stats.missing_chunks == 0
        np.testing.assert_array_equal(reader.read_field(1), expected)
        assert reader.stats.missing_chunks == 1, decode
        with pytest.warns(RuntimeWarning, match=f"1 chunk reads of {plate} found no chunk"):
            assert warn_missing_chunks(reader) == 1


def _counting_native_loads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the native load calls that decoded (did not decline)."""
    calls: list[int] = []
    load_chunks = native.load_chunks

    def counted(*arguments: object) -> object:
        outcome = load_chunks(*arguments)
        calls.append(outcome is not None)
        return outcome

    monkeypatch.setattr(native, "load_chunks", counted)
    return calls


def _python_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "load_chunks", None)


def _read_everything(plate: Path, threads: int = 1) -> tuple[list[np.ndarray], np.ndarray, DirectChunkReader]:
    metadata = read_plate_metadata(plate)
    reader = DirectChunkReader(metadata, chunk_cache_bytes=50_000, decode_threads=threads)
    fields = [reader.read_field(index) for index in range(len(metadata.fields))]
    regions = _regions(48, seed=11)
    out = np.zeros((len(regions), metadata.field_shape[0], 40, 40), dtype=metadata.dtype)
    reader.read_regions(regions, out)
    return fields, out, reader


@needs_native_loads
@pytest.mark.parametrize("threads", [1, 2])
def test_native_loads_give_the_bytes_and_counts_of_the_python_path(
    layout_plate: Path, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _counting_native_loads(monkeypatch)
    fields, batch, native = _read_everything(layout_plate, threads)
    assert (sum(calls) > 0) == (layout_plate.stem in NATIVE_LAYOUTS)
    assert all(calls), "a native load declined on a sound plate"
    _python_only(monkeypatch)
    expected_fields, expected_batch, python = _read_everything(layout_plate, threads)
    for field, expected in zip(fields, expected_fields, strict=True):
        np.testing.assert_array_equal(field, expected)
    np.testing.assert_array_equal(batch, expected_batch)
    if threads > 1:  # which chunks the cache keeps depends on which thread finishes first
        return
    assert native.stats == python.stats
    assert (native.source.requests, native.source.bytes_transferred) == (
        python.source.requests,
        python.source.bytes_transferred,
    )


@needs_native_loads
@pytest.mark.parametrize("channels", [np.array([4, 0, 2]), np.array([3, 1], dtype=np.int32)])
def test_copies_made_while_loading_give_the_bytes_of_the_python_path(
    tiny_plate: Path, channels: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copies made while loading give the Python path's bytes, a selection's channels of either integer type."""
    calls = _counting_native_loads(monkeypatch)
    metadata = read_plate_metadata(tiny_plate)
    regions = _regions(40, seed=8)
    out = np.zeros((len(regions), len(channels), 40, 40), dtype=metadata.dtype)
    for threads in (1, 2):
        DirectChunkReader(metadata, chunk_cache_bytes=50_000, decode_threads=threads).read_regions(
            regions, out, channels
        )
        assert calls and all(calls)
        _python_only(monkeypatch)
        expected = np.zeros_like(out)
        DirectChunkReader(metadata, chunk_cache_bytes=50_000, decode_threads=threads).read_regions(
            regions, expected, channels
        )
        np.testing.assert_array_equal(out, expected)
        monkeypatch.undo()
        calls = _counting_native_loads(monkeypatch)


@needs_native_loads
def test_native_loads_refuse_pieces_outside_the_pieces_given(tiny_plate: Path) -> None:
    chunk = np.empty((5, 8, 8), dtype=np.uint16)
    out = np.zeros((1, 5, 8, 8), dtype=np.uint16)
    every = Channels.every().table
    piece = int64_records([(0, 0, 0, 0, 8, 0, 8, 0, 8, 0, 8)], PIECE)
    paths = [bytes(tiny_plate / "nothing")]

    def reads(chunks: int) -> np.ndarray:
        return int64_records([(-1, 0, 0, -1, native.RAW, 0, chunks)], NATIVE_READ)

    def chunks(*ranges: tuple[int, int]) -> np.ndarray:
        return int64_records([(0, -1, first, end) for first, end in ranges], NATIVE_CHUNK)

    tally = np.zeros(1, dtype=NATIVE_TALLY)
    with pytest.raises(ValueError, match="pieces are not a range"):
        native.load_chunks(reads(1), paths, chunks((0, 2)), [chunk], tally, piece, every, out)
    with pytest.raises(TypeError, match="pieces, channels and out come together"):
        native.load_chunks(reads(1), paths, chunks((0, 1)), [chunk], tally, piece)
    with pytest.raises(ValueError, match="arrays and chunks differ"):
        native.load_chunks(reads(1), paths, chunks((0, 1)), [chunk, chunk], tally, piece, every, out)
    with pytest.raises(ValueError, match="read 0 is not"):  # no path 1
        native.load_chunks(reads(1), [], chunks((0, 1)), [chunk], tally, piece, every, out)
    with pytest.raises(TypeError, match="56-byte records"):
        native.load_chunks(reads(1).view(np.int64), paths, chunks((0, 1)), [chunk], tally)
    with pytest.raises(TypeError, match="tally is not a writable array"):
        native.load_chunks(reads(1), paths, chunks((0, 1)), [chunk], b"read-only")
    with pytest.raises(ValueError, match="outside its chunk"):
        moved = piece.copy()
        moved["sy1"] = 9
        native.load_chunks(reads(1), paths, chunks((0, 1)), [chunk], tally, moved, every, out)
    absent = native.load_chunks(reads(1), paths, chunks((0, 1)), [chunk], tally, piece, every, out)
    assert (int(tally[0]["bytes_read"]), absent) == (0, [0])  # no such file: nothing read, nothing copied
    assert not out.any()


@needs_native_loads
def test_native_loads_keep_the_stage_clocks(tiny_plate: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting_native_loads(monkeypatch)
    reader = StageTimedChunkReader(read_plate_metadata(tiny_plate), chunk_cache_bytes=0)
    reader.read_field(0)
    assert calls and all(calls)
    assert reader.decode_calls == reader.stats.chunks_decoded > 0
    assert reader.decoded_bytes == reader.stats.bytes_decoded
    assert 0 < reader.stage_ns["fetch"] + reader.stage_ns["decode"] <= reader.stage_ns["region"]


@pytest.mark.parametrize("threads", [1, 2])
def test_stage_counters_count_every_decode_thread(layout_plate: Path, threads: int) -> None:
    metadata = read_plate_metadata(layout_plate)
    reader = StageTimedChunkReader(metadata, chunk_cache_bytes=0, decode_threads=threads)
    for seed in range(3):
        regions = _regions(32, seed=seed)
        reader.read_regions(regions, np.zeros((32, 5, 40, 40), dtype=np.uint16))
    assert reader.decode_calls == reader.stats.chunks_decoded > 0
    assert reader.decoded_bytes == reader.stats.bytes_decoded


def _damage_first_chunk(plate: Path, tmp_path: Path, damage: str) -> tuple[Path, Path]:
    """A copy of the plate (a layout with a file per chunk) with its first chunk damaged."""
    copy = tmp_path / plate.name
    shutil.copytree(plate, copy)
    array_dir = copy / read_plate_metadata(copy).fields[0].path
    first = sorted(path for path in (array_dir / "c").rglob("*") if path.is_file())[0]
    data = first.read_bytes()
    first.write_bytes(
        {
            "truncated": data[: len(data) // 2],
            "flipped header": data[:12] + bytes(b ^ 0xFF for b in data[12:16]) + data[16:],
            "trailing bytes": data + b"\0" * 7,
            "empty": b"",
        }[damage]
    )
    return copy, first


@pytest.fixture(scope="module")
def tiles_plate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiles") / "tiles.zarr"
    generate_plate(path, TINY_SPEC, TEST_LAYOUTS["tiles"], progress=False)
    return path


@needs_native_loads
@pytest.mark.parametrize("damage", ["truncated", "flipped header", "trailing bytes", "empty"])
def test_a_chunk_the_native_loads_decline_gets_the_python_paths_answer(
    tiles_plate: Path, tmp_path: Path, damage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    plate, _ = _damage_first_chunk(tiles_plate, tmp_path, damage)
    answers = []
    for natively in (True, False):
        if not natively:
            _python_only(monkeypatch)
        reader = DirectChunkReader(read_plate_metadata(plate), chunk_cache_bytes=0)
        try:
            answers.append(reader.read_region(0, 0, 8, 0, 8))
        except StoreError as error:
            answers.append(str(error))
    if damage == "trailing bytes":  # bytes after what the blosc header counts are not read
        np.testing.assert_array_equal(answers[0], open_plate(tiles_plate, "direct").read_region(0, 0, 8, 0, 8))
        np.testing.assert_array_equal(answers[1], answers[0])
    else:
        assert answers[0] == answers[1]
        assert "cannot be decoded (corrupt chunk)" in answers[0]
        if damage == "truncated":  # c-blosc alone would read past the end and decode the rest of memory
            assert "truncated: the blosc header counts" in answers[0]


@needs_native_loads
def test_without_numcodecs_c_blosc_blosc_chunks_take_the_python_path(
    tiles_plate: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert native.BLOSC_BOUND, "the numcodecs pyproject.toml pins exports c-blosc's calls"
    assert not native.bind_blosc(str(tmp_path / "blosc.so")), "a module that is not loaded binds nothing"
    expected = DirectChunkReader(read_plate_metadata(tiles_plate)).read_field(0)
    monkeypatch.setattr(native, "BLOSC_BOUND", False)  # what a numcodecs without the symbols gives
    calls = _counting_native_loads(monkeypatch)
    with pytest.warns(RuntimeWarning, match="does not export blosc_cbuffer_validate") as warned:
        reader = DirectChunkReader(read_plate_metadata(tiles_plate))
        np.testing.assert_array_equal(reader.read_field(0), expected)
    assert calls == [], "the native loads were asked to decode blosc"
    assert reader.stats.chunks_decoded > 0
    message = str(warned[0].message)
    assert "\n" not in message and message.startswith("cropbench: numcodecs ")


def test_a_batch_asks_for_the_indexes_of_every_shard_it_touches_first_at_once(
    tiny_plate: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cropbench.formats.sources import FileSource

    asked: list[list[str]] = []
    own = FileSource.get_suffixes

    def recorded(self: FileSource, requests: list[tuple[str, int]]) -> list[bytes | None]:
        asked.append([key for key, _ in requests])
        return own(self, requests)

    monkeypatch.setattr(FileSource, "get_suffixes", recorded)
    reader = open_plate(tiny_plate, "direct")
    fields = len(reader.metadata.fields)
    zero = np.zeros(fields, dtype=np.int64)
    regions = Regions(np.arange(fields, dtype=np.int64), zero, zero + 8, zero, zero + 8, zero, zero)
    out = np.zeros((fields, 5, 8, 8), dtype=np.uint16)
    reader.read_regions(regions, out)
    assert len(asked) == 1 and len(set(asked[0])) == fields, asked
    for field in range(fields):
        assert np.array_equal(out[field], reader.read_region(field, 0, 8, 0, 8))
    assert len(asked) == 1, "indexes already read are not asked for again"
