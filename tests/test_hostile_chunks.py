"""Hostile OME-Zarr plates against the chunk readers: shard indexes, chunk files and array metadata
that a careless or malicious writer left. Every read path (direct per region, natively and in
Python; direct batches over 1 and 2 decode threads; whole fields) must end in a CropbenchError
naming the file at fault, never an untyped exception, an unbounded read or silent zeros."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np
import pytest
import zarr

from cropbench.errors import CropbenchError
from cropbench.formats import DirectChunkReader, Regions, open_plate, read_plate_metadata
from cropbench.formats.direct import native
from cropbench.formats.direct.records import NATIVE_CHUNK, NATIVE_READ, NATIVE_TALLY, int64_records

EMPTY = 2**64 - 1


def _copy(plate: Path, tmp_path: Path) -> Path:
    copy = tmp_path / plate.name
    shutil.copytree(plate, copy)
    return copy


def array_dirs(plate: Path) -> list[Path]:
    metadata = read_plate_metadata(plate)
    return [plate / info.path for info in metadata.fields]


def chunk_files(array_dir: Path) -> list[Path]:
    return sorted(path for path in (array_dir / "c").rglob("*") if path.is_file())


def _read_whole_fields(plate: Path, decode: str, threads: int = 1) -> list[np.ndarray]:
    reader = open_plate(plate, decode, chunk_cache_bytes=0, decode_threads=threads)
    return [reader.read_field(index) for index in range(len(reader.metadata.fields))]


def _read_batch(plate: Path, threads: int) -> np.ndarray:
    metadata = read_plate_metadata(plate)
    reader = DirectChunkReader(metadata, chunk_cache_bytes=0, decode_threads=threads)
    count = len(metadata.fields) * 4
    field = np.repeat(np.arange(len(metadata.fields)), 4)
    y0 = np.tile(np.array([0, 0, 32, 32]), len(metadata.fields))
    x0 = np.tile(np.array([0, 32, 0, 32]), len(metadata.fields))
    zeros = np.zeros(count, dtype=np.int64)
    regions = Regions(field, y0, y0 + 32, x0, x0 + 32, zeros, zeros)
    out = np.zeros((count, metadata.field_shape[0], 32, 32), dtype=metadata.dtype)
    return reader.read_regions(regions, out)


#: Every read path of the chunk readers, by name: (reads the plate, needs the Python loads only).
READ_PATHS: dict[str, tuple[Callable[[Path], Any], bool]] = {
    "direct": (lambda plate: _read_whole_fields(plate, "direct"), False),
    "direct-python": (lambda plate: _read_whole_fields(plate, "direct"), True),
    "batch-1-thread": (lambda plate: _read_batch(plate, 1), False),
    "batch-2-threads": (lambda plate: _read_batch(plate, 2), False),
    "field": (lambda plate: _read_whole_fields(plate, "field"), False),
}


def _errors_on_every_path(plate: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The error each read path gives; a path that reads without one fails the test."""
    messages = []
    for name, (read, python_only) in READ_PATHS.items():
        with monkeypatch.context() as patch:
            if python_only:
                patch.setattr(native, "load_chunks", None)
            with pytest.raises(CropbenchError) as raised:
                read(plate)
        message = str(raised.value)
        assert "\n" not in message, (name, message)
        messages.append(message)
    return messages


