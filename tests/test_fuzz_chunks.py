"""Generated hostile OME-Zarr plates against every chunk read path: shard-index entries, chunk and
shard files, and array metadata values, each case read per region (natively and in Python), in
batches over 1 and 2 decode threads, through the field cache and through zarr-python's path.

Each case must end, on every path, in a CropbenchError or in the bytes zarr-python reads from the
same damaged plate; bytes where zarr-python refuses, or other bytes, fail the case, and so does
any other exception. The fast tier runs a fixed seed; the slow tier many more cases from
``conftest.slow_fuzz_seed`` (random for a developer, fixed under CI, CROPBENCH_FUZZ_SEED to choose).
Each surface prints its counts: cases, typed errors, correct reads (and typed errors where
zarr-python reads: a stricter bound).

One damage has no zarr-python answer to compare with: a Blosc frame cut shorter than the length its
header declares (a chunk file cut short, or a shard index entry that slices an inner chunk short).
numcodecs' Blosc decoder is not given the frame's length and reads past its end (numcodecs 0.16;
upstream: https://github.com/zarr-developers/numcodecs/issues/228), so zarr-python, and cropbench's
``zarr`` path with it, reads such a chunk as an error or as other bytes, changing from one read to
the next. There the chunk readers must refuse the chunk (or read the sound plate's
bytes where the window does not touch it), and the ``zarr`` path is not judged (counted apart).
"""

from __future__ import annotations

import functools
import json
import random
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np
import pytest
import zarr
from conftest import HOSTILE_LAYOUTS, slow_fuzz_seed
from test_hostile_chunks import array_dirs, chunk_files, index_layout

from cropbench.errors import CropbenchError
from cropbench.formats import DirectChunkReader, PlateReader, Regions, open_plate, read_plate_metadata
from cropbench.formats.direct import native

#: The read window of each field (clipped to the field).
WINDOW = 40
EMPTY = 2**64 - 1
#: Cases per surface: the fast tier (fixed seed) and the slow tier (random seed).
FAST_CASES, SLOW_CASES = 12, 200
FAST_SEED = 20260


@dataclass
class Tally:
    """What one surface's cases ended in, over every read path."""

    cases: int = 0
    reads: int = 0
    typed_errors: int = 0
    correct_reads: int = 0
    #: Typed errors where zarr-python reads the damaged plate (the direct path's bounds are stricter).
    stricter: int = 0
    #: zarr-python reads not judged: a Blosc frame cut short, which numcodecs reads past its end.
    unjudged: int = 0
    failures: list[str] = field(default_factory=list)

    def line(self, surface: str) -> str:
        return (
            f"{surface}: {self.cases} cases, {self.reads} reads: {self.typed_errors} typed errors "
            f"({self.stricter} where zarr-python reads), {self.correct_reads} correct reads, "
            f"{self.unjudged} zarr-python reads of a cut-short Blosc frame not judged, {len(self.failures)} failures"
        )


# -- read paths ---------------------------------------------------------------------------------


def _windows(plate: Path) -> tuple[int, int, int]:
    metadata = read_plate_metadata(plate)
    _, height, width = metadata.field_shape
    return len(metadata.fields), min(WINDOW, height), min(WINDOW, width)


def _per_region(reader: PlateReader, fields: int, height: int, width: int) -> np.ndarray:
    try:
        return np.stack([reader.read_region(index, 0, height, 0, width) for index in range(fields)])
    finally:
        reader.close()


def _batch(plate: Path, threads: int) -> np.ndarray:
    fields, height, width = _windows(plate)
    metadata = read_plate_metadata(plate)
    reader = DirectChunkReader(metadata, chunk_cache_bytes=0, decode_threads=threads)
    zeros = np.zeros(fields, dtype=np.int64)
    regions = Regions(np.arange(fields), zeros, zeros + height, zeros, zeros + width, zeros, zeros)
    out = np.zeros((fields, metadata.field_shape[0], height, width), dtype=metadata.dtype)
    try:
        return reader.read_regions(regions, out)
    finally:
        reader.close()


def _python_loads(plate: Path) -> np.ndarray:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(native, "load_chunks", None)
        return _per_region(open_plate(plate, "direct", chunk_cache_bytes=0), *_windows(plate))


READ_PATHS: dict[str, Callable[[Path], np.ndarray]] = {
    "direct": lambda plate: _per_region(open_plate(plate, "direct", chunk_cache_bytes=0), *_windows(plate)),
    "direct-python": _python_loads,
    "batch-1-thread": lambda plate: _batch(plate, 1),
    "batch-2-threads": lambda plate: _batch(plate, 2),
    "field": lambda plate: _per_region(open_plate(plate, "field"), *_windows(plate)),
}
Paths = dict[str, Callable[[Path], np.ndarray]]
#: zarr-python's own path through cropbench, in the slow tier (each open costs as much as the rest).
ZARR_PATH: dict[str, Callable[[Path], np.ndarray]] = {
    "zarr": lambda plate: _per_region(open_plate(plate, "zarr"), *_windows(plate)),
}


