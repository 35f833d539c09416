"""cropbench import: CellProfiler/CytoTable tables and TIFF folders in, exact plates out.

The NF1 test compares every object's crop with the same region cut straight from the source
TIFFs with tifffile; the synthetic tests cover each naming variant and each input error.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import tifffile

from cropbench.cli import main
from cropbench.config import CropConfig, layout_by_name
from cropbench.data.dataset import CropDataset
from cropbench.errors import ImportInputError
from cropbench.formats import open_plate, read_plate_metadata
from cropbench.objects import read_object_table
from cropbench.plates.importing import ImportOptions, import_plate, plan_import

NF1 = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "nf1_cellpainting_subset"
NF1_TABLE = NF1 / "Plate_2_with_image_data_shrunken.parquet"
NF1_IMAGES = NF1 / "Plate_2_images"
needs_nf1 = pytest.mark.skipif(
    not NF1_TABLE.is_file(),
    reason=f"NF1 subset not found at {NF1}: copy tests/data/cytotable/NF1_cellpainting_data_shrunken of "
           "github.com/cytomining/CytoDataFrame (NF1 Cell Painting, Plate 2) there",
)

HEIGHT, WIDTH = 60, 80
CHANNELS = ("DNA", "ER", "Mito")
#: (well, site) of each synthetic field, with two cells each.
FIELDS = (("B07", 1), ("B07", 2), ("C03", 1))


def _pixels(field: int, channel: int) -> np.ndarray:
    rng = np.random.default_rng(100 * field + channel)
    return rng.integers(0, 60000, size=(HEIGHT, WIDTH), dtype=np.uint16)


def _cells() -> list[dict[str, Any]]:
    """Two cells per field; their nuclei and cells centroids differ."""
    rows = []
    for number, (well, site) in enumerate(FIELDS):
        for cell in range(2):
            x, y = 10.5 + 30 * cell + number, 12.25 + 20 * cell
            rows.append({"field": number, "well": well, "site": site, "nx": x, "ny": y, "cx": x + 3, "cy": y + 2})
    return rows


def _write_named_tiffs(folder: Path, **tiff_options: Any) -> dict[tuple[int, str], str]:
    folder.mkdir(parents=True, exist_ok=True)
    names = {}
    for number, (well, site) in enumerate(FIELDS):
        for channel_index, channel in enumerate(CHANNELS):
            name = f"{well}_s{site}_{channel}.tif"
            tifffile.imwrite(folder / name, _pixels(number, channel_index), **tiff_options)
            names[(number, channel)] = name
    return names


def _table(columns: dict[str, Callable[[dict[str, Any]], Any]]) -> pa.Table:
    cells = _cells()
    return pa.table({name: [make(cell) for cell in cells] for name, make in columns.items()})


def _cellprofiler_columns(names: dict[tuple[int, str], str], file_prefix: str = "Image_FileName_",
                          meta: str = "Metadata_", suffix: str = "") -> dict[str, Callable[[dict[str, Any]], Any]]:
    columns: dict[str, Callable[[dict[str, Any]], Any]] = {
        f"{meta}Plate{suffix}": lambda c: "P1", f"{meta}Well{suffix}": lambda c: c["well"],
        f"{meta}Site{suffix}": lambda c: c["site"],
        "Nuclei_Location_Center_X": lambda c: c["nx"], "Nuclei_Location_Center_Y": lambda c: c["ny"],
        "Cells_Location_Center_X": lambda c: c["cx"], "Cells_Location_Center_Y": lambda c: c["cy"],
        "Cells_AreaShape_BoundingBoxMinimum_X": lambda c: c["cx"] - 4.0,
        "Cells_AreaShape_BoundingBoxMinimum_Y": lambda c: c["cy"] - 5.0,
        "Cells_AreaShape_BoundingBoxMaximum_X": lambda c: c["cx"] + 4.0,
        "Cells_AreaShape_BoundingBoxMaximum_Y": lambda c: c["cy"] + 5.0,
    }
    for channel in CHANNELS:
        columns[f"{file_prefix}{channel}"] = lambda c, ch=channel: names[(c["field"], ch)]
    return columns


def _check_plate(plate: Path, channel_sources: tuple[str, ...] = CHANNELS) -> None:
    """Every field equals its source pixels; the object table points at the right field and cell."""
    metadata = read_plate_metadata(plate)
    assert [(f.well, f.field) for f in metadata.fields] == [("B7", 0), ("B7", 1), ("C3", 0)]
    reader = open_plate(plate, "direct")
    for number in range(len(FIELDS)):
        expected = np.stack([_pixels(number, CHANNELS.index(c)) for c in channel_sources])
        np.testing.assert_array_equal(reader.read_field(number), expected)
    table = read_object_table(plate)
    assert table.object_id.tolist() == list(range(6))
    assert table.well.tolist() == ["B7", "B7", "B7", "B7", "C3", "C3"]
    assert table.field.tolist() == [0, 0, 1, 1, 0, 0]


@pytest.fixture
def images(tmp_path: Path) -> tuple[Path, dict[tuple[int, str], str]]:
    folder = tmp_path / "images"
    return folder, _write_named_tiffs(folder)


def test_image_filename_columns_with_metadata_prefix(images: tuple[Path, Any], tmp_path: Path) -> None:
    folder, names = images
    pq.write_table(_table(_cellprofiler_columns(names)), tmp_path / "cells.parquet")
    imported = import_plate(tmp_path / "cells.parquet", folder, tmp_path / "p.zarr", layout_by_name("tiles"),
                            progress=False)
    assert imported.fields == 3 and imported.objects == 6
    _check_plate(imported.path)
    metadata = read_plate_metadata(imported.path)
    assert metadata.name == "P1" and metadata.channel_names == CHANNELS
    table = read_object_table(imported.path)
    cells = _cells()
    np.testing.assert_allclose(table.centroid_x, [c["nx"] for c in cells])  # Nuclei first by default
    assert (table.bbox == -1).all()  # Nuclei boxes are absent


#: Compressions microscopes and image tools write (all lossless here), with the options that make them so.
COMPRESSIONS = {
    "lzw": {"predictor": True}, "zlib": {}, "deflate": {}, "zstd": {}, "packbits": {},
    "jpeg2000": {"compressionargs": {"level": 0}}, "jpegxr": {"compressionargs": {"level": 1.0}},
}


@pytest.mark.parametrize("compression", sorted(COMPRESSIONS))
def test_compressed_tiffs_import_exactly(tmp_path: Path, compression: str) -> None:
    """LZW (Phenix/Opera, ImageXpress), deflate, zstd, JPEG-2000/XR: decoded through imagecodecs."""
    folder = tmp_path / "images"
    names = _write_named_tiffs(folder, compression=compression, **COMPRESSIONS[compression])
    with tifffile.TiffFile(folder / names[(0, "DNA")]) as tiff:
        assert tiff.pages.first.compression.name == {"zlib": "ADOBE_DEFLATE"}.get(compression, compression.upper())
    pq.write_table(_table(_cellprofiler_columns(names)), tmp_path / "cells.parquet")
    plate = import_plate(tmp_path / "cells.parquet", folder, tmp_path / "p", layout_by_name("default"),
                         progress=False).path
    _check_plate(plate)


def test_orig_channels_pathnames_csv_and_image_metadata_prefix(tmp_path: Path) -> None:
    elsewhere = tmp_path / "recorded" / "folder"
    names = _write_named_tiffs(elsewhere)
    columns = _cellprofiler_columns(names, file_prefix="Image_FileName_Orig", meta="Image_Metadata_")
    for channel in CHANNELS:
        columns[f"Image_PathName_Orig{channel}"] = lambda c: str(elsewhere)
    pacsv.write_csv(_table(columns), tmp_path / "cells.csv")
    empty = tmp_path / "empty"
    empty.mkdir()
    plate = import_plate(tmp_path / "cells.csv", empty, tmp_path / "p", layout_by_name("tiff-zlib"),
                         progress=False).path
    _check_plate(plate)
    assert read_plate_metadata(plate).layout == "tiff"


def test_merge_suffixes_and_compartment_choice_with_boxes(images: tuple[Path, Any], tmp_path: Path) -> None:
    folder, names = images
    columns = _cellprofiler_columns(names, meta="Image_Metadata_", suffix="_y")
    pq.write_table(_table(columns), tmp_path / "cells.parquet")
    plan = plan_import(tmp_path / "cells.parquet", folder, ImportOptions(compartment="Cells"))
    assert plan.columns["well"] == "Image_Metadata_Well_y" and plan.columns["compartment"] == "Cells"
    cells = _cells()
    np.testing.assert_allclose(plan.objects.centroid_x, [c["cx"] for c in cells])
    np.testing.assert_allclose(plan.objects.centroid_y, [c["cy"] for c in cells])
    assert plan.objects.bbox[0].tolist() == [int(np.floor(cells[0]["cy"] - 5)), int(np.floor(cells[0]["cx"] - 4)),
                                             int(np.ceil(cells[0]["cy"] + 5)), int(np.ceil(cells[0]["cx"] + 4))]
    with pytest.raises(ImportInputError, match="Cytoplasm_Location_Center_X"):
        plan_import(tmp_path / "cells.parquet", folder, ImportOptions(compartment="Cytoplasm"))


def test_channels_are_chosen_reordered_and_renamed(images: tuple[Path, Any], tmp_path: Path) -> None:
    folder, names = images
    pq.write_table(_table(_cellprofiler_columns(names)), tmp_path / "cells.parquet")
    options = ImportOptions(channels=ImportOptions.parse_channels(["Mito=MitoTracker", "DNA"]))
    plate = import_plate(tmp_path / "cells.parquet", folder, tmp_path / "p", layout_by_name("memmap"), options,
                         progress=False).path
    assert read_plate_metadata(plate).channel_names == ("MitoTracker", "DNA")
    _check_plate(plate, channel_sources=("Mito", "DNA"))
    with pytest.raises(ImportInputError, match="'GFP' is not in the input; channels: DNA, ER, Mito"):
        plan_import(tmp_path / "cells.parquet", folder, ImportOptions(channels=(("GFP", "GFP"),)))
    with pytest.raises(ImportInputError, match="repeat"):
        ImportOptions.parse_channels(["DNA=A", "ER=A"])


def test_phenix_file_names_without_file_columns(tmp_path: Path) -> None:
    folder = tmp_path / "phenix"
    folder.mkdir()
    for number, (well, site) in enumerate(FIELDS):
        row, column = ord(well[0]) - ord("A") + 1, int(well[1:])
        for channel in range(len(CHANNELS)):
            name = f"r{row:02d}c{column:02d}f{site:02d}p01-ch{channel + 1}sk1fk1fl1.tiff"
            tifffile.imwrite(folder / name, _pixels(number, channel))
    tifffile.imwrite(folder / "r02c07f01p02-ch1sk1fk1fl1.tiff", np.zeros((HEIGHT, WIDTH), np.uint16))  # plane 2
    columns: dict[str, Callable[[dict[str, Any]], Any]] = {
        "Metadata_Row": lambda c: ord(c["well"][0]) - ord("A") + 1, "Metadata_Col": lambda c: int(c["well"][1:]),
        "Metadata_Field": lambda c: c["site"],
        "Location_Center_X": lambda c: c["nx"], "Location_Center_Y": lambda c: c["ny"],
    }
    pq.write_table(_table(columns), tmp_path / "Nuclei.parquet")
    options = ImportOptions(channels=ImportOptions.parse_channels(["ch1=DNA", "ch2=ER", "ch3=Mito"]))
    plate = import_plate(tmp_path / "Nuclei.parquet", folder, tmp_path / "p", layout_by_name("default"), options,
                         progress=False).path
    _check_plate(plate)
    assert read_plate_metadata(plate).name == "Nuclei"


def test_fields_are_told_apart_by_their_files_without_a_site_column(images: tuple[Path, Any], tmp_path: Path) -> None:
    folder, names = images
    columns = _cellprofiler_columns(names)
    del columns["Metadata_Site"]
    pq.write_table(_table(columns), tmp_path / "cells.parquet")
    plan = plan_import(tmp_path / "cells.parquet", folder)
    assert [(f.well, f.site) for f in plan.fields] == [("B7", "1"), ("B7", "2"), ("C3", "1")]


def test_missing_files_are_all_listed(images: tuple[Path, Any], tmp_path: Path) -> None:
    folder, names = images
    (folder / names[(0, "ER")]).unlink()
    (folder / names[(2, "Mito")]).unlink()
    pq.write_table(_table(_cellprofiler_columns(names)), tmp_path / "cells.parquet")
    with pytest.raises(ImportInputError, match="2 image files are missing") as error:
        plan_import(tmp_path / "cells.parquet", folder)
    assert names[(0, "ER")] in str(error.value) and names[(2, "Mito")] in str(error.value)


def test_channels_of_different_shapes_are_refused(images: tuple[Path, Any], tmp_path: Path) -> None:
    folder, names = images
    tifffile.imwrite(folder / names[(1, "ER")], np.zeros((HEIGHT, WIDTH + 1), np.uint16))
    pq.write_table(_table(_cellprofiler_columns(names)), tmp_path / "cells.parquet")
    with pytest.raises(ImportInputError, match=r"well B7 site 2 differ: DNA is \(60, 80\).*ER is \(60, 81\)"):
        plan_import(tmp_path / "cells.parquet", folder)


def test_centroids_outside_the_field_are_refused(images: tuple[Path, Any], tmp_path: Path) -> None:
    folder, names = images
    columns = _cellprofiler_columns(names)
    columns["Nuclei_Location_Center_X"] = lambda c: c["nx"] + (WIDTH if c["field"] == 2 else 0)
    pq.write_table(_table(columns), tmp_path / "cells.parquet")
    with pytest.raises(ImportInputError, match=r"2 centroids lie outside the 60x80 field: row 4 \(well C3 site 1"):
        plan_import(tmp_path / "cells.parquet", folder)


@pytest.mark.parametrize(("drop", "message"), [
    (("Metadata_Well",), "no well: looked for Metadata_Well, Image_Metadata_Well"),
    (tuple(f"{c}_Location_Center_{a}" for c in ("Nuclei", "Cells") for a in "XY"),
     "no object centroids: looked for Nuclei_Location_Center_X"),
    (tuple(f"Image_FileName_{c}" for c in CHANNELS), "no file name columns.*Image_FileName_Orig<Channel>"),
])
def test_tables_without_needed_columns_say_what_was_looked_for(
    images: tuple[Path, Any], tmp_path: Path, drop: tuple[str, ...], message: str,
) -> None:
    folder, names = images
    columns = _cellprofiler_columns(names)
    for name in drop:
        del columns[name]
    pq.write_table(_table(columns), tmp_path / "cells.parquet")
    with pytest.raises(ImportInputError, match=message):
        plan_import(tmp_path / "cells.parquet", folder)


def test_several_plates_need_a_choice(images: tuple[Path, Any], tmp_path: Path) -> None:
    folder, names = images
    columns = _cellprofiler_columns(names)
    columns["Metadata_Plate"] = lambda c: "P1" if c["field"] < 2 else "P2"
    pq.write_table(_table(columns), tmp_path / "cells.parquet")
    with pytest.raises(ImportInputError, match="2 plates.*--plate"):
        plan_import(tmp_path / "cells.parquet", folder)
    plan = plan_import(tmp_path / "cells.parquet", folder, ImportOptions(plate="P2"))
    assert plan.name == "P2" and plan.objects.object_id.tolist() == [4, 5]


def test_cli_import_takes_layout_knobs_and_reports_errors(
    images: tuple[Path, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    folder, names = images
    pq.write_table(_table(_cellprofiler_columns(names)), tmp_path / "cells.parquet")
    args = ["import", "--table", str(tmp_path / "cells.parquet"), "--images", str(folder), "--no-progress"]
    assert main([*args, "--out", str(tmp_path / "p"), "--layout", "channel-tiles", "--codec", "zstd",
                 "--channel", "DNA=Hoechst"]) == 0
    assert "3 fields, 6 objects, layout c1-yx256-zstd" in capsys.readouterr().out
    assert read_plate_metadata(tmp_path / "p").channel_names == ("Hoechst",)
    assert main([*args, "--out", str(tmp_path / "q"), "--channel", "GFP"]) == 2
    assert "cropbench: error: channel 'GFP'" in capsys.readouterr().err


@needs_nf1
@pytest.mark.parametrize("layout", ["default", "tiff-zlib", "memmap"])
def test_nf1_imports_and_every_crop_equals_the_source_tiffs(tmp_path: Path, layout: str) -> None:
    plate = import_plate(NF1_TABLE, NF1_IMAGES, tmp_path / "nf1", layout_by_name(layout), progress=False).path
    metadata = read_plate_metadata(plate)
    assert metadata.channel_names == ("DAPI", "GFP", "RFP") and metadata.field_shape == (3, 904, 1224)
    assert metadata.name == "Plate_2" and len(metadata.fields) == 5
    source = pq.read_table(NF1_TABLE, columns=[
        "Image_Metadata_Well_x", "Nuclei_Location_Center_X", "Nuclei_Location_Center_Y",
        *(f"Image_FileName_{c}" for c in ("DAPI", "GFP", "RFP")),
    ]).to_pylist()
    size = 128
    for decode in ("zarr", "direct", "field") if layout != "memmap" else ("direct", "field"):
        dataset = CropDataset(plate, CropConfig(crop_size=size, dtype="uint16", decode=decode))
        assert len(dataset) == len(source) == 5
        for index in range(len(dataset)):
            item = dataset.metadata_of(index)
            row = source[item["object_id"]]
            assert item["well"] == row["Image_Metadata_Well_x"]
            assert item["centroid_x"] == row["Nuclei_Location_Center_X"]
            fields = [tifffile.imread(NF1_IMAGES / row[f"Image_FileName_{c}"]) for c in ("DAPI", "GFP", "RFP")]
            y0 = int(np.floor(row["Nuclei_Location_Center_Y"] - (size - 1) / 2 + 0.5))
            x0 = int(np.floor(row["Nuclei_Location_Center_X"] - (size - 1) / 2 + 0.5))
            expected = np.zeros((3, size, size), np.uint16)
            cy0, cx0 = max(y0, 0), max(x0, 0)
            cy1, cx1 = min(y0 + size, 904), min(x0 + size, 1224)
            for channel, field in enumerate(fields):
                expected[channel, cy0 - y0:cy1 - y0, cx0 - x0:cx1 - x0] = field[cy0:cy1, cx0:cx1]
            np.testing.assert_array_equal(dataset.read_raw(index), expected, err_msg=f"{layout}/{decode} row {index}")
    reader = open_plate(plate, "direct")
    for info in metadata.fields:
        row = next(r for r in source if r["Image_Metadata_Well_x"] == info.well)
        full = np.stack([tifffile.imread(NF1_IMAGES / row[f"Image_FileName_{c}"]) for c in ("DAPI", "GFP", "RFP")])
        np.testing.assert_array_equal(reader.read_field(info.index), full)
