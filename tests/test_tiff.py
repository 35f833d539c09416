"""The TIFF-per-field-per-channel layout: files as CellProfiler keeps them, and its decode paths."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import tifffile

from cropbench.config import layout_by_name
from cropbench.errors import StoreError
from cropbench.formats import open_plate, read_plate_metadata
from cropbench.formats.tiff import TiffReader, field_file_names
from cropbench.plates.convert import convert_plate


@pytest.fixture(scope="module")
def tiff_plates(tiny_plate: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiff")
    return {name: convert_plate(tiny_plate, root / name, layout_by_name(name)).path for name in ("tiff", "tiff-zlib")}


def test_files_are_2d_tiffs_one_per_field_and_channel_named_by_the_plate(
    tiff_plates: dict[str, Path], tiny_plate: Path
) -> None:
    images = sorted(p.name for p in (tiff_plates["tiff-zlib"] / "images").iterdir())
    assert len(images) == 4 * 5
    assert images[0] == "A1_field0_c0_DNA.tiff" and "A2_field1_c4_Mito.tiff" in images
    with tifffile.TiffFile(tiff_plates["tiff-zlib"] / "images" / images[0]) as tiff:
        assert tiff.pages.first.shape == (200, 240) and tiff.pages.first.compression == 8
    with tifffile.TiffFile(tiff_plates["tiff"] / "images" / images[0]) as tiff:
        assert tiff.pages.first.compression == 1
    source = open_plate(tiny_plate, "zarr").read_field(3)
    np.testing.assert_array_equal(
        tifffile.imread(tiff_plates["tiff-zlib"] / "images" / "A2_field1_c3_AGP.tiff"), source[3]
    )


def test_file_names_cannot_be_mistaken_for_a_microscope_export() -> None:
    """Phenix names number sites and channels from 1 in the source's order; these say well, field, channel."""
    from cropbench.plates.importing.files import _PHENIX

    names = field_file_names("AB", "12", 2, ("DNA", "Orig RNA/2"))
    assert names == ["AB12_field2_c0_DNA.tiff", "AB12_field2_c1_Orig-RNA-2.tiff"]
    assert not any(_PHENIX.match(name) for name in names)


def test_direct_path_decodes_only_the_strips_a_crop_touches(tmp_path: Path) -> None:
    from cropbench.config import LAYOUTS, PlateSpec
    from cropbench.plates.generate import generate_plate

    spec = PlateSpec(
        name="tall",
        rows=1,
        columns=1,
        fields_per_well=1,
        channels=2,
        field_height=1024,
        field_width=256,
        cells_per_field=10,
    )
    plate = generate_plate(tmp_path / "tall", spec, LAYOUTS["tiff-zlib"], progress=False).path
    reader = open_plate(plate, "direct", chunk_cache_bytes=0)
    assert isinstance(reader, TiffReader)
    rows_per_strip = reader.grain()[0]
    assert 0 < rows_per_strip < 1024
    reader.read_region(0, 10, 20, 0, 50)
    assert reader.stats.chunks_decoded == 2  # one strip per channel
    assert reader.stats.bytes_decoded == 2 * rows_per_strip * 256 * 2
    whole = open_plate(plate, "field").read_field(0)
    np.testing.assert_array_equal(reader.read_region(0, 500, 700, 3, 250), whole[:, 500:700, 3:250])


@pytest.mark.parametrize("decode", ["zarr", "direct", "field"])
def test_readers_pickle_into_workers_and_reopen(tiff_plates: dict[str, Path], decode: str) -> None:
    reader = open_plate(tiff_plates["tiff-zlib"], decode)
    before = reader.read_region(2, 5, 60, 7, 90, np.array([1, 3]))
    clone = pickle.loads(pickle.dumps(reader))
    np.testing.assert_array_equal(clone.read_region(2, 5, 60, 7, 90, np.array([1, 3])), before)
    reader.close()
    np.testing.assert_array_equal(reader.read_region(2, 5, 60, 7, 90, np.array([1, 3])), before)


