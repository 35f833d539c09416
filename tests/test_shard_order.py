"""Shard chunks in Hilbert order (layout ``hilbert``): still OME-Zarr that zarr-python and ome-zarr-py read
with the same pixels as the default layout, and over an object store the direct reader moves at most
1.5x a crop's own bytes per crop (counted, not timed), where the default layout moves more."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zarr

from cropbench import metrics as m
from cropbench.cli.options import add_store_knobs, store_config
from cropbench.config import LAYOUTS, LayoutSpec, StoreConfig, coalesce_gap
from cropbench.errors import ConfigError, StoreError
from cropbench.formats import open_plate
from cropbench.formats.shard_order import ENTRY_BYTES, hilbert_curve, reorder_shard, storage_order
from cropbench.formats.sources import mirror_metadata
from cropbench.measure import endpoints
from cropbench.measure.remote import requests_per_crop
from cropbench.plates.convert import convert_plate

CROP_SIZE = 96
#: Bytes of one crop of every channel of the tiny plate, uint16: what a crop is, against what it moves.
CROP_BYTES = 5 * CROP_SIZE * CROP_SIZE * 2
#: The most bytes per crop the ``hilbert`` layout may move over a store, as a multiple of the crop's own.
MOST_BYTES_PER_CROP = 1.5


@pytest.fixture(scope="module")
def hilbert_plate(tiny_plate: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hilbert") / "hilbert.zarr"
    convert_plate(tiny_plate, path, LAYOUTS["hilbert"])
    return path


def _arrays(plate: Path) -> list[Path]:
    return sorted(path.parent for path in plate.glob("*/*/*/0/zarr.json"))


@pytest.mark.parametrize("height,width", [(1, 1), (1, 7), (7, 1), (2, 2), (3, 5), (7, 8), (34, 34), (45, 17)])
def test_the_hilbert_curve_visits_every_cell_once_stepping_to_a_neighbour(height: int, width: int) -> None:
    curve = hilbert_curve(height, width)
    assert curve.shape == (height * width, 2)
    assert len({(int(y), int(x)) for y, x in curve}) == height * width
    assert ((curve >= 0) & (curve < (height, width))).all()
    assert (np.abs(np.diff(curve, axis=0)).sum(axis=1) == 1).all(), "a jump: chunks next on disk are not neighbours"
    assert tuple(curve[0]) == (0, 0)


def test_the_chunks_of_one_position_are_written_together_channel_by_channel() -> None:
    order = storage_order((2, 2, 3))  # two channel chunks on a 2 x 3 grid: C-order indices c * 6 + y * 3 + x
    assert sorted(order.tolist()) == list(range(12))
    pairs = order.reshape(-1, 2)
    assert (pairs[:, 1] - pairs[:, 0] == 6).all(), "each (y, x) position's channel chunks lie side by side"
    assert pairs[:, 0].tolist() == [y * 3 + x for y, x in hilbert_curve(2, 3).tolist()]


def test_the_layout_is_named_checked_and_labelled() -> None:
    layout = LAYOUTS["hilbert"]
    assert (layout.chunk_yx, layout.shard_yx, layout.chunk_order) == (32, -1, "hilbert")
    assert layout.label == f"call-yx32-blosc-lz4-shard-field-hilbert-gap{layout.coalesce_gap_bytes}"
    assert LAYOUTS["default"].label == "call-yx64-blosc-lz4-shard-field", "the default layout's label is unchanged"
    with pytest.raises(ConfigError, match="chunk_order='hilbert'.*shard_yx"):
        LayoutSpec(chunk_yx=32, chunk_order="hilbert")
    with pytest.raises(ConfigError, match="chunk_order"):
        LayoutSpec(chunk_yx=32, shard_yx=-1, chunk_order="random")
    with pytest.raises(ConfigError, match="coalesce_gap_bytes"):
        LayoutSpec(coalesce_gap_bytes=-1)


def test_zarr_python_and_ome_zarr_py_read_the_same_pixels_as_the_default_layout(
    tiny_plate: Path, hilbert_plate: Path
) -> None:
    from ome_zarr.io import parse_url
    from ome_zarr.reader import Reader

    arrays = _arrays(tiny_plate)
    assert [a.relative_to(tiny_plate) for a in arrays] == [a.relative_to(hilbert_plate) for a in _arrays(hilbert_plate)]
    for array in arrays:
        relative = array.relative_to(tiny_plate)
        expected = np.asarray(zarr.open_array(str(array), mode="r")[...])
        converted = zarr.open_array(str(hilbert_plate / relative), mode="r")
        assert converted.shards is not None and converted.chunks == (5, 32, 32)
        assert np.array_equal(np.asarray(converted[...]), expected)
        crop = np.asarray(converted[:, 37:133, 101:197])  # a crop: partial reads of the shards
        assert np.array_equal(crop, expected[:, 37:133, 101:197])
        nodes = list(Reader(parse_url(str(hilbert_plate / relative.parent)))())
        assert np.array_equal(np.asarray(nodes[0].data[0]), expected), f"ome-zarr-py reads {relative} differently"


def test_the_chunks_lie_along_the_curve_and_every_decode_path_reads_the_same_crops(
    tiny_plate: Path, hilbert_plate: Path
) -> None:
    array = _arrays(hilbert_plate)[0]
    shard = next((array / "c").rglob("*"), None)
    while shard is not None and shard.is_dir():
        shard = next(shard.iterdir())
    assert shard is not None
    per_shard = (1, 224 // 32, 256 // 32)  # the 200 x 240 field's shard, rounded up to whole chunks
    entries = len(storage_order(per_shard))
    raw = shard.read_bytes()[-(entries * ENTRY_BYTES + 4) : -4]
    offsets = np.frombuffer(raw, dtype="<u8").reshape(-1, 2)[:, 0].astype(np.int64)
    assert (np.diff(offsets[storage_order(per_shard)]) > 0).all(), "the chunks are not written along the curve"
    window = (0, 40, 136, 50, 146)
    expected = open_plate(tiny_plate, "direct").read_region(*window)
    for decode in ("direct", "zarr"):
        assert np.array_equal(open_plate(hilbert_plate, decode).read_region(*window), expected), decode


def test_a_shard_whose_index_is_corrupt_is_refused_naming_it(tmp_path: Path) -> None:
    shard = tmp_path / "0"
    shard.write_bytes(b"\0" * 40)
    with pytest.raises(StoreError, match=f"shard {shard} has a corrupt index"):
        reorder_shard(shard, np.arange(2), index_at_end=True, checksum=True)
    with pytest.raises(StoreError, match="truncated"):
        reorder_shard(shard, np.arange(4), index_at_end=True, checksum=True)


def test_the_layouts_gap_caps_the_stores_unless_the_store_says_otherwise() -> None:
    named = dataclasses.asdict(LAYOUTS["hilbert"])
    gap = LAYOUTS["hilbert"].coalesce_gap_bytes
    assert coalesce_gap(dataclasses.asdict(StoreConfig()), named) == gap
    assert coalesce_gap(dataclasses.asdict(StoreConfig(coalesce_gap_bytes=1000)), named) == 1000
    assert coalesce_gap(dataclasses.asdict(StoreConfig(layout_gap=False)), named) == StoreConfig().coalesce_gap_bytes
    assert coalesce_gap(dataclasses.asdict(StoreConfig()), dataclasses.asdict(LAYOUTS["default"])) == 2**20
    assert coalesce_gap({"coalesce_gap_bytes": 4096}, None) == 4096, "a mirror or plate written before the knob"
    parser = argparse.ArgumentParser()
    add_store_knobs(parser)
    assert store_config(parser.parse_args([])) == StoreConfig()
    given = store_config(parser.parse_args(["--coalesce-gap", "65536"]))
    assert (given.coalesce_gap_bytes, given.layout_gap) == (65536, False), "a gap given is the gap read with"


@pytest.fixture(scope="module")
def served(tiny_plate: Path, hilbert_plate: Path) -> Iterator[dict[str, str]]:
    if endpoints.nginx_binary() is None:
        pytest.skip("nginx is not installed: apt-get install -y nginx")
    with endpoints.http_plate(tiny_plate) as default, endpoints.http_plate(hilbert_plate) as hilbert:
        yield {"default": default, "hilbert": hilbert}


def test_over_a_store_a_crop_moves_at_most_one_and_a_half_times_its_bytes(
    served: dict[str, str], tmp_path: Path
) -> None:
    counts = {}
    for name, url in served.items():
        mirror = mirror_metadata(url, StoreConfig(), cache_dir=tmp_path / name)
        counts[name] = requests_per_crop(mirror, "direct", crops=64, crop_size=CROP_SIZE, cache_bytes=0)
    moved = {name: count[m.BYTES_TRANSFERRED_PER_CROP] / CROP_BYTES for name, count in counts.items()}
    assert moved["hilbert"] <= MOST_BYTES_PER_CROP < moved["default"], moved
    assert counts["hilbert"][m.REQUESTS_PER_CROP] <= 4, "the crop's chunks lie in a few byte ranges"
    reader = open_plate(mirror_metadata(served["hilbert"], StoreConfig(), cache_dir=tmp_path / "gap"), "direct")
    assert reader.coalesce_gap == LAYOUTS["hilbert"].coalesce_gap_bytes, "the plate's gap travels through its mirror"