def _reference(plate: Path) -> np.ndarray | None:
    """zarr-python's read of the same windows of the damaged plate, or None when it refuses it."""
    try:
        fields, height, width = _windows(plate)
    except CropbenchError:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return np.stack(
                [np.asarray(zarr.open_array(str(d), mode="r")[:, :height, :width]) for d in array_dirs(plate)]
            )
    except Exception:  # zarr-python refuses a damaged plate with many exception types
        return None


def _oversize(plate: Path) -> bool:
    """Whether a file of the plate is far longer than any of its chunks may be stored in."""
    return any(path.stat().st_size > OVERSIZE for path in plate.rglob("*") if path.is_file())


#: Bytes beyond which a chunk or shard file is far longer than any of its chunks may be stored in.
OVERSIZE = 2**24
#: A Blosc frame's header: its length in bytes (``cbytes``) is the little-endian uint32 at bytes 12-15.
BLOSC_HEADER = 16


def _frame_cut_short(frame: bytes) -> bool:
    """Whether a Blosc frame is shorter than its header, or than the length its header declares."""
    return len(frame) < BLOSC_HEADER or int.from_bytes(frame[12:16], "little") > len(frame)


def _inner_frames(shard: bytes, entries: int, checksum: bool) -> list[bytes]:
    """The inner chunks a shard's index (at its end) points at, each cut where the file ends."""
    start = len(shard) - entries * 16 - (4 if checksum else 0)
    if start < 0:
        return []  # no whole index: zarr-python refuses the shard before any inner chunk
    index = np.frombuffer(shard[start : start + entries * 16], dtype="<u8").reshape(-1, 2)
    return [shard[int(offset) : int(offset) + int(nbytes)] for offset, nbytes in index if int(offset) != EMPTY]


def _blosc_frame_cut_short(plate: Path) -> bool:
    """Whether a Blosc chunk of the plate (a chunk file, or an inner chunk as its shard's index
    slices it) is shorter than the frame its header declares, or than the header: zarr-python's
    answer to it is undefined (see the module's docstring)."""
    try:
        arrays = array_dirs(plate)
    except CropbenchError:
        return False  # damaged plate metadata: every path refuses the plate before any chunk
    for array_dir in arrays:
        try:
            codecs = json.loads((array_dir / "zarr.json").read_text())["codecs"]
            names = [codec.get("name") for codec in codecs]
            if names[0] == "sharding_indexed":
                names = [codec.get("name") for codec in codecs[0]["configuration"]["codecs"]]
                layout: tuple[int, bool] | None = index_layout(array_dir)
            else:
                layout = None
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError, AssertionError):
            continue  # damaged metadata: zarr-python refuses it before any chunk
        if "blosc" not in names:
            continue
        for path in chunk_files(array_dir):
            if path.stat().st_size > OVERSIZE:
                continue  # an oversize file: the chunk readers refuse it (see _run_case)
            data = path.read_bytes()
            frames = [data] if layout is None else _inner_frames(data, *layout)
            if any(frame and _frame_cut_short(frame) for frame in frames):
                return True
    return False


def _run_case(plate: Path, case: str, tally: Tally, paths: Paths, sound: np.ndarray) -> None:
    """Read the damaged plate by every path; ``sound`` is what zarr-python reads of it undamaged.

    A file far longer than its chunk is not given to zarr-python, which reads a whole chunk file
    however long: the chunk readers must refuse it, and cropbench's zarr path (zarr-python's rule)
    may read it, giving the bytes of the sound plate when what follows the chunk is ignored.
    """
    tally.cases += 1
    oversize = _oversize(plate)
    cut_short = _blosc_frame_cut_short(plate)
    # With a cut-short frame the readers must refuse it where the window reads it, and read the sound
    # bytes where it does not: zarr-python's answer to it is no reference.
    expected = sound if cut_short else None if oversize else _reference(plate)
    for name, read in paths.items():
        if cut_short and name in ZARR_PATH:
            tally.unjudged += 1
            continue
        if oversize and name in ZARR_PATH:
            expected = sound
        tally.reads += 1
        try:
            got = read(plate)
        except CropbenchError as error:
            message = str(error)
            if "\n" in message:
                tally.failures.append(f"{case} {name}: an error of several lines: {message!r}")
            tally.typed_errors += 1
            tally.stricter += expected is not None
            continue
        except Exception as error:  # what the fuzz looks for: anything untyped
            tally.failures.append(f"{case} {name}: {type(error).__name__}: {error}")
            continue
        if expected is None:
            tally.failures.append(f"{case} {name}: read what zarr-python refuses")
        elif got.shape != expected.shape or not np.array_equal(got, expected):
            tally.failures.append(f"{case} {name}: bytes that differ from zarr-python's")
        else:
            tally.correct_reads += 1