def test_missing_or_foreign_tiffs_raise_store_errors(tiff_plates: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiff_plates["tiff-zlib"], broken)
    (broken / "images" / "A1_field0_c1_ER.tiff").unlink()
    for decode in ("direct", "field", "zarr"):
        with pytest.raises(StoreError, match="A1_field0_c1_ER"):
            open_plate(broken, decode).read_region(0, 0, 10, 0, 10)
    tifffile.imwrite(
        broken / "images" / "A1_field0_c1_ER.tiff", np.zeros((200, 240), np.uint16), compression="zlib", predictor=True
    )
    with pytest.raises(StoreError, match="predictor"):
        open_plate(broken, "direct").read_region(0, 0, 10, 0, 10)
    assert read_plate_metadata(broken).format == "tiff"


# --- hostile files ------------------------------------------------------------------------------

DECODES = ("direct", "field", "zarr")


def _copy(plate: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(plate, tmp_path / plate.name))


def _channel_file(plate: Path) -> Path:
    return plate / "images" / "A1_field0_c1_ER.tiff"


def _read_bounded(plate: Path, decode: str, release: Path | None = None, limit_s: float = 20.0) -> BaseException | None:
    """What read_region of field 0, channel 1 raised (None: nothing), on a thread bounded by ``limit_s``."""
    from test_sources import bounded

    error, _ = bounded(
        lambda: open_plate(plate, decode).read_region(0, 0, 50, 0, 50, np.array([1])), limit_s, release=release
    )
    return error


@pytest.mark.parametrize("decode", DECODES)
def test_a_corrupt_zlib_strip_is_a_store_error_on_every_path(
    tiff_plates: dict[str, Path], tmp_path: Path, decode: str
) -> None:
    plate = _copy(tiff_plates["tiff-zlib"], tmp_path)
    path = _channel_file(plate)
    with tifffile.TiffFile(path) as tiff:
        offset, count = tiff.pages.first.dataoffsets[0], tiff.pages.first.databytecounts[0]
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(b"\x00" * count)
    error = _read_bounded(plate, decode)
    assert isinstance(error, StoreError) and path.name in str(error), repr(error)


@pytest.mark.parametrize("layout", ["tiff", "tiff-zlib"])
@pytest.mark.parametrize("decode", DECODES)
def test_a_strip_byte_count_beyond_its_plane_is_refused_before_reading(
    tiff_plates: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decode: str, layout: str
) -> None:
    import os

    plate = _copy(tiff_plates[layout], tmp_path)
    path = _channel_file(plate)
    with tifffile.TiffFile(path, mode="r+b") as tiff:
        tag = tiff.pages.first.tags["StripByteCounts"]
        tag.overwrite((2**31,) * len(tiff.pages.first.databytecounts), dtype="I")
    real_pread, real_read = os.pread, tifffile.FileHandle.read

    def bounded_pread(fd: int, length: int, offset: int) -> bytes:
        assert length <= 2**20, f"a read of {length} bytes"
        return real_pread(fd, length, offset)

    def bounded_read(self: tifffile.FileHandle, size: int = -1) -> bytes:
        assert size <= 2**20, f"a read of {size} bytes"
        return real_read(self, size)

    monkeypatch.setattr(os, "pread", bounded_pread)
    monkeypatch.setattr(tifffile.FileHandle, "read", bounded_read)
    error = _read_bounded(plate, decode)
    assert isinstance(error, StoreError) and "byte count" in str(error) and path.name in str(error), repr(error)


