"""Training formats: every format gives back the plate's crops exactly; damaged stores fail in one clear error."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import TINY_SPEC

from cropbench.config import LAYOUTS
from cropbench.data.dataset import CropDataset
from cropbench.data.training import (
    MANIFEST_NAME,
    TRAINING_FORMATS,
    CropStoreInfo,
    EpochSpec,
    FormatUnavailableError,
    TrainingFormat,
    crop_dataset,
    training_format,
)
from cropbench.data.training import base as training_base
from cropbench.errors import ConfigError, OutputError, StoreError
from cropbench.measure.fidelity import fidelity_hash
from cropbench.plates.generate import generate_plate

#: Objects compared item by item with the plate.
COMPARED = 200
CROP_SIZE = 32
#: Small shards, so every sharded format writes several.
SHARD_BYTES = 200_000


def usable(name: str) -> TrainingFormat:
    """The format, or a skip naming the command that installs its library."""
    reason = TRAINING_FORMATS[name].available()
    if reason is not None:
        pytest.skip(reason)
    return training_format(name)


@pytest.fixture(scope="module")
def plate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small plate with more than ``COMPARED`` objects, some of them on a field's border."""
    path = tmp_path_factory.mktemp("training") / "plate.zarr"
    generate_plate(path, dataclasses.replace(TINY_SPEC, cells_per_field=60), LAYOUTS["default"], progress=False)
    return path


@pytest.fixture(scope="module")
def reference(plate: Path) -> CropDataset:
    dataset = crop_dataset(plate, CROP_SIZE, None, None)
    assert len(dataset) > COMPARED
    return dataset


@pytest.fixture(scope="module")
def stores(plate: Path, reference: CropDataset, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each available format written once."""
    root = tmp_path_factory.mktemp("stores")
    written = {}
    for name, cls in TRAINING_FORMATS.items():
        if cls.available() is None:
            written[name] = root / f"{name}.crops"
            training_format(name).write(reference, written[name], shard_bytes=SHARD_BYTES)
    return written


def store_of(stores: dict[str, Path], name: str) -> Path:
    usable(name)
    return stores[name]


def same_item(got: dict[str, Any], expected: dict[str, Any]) -> bool:
    return (
        got.keys() == expected.keys()
        and got["image"].dtype == expected["image"].dtype == torch.uint16
        and torch.equal(got["image"], expected["image"])
        and {k: v for k, v in got.items() if k != "image"} == {k: v for k, v in expected.items() if k != "image"}
    )


def epoch_items(fmt: TrainingFormat, path: Path, shuffle: bool, workers: int = 0) -> list[dict[str, Any]]:
    """Every sample of one epoch through the format's loader, uncollated, in delivery order."""
    items = []
    for batch in fmt.epoch_loader(path, EpochSpec(batch_size=16, workers=workers, shuffle=shuffle, seed=3)):
        for position in range(len(batch["index"])):
            items.append(
                {
                    key: (value[position].item() if value[position].dim() == 0 else value[position])
                    if isinstance(value, torch.Tensor)
                    else value[position]
                    for key, value in batch.items()
                }
            )
    return items


@pytest.mark.parametrize("name", sorted(TRAINING_FORMATS))
def test_every_format_returns_the_plates_tensors(name: str, stores: dict[str, Path], reference: CropDataset) -> None:
    fmt, path = usable(name), store_of(stores, name)
    expected = [reference[i] for i in range(COMPARED)]
    if fmt.random_access:
        dataset = fmt.map_dataset(path)
        assert len(dataset) == len(reference)  # type: ignore[arg-type]
        got = [dataset[i] for i in range(COMPARED)]
        assert [i for i in range(COMPARED) if not same_item(got[i], expected[i])] == []
    in_order = epoch_items(fmt, path, shuffle=False)[:COMPARED]
    assert [i for i in range(COMPARED) if not same_item(in_order[i], expected[i])] == []
    names = reference.channel_names
    assert fidelity_hash(in_order, names) == fidelity_hash(expected, names)


@pytest.mark.parametrize("name", sorted(TRAINING_FORMATS))
def test_a_shuffled_epoch_delivers_every_crop_once(name: str, stores: dict[str, Path], reference: CropDataset) -> None:
    fmt, path = usable(name), store_of(stores, name)
    items = epoch_items(fmt, path, shuffle=True)
    order = [item["index"] for item in items]
    assert sorted(order) == list(range(len(reference)))
    assert order != sorted(order)  # the library shuffled
    by_index = {item["index"]: item for item in items}
    assert all(same_item(by_index[i], reference[i]) for i in range(0, len(reference), 7))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TRAINING_FORMATS))