# -- surfaces -----------------------------------------------------------------------------------


def shard_index_case(plate: Path, rng: random.Random) -> str:
    """Damage one or two entries of the first shard's index (its crc32c recomputed, mostly)."""
    array_dir = array_dirs(plate)[0]
    entries, checksum = index_layout(array_dir)
    shard = chunk_files(array_dir)[0]
    data = bytearray(shard.read_bytes())
    start = len(data) - entries * 16 - (4 if checksum else 0)
    index = np.frombuffer(bytes(data[start : start + entries * 16]), dtype="<u8").reshape(-1, 2).copy()
    entry = rng.randrange(entries)
    offset, nbytes = (int(v) for v in index[entry])
    size = len(data)
    kind = rng.choice(["offset", "nbytes", "both", "swap", "empty-half", "stale-crc"])
    offsets = [0, offset - 1, offset + 1, size, size - 1, 2**32, 2**63 - 1, 2**63, EMPTY - 1, EMPTY]
    sizes = [0, 1, 15, 16, nbytes - 1, nbytes + 1, size, 2**31, 2**40, 2**63, EMPTY - 1, EMPTY]
    offsets = [min(max(value, 0), EMPTY) for value in offsets + [rng.randrange(size)]]
    sizes = [min(max(value, 0), EMPTY) for value in sizes + [rng.randrange(size)]]
    if kind == "offset":
        index[entry, 0] = rng.choice(offsets)
    elif kind == "nbytes":
        index[entry, 1] = rng.choice(sizes)
    elif kind == "both":
        index[entry] = (rng.choice(offsets), rng.choice(sizes))
    elif kind == "swap":
        other = rng.randrange(entries)
        index[[entry, other]] = index[[other, entry]]
    elif kind == "empty-half":
        index[entry, rng.randrange(2)] = EMPTY
    data[start : start + entries * 16] = index.astype("<u8").tobytes()
    if checksum and kind != "stale-crc":
        data[-4:] = google_crc32c.value(bytes(data[start:-4])).to_bytes(4, "little")
    elif kind == "stale-crc":
        data[start + rng.randrange(entries * 16)] ^= 1 << rng.randrange(8)
    shard.write_bytes(bytes(data))
    return f"{kind} entry {entry} -> {tuple(int(v) for v in index[entry])}"


def chunk_file_case(plate: Path, rng: random.Random) -> str:
    """Damage one chunk (or shard) file: cut, flipped, lengthened, replaced, emptied, deleted."""
    array_dir = array_dirs(plate)[rng.randrange(2)]
    path = rng.choice(chunk_files(array_dir))
    data = path.read_bytes()
    kind = rng.choice(["truncate", "flip", "append", "random", "sparse", "empty", "delete"])
    if kind == "truncate":
        path.write_bytes(data[: rng.randrange(len(data))])
    elif kind == "flip":
        flipped = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(flipped))
    elif kind == "append":
        path.write_bytes(data + rng.randbytes(rng.randint(1, 64)))
    elif kind == "random":
        path.write_bytes(rng.randbytes(len(data)))
    elif kind == "sparse":
        with path.open("r+b") as handle:
            handle.truncate(rng.choice([2**26, 2**40]))
    elif kind == "empty":
        path.write_bytes(b"")
    else:
        path.unlink()
    return f"{kind} {path.relative_to(plate)}"


#: Array metadata keys (dotted, list positions as numbers) and values to put there.
METADATA_KEYS = {
    "tiles": [
        "shape",
        "shape.1",
        "chunk_grid.configuration.chunk_shape",
        "chunk_grid.configuration.chunk_shape.2",
        "data_type",
        "fill_value",
        "codecs",
        "codecs.0",
        "codecs.1",
        "codecs.0.configuration.endian",
        "chunk_key_encoding",
        "chunk_key_encoding.configuration.separator",
        "zarr_format",
    ],
    "sharded": [
        "codecs.0.configuration.chunk_shape",
        "codecs.0.configuration.chunk_shape.1",
        "codecs.0.configuration.codecs",
        "codecs.0.configuration.index_codecs",
        "codecs.0.configuration.index_location",
        "chunk_grid.configuration.chunk_shape.2",
        "fill_value",
    ],
}
METADATA_VALUES: list[Any] = [
    0,
    -1,
    1,
    7,
    16,
    63,
    65,
    2**31 - 1,
    2**31,
    2**40,
    2**62,
    2**64,
    2**70,
    1.5,
    True,
    None,
    "NaN",
    "7",
    "uint17",
    "uint8",
    "float32",
    "int16",
    "big",
    "start",
    ".",
    [],
    {},
    [0, 0, 0],
    [2, 16, 16],
    [2, 32, 16],
    [2, -16, 16],
    ["2", "64", "64"],
    [{"name": "bytes"}],
    [{"name": "blosc"}],
    {"name": "default"},
    {"name": "v2"},
]


