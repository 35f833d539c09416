"""Every decode path returns exactly the pixels zarr-python returns, for every layout."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import zarr

from cropbench.config import ReaderOptions
from cropbench.errors import ConfigError, StoreError
from cropbench.formats import DIRECT_READERS, open_plate, read_plate_metadata
from cropbench.formats.base import LruCache, PlateGeometry

DECODES = ("zarr", "direct", "field")


def full_field(plate: Path, field_index: int) -> np.ndarray:
    metadata = read_plate_metadata(plate)
    return zarr.open_array(str(plate / metadata.fields[field_index].path), mode="r")[...]


def test_plate_metadata_lists_wells_fields_and_channels(tiny_plate: Path) -> None:
    metadata = read_plate_metadata(tiny_plate)
    assert [(f.well, f.field) for f in metadata.fields] == [("A1", 0), ("A1", 1), ("A2", 0), ("A2", 1)]
    assert metadata.channel_names == ("DNA", "ER", "RNA", "AGP", "Mito")
    assert metadata.field_shape == (5, 200, 240) and metadata.dtype == "uint16"


@pytest.mark.parametrize("decode", DECODES)
def test_random_regions_equal_numpy_slices_of_the_full_field(layout_plate: Path, decode: str) -> None:
    reader = open_plate(layout_plate, decode)
    rng = np.random.default_rng(1)
    for field_index in range(4):
        reference = full_field(layout_plate, field_index)
        for _ in range(25):
            y0, x0 = int(rng.integers(0, 199)), int(rng.integers(0, 239))
            y1, x1 = int(rng.integers(y0 + 1, 201)), int(rng.integers(x0 + 1, 241))
            channels = None if rng.random() < 0.5 else np.sort(rng.choice(5, 3, replace=False))
            expected = reference[:, y0:y1, x0:x1] if channels is None else reference[channels, y0:y1, x0:x1]
            assert np.array_equal(reader.read_region(field_index, y0, y1, x0, x1, channels), expected)


@pytest.mark.parametrize("decode", DECODES)
def test_field_edges_and_whole_field(tiny_plate: Path, decode: str) -> None:
    reader = open_plate(tiny_plate, decode)
    reference = full_field(tiny_plate, 3)
    assert np.array_equal(reader.read_region(3, 190, 200, 230, 240), reference[:, 190:, 230:])
    assert np.array_equal(reader.read_field(3), reference)


@pytest.mark.parametrize("decode", DECODES)
def test_windows_outside_the_field_are_refused(tiny_plate: Path, decode: str) -> None:
    reader = open_plate(tiny_plate, decode)
    with pytest.raises(ConfigError, match="not inside field"):
        reader.read_region(0, -1, 10, 0, 10)
    with pytest.raises(ConfigError, match="field_index"):
        reader.read_region(9, 0, 10, 0, 10)


@pytest.mark.parametrize("decode", DECODES)
def test_readers_pickle_without_their_caches(tiny_plate: Path, decode: str) -> None:
    reader = open_plate(tiny_plate, decode)
    before = reader.read_region(1, 10, 60, 20, 70)
    clone = pickle.loads(pickle.dumps(reader))
    assert len(pickle.dumps(reader)) < 20_000
    assert np.array_equal(clone.read_region(1, 10, 60, 20, 70), before)


def test_each_reader_is_built_from_one_options_object(tiny_plate: Path) -> None:
    """``open_plate`` hands every format's reader the same options; the field cache's reader caches no chunks."""
    direct = open_plate(tiny_plate, "direct", chunk_cache_bytes=12345, decode_threads=2)
    field = open_plate(tiny_plate, "field", chunk_cache_bytes=12345, decode_threads=2)
    try:
        assert (direct.chunk_cache_bytes, direct.decode_threads) == (12345, 2)
        assert (field.inner.chunk_cache_bytes, field.inner.decode_threads) == (0, 2)
    finally:
        direct.close()
        field.close()
    metadata, options = read_plate_metadata(tiny_plate), ReaderOptions(chunk_cache_bytes=12345, decode_threads=2)
    for reader_class in DIRECT_READERS.values():  # built by the same call; nothing is opened before a read
        reader = reader_class.from_options(metadata, options)
        assert type(reader) is reader_class
        assert getattr(reader, "chunk_cache_bytes", options.chunk_cache_bytes) == options.chunk_cache_bytes
        reader.close()
    with pytest.raises(ConfigError, match="decode_threads must be a positive integer, got 0"):
        ReaderOptions(decode_threads=0)
    with pytest.raises(ConfigError, match="chunk_cache_bytes must be >= 0, got -1"):
        ReaderOptions(chunk_cache_bytes=-1)


def test_direct_path_counts_read_amplification(tiny_plate: Path) -> None:
    reader = open_plate(tiny_plate, "direct", chunk_cache_bytes=0)
    reader.read_region(0, 10, 20, 10, 20)
    stats = reader.stats.per_region()
    assert stats["chunks_touched_per_crop"] == 1
    assert stats["decode_amplification"] == pytest.approx(64 * 64 / 100), "one 64x64 chunk per 10x10 crop"
    reader.read_region(0, 60, 70, 60, 70)
    assert reader.stats.chunks_touched == 5, "a window across a chunk corner touches four chunks"


def test_every_path_reports_a_corrupt_chunk_by_name(tmp_path: Path, tiny_plate: Path) -> None:
    import shutil

    plate = tmp_path / "corrupt.zarr"
    shutil.copytree(tiny_plate, plate)
    chunk = plate / read_plate_metadata(plate).fields[0].path / "c" / "0" / "0" / "0"
    chunk.write_bytes(b"\x02\x01" + chunk.read_bytes()[2:40])
    for decode in DECODES:
        with pytest.raises(StoreError, match=r"A/1/0/0|corrupt"):
            open_plate(plate, decode).read_region(0, 0, 10, 0, 10)


def test_missing_and_non_plate_stores_are_named(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        read_plate_metadata(tmp_path / "nope.zarr")
    (tmp_path / "empty").mkdir()
    with pytest.raises(StoreError, match="not a zarr group"):
        read_plate_metadata(tmp_path / "empty")


def test_lru_cache_evicts_least_recently_used() -> None:
    cache: LruCache[str, np.ndarray] = LruCache(300)
    for key in "abc":
        cache.put(key, np.zeros(100, np.uint8))
    cache.get("a")
    cache.put("d", np.zeros(100, np.uint8))
    assert cache.get("b") is None and cache.get("a") is not None and cache.used == 300
    cache.put("huge", np.zeros(301, np.uint8))
    assert cache.get("huge") is None


def test_lru_cache_bounds_a_count_and_can_keep_the_newest() -> None:
    fields: LruCache[int, str] = LruCache(2, size=lambda _: 1)
    for key in range(3):
        fields.put(key, "pixels")
    assert fields.get(0) is None and len(fields) == 2
    rows: LruCache[int, np.ndarray] = LruCache(100, keep_newest=True)
    rows.put(0, np.zeros(60, np.uint8))
    rows.put(1, np.zeros(500, np.uint8))
    assert rows.get(0) is None and rows.get(1) is not None and len(rows) == 1


def test_lru_cache_put_many_keeps_what_put_one_by_one_keeps() -> None:
    rng = np.random.default_rng(4)
    for trial in range(50):
        one, many = LruCache[int, np.ndarray](500), LruCache[int, np.ndarray](500)
        for _ in range(6):
            batch = [(int(key), np.zeros(int(rng.integers(1, 260)), np.uint8)) for key in rng.integers(0, 12, 7)]
            for key, value in batch:
                one.put(key, value)
            held = {id(value) for value, _ in many._items.values()}
            dropped = many.put_many(batch)
            assert list(one._items) == list(many._items), trial
            kept = {id(value) for value, _ in many._items.values()}
            let_go = [id(value) for value in dropped]  # evicted, replaced or too heavy: every value exactly once
            assert sorted([*kept, *let_go]) == sorted(held | {id(value) for _, value in batch})
            assert one.used == many.used <= 500
            touched = [int(key) for key in rng.integers(0, 12, 3)]
            one.get_many(touched)
            many.get_many(touched)


def test_plate_geometry_is_normalised_and_checked_once() -> None:
    geometry = PlateGeometry("p", ["a", "b"], [2, 8, 8], [("A", 1), ("B", 2)], [1, 3])  # type: ignore[arg-type]
    assert geometry.channel_names == ("a", "b") and geometry.wells == (("A", "1"), ("B", "2"))
    assert geometry.field_slots() == [("A", "1", 0), ("B", "2", 0), ("B", "2", 1), ("B", "2", 2)]
    assert geometry.display_ranges == ((0.0, 65535.0),) * 2
    with pytest.raises(ConfigError, match="fields_per_well must be >= 1 for each of the 2 wells"):
        PlateGeometry("p", ("a", "b"), (2, 8, 8), (("A", "1"), ("B", "2")), (1,))
    with pytest.raises(ConfigError, match="1 display ranges for 2 channels"):
        PlateGeometry("p", ("a", "b"), (2, 8, 8), (("A", "1"),), display_ranges=((0, 1),))
    with pytest.raises(StoreError, match="1 channel names for 2 channels"):
        PlateGeometry("p", ("a",), (2, 8, 8), (("A", "1"),))