def test_workers_split_the_epoch_between_them(name: str, stores: dict[str, Path], reference: CropDataset) -> None:
    fmt, path = usable(name), store_of(stores, name)
    order = [item["index"] for item in epoch_items(fmt, path, shuffle=True, workers=2)]
    assert sorted(order) == list(range(len(reference)))


def test_the_manifest_names_what_was_cut(stores: dict[str, Path], reference: CropDataset) -> None:
    for name, path in stores.items():
        info = CropStoreInfo.read(path)
        assert (info.format, info.count, info.crop_size) == (name, len(reference), CROP_SIZE)
        assert info.channel_names == reference.channel_names
        assert info.library_version == importlib.metadata.version(TRAINING_FORMATS[name].library)
        assert info.stored_bytes == sum(p.stat().st_size for p in path.rglob("*") if p.name != MANIFEST_NAME)


def damaged_copy(stores: dict[str, Path], name: str, tmp_path: Path) -> Path:
    copy = tmp_path / f"{name}.crops"
    shutil.copytree(store_of(stores, name), copy)
    return copy


def largest_data_file(path: Path) -> Path:
    return max((p for p in path.rglob("*") if p.is_file() and p.suffix != ".json"), key=lambda p: p.stat().st_size)


@pytest.mark.parametrize("name", sorted(TRAINING_FORMATS))
def test_a_truncated_shard_is_one_error_naming_it(name: str, stores: dict[str, Path], tmp_path: Path) -> None:
    path = damaged_copy(stores, name, tmp_path)
    shard = largest_data_file(path)
    os.truncate(shard, shard.stat().st_size // 2)
    fmt = training_format(name)
    with pytest.raises(StoreError, match=f"{shard.name} holds .* bytes, .* were written"):
        fmt.epoch_loader(path, EpochSpec(batch_size=8, shuffle=False))
    if fmt.random_access:
        with pytest.raises(StoreError, match="truncated"):
            fmt.map_dataset(path)


@pytest.mark.parametrize("name", sorted(TRAINING_FORMATS))
def test_a_missing_index_file_is_one_error_naming_it(name: str, stores: dict[str, Path], tmp_path: Path) -> None:
    path = damaged_copy(stores, name, tmp_path)
    index = path / "index.json" if (path / "index.json").is_file() else largest_data_file(path)
    index.unlink()
    with pytest.raises(StoreError, match=f"{index.name} is missing"):
        training_format(name).epoch_loader(path, EpochSpec(batch_size=8, shuffle=False))


def test_a_store_without_its_manifest_is_not_a_store(stores: dict[str, Path], tmp_path: Path) -> None:
    name = next(iter(stores), None)
    if name is None:
        pytest.skip("no training format library is installed")
    path = damaged_copy(stores, name, tmp_path)
    (path / MANIFEST_NAME).unlink()
    with pytest.raises(StoreError, match=f"not a complete crop store: {MANIFEST_NAME} is missing"):
        training_format(name).epoch_loader(path, EpochSpec(batch_size=8, shuffle=False))
    with pytest.raises(StoreError, match="does not exist"):
        CropStoreInfo.read(tmp_path / "nowhere")


def test_a_manifest_of_another_version_or_format_is_refused(stores: dict[str, Path], tmp_path: Path) -> None:
    if "hdf5" not in stores:
        pytest.skip(TRAINING_FORMATS["hdf5"].available() or "")
    path = damaged_copy(stores, "hdf5", tmp_path)
    manifest = path / MANIFEST_NAME
    original = manifest.read_text()
    manifest.write_text(original.replace('"manifest_version": 1', '"manifest_version": 99'))
    with pytest.raises(StoreError, match="manifest_version 99; this cropbench reads 1"):
        training_format("hdf5").map_dataset(path)
    manifest.write_text(original.replace('"format": "hdf5"', '"format": "mds"'))
    with pytest.raises(StoreError, match="holds format 'mds', not 'hdf5'"):
        training_format("hdf5").map_dataset(path)
    manifest.write_text(original.replace('"crops.h5"', '"../crops.h5"'))
    with pytest.raises(StoreError, match="'files' must map relative paths inside the store"):
        training_format("hdf5").map_dataset(path)
    manifest.write_text("[1, 2]")
    with pytest.raises(StoreError, match="manifest_version"):
        training_format("hdf5").map_dataset(path)


@pytest.mark.parametrize("name", sorted(TRAINING_FORMATS))
def test_a_library_of_an_untested_version_is_one_error_with_the_install_command(
    name: str, stores: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = store_of(stores, name)
    monkeypatch.setattr(training_base.importlib.metadata, "version", lambda distribution: "99.0")
    cls = TRAINING_FORMATS[name]
    with pytest.raises(FormatUnavailableError, match=rf"needs {cls.library}>=.*; 99.0 is installed; .*pip install"):
        training_format(name).epoch_loader(path, EpochSpec(batch_size=8, shuffle=False))
    assert "99.0 is installed" in (cls.available() or "")


def test_a_missing_library_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    for cls in TRAINING_FORMATS.values():
        monkeypatch.setattr(cls, "module", "cropbench_no_such_module")
        reason = cls.available()
        assert reason is not None and "cannot be imported" in reason and "pip install" in reason


def test_an_unknown_format_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="format 'parquet' is not one of hdf5, webdataset, litdata, mds"):
        training_format("parquet")


def test_an_epoch_spec_checks_its_knobs() -> None:
    with pytest.raises(ConfigError, match="batch_size must be a whole number >= 1, got 0"):
        EpochSpec(batch_size=0)
    with pytest.raises(ConfigError, match="workers must be a whole number from 0 to 256 .*, got -2"):
        EpochSpec(workers=-2)


def test_webdataset_has_no_random_access() -> None:
    with pytest.raises(ConfigError, match="no random access"):
        training_format("webdataset").map_dataset("anything")


class Interrupted(KeyboardInterrupt):
    pass


@pytest.mark.parametrize("name", sorted(TRAINING_FORMATS))
def test_an_interrupted_write_leaves_nothing(
    name: str, reference: CropDataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fmt = usable(name)
    cut = training_base.cut_crops

    def interrupted(dataset: CropDataset, batch: int = training_base.CUT_BATCH) -> Any:
        yield from list(cut(dataset, batch))[:2]  # two batches reach the library's files, then Ctrl-C
        raise Interrupted

    monkeypatch.setattr(training_base, "cut_crops", interrupted)
    with pytest.raises(Interrupted):
        fmt.write(reference, tmp_path / "crops", shard_bytes=SHARD_BYTES)
    assert list(tmp_path.iterdir()) == []


def test_a_folder_that_is_not_a_store_is_never_replaced(reference: CropDataset, tmp_path: Path) -> None:
    fmt = usable("hdf5")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(OutputError, match="already exists; pass --force"):
        fmt.write(reference, mine, shard_bytes=SHARD_BYTES)
    with pytest.raises(OutputError, match="refusing to replace .* not a crop store cropbench wrote"):
        fmt.write(reference, mine, shard_bytes=SHARD_BYTES, overwrite=True)
    assert [p.name for p in tmp_path.iterdir()] == ["mine"] and (mine / "notes.txt").read_text() == "keep me"
    store = tmp_path / "store"
    fmt.write(reference, store, shard_bytes=SHARD_BYTES)
    fmt.write(reference, store, shard_bytes=SHARD_BYTES, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "store"]


def read_everything(fmt: TrainingFormat, path: Path) -> None:
    """Every crop by index (where the format has random access), then one epoch in order."""
    if fmt.random_access:
        dataset = fmt.map_dataset(path)
        for index in range(len(dataset)):  # type: ignore[arg-type]
            dataset[index]
    for _ in fmt.epoch_loader(path, EpochSpec(batch_size=8, shuffle=False)):
        pass


@pytest.mark.parametrize(
    ("name", "file"),
    [
        ("webdataset", "crops-000001.tar"),  # tarfile.ReadError
        ("mds", "index.json"),  # UnicodeDecodeError
        ("litdata", "index.json"),  # UnicodeDecodeError
        ("mds", "shard.00001.mds"),  # IndexError
        ("litdata", "chunk-0-1.bin"),
        ("hdf5", "crops.h5"),
    ],
)
def test_a_file_replaced_by_garbage_of_its_size_is_a_store_error_naming_it(
    name: str, file: str, stores: dict[str, Path], tmp_path: Path
) -> None:
    path = damaged_copy(stores, name, tmp_path)
    target = path / file
    target.write_bytes(np.random.default_rng(7).integers(0, 256, target.stat().st_size, dtype=np.uint8).tobytes())
    with pytest.raises(StoreError, match=re.escape(file)) as caught:
        read_everything(training_format(name), path)
    assert "\n" not in str(caught.value)


def test_a_manifest_nested_deep_is_a_store_error(stores: dict[str, Path], tmp_path: Path) -> None:
    name = next(iter(stores), None)
    if name is None:
        pytest.skip("no training format library is installed")
    path = damaged_copy(stores, name, tmp_path)
    (path / MANIFEST_NAME).write_text("[" * 100_000 + "]" * 100_000)  # RecursionError in json
    with pytest.raises(StoreError, match=f"{MANIFEST_NAME}: its JSON is nested too deep"):
        training_format(name).epoch_loader(path, EpochSpec(batch_size=8, shuffle=False))
    (path / MANIFEST_NAME).write_text('{"manifest_version": 1, "files": {}, "count": "many"}')
    with pytest.raises(StoreError, match="not a crop store manifest: format, library"):
        CropStoreInfo.read(path)


def test_an_hdf5_store_declaring_more_crops_than_it_holds_is_refused_before_allocating(
    stores: dict[str, Path], tmp_path: Path
) -> None:
    usable("hdf5")  # a skip naming the install command where h5py is missing
    import h5py

    path = damaged_copy(stores, "hdf5", tmp_path)
    manifest = path / MANIFEST_NAME
    original = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**original, "crop_size": 40_000}))
    with pytest.raises(StoreError, match=r"declares \d+ crops of \(5, 40000, 40000\)"):
        training_format("hdf5").map_dataset(path)
    manifest.write_text(json.dumps(original))
    # The file itself declares 40,000 x 40,000 crops (HDF5 allocates chunks lazily, so it stays small).
    with h5py.File(path / "crops.h5", "w") as handle:
        handle.create_dataset("crops", shape=(original["count"], 5, 40_000, 40_000), dtype="<u2", chunks=(1, 5, 64, 64))
        for column in ("object_id", "field", "field_index", "crop_y0", "crop_x0", "index", "centroid_y"):
            handle.create_dataset(f"objects/{column}", shape=(40_000 * 40_000,), dtype="<i8", chunks=(4096,))
    os.truncate(path / "crops.h5", original["files"]["crops.h5"])  # padded to the size the manifest names
    with pytest.raises(StoreError, match=r"crops.h5: /crops is uint16 .*40000, 40000\), expected"):
        training_format("hdf5").map_dataset(path)


