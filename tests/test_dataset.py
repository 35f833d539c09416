"""CropDataset: keys, shapes, dtypes, channels, borders, collate, and agreement between decode paths."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import zarr
from torch.utils.data import DataLoader, default_collate

from cropbench.config import CropConfig
from cropbench.data.dataset import CropDataset, PairedViews
from cropbench.data.loader import LoaderSpec, ScheduledSampler, batch_collate, build_loader
from cropbench.errors import ConfigError, ObjectTableError
from cropbench.formats import read_plate_metadata
from cropbench.objects import ObjectTable, read_object_table

KEYS = {
    "image",
    "object_id",
    "plate",
    "well",
    "field",
    "field_index",
    "centroid_y",
    "centroid_x",
    "crop_y0",
    "crop_x0",
    "index",
}


def test_item_is_a_dict_with_metadata_and_a_chw_tensor(tiny_plate: Path) -> None:
    dataset = CropDataset(tiny_plate, CropConfig(crop_size=32))
    item = dataset[0]
    assert set(item) == KEYS
    assert item["image"].shape == (5, 32, 32) and item["image"].dtype == torch.float32
    assert item["plate"] == "tiny" and item["well"] in ("A1", "A2")
    assert len(dataset) == len(read_object_table(tiny_plate))


@pytest.mark.parametrize(
    ("dtype", "torch_dtype"),
    [
        ("uint16", torch.uint16),
        ("float32", torch.float32),
        ("float16", torch.float16),
        ("bfloat16", torch.bfloat16),
    ],
)
def test_output_dtype(tiny_plate: Path, dtype: str, torch_dtype: torch.dtype) -> None:
    assert CropDataset(tiny_plate, CropConfig(crop_size=16, dtype=dtype))[3]["image"].dtype == torch_dtype


def test_channel_selection_by_name_and_index_keeps_the_requested_order(tiny_plate: Path) -> None:
    everything = CropDataset(tiny_plate, CropConfig(crop_size=24, dtype="uint16"))
    by_name = CropDataset(tiny_plate, CropConfig(crop_size=24, dtype="uint16", channels=("Mito", "DNA")))
    by_index = CropDataset(tiny_plate, CropConfig(crop_size=24, dtype="uint16", channels=("4", "0")))
    assert by_name.channel_names == ("Mito", "DNA")
    full = everything[5]["image"]
    assert torch.equal(by_name[5]["image"], full[[4, 0]])
    assert torch.equal(by_index[5]["image"], full[[4, 0]])
    with pytest.raises(ConfigError, match="unknown channel 'Actin'"):
        CropDataset(tiny_plate, CropConfig(channels=("Actin",)))


def test_crop_equals_the_numpy_slice_around_the_centroid(tiny_plate: Path) -> None:
    dataset = CropDataset(tiny_plate, CropConfig(crop_size=20, dtype="uint16", border="drop"))
    metadata = read_plate_metadata(tiny_plate)
    for index in range(0, len(dataset), 7):
        item = dataset[index]
        field = zarr.open_array(str(tiny_plate / metadata.fields[item["field_index"]].path))[...]
        y0, x0 = int(np.floor(item["centroid_y"] - 9)), int(np.floor(item["centroid_x"] - 9))
        assert (item["crop_y0"], item["crop_x0"]) == (y0, x0)
        assert np.array_equal(item["image"].numpy(), field[:, y0 : y0 + 20, x0 : x0 + 20])


@pytest.mark.parametrize("size", [20, 21, 33, 96])
def test_window_centre_is_within_half_a_pixel_of_the_centroid(tiny_plate: Path, size: int) -> None:
    """Window start floor(c - (size - 1) / 2 + 1 / 2): centre start + (size - 1) / 2 is at most 0.5 px off."""
    dataset = CropDataset(tiny_plate, CropConfig(crop_size=size, border="pad"))
    offsets = np.concatenate(
        [
            dataset.window_y0 + (size - 1) / 2 - dataset.centroid_y,
            dataset.window_x0 + (size - 1) / 2 - dataset.centroid_x,
        ]
    )
    assert np.all(np.abs(offsets) <= 0.5) and np.ptp(offsets) > 0.5  # fractional centroids, both sides


def test_labels_come_with_each_item_and_collate_into_a_batch(tiny_plate: Path, tmp_path: Path) -> None:
    """A plate written by others with a separate table: string labels become sorted class ids."""
    table = read_object_table(tiny_plate)
    treatments = np.array(["taxol", "DMSO", None], dtype=object)[np.arange(len(table)) % 3]
    labelled = ObjectTable.from_columns(
        well=table.well,
        field=table.field,
        centroid_y=table.centroid_y,
        centroid_x=table.centroid_x,
        extra={"treatment": treatments, "dose": np.arange(len(table)) * 0.5},
    )
    labelled.write(tmp_path / "cells.parquet")
    dataset = CropDataset(
        tiny_plate, CropConfig(crop_size=16), objects=tmp_path / "cells.parquet", labels=["treatment", "dose"]
    )
    assert dataset.label_classes == {"treatment": ("DMSO", "taxol")}
    assert dataset[1]["labels"] == {"treatment": 0, "dose": 0.5} and dataset[2]["labels"]["treatment"] == -1
    batch = next(iter(DataLoader(dataset, batch_size=6, collate_fn=default_collate)))
    assert batch["labels"]["treatment"].tolist() == [1, 0, -1, 1, 0, -1]
    assert batch["labels"]["dose"].tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
    assert "labels" not in CropDataset(tiny_plate, CropConfig(crop_size=16))[0]
    with pytest.raises(ObjectTableError, match="no column 'moa'"):
        CropDataset(tiny_plate, objects=tmp_path / "cells.parquet", labels=["moa"])


def _edge_table(plate: Path) -> ObjectTable:
    return ObjectTable.from_columns(
        well=np.array(["A1", "A1"]),
        field=np.array([0, 0]),
        centroid_y=np.array([2.0, 100.0]),
        centroid_x=np.array([3.0, 120.0]),
    )


def test_border_policies(tiny_plate: Path) -> None:
    field = zarr.open_array(str(tiny_plate / read_plate_metadata(tiny_plate).fields[0].path))[...]
    table = _edge_table(tiny_plate)
    padded = CropDataset(tiny_plate, CropConfig(crop_size=16, dtype="uint16", border="pad"), objects=table)[0]
    image = padded["image"].numpy()
    assert (image[:, :5, :] == 0).all() and (image[:, :, :4] == 0).all()  # window starts at (-5, -4)
    assert np.array_equal(image[:, 5:, 4:], field[:, :11, :12])
    shifted = CropDataset(tiny_plate, CropConfig(crop_size=16, dtype="uint16", border="shift"), objects=table)[0]
    assert np.array_equal(shifted["image"].numpy(), field[:, :16, :16])
    assert len(CropDataset(tiny_plate, CropConfig(crop_size=16, border="drop"), objects=table)) == 1


def test_all_decode_paths_give_identical_tensors(layout_plate: Path) -> None:
    datasets = [
        CropDataset(layout_plate, CropConfig(crop_size=40, tier="typical", decode=d, seed=3))
        for d in ("zarr", "direct", "field")
    ]
    for index in range(0, len(datasets[0]), 5):
        first = datasets[0][index]["image"]
        for other in datasets[1:]:
            assert torch.equal(other[index]["image"], first)


def test_tiers_light_normalises_and_resizes_typical_is_seeded(tiny_plate: Path) -> None:
    light = CropDataset(tiny_plate, CropConfig(crop_size=32, tier="light", output_size=24))[0]["image"]
    assert light.shape == (5, 24, 24) and -1.0 < float(light.mean()) < 2.0
    typical = CropDataset(tiny_plate, CropConfig(crop_size=32, tier="typical", seed=1))
    again = CropDataset(tiny_plate, CropConfig(crop_size=32, tier="typical", seed=1))
    assert torch.equal(typical[4]["image"], again[4]["image"])
    other_seed = CropDataset(tiny_plate, CropConfig(crop_size=32, tier="typical", seed=2))
    assert any(not torch.equal(typical[i]["image"], other_seed[i]["image"]) for i in range(8))
    with pytest.raises(ConfigError, match="float dtype"):
        CropConfig(tier="light", dtype="uint16")


def test_paired_views_share_the_object_but_differ_in_augmentation(tiny_plate: Path) -> None:
    pairs = PairedViews(CropDataset(tiny_plate, CropConfig(crop_size=32, tier="typical")))
    views = [pairs[i] for i in range(6)]
    assert all(v["view1"].shape == v["view2"].shape == (5, 32, 32) for v in views)
    assert any(not torch.equal(v["view1"], v["view2"]) for v in views)


def test_default_collate_and_dataloader_workers(tiny_plate: Path) -> None:
    dataset = CropDataset(tiny_plate, CropConfig(crop_size=16, dtype="uint16"))
    batch = default_collate([dataset[i] for i in range(4)])
    assert batch["image"].shape == (4, 5, 16, 16) and batch["image"].dtype == torch.uint16
    assert len(batch["well"]) == 4 and batch["object_id"].dtype == torch.int64
    assert len(pickle.dumps(dataset)) < 200_000
    loader = DataLoader(dataset, batch_size=8, num_workers=2)
    delivered = torch.cat([b["object_id"] for b in loader])
    assert sorted(delivered.tolist()) == sorted(dataset.object_id.tolist())


def test_bad_object_tables_are_named(tiny_plate: Path) -> None:
    unknown_well = ObjectTable.from_columns(
        well=np.array(["H12"]), field=np.array([0]), centroid_y=np.array([5.0]), centroid_x=np.array([5.0])
    )
    with pytest.raises(ObjectTableError, match="H12"):
        CropDataset(tiny_plate, objects=unknown_well)
    outside = ObjectTable.from_columns(
        well=np.array(["A1"]), field=np.array([0]), centroid_y=np.array([500.0]), centroid_x=np.array([5.0])
    )
    with pytest.raises(ObjectTableError, match="outside"):
        CropDataset(tiny_plate, objects=outside)
    with pytest.raises(ObjectTableError, match="NaN"):
        ObjectTable.from_columns(
            well=np.array(["A1"]), field=np.array([0]), centroid_y=np.array([np.nan]), centroid_x=np.array([5.0])
        )
    with pytest.raises(ConfigError, match="larger than the field"):
        CropDataset(tiny_plate, CropConfig(crop_size=512))


def test_an_empty_object_table_is_named_as_empty_not_blamed_on_the_border(tiny_plate: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty.parquet"
    pq.write_table(read_object_table(tiny_plate).to_arrow().slice(0, 0), empty)
    with pytest.raises(ObjectTableError, match=r"object table .*empty\.parquet is empty") as raised:
        CropDataset(tiny_plate, objects=empty)
    assert "border" not in str(raised.value)
    nothing = np.array([])
    with pytest.raises(ObjectTableError, match="given as objects= is empty"):
        CropDataset(tiny_plate, objects=ObjectTable.from_columns(nothing, nothing, nothing, nothing))


BATCH_CONFIGS = [
    CropConfig(crop_size=48, dtype="uint16"),
    CropConfig(crop_size=48, dtype="bfloat16", channels=("Mito", "DNA"), chunk_cache_bytes=60_000),
    CropConfig(crop_size=40, tier="typical", output_size=32, seed=3, chunk_cache_bytes=0),
    CropConfig(crop_size=48, dtype="uint16", chunk_cache_bytes=60_000, decode_threads=2),
]


@pytest.mark.parametrize("config", BATCH_CONFIGS, ids=["uint16", "bfloat16-channels", "typical", "2-threads"])
def test_a_batch_equals_default_collate_of_its_items(layout_plate: Path, config: CropConfig) -> None:
    batched, single = CropDataset(layout_plate, config), CropDataset(layout_plate, config)
    indices = [*np.random.default_rng(4).permutation(len(single))[:30].tolist(), -1, 0, 0]
    batch = batch_collate(batched.__getitems__(indices))
    expected = default_collate([single[i] for i in indices])
    assert batch.keys() == expected.keys()
    for key, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert batch[key].dtype == value.dtype and torch.equal(batch[key], value), key
        else:
            assert batch[key] == value, key


def test_a_crop_batch_is_a_sequence_of_items_for_any_collate(tiny_plate: Path) -> None:
    dataset = CropDataset(tiny_plate, CropConfig(crop_size=32, dtype="uint16"))
    batch = dataset.__getitems__([3, 1, 2])
    assert len(batch) == 3 and torch.equal(batch[1]["image"], dataset[1]["image"])
    assert {k: v for k, v in batch[1].items() if k != "image"} == {k: v for k, v in dataset[1].items() if k != "image"}
    stacked, passed_on = default_collate(batch), batch_collate(batch)
    assert torch.equal(stacked["image"], passed_on["image"]) and passed_on["image"] is batch.image
    with pytest.raises(IndexError):
        dataset.__getitems__([len(dataset)])


def test_a_batch_of_border_crops_sets_every_pixel_of_its_output(tiny_plate: Path) -> None:
    dataset = CropDataset(tiny_plate, CropConfig(crop_size=96, dtype="uint16", border="pad"))
    _, height, width = dataset.reader.metadata.field_shape
    inside = (dataset.window_y0 >= 0) & (dataset.window_x0 >= 0)
    inside &= (dataset.window_y0 + 96 <= height) & (dataset.window_x0 + 96 <= width)
    indices = np.arange(len(dataset))
    assert 0 < inside.sum() < len(indices), "the tiny plate should give crops inside and crops over the border"
    out = np.full((len(indices), len(dataset.channel_indices), 96, 96), 0xFFFF, dtype=np.uint16)  # not zeroed
    dataset.read_raw_batch(indices, out)
    np.testing.assert_array_equal(out, np.stack([dataset.read_raw(int(index)) for index in indices]))


@pytest.mark.parametrize("threads", [2, 4])
def test_decode_threads_do_not_change_the_bytes(layout_plate: Path, threads: int) -> None:
    config = CropConfig(crop_size=48, dtype="uint16", chunk_cache_bytes=100_000)
    single = CropDataset(layout_plate, config)
    threaded = CropDataset(layout_plate, config.replace(decode_threads=threads))
    order = np.random.default_rng(6).permutation(len(single))
    for start in range(0, len(order), 32):
        indices = order[start : start + 32].tolist()
        assert torch.equal(threaded.__getitems__(indices).image, single.__getitems__(indices).image)
    for index in order[:10].tolist():
        assert torch.equal(threaded[index]["image"], single[index]["image"])


@pytest.mark.slow
def test_the_loader_fetches_whole_batches_in_workers(tiny_plate: Path) -> None:
    dataset = CropDataset(tiny_plate, CropConfig(crop_size=32, dtype="uint16", decode_threads=2))
    order = np.random.default_rng(1).permutation(len(dataset))
    expected = torch.stack([dataset[i]["image"] for i in order.tolist()])
    for workers in (0, 1):
        loader = build_loader(dataset, LoaderSpec(num_workers=workers, batch_size=16), ScheduledSampler([order]))
        batches = list(loader)
        assert torch.equal(torch.cat([b["image"] for b in batches]), expected)
        assert torch.equal(torch.cat([b["index"] for b in batches]), torch.from_numpy(order))
