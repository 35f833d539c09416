"""The raw memory-mapped layout (the uncompressed reference) and its layout marker."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from cropbench.config import layout_by_name
from cropbench.errors import ConfigError, StoreError
from cropbench.formats import PlateGeometry, open_plate, read_plate_metadata
from cropbench.formats.marker import LAYOUT_MARKER
from cropbench.formats.memmap import PIXELS_NAME, MemmapPlateWriter, MemmapReader
from cropbench.plates.convert import convert_plate


@pytest.fixture(scope="module")
def memmap_plate(tiny_plate: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return convert_plate(tiny_plate, tmp_path_factory.mktemp("memmap") / "plate", layout_by_name("memmap")).path


def test_one_raw_file_holds_every_field_in_plate_order(memmap_plate: Path, tiny_plate: Path) -> None:
    raw = np.fromfile(memmap_plate / PIXELS_NAME, dtype="<u2").reshape(4, 5, 200, 240)
    source = open_plate(tiny_plate, "zarr")
    for index in range(4):
        np.testing.assert_array_equal(raw[index], source.read_field(index))
    marker = json.loads((memmap_plate / LAYOUT_MARKER).read_text())
    assert marker["format"] == "memmap" and marker["dtype"] == "uint16" and marker["field_shape"] == [5, 200, 240]
    metadata = read_plate_metadata(memmap_plate)
    assert metadata.display_ranges == read_plate_metadata(tiny_plate).display_ranges
    assert metadata.display_ranges != ((0.0, 65535.0),) * 5, "the source's ranges, not the default"


def test_zarr_decode_does_not_apply_and_says_what_does(memmap_plate: Path) -> None:
    with pytest.raises(ConfigError, match="does not apply to the memmap layout.*direct, field"):
        open_plate(memmap_plate, "zarr")


def test_direct_reader_counts_bytes_and_pickles(memmap_plate: Path) -> None:
    reader = open_plate(memmap_plate, "direct")
    assert isinstance(reader, MemmapReader)
    region = reader.read_region(1, 10, 42, 20, 52, np.array([0, 4]))
    assert region.shape == (2, 32, 32)
    assert reader.stats.bytes_delivered == reader.stats.bytes_fetched == region.nbytes
    clone = pickle.loads(pickle.dumps(reader))
    np.testing.assert_array_equal(clone.read_region(1, 10, 42, 20, 52, np.array([0, 4])), region)


def test_truncated_pixels_and_interrupted_writes_are_refused(memmap_plate: Path, tmp_path: Path) -> None:
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(memmap_plate, broken)
    with open(broken / PIXELS_NAME, "r+b") as handle:
        handle.truncate(1000)
    with pytest.raises(StoreError, match="should hold"):
        open_plate(broken, "direct").read_region(0, 0, 5, 0, 5)
    geometry = PlateGeometry("p", ("a",), (1, 8, 8), (("A", "1"),), 2)
    writer = MemmapPlateWriter(tmp_path / "partial", geometry, layout_by_name("memmap"))
    writer.write_field("A", "1", 0, np.ones((1, 8, 8), np.uint16))
    with pytest.raises(StoreError, match="not a zarr group|layout marker"):
        read_plate_metadata(tmp_path / "partial")  # no marker until close()
    with pytest.raises(StoreError, match="A1/5"):
        writer.write_field("A", "1", 5, np.ones((1, 8, 8), np.uint16))
    writer.close()
    assert read_plate_metadata(tmp_path / "partial").fields[1].field == 1


def test_pixels_that_are_not_a_regular_file_are_named_so(memmap_plate: Path, tmp_path: Path) -> None:
    import os
    import shutil

    broken = tmp_path / "fifo"
    shutil.copytree(memmap_plate, broken)
    (broken / PIXELS_NAME).unlink()
    os.mkfifo(broken / PIXELS_NAME)
    with pytest.raises(StoreError, match="not a regular file"):
        open_plate(broken, "direct").read_region(0, 0, 5, 0, 5)