def index_layout(array_dir: Path) -> tuple[int, bool]:
    """Entries of the shard index, and whether a crc32c follows it (the index at the end)."""
    document = json.loads((array_dir / "zarr.json").read_text())
    sharding = document["codecs"][0]["configuration"]
    shard = document["chunk_grid"]["configuration"]["chunk_shape"]
    entries = int(np.prod([s // i for s, i in zip(shard, sharding["chunk_shape"], strict=True)]))
    checksum = any(codec["name"] == "crc32c" for codec in sharding["index_codecs"])
    assert sharding.get("index_location", "end") == "end"
    return entries, checksum


def set_index_entry(shard: Path, entries: int, checksum: bool, entry: int, offset: int, nbytes: int) -> None:
    """Write (offset, nbytes) into one entry of a shard's index (at its end), its crc32c recomputed."""
    data = bytearray(shard.read_bytes())
    start = len(data) - entries * 16 - (4 if checksum else 0)
    at = start + entry * 16
    data[at : at + 16] = offset.to_bytes(8, "little") + nbytes.to_bytes(8, "little")
    if checksum:
        data[-4:] = google_crc32c.value(bytes(data[start:-4])).to_bytes(4, "little")
    shard.write_bytes(bytes(data))


def _first_shard(plate: Path) -> tuple[Path, int, bool]:
    array_dir = array_dirs(plate)[0]
    entries, checksum = index_layout(array_dir)
    return chunk_files(array_dir)[0], entries, checksum


# -- shard indexes ----------------------------------------------------------------------------------


@pytest.mark.parametrize("nbytes", [2**63, EMPTY - 1, 2**40], ids=["2**63", "2**64-2", "1TiB"])
def test_an_index_entry_beyond_its_shard_is_a_corrupt_index(
    hostile_plates: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nbytes: int
) -> None:
    plate = _copy(hostile_plates["sharded"], tmp_path)
    shard, entries, checksum = _first_shard(plate)
    set_index_entry(shard, entries, checksum, 0, 0, nbytes)
    for message in _errors_on_every_path(plate, monkeypatch):
        assert f"shard {shard}" in message and "corrupt index" in message, message


@pytest.mark.parametrize("offset", [2**63, EMPTY - 1, EMPTY], ids=["2**63", "2**64-2", "2**64-1"])
def test_an_index_offset_that_is_not_the_empty_marker_is_not_read_as_a_missing_chunk(
    hostile_plates: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offset: int
) -> None:
    """Only (2**64-1, 2**64-1) marks an empty entry (zarr's rule); any other offset past 2**63 is corrupt."""
    plate = _copy(hostile_plates["sharded"], tmp_path)
    shard, entries, checksum = _first_shard(plate)
    set_index_entry(shard, entries, checksum, 0, offset, 100)
    for message in _errors_on_every_path(plate, monkeypatch):
        assert f"shard {shard}" in message and "corrupt index" in message, message


def test_an_index_entry_larger_than_a_chunk_can_encode_to_is_refused(
    hostile_plates: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Within the shard's file, but more bytes than a blosc chunk of its size can take."""
    plate = _copy(hostile_plates["sharded"], tmp_path)
    shard, entries, checksum = _first_shard(plate)
    with shard.open("r+b") as handle:  # room in the file, so only the chunk's bound refuses it
        handle.truncate(shard.stat().st_size + 2**20)
    set_index_entry(shard, entries, checksum, 0, 0, 2**20)
    for message in _errors_on_every_path(plate, monkeypatch):
        assert f"shard {shard}" in message and "corrupt index" in message, message


def test_an_empty_marker_in_a_sound_index_still_reads_as_the_fill_value(
    hostile_plates: dict[str, Path], tmp_path: Path
) -> None:
    plate = _copy(hostile_plates["sharded"], tmp_path)
    shard, entries, checksum = _first_shard(plate)
    set_index_entry(shard, entries, checksum, 0, EMPTY, EMPTY)
    expected = zarr.open_array(str(array_dirs(plate)[0]), mode="r")[...]
    reader = open_plate(plate, "direct")
    np.testing.assert_array_equal(reader.read_field(0), expected)
    assert reader.stats.missing_chunks == 1


# -- chunk files --------------------------------------------------------------------------------------


@pytest.mark.parametrize("extra", [1, 2])
def test_a_raw_chunk_of_the_wrong_length_is_a_typed_error(
    hostile_plates: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: int
) -> None:
    plate = _copy(hostile_plates["raw"], tmp_path)
    chunk = chunk_files(array_dirs(plate)[0])[0]
    chunk.write_bytes(chunk.read_bytes() + b"\0" * extra)
    for message in _errors_on_every_path(plate, monkeypatch):
        assert str(chunk) in message or chunk.relative_to(plate).as_posix() in message, message


@pytest.mark.parametrize("layout", ["tiles", "raw", "zstd"])
@pytest.mark.parametrize("size", [2**26, 2**40], ids=["64MiB", "1TiB"])
def test_a_chunk_file_larger_than_its_metadata_allows_is_refused_unread(
    hostile_plates: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str, size: int
) -> None:
    """A sparse file: its first bytes a sound chunk, its length far beyond what the chunk can encode to."""
    plate = _copy(hostile_plates[layout], tmp_path)
    chunk = chunk_files(array_dirs(plate)[0])[0]
    with chunk.open("r+b") as handle:
        handle.truncate(size)
    for message in _errors_on_every_path(plate, monkeypatch):
        assert str(chunk) in message and "more than" in message, message


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_a_chunk_that_is_a_link_to_a_device_is_refused_unread(
    hostile_plates: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, device: str
) -> None:
    plate = _copy(hostile_plates["tiles"], tmp_path)
    chunk = chunk_files(array_dirs(plate)[0])[0]
    chunk.unlink()
    chunk.symlink_to(device)
    for message in _errors_on_every_path(plate, monkeypatch):
        assert "not a regular file" in message, message


@pytest.mark.skipif(native.load_chunks is None, reason="the C extension is not built")
def test_the_native_loads_decline_a_whole_file_beyond_its_bound_or_not_regular(tmp_path: Path) -> None:
    """The C side checks what the Python side checked before it (a file swapped in between)."""
    chunk = np.zeros((1, 2, 2), dtype=np.uint16)
    path = tmp_path / "chunk"
    path.write_bytes(b"\1\0" * 4)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    paths = [os.fsencode(path), os.fsencode(fifo)]
    chunks = int64_records([(0, -1, 0, 0)], NATIVE_CHUNK)

    def read(path: int, bound: int) -> np.ndarray:
        return int64_records([(-1, path, 0, bound, native.RAW, 0, 1)], NATIVE_READ)

    tally = np.zeros(1, dtype=NATIVE_TALLY)
    assert native.load_chunks(read(0, 8), paths, chunks, [chunk], tally) == []
    assert int(tally[0]["bytes_read"]) == 8
    assert native.load_chunks(read(0, 7), paths, chunks, [chunk], tally) is None
    assert native.load_chunks(read(1, 8), paths, chunks, [chunk], tally) is None


# -- decoders -------------------------------------------------------------------------------------


def test_each_decoder_gives_no_more_than_a_chunk_holds() -> None:
    """A chunk whose codec would give more bytes than the chunk's size is refused before it does."""
    import gzip
    import zlib

    import numcodecs

    from cropbench.formats.direct.codecs import CODECS

    data = np.arange(4096, dtype=np.uint16).tobytes()
    blosc = numcodecs.Blosc(cname="lz4").encode(data)
    zstd = numcodecs.Zstd(level=1).encode(data)
    two_members = gzip.compress(data[:100]) + gzip.compress(data[100:])
    assert bytes(CODECS["blosc"].decode(blosc, len(data))) == data
    assert bytes(CODECS["zstd"].decode(zstd, len(data))) == data
    assert CODECS["gzip"].decode(two_members, len(data)) == data
    assert CODECS["zlib"].decode(zlib.compress(data), len(data)) == data
    cases = {
        "blosc": (blosc, "promises"),
        "zstd": (zstd, "says it holds"),
        "gzip": (gzip.compress(data), "more than"),
        "zlib": (zlib.compress(data), "more than"),
    }
    assert set(CODECS) == {*cases, "crc32c"}  # a checksum decodes to less than it is given: nothing to bound
    for name, (encoded, says) in cases.items():
        decode = CODECS[name].decode
        with pytest.raises(ValueError, match=says):
            decode(encoded, len(data) - 1)
        with pytest.raises((ValueError, RuntimeError), match="."):  # cut short (the loads make either a StoreError)
            decode(encoded[: len(encoded) // 2], len(data))


def test_the_bound_of_a_stored_chunk_follows_its_codecs(hostile_plates: dict[str, Path]) -> None:
    from cropbench.formats.direct.layout import read_chunk_layout

    expected = {"raw": 2 * 32 * 32 * 2, "tiles": 2 * 32 * 32 * 2 + 16, "sharded": 2 * 16 * 16 * 2 + 16}
    for name, bound in expected.items():
        assert read_chunk_layout(array_dirs(hostile_plates[name])[0]).max_encoded == bound
    zstd = read_chunk_layout(array_dirs(hostile_plates["zstd"])[0])
    assert zstd.chunk_bytes < zstd.max_encoded < zstd.chunk_bytes + 2**10
