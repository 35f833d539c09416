"""The fidelity gate: same seed, same tensors, whatever the decode path, layout or worker count."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from cropbench.config import CropConfig
from cropbench.data.dataset import CropDataset
from cropbench.data.sampling import RandomObjectSampler
from cropbench.formats import open_plate
from cropbench.harness.context import RunContext
from cropbench.harness.dataset_case import DatasetCase, case_fidelity_hash
from cropbench.measure.fidelity import fidelity_hash


@pytest.mark.parametrize("access", ["random", "paired", "chunk-aware"])
def test_every_decode_path_has_the_same_fidelity_hash(layout_plate: Path, access: str) -> None:
    crop = CropConfig(crop_size=32, tier="typical", seed=5)
    hashes = {
        decode: case_fidelity_hash(
            RunContext(plate=layout_plate), DatasetCase(crop=crop.replace(decode=decode), access=access)
        )
        for decode in ("zarr", "direct", "field")
    }
    assert len(set(hashes.values())) == 1, hashes


def test_layouts_share_the_hash_of_the_same_plate(layout_plate: Path, tiny_plate: Path) -> None:
    case = DatasetCase(crop=CropConfig(crop_size=32, dtype="uint16"))
    assert case_fidelity_hash(RunContext(plate=layout_plate), case) == case_fidelity_hash(
        RunContext(plate=tiny_plate), case
    )


class OffByOneReader:
    """A 'fast path' that returns the wrong pixels: the gate must notice."""

    def __init__(self, plate: Path) -> None:
        self.inner = open_plate(plate, "direct")
        self.metadata = self.inner.metadata

    def read_region(
        self,
        field_index: int,
        y0: int,
        y1: int,
        x0: int,
        x1: int,
        channels: np.ndarray | None = None,
        out: np.ndarray | None = None,
        window: tuple[int, int] | None = None,
    ) -> np.ndarray:
        result = self.inner.read_region(field_index, y0, y1, x0, x1, channels, out, window)
        result[0, 0, 0] += 1
        return result


def test_a_path_that_changes_one_pixel_changes_the_hash(tiny_plate: Path) -> None:
    crop = CropConfig(crop_size=16, dtype="uint16")
    honest = CropDataset(tiny_plate, crop)
    broken = CropDataset(tiny_plate, crop, reader=OffByOneReader(tiny_plate))  # type: ignore[arg-type]
    assert fidelity_hash((honest[i] for i in range(8)), honest.channel_names) != fidelity_hash(
        (broken[i] for i in range(8)), broken.channel_names
    )


def test_the_hash_covers_dtype_channel_order_and_coordinates(tiny_plate: Path) -> None:
    base = CropDataset(tiny_plate, CropConfig(crop_size=16, dtype="float32"))
    half = CropDataset(tiny_plate, CropConfig(crop_size=16, dtype="float16"))
    reordered = CropDataset(
        tiny_plate, CropConfig(crop_size=16, dtype="float32", channels=("ER", "DNA", "RNA", "AGP", "Mito"))
    )
    digests = {fidelity_hash((d[i] for i in range(4)), d.channel_names) for d in (base, half, reordered)}
    assert len(digests) == 3
    shifted = [dict(base[i], crop_y0=base[i]["crop_y0"] + 1) for i in range(4)]
    assert fidelity_hash(shifted, base.channel_names) != fidelity_hash((base[i] for i in range(4)), base.channel_names)


@pytest.mark.slow
def test_workers_0_1_2_deliver_byte_identical_batches(tiny_plate: Path) -> None:
    dataset = CropDataset(tiny_plate, CropConfig(crop_size=24, tier="typical", seed=9))
    digests = []
    for workers in (0, 1, 2):
        loader = DataLoader(
            dataset, batch_size=7, sampler=RandomObjectSampler(len(dataset), seed=3), num_workers=workers
        )
        batches = list(loader)
        assert all(isinstance(b["image"], torch.Tensor) for b in batches)
        digests.append(fidelity_hash(batches, dataset.channel_names))
    assert len(set(digests)) == 1
