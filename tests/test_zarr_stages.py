"""cropbench.measure.zarr_stages: zarr-python's crop path split into store reads, codec pipeline and the rest.

Structure only, never timing: the stages add up to the whole, each is counted, the counts follow the
work (a chunk decoded twice counts twice, a shard index read per chunk adds store reads), and zarr's
classes are left as they were.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cropbench.config import CropConfig
from cropbench.data.dataset import CropDataset
from cropbench.data.sampling import access_order
from cropbench.measure import zarr_stages as stages


@pytest.fixture(scope="module")
def zarr_dataset(tiny_plate: Path) -> CropDataset:
    dataset = CropDataset(tiny_plate, CropConfig(crop_size=64, decode="zarr"))
    for index in range(len(dataset)):  # open every field's array: metadata reads stay out of the counts
        dataset[index]
    return dataset


def _indices(dataset: CropDataset, count: int) -> list[int]:
    return [int(index) for index in access_order(dataset, "random", count, 0)]


def test_union_counts_overlapping_calls_once() -> None:
    assert stages.union_ns([(0, 10), (5, 15), (20, 25), (21, 22)]) == 20
    assert stages.union_ns([]) == 0
    record = stages.StageRecord(store=[(0, 10)], codec=[(5, 30)])
    assert stages.split_ns(record, 100) == {"store": 10, "codec": 20, "index_assemble": 70}


def test_the_stages_add_up_to_the_crops_and_each_is_counted(zarr_dataset: CropDataset) -> None:
    indices = _indices(zarr_dataset, 64)
    measured = stages.measure_stages(zarr_dataset.__getitem__, indices)
    assert measured.crops == len(indices)
    assert sorted(measured.stage_ns) == sorted(stages.STAGES)
    assert sum(measured.stage_ns.values()) == measured.total_ns
    assert all(ns > 0 for ns in measured.stage_ns.values()), measured.stage_ns
    counts = measured.counts()
    assert sorted(counts) == sorted(stages.COUNTS)
    assert counts[stages.STORE_READS_PER_CROP] >= 1 and counts[stages.CHUNKS_DECODED_PER_CROP] >= 1
    assert counts[stages.STORE_BYTES_PER_CROP] > 0


def test_the_counts_do_not_change_between_identical_runs(zarr_dataset: CropDataset) -> None:
    indices = _indices(zarr_dataset, 48)
    first = stages.measure_stages(zarr_dataset.__getitem__, indices)
    second = stages.measure_stages(zarr_dataset.__getitem__, indices)
    assert first.counts() == second.counts()


def test_against_a_reference_the_stage_parts_add_up_to_the_ratio(zarr_dataset: CropDataset) -> None:
    indices = _indices(zarr_dataset, 32 * 4)
    reference_crops = {index: zarr_dataset[index]["image"].clone() for index in set(indices)}
    measured = stages.measure_stages(zarr_dataset.__getitem__, indices, reference=reference_crops.__getitem__)
    assert measured.relative is not None and measured.relative > 0
    parts = measured.relative_stages()
    assert sum(parts.values()) == pytest.approx(measured.relative, rel=1e-9)
    assert all(part > 0 for part in parts.values()), parts
    with pytest.raises(ValueError, match="reference"):
        stages.measure_stages(zarr_dataset.__getitem__, indices[:4]).relative_stages()


def test_work_done_twice_counts_twice(zarr_dataset: CropDataset, monkeypatch: pytest.MonkeyPatch) -> None:
    """zarr reading every selection twice (the first result discarded): twice the reads, bytes and decodes."""
    import zarr

    indices = _indices(zarr_dataset, 32)
    once = stages.measure_stages(zarr_dataset.__getitem__, indices)
    getitem = zarr.Array.__getitem__  # the reader's call when every channel is read

    def twice(read: Any) -> Any:
        def again(self: Any, *args: Any, **kwargs: Any) -> Any:
            read(self, *args, **kwargs)
            return read(self, *args, **kwargs)

        return again

    monkeypatch.setattr(zarr.Array, "__getitem__", twice(getitem))
    doubled = stages.measure_stages(zarr_dataset.__getitem__, indices)
    assert once.chunks_decoded > 0
    assert (doubled.store_reads, doubled.store_bytes, doubled.chunks_decoded) == (
        2 * once.store_reads,
        2 * once.store_bytes,
        2 * once.chunks_decoded,
    )


def test_zarrs_classes_are_restored_even_when_a_crop_fails(zarr_dataset: CropDataset) -> None:
    from zarr.core.codec_pipeline import BatchedCodecPipeline
    from zarr.storage import LocalStore

    before = (LocalStore.get, LocalStore.get_partial_values, BatchedCodecPipeline.decode_batch)

    def failing(index: int) -> Any:
        raise KeyError(index)

    with pytest.raises(KeyError):
        stages.measure_stages(failing, [0])
    assert (LocalStore.get, LocalStore.get_partial_values, BatchedCodecPipeline.decode_batch) == before
    with pytest.raises(ValueError, match="at least one index"):
        stages.measure_stages(zarr_dataset.__getitem__, [])
