"""Hostile converted stores, generated: every file of an HDF5, WebDataset, litdata and MDS crop store is
truncated, bit-flipped, deleted, replaced by garbage of its own size, or (a JSON document) replaced by
malformed JSON of its own size, so the manifest's size check passes and the library itself parses it.
Reading the store back (every crop by index where the format has random access, then one epoch in
order) must end in one of:

- a StoreError naming the store or the damaged file, in one line, or
- the plate's crops, byte-identical, or, where the bytes carry no checksum (raw pixels in every
  format), crops of the right shape and type;

never another exception, a crash or a hang, and nothing outside the case's own copy is touched.
"""

from __future__ import annotations

import hashlib
import shutil
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import FUZZ_SPEC, slow_fuzz_seed

from cropbench.config import LAYOUTS
from cropbench.data.dataset import CropDataset
from cropbench.data.training import MANIFEST_NAME, TRAINING_FORMATS, EpochSpec, crop_dataset, training_format
from cropbench.errors import StoreError
from cropbench.plates.generate import generate_plate

CROP_SIZE = 24
#: Small shards, so every sharded format writes several.
SHARD_BYTES = 8_000
MUTATIONS = ("truncate", "flip", "delete", "garbage", "malform")
BAD_JSON = ("", "{", "[]", "null", "{}", '{"version": [1, 2]}', "[" * 5000 + "]" * 5000, '{"a": 1e999999}')
#: Seconds one case may take before it counts as a hang.
DEADLINE_S = 60
#: MosaicML streaming keeps each StreamingDataset's shared memory open until the process exits (an atexit
#: handler holds it), so one process reads a few hundred MDS stores at most.
FAST_CASES, SLOW_CASES = 100, 240


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> CropDataset:
    plate = tmp_path_factory.mktemp("fuzz-stores") / "plate.zarr"
    generate_plate(plate, FUZZ_SPEC, LAYOUTS["default"], progress=False)
    return crop_dataset(plate, CROP_SIZE, None, None)