def metadata_case(plate: Path, rng: random.Random, keys: list[str]) -> str:
    """Put a hostile value at one key of every field's zarr.json."""
    key, value = rng.choice(keys), rng.choice(METADATA_VALUES)
    for array_dir in array_dirs(plate):
        path = array_dir / "zarr.json"
        document = json.loads(path.read_text())
        *parents, last = key.split(".")
        node: Any = document
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node[int(last) if isinstance(node, list) else last] = value
        path.write_text(json.dumps(document))
    return f"{key}={value!r}"


# -- runs ---------------------------------------------------------------------------------------


def _surface(
    pristine: Path,
    work: Path,
    cases: int,
    seed: int,
    damage: Callable[[Path, random.Random], str],
    paths: dict[str, Callable[[Path], np.ndarray]],
) -> Tally:
    """``cases`` cases on fresh copies of a plate, each damaged once by ``damage``, read by ``paths``."""
    rng = random.Random(seed)
    tally = Tally()
    sound = _reference(pristine)
    assert sound is not None
    for number in range(cases):
        plate = work / f"{number}-{pristine.name}"
        shutil.copytree(pristine, plate)
        case = damage(plate, rng)
        _run_case(plate, f"[seed {seed} case {number}: {pristine.stem} {case}]", tally, paths, sound)
        shutil.rmtree(plate)
    return tally


def _shard_index_surface(pristine: dict[str, Path], work: Path, cases: int, seed: int, paths: Paths) -> Tally:
    return _surface(pristine["sharded"], work, cases, seed, shard_index_case, paths)


def _metadata_surface(pristine: dict[str, Path], work: Path, cases: int, seed: int, paths: Paths) -> Tally:
    tally = Tally()
    for offset, name in enumerate(METADATA_KEYS):
        keys = METADATA_KEYS[name]
        damage = functools.partial(metadata_case, keys=keys)
        _add(tally, _surface(pristine[name], work, cases // len(METADATA_KEYS), seed + offset, damage, paths))
    return tally


def _chunk_file_surface(pristine: dict[str, Path], work: Path, cases: int, seed: int, paths: Paths) -> Tally:
    tally = Tally()
    for offset, name in enumerate(HOSTILE_LAYOUTS):
        _add(
            tally, _surface(pristine[name], work, cases // len(HOSTILE_LAYOUTS), seed + offset, chunk_file_case, paths)
        )
    return tally


#: Each surface the fuzz damages: (pristine plates, work folder, cases, seed, read paths) -> its tally.
SURFACES: dict[str, Callable[[dict[str, Path], Path, int, int, Paths], Tally]] = {
    "shard index": _shard_index_surface,
    "metadata": _metadata_surface,
    "chunk files": _chunk_file_surface,
}


def _add(total: Tally, part: Tally) -> None:
    total.cases += part.cases
    total.reads += part.reads
    total.typed_errors += part.typed_errors
    total.correct_reads += part.correct_reads
    total.stricter += part.stricter
    total.unjudged += part.unjudged
    total.failures += part.failures


def _assert_clean(surface: str, tally: Tally) -> None:
    print(tally.line(surface))
    assert not tally.failures, f"{len(tally.failures)} failing reads:\n" + "\n".join(tally.failures[:20])
    assert tally.cases > 0 and tally.typed_errors > 0
    assert tally.typed_errors + tally.correct_reads == tally.reads


@pytest.mark.parametrize("surface", SURFACES)
def test_fixed_seed_hostile_plates_end_in_a_typed_error_or_zarrs_bytes(
    hostile_plates: dict[str, Path], tmp_path: Path, surface: str
) -> None:
    tally = SURFACES[surface](hostile_plates, tmp_path, FAST_CASES, FAST_SEED, READ_PATHS)
    _assert_clean(surface, tally)
    assert tally.correct_reads > 0


@pytest.mark.slow
@pytest.mark.parametrize("surface", SURFACES)
def test_random_hostile_plates_end_in_a_typed_error_or_zarrs_bytes(
    hostile_plates: dict[str, Path], tmp_path: Path, surface: str
) -> None:
    seed = slow_fuzz_seed()
    _assert_clean(surface, SURFACES[surface](hostile_plates, tmp_path, SLOW_CASES, seed, {**READ_PATHS, **ZARR_PATH}))
