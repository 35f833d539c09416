"""Training formats: every format gives back the plate's crops exactly; damaged stores fail in one clear error."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import shutil
from pathlib import Path
from typing import Any

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
    with pytest.raises(ConfigError, match="workers must be a whole number >= 0, got -2"):
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
