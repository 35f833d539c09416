"""The one in-memory reference cuts the dataset's own crops, byte for byte, border crops included: per crop
(the relative cost's reference), per batch (the fetch ceiling's copy) and served by Track 2's memory source."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from cropbench.config import CropConfig
from cropbench.data.dataset import CropDataset
from cropbench.errors import ConfigError
from cropbench.harness.loader_case import MemoryCrops
from cropbench.harness.memory_reference import MemoryReference

CONFIGS = {
    "uint16": CropConfig(crop_size=48, dtype="uint16"),
    "float32, two channels": CropConfig(crop_size=48, dtype="float32", channels=("RNA", "DNA")),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def dataset(request: pytest.FixtureRequest, tiny_plate: Path) -> CropDataset:
    return CropDataset(tiny_plate, CONFIGS[request.param])


def test_each_crop_is_the_datasets_crop_cast_like_it(dataset: CropDataset) -> None:
    reference = MemoryReference.of_dataset(dataset)
    assert reference.padded.any() and not reference.padded.all(), "border and inner crops both tested"
    for index in range(len(dataset)):
        expected = dataset[index]["image"]
        crop = reference(index)
        assert crop.dtype == expected.dtype and torch.equal(crop, expected), index
        assert np.array_equal(reference.cut(index), dataset.read_raw(index)), index


def test_a_batch_copy_is_the_datasets_batch_and_zeroes_padding_left_in_a_reused_buffer(
    dataset: CropDataset,
) -> None:
    reference = MemoryReference.of_dataset(dataset)
    batch = 16
    out = np.full((batch, *reference.crop_shape), 7, dtype=reference.pixel_dtype)
    for start in range(0, len(dataset) - batch + 1, batch):
        indices = list(range(start, start + batch))
        reference.copy(reference.batch_pieces(indices, out), out)
        assert np.array_equal(out, np.stack([dataset.read_raw(index) for index in indices])), start


def test_the_fields_read_are_those_of_the_indices_asked_for(dataset: CropDataset) -> None:
    first_field = np.flatnonzero(dataset.field_index == dataset.field_index[0])
    reference = MemoryReference.of_dataset(dataset, first_field[:3])
    assert list(reference.fields) == [int(dataset.field_index[0])]
    assert np.array_equal(reference.cut(int(first_field[1])), dataset.read_raw(int(first_field[1])))


def test_track2s_memory_source_serves_the_datasets_crops_in_turn(dataset: CropDataset) -> None:
    crops = MemoryCrops(dataset, count=10)
    assert len(crops) == len(dataset)
    for index in (0, 9, 10, 23):
        assert torch.equal(crops[index]["image"], dataset[index % 10]["image"]), index
    first, second = crops[3]["image"], crops[3]["image"]
    assert first.data_ptr() != second.data_ptr(), "a fresh tensor per item"


def test_no_fields_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="at least one field"):
        MemoryReference({}, np.zeros(1, dtype=np.int64), np.zeros(1), np.zeros(1), 8)
