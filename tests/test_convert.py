"""One plate, many layouts: every named layout, through every decode path it offers, gives the
same bytes as the source plate, and materialised layouts are reused until the source changes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cropbench.config import LAYOUTS, OPTIONAL_LAYOUTS, CropConfig, PlateSpec, layout_by_name
from cropbench.data.dataset import CropDataset
from cropbench.errors import StoreError
from cropbench.formats import open_plate, read_plate_metadata, supported_decodes
from cropbench.formats.omearrow import ome_arrow_available
from cropbench.objects import OBJECT_TABLE_NAME, read_object_table
from cropbench.plates.convert import convert_plate, materialize_layout, pixel_bytes
from cropbench.plates.generate import generate_plate


def _regions(seed: int = 3) -> list[tuple[int, int, int, int, int, np.ndarray | None]]:
    rng = np.random.default_rng(seed)
    regions: list[tuple[int, int, int, int, int, np.ndarray | None]] = [
        (0, 0, 200, 0, 240, None),
        (3, 150, 200, 190, 240, np.array([4, 0])),
        (1, 0, 1, 0, 1, np.array([2])),
    ]
    for _ in range(12):
        y0, x0 = int(rng.integers(0, 190)), int(rng.integers(0, 230))
        channels = None if rng.random() < 0.5 else np.sort(rng.choice(5, 2, replace=False))
        regions.append(
            (int(rng.integers(0, 4)), y0, int(rng.integers(y0 + 1, 201)), x0, int(rng.integers(x0 + 1, 241)), channels)
        )
    return regions


@pytest.fixture(scope="module")
def reference(tiny_plate: Path) -> list[np.ndarray]:
    reader = open_plate(tiny_plate, "zarr")
    return [reader.read_region(f, y0, y1, x0, x1, c) for f, y0, y1, x0, x1, c in _regions()]


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_every_layout_and_decode_path_returns_identical_bytes(
    tiny_plate: Path,
    reference: list[np.ndarray],
    tmp_path: Path,
    name: str,
) -> None:
    if name in OPTIONAL_LAYOUTS and not ome_arrow_available():
        pytest.skip(f"layout {name} needs the optional extra [arrow]: .venv/bin/pip install -e '.[arrow]'")
    converted = convert_plate(tiny_plate, tmp_path / name, layout_by_name(name))
    metadata = read_plate_metadata(converted.path)
    assert metadata.format == layout_by_name(name).format
    assert metadata.layout_label == layout_by_name(name).label
    assert metadata.channel_names == ("DNA", "ER", "RNA", "AGP", "Mito")
    assert [(f.well, f.field) for f in metadata.fields] == [("A1", 0), ("A1", 1), ("A2", 0), ("A2", 1)]
    assert converted.raw_bytes == 4 * 5 * 200 * 240 * 2 and converted.stored_bytes > 0
    decodes = supported_decodes(metadata)
    assert "field" in decodes and "direct" in decodes
    assert ("as-py" in decodes) == (metadata.format == "ome-arrow")
    for decode in decodes:
        reader = open_plate(converted.path, decode)
        for (f, y0, y1, x0, x1, c), expected in zip(_regions(), reference, strict=True):
            region = reader.read_region(f, y0, y1, x0, x1, c)
            assert region.dtype == np.uint16
            np.testing.assert_array_equal(region, expected, err_msg=f"{name}/{decode} field {f} y{y0}:{y1} x{x0}:{x1}")
        reader.close()


@pytest.mark.parametrize("name", ["tiff-zlib", "memmap", "sharded-zstd"])
def test_every_crop_of_the_dataset_is_identical_across_layouts(tiny_plate: Path, tmp_path: Path, name: str) -> None:
    converted = convert_plate(tiny_plate, tmp_path / name, layout_by_name(name))
    assert (converted.path / OBJECT_TABLE_NAME).is_file()
    config = CropConfig(crop_size=48, dtype="uint16", channels=("Mito", "DNA"))
    source, target = CropDataset(tiny_plate, config), CropDataset(converted.path, config)
    assert len(source) == len(target) == len(read_object_table(tiny_plate))
    for index in range(len(source)):
        np.testing.assert_array_equal(target.read_raw(index), source.read_raw(index))


def test_layouts_convert_into_each_other_and_track_their_origin(tiny_plate: Path, tmp_path: Path) -> None:
    tiff = convert_plate(tiny_plate, tmp_path / "tiff", layout_by_name("tiff-zlib"))
    back = convert_plate(tiff.path, tmp_path / "zarr", layout_by_name("channel-tiles-zstd"))
    origin = read_plate_metadata(back.path).attributes["converted_from"]
    assert origin["path"] == str(tiff.path.resolve())
    first, second = open_plate(tiny_plate, "field"), open_plate(back.path, "direct")
    for index in range(4):
        np.testing.assert_array_equal(second.read_field(index), first.read_field(index))
    assert pixel_bytes(back.path) == back.stored_bytes
    with pytest.raises(StoreError, match="onto itself"):
        convert_plate(tiff.path, tiff.path, layout_by_name("memmap"))


def test_materialized_layouts_are_reused_until_the_source_changes(tmp_path: Path) -> None:
    spec = PlateSpec(
        name="small",
        rows=1,
        columns=1,
        fields_per_well=1,
        channels=2,
        field_height=96,
        field_width=96,
        cells_per_field=5,
    )
    source = tmp_path / "small.zarr"
    generate_plate(source, spec, LAYOUTS["default"], progress=False)
    path = materialize_layout(source, "memmap")
    assert path == tmp_path / "small.zarr.layouts" / "memmap"
    marker_time = (path / "cropbench_layout.json").stat().st_mtime_ns
    assert materialize_layout(source, "memmap") == path
    assert (path / "cropbench_layout.json").stat().st_mtime_ns == marker_time
    generate_plate(source, spec, LAYOUTS["default"], overwrite=True, progress=False)
    materialize_layout(source, "memmap")
    assert (path / "cropbench_layout.json").stat().st_mtime_ns != marker_time
    other = materialize_layout(source, "tiff", root=tmp_path / "elsewhere")
    assert other == tmp_path / "elsewhere" / "tiff" and read_plate_metadata(other).format == "tiff"


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_batched_items_equal_single_items_on_every_layout_and_decode_path(
    tiny_plate: Path,
    tmp_path: Path,
    name: str,
) -> None:
    if name in OPTIONAL_LAYOUTS and not ome_arrow_available():
        pytest.skip(f"layout {name} needs the optional extra [arrow]: .venv/bin/pip install -e '.[arrow]'")
    converted = convert_plate(tiny_plate, tmp_path / name, layout_by_name(name))
    indices = [*np.random.default_rng(5).permutation(len(read_object_table(tiny_plate)))[:24].tolist(), 0, 0]
    for decode in supported_decodes(read_plate_metadata(converted.path)):
        for channels in (None, ("Mito", "DNA")):
            config = CropConfig(crop_size=48, dtype="uint16", decode=decode, channels=channels)
            batched, single = CropDataset(converted.path, config), CropDataset(converted.path, config)
            expected = np.stack([single.read_raw(i) for i in indices])
            np.testing.assert_array_equal(
                batched.__getitems__(indices).image.numpy(), expected, err_msg=f"{name}/{decode}/{channels}"
            )
