"""Track targets: the ceiling cuts the same bytes as the readers, ratios are paired per block, a ratio
to the ceiling above 1 is flagged, and every row the track writes is a valid record."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import cropbench
from cropbench import metrics as m
from cropbench.config import LAYOUTS, CropConfig
from cropbench.data.dataset import CropDataset
from cropbench.data.sampling import access_order
from cropbench.errors import ConfigError
from cropbench.formats.atlas import FieldRun
from cropbench.formats.direct.keys import FIELD_SHIFT, chunk_name
from cropbench.harness.memory_reference import MemoryReference
from cropbench.harness.ratios import paired_ratios
from cropbench.harness.windows import CropWindows
from cropbench.plates.convert import materialize_layout
from cropbench.records import parse_record
from cropbench.tracks.targets import (
    IMPOSSIBLE,
    CodecCeiling,
    CopyCeiling,
    StoredChunks,
    TargetsCase,
    TensorStoreReads,
    ZarrAsyncReads,
    ceiling_flags,
    comparisons,
    memmap_fields,
)

CROP = CropConfig(crop_size=48, dtype="uint16")


@pytest.fixture(scope="module")
def dataset(tiny_plate: Path) -> CropDataset:
    return CropDataset(tiny_plate, CROP)


@pytest.fixture(scope="module")
def windows(dataset: CropDataset) -> CropWindows:
    return CropWindows.from_dataset(dataset)


def _expected(dataset: CropDataset, indices: list[int]) -> np.ndarray:
    return np.stack([dataset[i]["image"].numpy() for i in indices])


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_the_ceiling_cuts_the_same_bytes_as_the_reader_border_crops_included(
    tiny_plate: Path, dataset: CropDataset, windows: CropWindows, threads: int
) -> None:
    fields = memmap_fields(materialize_layout(tiny_plate, "memmap"))
    ceiling = CopyCeiling(MemoryReference.of_windows(fields, windows), threads, batch=16)
    try:
        for start in range(0, 64, 16):  # a reused output: padding left by an earlier batch is zeroed again
            indices = list(range(start, start + 16))
            assert np.array_equal(ceiling(indices), _expected(dataset, indices))
    finally:
        ceiling.close()
    y0, x0, size = windows.window_y0, windows.window_x0, windows.size
    assert ((y0 < 0) | (x0 < 0) | (y0 + size > 200) | (x0 + size > 240))[:64].any(), "no border crop tested"


@pytest.mark.parametrize("threads", [1, 2])
def test_the_codec_ceiling_decodes_each_chunk_a_batch_touches_once_as_the_reader_does(
    tiny_plate: Path, threads: int
) -> None:
    uncached = CropDataset(tiny_plate, CROP.replace(chunk_cache_bytes=0))
    stored = StoredChunks(uncached)
    ceiling = CodecCeiling(stored, threads, batch=16)
    try:
        for start in range(0, 48, 16):
            indices = list(range(start, start + 16))
            uncached.__getitems__(indices)
            ceiling(indices)
        assert ceiling.chunks_decoded == uncached.reader.stats.chunks_decoded > 0
        assert ceiling.bytes_decoded == uncached.reader.stats.bytes_decoded
        assert ceiling.per_crop(48)[m.CHUNKS_DECODED_PER_CROP] == ceiling.chunks_decoded / 48
        key = int(stored.alone[1][0])
        ceiling([0])
        encoded, layout = stored.chunks[key]
        c, y, x = (index * size for index, size in zip(chunk_name(key), layout.chunk_cyx, strict=True))
        (_, cy, cx) = layout.chunk_cyx
        expected = uncached.reader.read_region(key >> FIELD_SHIFT, y, y + cy, x, x + cx)
        decoded = ceiling.buffers[stored.of([0], FieldRun())[0].index((encoded, layout)), : layout.chunk_bytes]
        assert c == 0 and np.array_equal(decoded.view(layout.dtype).reshape(layout.chunk_cyx), expected)
    finally:
        ceiling.close()


@pytest.mark.parametrize("access", ["random", "grouped-field"])
def test_over_a_crop_atlas_the_codec_ceiling_decodes_what_the_reader_decodes(atlas_plate: Path, access: str) -> None:
    """Read one by one, or in a grouped run of a field (the field's chunks past the first crops)."""
    crop = CROP.replace(crop_size=LAYOUTS["atlas"].crop_atlas, chunk_cache_bytes=0)
    uncached = CropDataset(atlas_plate, crop)
    ceiling = CodecCeiling(StoredChunks(uncached), threads=1, batch=24)
    order = access_order(uncached, access, 72, seed=0)
    try:
        for start in range(0, 72, 24):
            uncached.__getitems__(order[start : start + 24])
            ceiling(order[start : start + 24])
        assert ceiling.chunks_decoded == uncached.reader.stats.chunks_decoded > 0
        assert ceiling.bytes_decoded == uncached.reader.stats.bytes_decoded
        from_atlas = uncached.reader.stats.atlas_regions / 72
        assert (from_atlas == 1.0) if access == "random" else (0 < from_atlas < 1)
    finally:
        ceiling.close()


@pytest.mark.skipif(importlib.util.find_spec("tensorstore") is None, reason="tensorstore is not installed")
@pytest.mark.parametrize("mode", ["batch", "futures"])
def test_tensorstore_at_its_best_reads_the_same_bytes(dataset: CropDataset, windows: CropWindows, mode: str) -> None:
    peer = TensorStoreReads(windows, cache_bytes=2**20, cores=2, mode=mode)
    assert peer.tuning["context"]["data_copy_concurrency"] == {"limit": 2}
    assert np.array_equal(peer(list(range(20))), _expected(dataset, list(range(20))))


def test_zarr_async_reads_the_same_bytes(dataset: CropDataset, windows: CropWindows) -> None:
    peer = ZarrAsyncReads(windows, concurrency=4)
    assert peer.tuning["async.concurrency"] == 4
    assert np.array_equal(peer(list(range(20))), _expected(dataset, list(range(20))))


def test_ratios_are_paired_per_block_and_a_ratio_to_the_ceiling_above_one_is_impossible() -> None:
    reader = np.array([[2.0, 4.0, 1.0, 2.0]])  # seconds per block
    ceiling = np.array([[1.0, 1.0, 1.0, 4.0]])
    ratio = paired_ratios(reader, ceiling)  # 0.5, 0.25, 1.0, 2.0: the reader's rate over the ceiling's
    assert ratio[m.RATIO_MEDIAN] == pytest.approx(0.75)
    assert (ratio[m.RATIO_MIN], ratio[m.RATIO_MAX], ratio[m.PAIRED_BLOCKS]) == (0.25, 2.0, 4)
    assert ratio[m.RATIO_Q1] <= ratio[m.RATIO_MEDIAN] <= ratio[m.RATIO_Q3]
    assert ceiling_flags(ratio) == []
    assert ceiling_flags(paired_ratios(reader, reader * 1.01)) == [IMPOSSIBLE]
    assert ceiling_flags(paired_ratios(reader, reader)) == [], "equal to the ceiling is not above it"


def test_each_direct_reader_is_compared_with_the_ceiling_at_its_own_thread_count_and_every_peer() -> None:
    names = ["direct-batched-1t", "ceiling-1t", "direct-batched-2t", "ceiling-2t", "tensorstore-batch"]
    assert comparisons(names, (1, 2)) == [
        ("direct-batched-1t", "ceiling-1t"),
        ("direct-batched-1t", "tensorstore-batch"),
        ("direct-batched-2t", "ceiling-2t"),
        ("direct-batched-2t", "tensorstore-batch"),
    ]
    with_codec = [*names, "codec-ceiling-1t", "codec-ceiling-2t"]
    assert comparisons(with_codec, (1, 2)) == [
        ("direct-batched-1t", "ceiling-1t"),
        ("direct-batched-1t", "codec-ceiling-1t"),
        ("direct-batched-1t", "tensorstore-batch"),
        ("direct-batched-2t", "ceiling-2t"),
        ("direct-batched-2t", "codec-ceiling-2t"),
        ("direct-batched-2t", "tensorstore-batch"),
    ], "the codec ceiling is compared at the reader's own thread count only, not as a peer"
    with pytest.raises(ConfigError, match="threads"):
        TargetsCase(threads=(0,))


def test_the_track_writes_valid_records_naming_the_ceilings_threads(tiny_plate: Path, tmp_path: Path) -> None:
    records = cropbench.run(tiny_plate, ["targets"], "smoke", tmp_path, samples=64)
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    assert [parse_record(line).case for line in lines] == [r.case for r in records]
    by_case = {r.case: r for r in records}
    for access in ("random", "grouped"):
        for threads in (1, 2):
            row = by_case[f"{access}/direct-batched-{threads}t/over/ceiling-{threads}t"]
            ratio, named = row.metrics, (row.config["access"], row.config["reader_name"], row.config["reference_name"])
            assert named == (access, f"direct-batched-{threads}t", f"ceiling-{threads}t"), (
                "reports read names, not labels"
            )
            assert ratio[m.CEILING_THREADS] == threads and ratio[m.PAIRED_BLOCKS] == 1
            assert ratio[m.VALIDITY_FLAGS] == ceiling_flags(ratio)
            assert by_case[f"{access}/ceiling-{threads}t"].metrics[m.CROPS_PER_S] > 0
            codec = by_case[f"{access}/codec-ceiling-{threads}t"].metrics
            assert codec[m.CROPS_PER_S] > 0 and codec[m.CHUNKS_DECODED_PER_CROP] > 0
            over_codec = by_case[f"{access}/direct-batched-{threads}t/over/codec-ceiling-{threads}t"]
            assert over_codec.metrics[m.PAIRED_BLOCKS] == 1 and over_codec.config["reference"]["threads"] == threads
            assert m.CEILING_THREADS not in over_codec.metrics, "not the copy ceiling, which no reader passes"
        readers = [r for r in records if r.case.count("/") == 1 and "/codec-ceiling-" not in r.case]
        assert len(readers) >= 4 and all(r.metrics[m.IDENTICAL_TO_DIRECT] is True for r in readers)
        summary = by_case[access].metrics
        assert len(summary[m.LOADAVG_START]) == 3 and 0 < summary[m.CHUNK_CACHE_FRACTION_OF_PLATE] <= 0.25
        peers = {r.case.split("/")[-1] for r in records if r.case.startswith(f"{access}/direct-batched-1t/over/")}
        every_peer = {"tensorstore-batch", "tensorstore-futures", "zarr-async", "zarrs-async"}
        assert peers - {"ceiling-1t", "codec-ceiling-1t"} == every_peer - set(summary[m.SKIPPED_PEERS])
    assert all(m.catalogued(key) for r in records for key in r.metrics)


def test_the_full_preset_also_runs_the_direct_reader_and_its_ceiling_at_every_core(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from cropbench.tracks import targets

    monkeypatch.setattr(targets, "usable_cores", lambda: 16)
    assert [(c.access, c.threads) for c in targets.preset_cases("full")] == [
        ("random", (1, 2, 16)),
        ("grouped", (1, 2, 16)),
    ]
    assert [c.threads for c in targets.preset_cases("smoke")] == [(1, 2), (1, 2)]
    with pytest.raises(ConfigError, match="preset"):
        targets.preset_cases("gpu")