@pytest.fixture(scope="module")
def stores(reference: CropDataset, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each format whose library is installed, written once."""
    root = tmp_path_factory.mktemp("fuzz-stores-written")
    written = {}
    for name, cls in TRAINING_FORMATS.items():
        if cls.available() is None:
            written[name] = root / name
            training_format(name).write(reference, written[name], shard_bytes=SHARD_BYTES)
    if not written:
        pytest.skip("no training format library is installed (scripts/setup_formats.sh)")
    return written


def _snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.blake2b(p.read_bytes(), digest_size=8).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _mutate(path: Path, how: str, rng: np.random.Generator) -> None:
    data = path.read_bytes()
    if how == "delete":
        path.unlink()
    elif how == "truncate":
        path.write_bytes(data[: int(rng.integers(0, max(len(data), 1)))])
    elif how == "flip":
        flipped = bytearray(data)
        if flipped:
            flipped[int(rng.integers(0, len(flipped)))] ^= 1 << int(rng.integers(0, 8))
        path.write_bytes(bytes(flipped))
    elif how == "garbage":
        path.write_bytes(rng.integers(0, 256, len(data), dtype=np.uint8).tobytes())
    else:  # malformed JSON of the file's own size (cut or padded with spaces)
        text = BAD_JSON[int(rng.integers(0, len(BAD_JSON)))].encode()
        path.write_bytes(text[: len(data)].ljust(len(data)))


class Hang(Exception):
    pass


@contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    def expired(signum: int, frame: object) -> None:
        raise Hang(f"a read took more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _read(name: str, path: Path) -> list[dict[str, Any]]:
    """Every crop by index where the format has random access, then one epoch in order, uncollated."""
    fmt = training_format(name)
    items: list[dict[str, Any]] = []
    if fmt.random_access:
        dataset = fmt.map_dataset(path)
        items.extend(dataset[i] for i in range(len(dataset)))  # type: ignore[arg-type]
    for batch in fmt.epoch_loader(path, EpochSpec(batch_size=8, shuffle=False)):
        for position in range(int(batch["image"].shape[0])):
            items.append({"image": batch["image"][position], "index": int(batch["index"][position])})
    return items


def _outcome(name: str, path: Path, expected: list[torch.Tensor]) -> str:
    """How one read of a damaged store ended: ``typed error``, ``correct read`` or ``different pixels``."""
    try:
        with _deadline(DEADLINE_S):
            items = _read(name, path)
    except StoreError as error:
        message = str(error)
        assert str(path) in message or MANIFEST_NAME in message, f"the error names no file: {message}"
        assert "\n" not in message.split("Original Traceback")[0].strip(), message
        return "typed error"
    shape, identical = expected[0].shape, True
    for item in items:
        image = item["image"]
        assert image.dtype == torch.uint16 and image.shape == shape, f"{name}: {image.dtype} {image.shape}"
        index = item["index"]
        identical &= 0 <= index < len(expected) and torch.equal(image, expected[index])
    identical &= len(items) == len(expected) * (2 if training_format(name).random_access else 1)
    return "correct read" if identical else "different pixels"


def _cases(stores: dict[str, Path], seed: int, count: int) -> Iterator[tuple[str, str, str, int]]:
    """``count`` cases (format, file, mutation, seed), the formats taken in turn."""
    rng = np.random.default_rng(seed)
    names = sorted(stores)
    for case in range(count):
        name = names[case % len(names)]
        files = sorted(str(p.relative_to(stores[name])) for p in stores[name].rglob("*") if p.is_file())
        file = files[int(rng.integers(0, len(files)))]
        mutations = MUTATIONS if file.endswith(".json") else MUTATIONS[:-1]
        yield name, file, mutations[int(rng.integers(0, len(mutations)))], int(rng.integers(0, 2**31))


def _fuzz(stores: dict[str, Path], reference: CropDataset, tmp_path: Path, seed: int, count: int) -> dict[str, int]:
    expected = [torch.from_numpy(np.asarray(reference.read_raw(i))) for i in range(len(reference))]
    before = {name: _snapshot(path) for name, path in stores.items()}
    counts = {"cases": 0, "typed error": 0, "correct read": 0, "different pixels": 0}
    started = time.perf_counter()
    for case, (name, file, how, case_seed) in enumerate(_cases(stores, seed, count)):
        copy = tmp_path / f"{case}-{name}"
        shutil.copytree(stores[name], copy)
        _mutate(copy / file, how, np.random.default_rng(case_seed))
        damaged = _snapshot(copy)
        try:
            counts[_outcome(name, copy, expected)] += 1
        except AssertionError as error:
            raise AssertionError(f"{name} {file} {how} (case seed {case_seed}): {error}") from error
        assert _snapshot(copy) == damaged, f"{name} {file} {how}: reading changed the store"
        counts["cases"] += 1
        shutil.rmtree(copy)
    assert {name: _snapshot(path) for name, path in stores.items()} == before, "a case touched another store"
    print(f"\nfuzz crop stores (seed {seed}): {counts} in {time.perf_counter() - started:.1f} s")
    return counts


def test_damaged_crop_stores_are_store_errors_or_the_plates_crops(
    stores: dict[str, Path], reference: CropDataset, tmp_path: Path
) -> None:
    counts = _fuzz(stores, reference, tmp_path, seed=0, count=FAST_CASES)
    assert counts["cases"] == FAST_CASES and counts["typed error"] > 0 and counts["correct read"] > 0


@pytest.mark.slow
def test_damaged_crop_stores_randomized(stores: dict[str, Path], reference: CropDataset, tmp_path: Path) -> None:
    _fuzz(stores, reference, tmp_path, seed=slow_fuzz_seed(), count=SLOW_CASES)