def test_a_users_folder_with_a_hand_made_manifest_is_never_replaced(
    stores: dict[str, Path], reference: CropDataset, tmp_path: Path
) -> None:
    fmt = usable("hdf5")
    mine = tmp_path / "hdf5"
    mine.mkdir()
    (mine / "mine.txt").write_text("keep me")
    (mine / MANIFEST_NAME).write_text("{}")
    with pytest.raises(OutputError, match="refusing to replace .* not a complete crop store"):
        fmt.write(reference, mine, shard_bytes=SHARD_BYTES, overwrite=True)
    assert (mine / "mine.txt").read_text() == "keep me"
    store = damaged_copy(stores, "hdf5", tmp_path)  # a complete store with a user's file beside it
    (store / "notes.txt").write_text("keep me")
    with pytest.raises(
        OutputError, match=r"refusing to replace .* files its crop store manifest does not name \(notes"
    ):
        fmt.write(reference, store, shard_bytes=SHARD_BYTES, overwrite=True)
    assert (store / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize("name", sorted(TRAINING_FORMATS))
def test_a_disk_too_small_for_the_store_is_refused_before_writing(
    name: str, reference: CropDataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fmt = usable(name)
    monkeypatch.setattr(training_base.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(2**30, 2**30, 2**20))  # type: ignore[attr-defined]
    with pytest.raises(StoreError, match=rf"{name}: cannot write crops to .*\[Errno 28\] No space left on device"):
        fmt.write(reference, tmp_path / "crops", shard_bytes=SHARD_BYTES)
    assert list(tmp_path.iterdir()) == []


FULL_DISK_WRITE = """
import sys
from cropbench.data.training import base, crop_dataset, training_format
from cropbench.errors import StoreError
base.check_free_space = lambda *args: None  # the disk fills up mid-write, after the check
try:
    training_format("hdf5").write(crop_dataset(sys.argv[1], 32, None, None), sys.argv[2], shard_bytes=10**6)
except StoreError as error:
    print(error)
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mount") is None, reason="mounting a small tmpfs needs root")
def test_hdf5_onto_a_disk_that_fills_up_mid_write_is_one_error_and_no_crash(plate: Path, tmp_path: Path) -> None:
    usable("hdf5")
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], check=False).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        done = subprocess.run(
            [sys.executable, "-c", FULL_DISK_WRITE, str(plate), str(disk / "crops")],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]  # h5py crashed (SIGSEGV) closing the file before
        assert "hdf5: cannot write crops" in done.stdout and "[Errno 28]" in done.stdout
        assert list(disk.iterdir()) == []
    finally:
        subprocess.run(["umount", str(disk)], check=False)
