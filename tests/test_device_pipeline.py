"""The device pipeline: raw uint16 batches made into the tier's tensors equal to the CPU tiers' ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from cropbench.config import CropConfig
from cropbench.data.dataset import CropDataset
from cropbench.data.device_pipeline import (
    IN_MAIN_PROCESS,
    IN_WORKERS,
    Boundaries,
    DeviceTier,
    HostStaging,
    boundaries,
    loader_crop,
    raw_crop,
)
from cropbench.data.loader import LoaderSpec, ScheduledSampler, build_loader
from cropbench.data.transforms import Augmentation, TransformPlan
from cropbench.errors import ConfigError

CPU = torch.device("cpu")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
#: Every tier and output dtype a crop config allows besides raw uint16.
TIERS = [
    ("none", "float32"),
    ("none", "bfloat16"),
    ("light", "float32"),
    ("light", "float16"),
    ("typical", "float32"),
    ("typical", "bfloat16"),
]


def _plan(tier: str, dtype: str = "float32", output_size: int | None = None, seed: int = 3) -> TransformPlan:
    windows = [(100.0, 4000.0), (0.0, 65535.0), (500.0, 501.0)]
    return TransformPlan.for_windows(tier, dtype, windows, output_size, seed)


def _raw(batch: int = 12, size: int = 16, seed: int = 0) -> torch.Tensor:
    values = np.random.default_rng(seed).integers(0, 2**16, size=(batch, 3, size, size), dtype=np.uint16)
    return torch.from_numpy(values)


def _per_crop(
    plan: TransformPlan, raw: torch.Tensor, indices: list[int], epoch: int = 0, view: int = 0
) -> torch.Tensor:
    return torch.stack([plan.apply(raw[slot], index, epoch, view) for slot, index in enumerate(indices)])


@pytest.mark.parametrize(("tier", "dtype"), TIERS)
def test_a_batch_equals_its_crops_one_by_one(tier: str, dtype: str) -> None:
    plan, raw = _plan(tier, dtype), _raw()
    indices = [5, 0, 17, 3, 3, 99, 4, 8, 1, 2, 60, 7]
    batched = plan.apply_batch(raw, indices, epoch=2, view=1)
    assert batched.dtype == _per_crop(plan, raw, indices, 2, 1).dtype
    assert torch.equal(batched, _per_crop(plan, raw, indices, 2, 1))
    assert torch.equal(raw, _raw()), "the raw batch is left as it was"


def test_a_resized_batch_equals_its_crops_one_by_one() -> None:
    plan, raw = _plan("typical", output_size=24), _raw(size=20)
    indices = list(range(12))
    assert torch.equal(plan.apply_batch(raw, indices), _per_crop(plan, raw, indices))


def test_the_typical_draws_depend_on_seed_epoch_index_and_view_only() -> None:
    plan = _plan("typical")
    first = plan.augmentation(7, channels=3, epoch=1, view=0)
    again = plan.augmentation(7, channels=3, epoch=1, view=0)
    assert first.geometry == again.geometry and np.array_equal(first.gain, again.gain)
    others = [plan.augmentation(7, 3, 2, 0), plan.augmentation(8, 3, 1, 0), plan.augmentation(7, 3, 1, 1)]
    assert all(not np.array_equal(first.gain, other.gain) for other in others)
    draws = [plan.augmentation(i, 3) for i in range(400)]
    assert {d.geometry for d in draws} == {(h, v, t) for h in (False, True) for v in (False, True) for t in range(4)}
    gains = np.concatenate([d.gain for d in draws])
    assert gains.min() >= 0.9 and gains.max() <= 1.1 and isinstance(draws[0], Augmentation)


def test_a_batch_refuses_a_mismatch_of_crops_and_indices() -> None:
    with pytest.raises(ValueError, match="B indices"):
        _plan("light").apply_batch(_raw(batch=4), [0, 1, 2])
    with pytest.raises(ValueError, match="square"):
        _plan("typical").augment_batch(torch.zeros(2, 3, 4, 6), [_plan("typical").augmentation(i, 3) for i in (0, 1)])


def _tier(dataset: CropDataset, crop: CropConfig) -> DeviceTier:
    return DeviceTier.for_dataset(dataset.plan, crop, CPU)


@pytest.mark.parametrize(("tier", "dtype"), TIERS)
def test_the_device_tier_on_the_cpu_equals_the_dataset_tier(tiny_plate: Path, tier: str, dtype: str) -> None:
    crop = CropConfig(crop_size=32, tier=tier, dtype=dtype, seed=5)
    reference, raw = CropDataset(tiny_plate, crop), CropDataset(tiny_plate, raw_crop(crop))
    reference.set_epoch(1)
    indices = [3, 0, 11, 7, 7, 2]
    expected = reference.__getitems__(indices).image
    delivered = raw.__getitems__(indices).image
    assert delivered.dtype == torch.uint16
    assert torch.equal(_tier(raw, crop)(delivered, indices, epoch=1), expected)


def test_the_device_tier_through_a_dataloader_equals_the_dataset_pipeline(tiny_plate: Path) -> None:
    crop = CropConfig(crop_size=32, tier="typical")
    spec = LoaderSpec(batch_size=8, collate="stack")
    order = [np.random.default_rng(0).permutation(16)]

    def batches(dataset: CropDataset) -> list[dict[str, Any]]:
        return list(build_loader(dataset, spec, ScheduledSampler(order)))

    reference = batches(CropDataset(tiny_plate, crop))
    raw = CropDataset(tiny_plate, loader_crop(crop, "device"))
    tier = _tier(raw, crop)
    for expected, batch in zip(reference, batches(raw), strict=True):
        assert batch["image"].dtype == torch.uint16 and np.array_equal(batch["index"], expected["index"])
        assert torch.equal(tier(batch["image"], batch["index"]), expected["image"])


def test_the_device_tier_refuses_what_is_not_raw(tiny_plate: Path) -> None:
    crop = CropConfig(crop_size=32, tier="light")
    dataset = CropDataset(tiny_plate, crop)
    with pytest.raises(ConfigError, match="raw uint16 crops"):
        DeviceTier.for_dataset(dataset.plan, crop, CPU)
    tier = _tier(CropDataset(tiny_plate, raw_crop(crop)), crop)
    with pytest.raises(ConfigError, match="uint16 batches, got torch.float32"):
        tier(torch.zeros(2, 5, 32, 32), [0, 1])
    with pytest.raises(ConfigError, match="pipeline='gpu' is not one of dataset, device"):
        loader_crop(crop, "gpu")
    with pytest.raises(ConfigError, match="needs a CUDA device"):
        HostStaging(CPU)


def test_boundaries_name_where_the_tier_ran_and_the_bytes_per_sample() -> None:
    crop = CropConfig(crop_size=96, tier="typical", dtype="float32")
    raw, wide = 5 * 96 * 96 * 2, 5 * 96 * 96 * 4
    cuda = torch.device("cuda", 0)
    assert boundaries(crop, 5, "dataset", 8, cuda) == Boundaries(IN_WORKERS, wide, wide)
    assert boundaries(crop, 5, "dataset", 0, CPU) == Boundaries(IN_MAIN_PROCESS, 0, 0)
    assert boundaries(crop, 5, "device", 8, cuda) == Boundaries("cuda:0", raw, raw)
    assert boundaries(crop, 5, "device", 4, CPU) == Boundaries("cpu", raw, 0)
    resized = crop.replace(output_size=64, dtype="bfloat16")
    assert boundaries(resized, 5, "dataset", 2, CPU).worker_to_main == 5 * 64 * 64 * 2
    assert boundaries(resized, 5, "device", 2, CPU).worker_to_main == raw


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(("tier", "dtype"), TIERS)
def test_the_device_tier_on_cuda_equals_the_cpu_tier(tier: str, dtype: str) -> None:
    plan = _plan(tier, dtype)
    device_tier = DeviceTier(plan, torch.device("cuda"))
    sent = []
    for batch in range(6):  # more batches than staging buffers: a reused buffer must not corrupt a copy
        raw = _raw(seed=batch)
        indices = list(range(batch * 12, batch * 12 + 12))
        sent.append((device_tier(raw, indices, epoch=1), _per_crop(plan, raw, indices, epoch=1)))
    for on_device, on_cpu in sent:
        assert on_device.is_cuda and torch.equal(on_device.cpu(), on_cpu)
    assert device_tier.staging is not None and device_tier.staging.allocations == 2


@pytest.mark.gpu
@needs_cuda
def test_staging_reuses_its_pinned_buffers_for_a_shorter_last_batch() -> None:
    staging = HostStaging(torch.device("cuda"), buffers=2)
    batches = [_raw(batch=12, seed=0), _raw(batch=12, seed=1), _raw(batch=5, seed=2)]
    moved = [staging.hand_over(staging.send(batch)) for batch in batches]
    assert all(torch.equal(m.cpu(), b) for m, b in zip(moved, batches, strict=True))
    assert staging.allocations == 2 and all(b is not None and b.is_pinned() for b in staging._buffers)