@pytest.mark.parametrize("layout", ["tiff", "tiff-zlib"])
@pytest.mark.parametrize("decode", DECODES)
def test_a_header_listing_fewer_strips_than_its_rows_need_is_refused(
    tiff_plates: dict[str, Path], tmp_path: Path, decode: str, layout: str
) -> None:
    plate = _copy(tiff_plates[layout], tmp_path)
    path = _channel_file(plate)
    compression = {"compression": "zlib"} if layout == "tiff-zlib" else {}
    pixels = tifffile.imread(path)
    tifffile.imwrite(path, pixels, photometric="minisblack", rowsperstrip=8, **compression)
    with tifffile.TiffFile(path, mode="r+b") as tiff:
        page = tiff.pages.first
        assert len(page.dataoffsets) == 25
        first_offset, first_count = page.dataoffsets[0], page.databytecounts[0]
        page.tags["StripOffsets"].overwrite((first_offset,), dtype="I")
        page.tags["StripByteCounts"].overwrite((first_count,), dtype="I")
    error = _read_bounded(plate, decode)
    assert isinstance(error, StoreError) and "strip" in str(error) and path.name in str(error), repr(error)


@pytest.mark.parametrize(("dtype", "value"), [("uint32", 70_000), ("int16", -5)])
@pytest.mark.parametrize("layout", ["tiff", "tiff-zlib"])
@pytest.mark.parametrize("decode", DECODES)
def test_a_channel_stored_in_a_wider_or_signed_type_is_refused_not_wrapped(
    tiff_plates: dict[str, Path], tmp_path: Path, decode: str, layout: str, dtype: str, value: int
) -> None:
    plate = _copy(tiff_plates[layout], tmp_path)
    path = _channel_file(plate)
    compression = {"compression": "zlib"} if layout == "tiff-zlib" else {}
    tifffile.imwrite(path, np.full((200, 240), value, dtype), photometric="minisblack", **compression)
    error = _read_bounded(plate, decode)
    assert isinstance(error, StoreError) and dtype in str(error) and path.name in str(error), repr(error)


@pytest.mark.parametrize("decode", DECODES)
def test_a_narrower_unsigned_channel_is_read_exactly(tiff_plates: dict[str, Path], tmp_path: Path, decode: str) -> None:
    plate = _copy(tiff_plates["tiff-zlib"], tmp_path)
    pixels = np.arange(200 * 240, dtype=np.uint32).reshape(200, 240) % 251
    tifffile.imwrite(_channel_file(plate), pixels.astype(np.uint8), photometric="minisblack", compression="zlib")
    crop = open_plate(plate, decode).read_region(0, 0, 50, 0, 50, np.array([1]))
    np.testing.assert_array_equal(crop[0], pixels[:50, :50])


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
@pytest.mark.parametrize("decode", DECODES)
def test_a_channel_file_that_is_not_a_regular_file_is_refused_before_opening(
    tiff_plates: dict[str, Path], tmp_path: Path, decode: str, kind: str
) -> None:
    from test_sources import make_special

    plate = _copy(tiff_plates["tiff-zlib"], tmp_path)
    path = make_special(_channel_file(plate), kind)
    error = _read_bounded(plate, decode, release=path if kind == "fifo" else None, limit_s=5.0)
    assert isinstance(error, StoreError) and "not a regular file" in str(error) and path.name in str(error), repr(error)


@pytest.mark.parametrize("decode", DECODES)
def test_a_strip_that_decodes_to_a_part_of_a_pixel_is_a_store_error(
    tiff_plates: dict[str, Path], tmp_path: Path, decode: str
) -> None:
    # A whole deflate stream in place of the first strip whose bytes are no whole number of uint16 pixels.
    import zlib

    plate = _copy(tiff_plates["tiff-zlib"], tmp_path)
    path = _channel_file(plate)
    stream = zlib.compress(b"\x01" * 101)
    with tifffile.TiffFile(path, mode="r+b") as tiff:
        offset, counts = tiff.pages.first.dataoffsets[0], tiff.pages.first.databytecounts
        assert len(stream) <= counts[0]
        tiff.pages.first.tags["StripByteCounts"].overwrite((len(stream), *counts[1:]), dtype="I")
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(stream)
    error = _read_bounded(plate, decode)
    assert isinstance(error, StoreError) and path.name in str(error), repr(error)
