"""cropbench.harness.crop_path: the relative cost, its stages and the decode step's work that the asv suites report."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
import torch

from cropbench.config import CropConfig, plate_preset
from cropbench.data.dataset import CropDataset
from cropbench.data.sampling import access_order
from cropbench.harness import crop_path
from cropbench.harness.memory_reference import MemoryReference


def test_the_bounded_cache_is_far_below_the_smoke_plate() -> None:
    assert crop_path.cache_knobs("default") == {}
    assert crop_path.cache_knobs("bounded") == {"chunk_cache_bytes": crop_path.BOUNDED_CACHE_BYTES}
    smoke = plate_preset("smoke")
    fields = smoke.rows * smoke.columns * smoke.fields_per_well
    decoded_bytes = fields * smoke.channels * smoke.field_height * smoke.field_width * 2
    assert decoded_bytes > crop_path.BOUNDED_CACHE_BYTES * 8
    with pytest.raises(ValueError, match="bounded"):
        crop_path.cache_knobs("tiny")


def test_a_case_without_a_value_says_why() -> None:
    assert crop_path.unmeasured("direct", "default") is None
    assert "only the 'bounded' case" in str(crop_path.unmeasured("zarr", "default"))
    assert "only 'direct'" in str(crop_path.unmeasured("zarr", "bounded", instruments=True))
    assert "whole plate is in the cache" in str(crop_path.unmeasured("direct", "default", misses=True))
    assert crop_path.channel_names("all") is None and crop_path.channel_names("DNA+RNA") == ("DNA", "RNA")


def test_the_relative_costs_reference_is_the_datasets_crops_border_crops_included(tiny_plate: Path) -> None:
    dataset = CropDataset(tiny_plate, CropConfig(crop_size=64, dtype="float32"))
    reference = MemoryReference.of_dataset(dataset)
    assert reference.padded.any(), "no border crop tested"
    for index in range(len(dataset)):
        assert torch.equal(reference(index), dataset[index]["image"])


def test_relative_cost_rises_with_a_slower_crop_path(tiny_plate: Path) -> None:
    dataset = CropDataset(tiny_plate, CropConfig(crop_size=64))
    ceiling = MemoryReference.of_dataset(dataset)
    indices = access_order(dataset, "random", crop_path.BLOCK * 20)

    def ten_times(index: int) -> None:
        for _ in range(10):
            ceiling(index)

    # Ten times the work, not three: with two busy loops beside the test, whichever of the pair reads a
    # block first pays cold CPU caches, and a mean of per-block ratios then put identical paths at 2.35
    # and three-fold work at only 1.2 times that. Ten-fold work stays clear of that noise.
    same = crop_path.block_cost(ceiling, ceiling, indices)
    slower = crop_path.block_cost(ten_times, ceiling, indices)
    assert slower > 1.5 * same


def test_sampler_stream_yields_the_access_order_across_epochs(tiny_plate: Path) -> None:
    dataset = CropDataset(tiny_plate, CropConfig(crop_size=64))
    for access in ("random", "grouped-field"):
        order = access_order(dataset, access, 2 * len(dataset) + 5)
        seen: list[int] = []
        get = crop_path.sampled(seen.append, dataset, access)
        for expected in order:
            get(expected)
        assert seen == order


def test_decode_work_counts_a_chunk_decoded_twice(tiny_plate: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stats count each chunk once however often it is decoded; the decode step's counters count the work."""
    crop = CropConfig(crop_size=64, chunk_cache_bytes=0)
    dataset = CropDataset(tiny_plate, crop)
    indices = access_order(dataset, "random", len(dataset))
    once = crop_path.decode_work(str(tiny_plate), crop, "random", indices)
    loader = importlib.import_module("cropbench.formats.direct.loads").ChunkLoader
    load = loader.load

    def twice(self: Any, reads: Any, *copies: Any) -> Any:
        load(self, reads, *copies)
        return load(self, reads, *copies)

    monkeypatch.setattr(loader, "load", twice)
    doubled = crop_path.decode_work(str(tiny_plate), crop, "random", indices)
    assert once.decode_calls > 0 and doubled.stats.bytes_decoded == once.stats.bytes_decoded
    assert (doubled.decode_calls, doubled.decoded_bytes) == (2 * once.decode_calls, 2 * once.decoded_bytes)


def test_stage_costs_are_parts_of_the_relative_cost(tiny_plate: Path) -> None:
    crop = CropConfig(crop_size=64, chunk_cache_bytes=0)
    dataset = crop_path.stage_timed_dataset(str(tiny_plate), crop)
    indices = access_order(dataset, "random", crop_path.BLOCK * 10)
    costs = crop_path.stage_costs(dataset, dataset.__getitem__, MemoryReference.of_dataset(dataset), indices)
    assert sorted(costs) == sorted(crop_path.STAGES)
    assert all(cost > 0.0 for cost in costs.values()), costs


def test_a_crop_path_reads_its_blocks_and_epochs_and_reports_the_decode_work(tiny_plate: Path) -> None:
    crop = CropConfig(crop_size=64, chunk_cache_bytes=0)
    path = crop_path.CropPath(tiny_plate, crop, "grouped-field", blocks=4, stage_timed=True)
    assert len(path.indices) == 4 * crop_path.BLOCK
    path.read_block()
    path.read_epoch()
    assert path.decode_amplification() >= 1.0 and path.decode_calls_per_mib() > 0
