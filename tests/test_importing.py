"""cropbench import: CellProfiler/CytoTable tables and TIFF folders in, exact plates out.

The NF1 test compares every object's crop with the same region cut straight from the source
TIFFs with tifffile; the synthetic tests cover each naming variant and each input error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import tifffile
import torch.utils.data

from cropbench.cli import main
from cropbench.config import CropConfig, layout_by_name
from cropbench.data.dataset import CropDataset
from cropbench.errors import ImportInputError, OutputError
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


def _cellprofiler_columns(
    names: dict[tuple[int, str], str], file_prefix: str = "Image_FileName_", meta: str = "Metadata_", suffix: str = ""
) -> dict[str, Callable[[dict[str, Any]], Any]]:
    columns: dict[str, Callable[[dict[str, Any]], Any]] = {
        f"{meta}Plate{suffix}": lambda c: "P1",
        f"{meta}Well{suffix}": lambda c: c["well"],
        f"{meta}Site{suffix}": lambda c: c["site"],
        "Nuclei_Location_Center_X": lambda c: c["nx"],
        "Nuclei_Location_Center_Y": lambda c: c["ny"],
        "Cells_Location_Center_X": lambda c: c["cx"],
        "Cells_Location_Center_Y": lambda c: c["cy"],
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
    imported = import_plate(
        tmp_path / "cells.parquet", folder, tmp_path / "p.zarr", layout_by_name("tiles"), progress=False
    )
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
    "lzw": {"predictor": True},
    "zlib": {},
    "deflate": {},
    "zstd": {},
    "packbits": {},
    "jpeg2000": {"compressionargs": {"level": 0}},
    "jpegxr": {"compressionargs": {"level": 1.0}},
}


@pytest.mark.parametrize("compression", sorted(COMPRESSIONS))
def test_compressed_tiffs_import_exactly(tmp_path: Path, compression: str) -> None:
    """LZW (Phenix/Opera, ImageXpress), deflate, zstd, JPEG-2000/XR: decoded through imagecodecs."""
    folder = tmp_path / "images"
    names = _write_named_tiffs(folder, compression=compression, **COMPRESSIONS[compression])
    with tifffile.TiffFile(folder / names[(0, "DNA")]) as tiff:
        assert tiff.pages.first.compression.name == {"zlib": "ADOBE_DEFLATE"}.get(compression, compression.upper())
    pq.write_table(_table(_cellprofiler_columns(names)), tmp_path / "cells.parquet")
    plate = import_plate(
        tmp_path / "cells.parquet", folder, tmp_path / "p", layout_by_name("default"), progress=False
    ).path
    _check_plate(plate)


def test_orig_channels_pathnames_csv_and_image_metadata_prefix(tmp_path: Path) -> None:
    elsewhere = tmp_path / "recorded" / "folder"
    names = _write_named_tiffs(elsewhere)
    columns = _cellprofiler_columns(names, file_prefix="Image_FileName_Orig", meta="Image_Metadata_")
    for channel in CHANNELS:
        columns[f"Image_PathName_Orig{channel}"] = lambda c: str(elsewhere)
    pacsv.write_csv(_table(columns), tmp_path / "cells.csv")
    plate = import_plate(  # the recorded folder lies under --images, which names no file itself
        tmp_path / "cells.csv", tmp_path / "recorded", tmp_path / "p", layout_by_name("tiff-zlib"), progress=False
    ).path
    _check_plate(plate)
    assert read_plate_metadata(plate).format == "tiff"


def test_merge_suffixes_and_compartment_choice_with_boxes(images: tuple[Path, Any], tmp_path: Path) -> None:
    folder, names = images
    columns = _cellprofiler_columns(names, meta="Image_Metadata_", suffix="_y")
    pq.write_table(_table(columns), tmp_path / "cells.parquet")
    plan = plan_import(tmp_path / "cells.parquet", folder, ImportOptions(compartment="Cells"))
    assert plan.columns["well"] == "Image_Metadata_Well_y" and plan.columns["compartment"] == "Cells"
    cells = _cells()
    np.testing.assert_allclose(plan.objects.centroid_x, [c["cx"] for c in cells])
    np.testing.assert_allclose(plan.objects.centroid_y, [c["cy"] for c in cells])
    assert plan.objects.bbox[0].tolist() == [
        int(np.floor(cells[0]["cy"] - 5)),
        int(np.floor(cells[0]["cx"] - 4)),
        int(np.ceil(cells[0]["cy"] + 5)),
        int(np.ceil(cells[0]["cx"] + 4)),
    ]
    with pytest.raises(ImportInputError, match="Cytoplasm_Location_Center_X"):
        plan_import(tmp_path / "cells.parquet", folder, ImportOptions(compartment="Cytoplasm"))


def test_channels_are_chosen_reordered_and_renamed(images: tuple[Path, Any], tmp_path: Path) -> None:
    folder, names = images
    pq.write_table(_table(_cellprofiler_columns(names)), tmp_path / "cells.parquet")
    options = ImportOptions(channels=ImportOptions.parse_channels(["Mito=MitoTracker", "DNA"]))
    plate = import_plate(
        tmp_path / "cells.parquet", folder, tmp_path / "p", layout_by_name("memmap"), options, progress=False
    ).path
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
        "Metadata_Row": lambda c: ord(c["well"][0]) - ord("A") + 1,
        "Metadata_Col": lambda c: int(c["well"][1:]),
        "Metadata_Field": lambda c: c["site"],
        "Location_Center_X": lambda c: c["nx"],
        "Location_Center_Y": lambda c: c["ny"],
    }
    pq.write_table(_table(columns), tmp_path / "Nuclei.parquet")
    options = ImportOptions(channels=ImportOptions.parse_channels(["ch1=DNA", "ch2=ER", "ch3=Mito"]))
    plate = import_plate(
        tmp_path / "Nuclei.parquet", folder, tmp_path / "p", layout_by_name("default"), options, progress=False
    ).path
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


@pytest.mark.parametrize(
    ("drop", "message"),
    [
        (("Metadata_Well",), "no well: looked for Metadata_Well, Image_Metadata_Well"),
        (
            tuple(f"{c}_Location_Center_{a}" for c in ("Nuclei", "Cells") for a in "XY"),
            "no object centroids: looked for Nuclei_Location_Center_X",
        ),
        (tuple(f"Image_FileName_{c}" for c in CHANNELS), "no file name columns.*Image_FileName_Orig<Channel>"),
    ],
)
def test_tables_without_needed_columns_say_what_was_looked_for(
    images: tuple[Path, Any],
    tmp_path: Path,
    drop: tuple[str, ...],
    message: str,
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
    images: tuple[Path, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    folder, names = images
    pq.write_table(_table(_cellprofiler_columns(names)), tmp_path / "cells.parquet")
    args = ["import", "--table", str(tmp_path / "cells.parquet"), "--images", str(folder), "--no-progress"]
    assert (
        main(
            [
                *args,
                "--out",
                str(tmp_path / "p"),
                "--layout",
                "channel-tiles",
                "--codec",
                "zstd",
                "--channel",
                "DNA=Hoechst",
            ]
        )
        == 0
    )
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
    source = pq.read_table(
        NF1_TABLE,
        columns=[
            "Image_Metadata_Well_x",
            "Nuclei_Location_Center_X",
            "Nuclei_Location_Center_Y",
            *(f"Image_FileName_{c}" for c in ("DAPI", "GFP", "RFP")),
        ],
    ).to_pylist()
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
                expected[channel, cy0 - y0 : cy1 - y0, cx0 - x0 : cx1 - x0] = field[cy0:cy1, cx0:cx1]
            np.testing.assert_array_equal(dataset.read_raw(index), expected, err_msg=f"{layout}/{decode} row {index}")
    reader = open_plate(plate, "direct")
    for info in metadata.fields:
        row = next(r for r in source if r["Image_Metadata_Well_x"] == info.well)
        full = np.stack([tifffile.imread(NF1_IMAGES / row[f"Image_FileName_{c}"]) for c in ("DAPI", "GFP", "RFP")])
        np.testing.assert_array_equal(reader.read_field(info.index), full)


def _import_args(tmp_path: Path, folder: Path, *extra: str) -> list[str]:
    return [
        "import",
        "--table",
        str(tmp_path / "cells.parquet"),
        "--images",
        str(folder),
        "--out",
        str(tmp_path / "plate"),
        "--no-progress",
        *extra,
    ]


def _left_behind(tmp_path: Path) -> list[str]:
    """What an import left in its output folder's parent besides the inputs."""
    return sorted(p.name for p in tmp_path.iterdir() if p.name not in ("images", "cells.parquet"))


def _truncate(path: Path, keep: int | None = None) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2 if keep is None else keep])


MALFORMED: dict[str, Callable[[Path], None]] = {
    "truncated-header": lambda path: _truncate(path, keep=8),
    "truncated-header-mid-ifd": lambda path: _truncate(path, keep=4),
    "truncated-data": _truncate,
    "not-a-tiff": lambda path: path.write_bytes(b"<html>not found</html>" * 40),
    "empty-file": lambda path: path.write_bytes(b""),
    "wrong-dtype": lambda path: tifffile.imwrite(path, np.zeros((HEIGHT, WIDTH), np.float64)),
    "wrong-shape": lambda path: tifffile.imwrite(path, np.zeros((HEIGHT, WIDTH + 3), np.uint16)),
    "stack-not-plane": lambda path: tifffile.imwrite(path, np.zeros((2, HEIGHT, WIDTH), np.uint16)),
    "missing": lambda path: path.unlink(),
}


@pytest.mark.parametrize("compression", [None, "lzw"])
@pytest.mark.parametrize("damage", sorted(MALFORMED))
def test_malformed_tiffs_exit_2_naming_the_file_and_leave_nothing(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    damage: str,
    compression: str | None,
) -> None:
    folder = tmp_path / "images"
    names = _write_named_tiffs(folder, compression=compression)
    pq.write_table(_table(_cellprofiler_columns(names)), tmp_path / "cells.parquet")
    bad = names[(2, "ER")]  # a channel of the last field
    MALFORMED[damage](folder / bad)
    assert main(_import_args(tmp_path, folder)) == 2
    error = capsys.readouterr().err
    assert error.startswith("cropbench: error:") and bad in error and "Traceback" not in error
    assert _left_behind(tmp_path) == []


def test_a_failure_on_the_last_field_leaves_no_plate_and_keeps_the_old_one(
    images: tuple[Path, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from cropbench.formats.omezarr import OmeZarrPlateWriter

    folder, names = images
    pq.write_table(_table(_cellprofiler_columns(names)), tmp_path / "cells.parquet")
    write_field = OmeZarrPlateWriter.write_field

    def fails_on_the_last_field(self: OmeZarrPlateWriter, row: str, column: str, site: int, pixels: Any) -> None:
        if (row, column, site) == self.geometry.field_slots()[-1]:
            raise OSError(28, "No space left on device")
        write_field(self, row, column, site, pixels)

    monkeypatch.setattr(OmeZarrPlateWriter, "write_field", fails_on_the_last_field)
    with pytest.raises(OutputError, match="No space left"):
        import_plate(tmp_path / "cells.parquet", folder, tmp_path / "plate", layout_by_name("default"), progress=False)
    assert _left_behind(tmp_path) == []
    monkeypatch.setattr(OmeZarrPlateWriter, "write_field", write_field)
    import_plate(tmp_path / "cells.parquet", folder, tmp_path / "plate", layout_by_name("tiff"), progress=False)
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "plate").rglob("*"))
    monkeypatch.setattr(OmeZarrPlateWriter, "write_field", fails_on_the_last_field)
    with pytest.raises(OutputError, match="No space left"):
        import_plate(
            tmp_path / "cells.parquet",
            folder,
            tmp_path / "plate",
            layout_by_name("default"),
            overwrite=True,
            progress=False,
        )
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "plate").rglob("*")) == before
    assert _left_behind(tmp_path) == ["plate"]


def test_missing_compartment_lists_the_ones_there(images: tuple[Path, Any], tmp_path: Path) -> None:
    folder, names = images
    pq.write_table(_table(_cellprofiler_columns(names)), tmp_path / "cells.parquet")
    with pytest.raises(ImportInputError, match=r"centroids of Cells, Nuclei \(choose one with --compartment\)"):
        plan_import(tmp_path / "cells.parquet", folder, ImportOptions(compartment="Nucleus"))
    with pytest.raises(ImportInputError, match="--label Metadata_moa: the table has no column.*Metadata_Well"):
        plan_import(tmp_path / "cells.parquet", folder, ImportOptions(labels=("Metadata_moa",)))
    with pytest.raises(ImportInputError, match="--label well names a column the object table makes"):
        ImportOptions(labels=("well",))


# A JUMP-like experiment, generated: Phenix file names, Image_FileName_Orig* / Image_PathName_Orig* columns
# recorded on another machine, LZW TIFFs, 8 channel columns of which only 3 have files, sites that are not
# 1..N, objects on the field edge, CytoTable-style identity columns and perturbation metadata.
JUMP_SHAPE = (70, 96)
#: Source channel column → Phenix channel number; only DNA, ER and RNA have files.
JUMP_CHANNELS = {"DNA": 5, "AGP": 3, "ER": 4, "Mito": 1, "RNA": 2, "Brightfield": 6, "HighZBF": 7, "LowZBF": 8}
JUMP_PRESENT = ("DNA", "ER", "RNA")
#: (well, site, perturbation, control type)
JUMP_FIELDS = (
    ("B05", 3, "DMSO", "negcon"),
    ("B05", 10, "DMSO", "negcon"),
    ("C11", 7, "aspirin", None),
    ("N20", 2, "taxol", "poscon"),
    ("N20", 9, "aspirin", None),
)
#: Centroids (x, y) per field: on each edge and corner, and inside.
JUMP_CELLS = ((0.0, 0.0), (95.9, 69.7), (1.4, 40.2), (60.5, 0.6), (47.25, 33.75), (94.0, 12.0))


def _jump_pixels(field: int, channel: str) -> np.ndarray:
    rng = np.random.default_rng(1000 * field + JUMP_CHANNELS[channel])
    return rng.integers(0, 65535, size=JUMP_SHAPE, dtype=np.uint16)


def _phenix(well: str, site: int, channel: str) -> str:
    row, column = ord(well[0]) - ord("A") + 1, int(well[1:])
    return f"r{row:02d}c{column:02d}f{site:02d}p01-ch{JUMP_CHANNELS[channel]}sk1fk1fl1.tiff"


@pytest.fixture
def jump(tmp_path: Path) -> tuple[Path, Path]:
    folder = tmp_path / "images"
    folder.mkdir()
    for number, (well, site, _, _) in enumerate(JUMP_FIELDS):
        for channel in JUMP_PRESENT:
            tifffile.imwrite(folder / _phenix(well, site, channel), _jump_pixels(number, channel), compression="lzw")
    rows: dict[str, list[Any]] = {}
    for number, (well, site, pert, control) in enumerate(JUMP_FIELDS):
        for cell, (x, y) in enumerate(JUMP_CELLS):
            values = {
                "Metadata_Source": "source_4",
                "Metadata_Plate": "BR00117035",
                "Metadata_Well": well,
                "Metadata_Site": site,
                "Metadata_ImageNumber": 100 + number,
                "Metadata_Nuclei_Number_Object_Number": cell + 1,
                "Image_Metadata_ImageResolutionX": 0.598,
                "Metadata_pert_iname": pert,
                "Metadata_control_type": control,
                "Metadata_dose": 0.5 * number,
                "Nuclei_Location_Center_X": x,
                "Nuclei_Location_Center_Y": y,
                "Cells_Location_Center_X": min(x + 1, 95.0),
                "Cells_Location_Center_Y": y,
                **{f"Image_FileName_Orig{c}": _phenix(well, site, c) for c in JUMP_CHANNELS},
                **{
                    f"Image_PathName_Orig{c}": "/home/ubuntu/bucket/images/BR00117035__2021-05-21/Images"
                    for c in JUMP_CHANNELS
                },
            }
            for name, value in values.items():
                rows.setdefault(name, []).append(value)
    pq.write_table(pa.table(rows), tmp_path / "cells.parquet")
    return tmp_path / "cells.parquet", folder


def _expected_crop(field: int, x: float, y: float, size: int, border: str) -> np.ndarray:
    """The crop cut straight from the source TIFF pixels with the documented window rule."""
    height, width = JUMP_SHAPE
    y0, x0 = int(np.floor(y - (size - 1) / 2 + 0.5)), int(np.floor(x - (size - 1) / 2 + 0.5))
    if border == "shift":
        y0, x0 = min(max(y0, 0), height - size), min(max(x0, 0), width - size)
    expected = np.zeros((len(JUMP_PRESENT), size, size), np.uint16)
    cy0, cx0, cy1, cx1 = max(y0, 0), max(x0, 0), min(y0 + size, height), min(x0 + size, width)
    for channel, name in enumerate(JUMP_PRESENT):
        expected[channel, cy0 - y0 : cy1 - y0, cx0 - x0 : cx1 - x0] = _jump_pixels(field, name)[cy0:cy1, cx0:cx1]
    return expected


@pytest.mark.parametrize("layout", ["default", "tiff-zlib"])
def test_jump_like_plate_imports_exactly_with_identity_labels_and_pixel_size(
    jump: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    layout: str,
) -> None:
    table, folder = jump
    args = ["import", "--table", str(table), "--images", str(folder), "--no-progress", "--layout", layout]
    assert main([*args, "--out", str(tmp_path / "refused")]) == 2
    error = capsys.readouterr().err
    assert "25 image files are missing, of channels AGP (5 of 5 fields), Mito (5 of 5 fields)" in error
    assert error.count("\n") == 1 and error.rstrip().endswith("--channel DNA --channel ER --channel RNA")
    assert f"{folder / _phenix('B05', 3, 'Mito')} (channel Mito)" in error and "and 22 more" in error
    labels = ["--label", "Metadata_pert_iname", "--label", "Metadata_control_type", "--label", "Metadata_dose"]
    plate = tmp_path / "plate"
    assert main([*args, "--out", str(plate), "--channel", "DNA", "--channel", "ER", "--channel", "RNA", *labels]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cells.parquet", "images", "plate"]
    metadata = read_plate_metadata(plate)
    assert metadata.channel_names == JUMP_PRESENT and metadata.name == "BR00117035"
    assert metadata.attributes["pixel_size_um"] == [0.598, 0.598]

    objects = read_object_table(plate)
    cells = len(JUMP_CELLS)
    assert objects.column("source_row").tolist() == list(range(len(JUMP_FIELDS) * cells))
    assert objects.column("source_site").tolist() == [site for _, site, _, _ in JUMP_FIELDS for _ in JUMP_CELLS]
    assert objects.field.tolist() == [f for f in (0, 1, 0, 0, 1) for _ in JUMP_CELLS]  # 0-based within the well
    assert objects.column("ImageNumber").tolist() == [100 + n for n in range(len(JUMP_FIELDS)) for _ in JUMP_CELLS]
    assert objects.column("ObjectNumber").tolist() == list(range(1, cells + 1)) * len(JUMP_FIELDS)

    for border in ("pad", "shift"):
        for size in (21, 32):
            for decode in ("zarr", "direct", "field"):
                dataset = CropDataset(plate, CropConfig(crop_size=size, dtype="uint16", decode=decode, border=border))
                assert len(dataset) == len(JUMP_FIELDS) * cells
                for index in range(len(dataset)):
                    item = dataset.metadata_of(index)
                    field, cell = divmod(item["object_id"], cells)
                    x, y = JUMP_CELLS[cell]
                    np.testing.assert_array_equal(
                        dataset.read_raw(index),
                        _expected_crop(field, x, y, size, border),
                        err_msg=f"{border}/{size}/{decode} object {index}",
                    )

    dataset = CropDataset(
        plate, CropConfig(crop_size=16), labels=["Metadata_pert_iname", "Metadata_control_type", "Metadata_dose"]
    )
    assert dataset.label_classes == {
        "Metadata_pert_iname": ("DMSO", "aspirin", "taxol"),
        "Metadata_control_type": ("negcon", "poscon"),
    }
    batch = next(iter(torch.utils.data.DataLoader(dataset, batch_size=len(dataset), shuffle=False)))
    assert batch["image"].shape == (len(dataset), 3, 16, 16)
    classes = {"DMSO": 0, "aspirin": 1, "taxol": 2}
    assert batch["labels"]["Metadata_pert_iname"].tolist() == [
        classes[p] for _, _, p, _ in JUMP_FIELDS for _ in JUMP_CELLS
    ]
    assert batch["labels"]["Metadata_control_type"].tolist() == [
        {"negcon": 0, "poscon": 1, None: -1}[c] for _, _, _, c in JUMP_FIELDS for _ in JUMP_CELLS
    ]
    np.testing.assert_allclose(
        batch["labels"]["Metadata_dose"].numpy(), [0.5 * n for n in range(len(JUMP_FIELDS)) for _ in JUMP_CELLS]
    )


def test_pixel_size_reaches_the_ngff_scale_or_stays_unknown(jump: tuple[Path, Path], tmp_path: Path) -> None:
    import json

    table, folder = jump
    options = ImportOptions(channels=(("DNA", "DNA"),))
    recorded = import_plate(table, folder, tmp_path / "a", layout_by_name("default"), options, progress=False).path
    image = json.loads((recorded / "B" / "5" / "0" / "zarr.json").read_text())["attributes"]["ome"]["multiscales"][0]
    assert image["datasets"][0]["coordinateTransformations"][0]["scale"] == [1.0, 0.598, 0.598]
    assert image["axes"][1]["unit"] == "micrometer"
    flagged = dataclasses.replace(options, pixel_size_um=0.325)
    given = import_plate(table, folder, tmp_path / "b", layout_by_name("default"), flagged, progress=False).path
    assert read_plate_metadata(given).attributes["pixel_size_um"] == [0.325, 0.325]
    columns = pq.read_table(table)
    pq.write_table(columns.drop(["Image_Metadata_ImageResolutionX"]), tmp_path / "plain.parquet")
    unknown = import_plate(
        tmp_path / "plain.parquet", folder, tmp_path / "c", layout_by_name("default"), options, progress=False
    ).path
    image = json.loads((unknown / "B" / "5" / "0" / "zarr.json").read_text())["attributes"]["ome"]["multiscales"][0]
    assert image["datasets"][0]["coordinateTransformations"][0]["scale"] == [1.0, 1.0, 1.0]
    assert "unit" not in image["axes"][1]


def test_conversion_keeps_identity_labels_and_pixel_size_and_a_failed_one_leaves_nothing(
    jump: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from cropbench.formats.tiff import TiffPlateWriter
    from cropbench.plates.convert import convert_plate

    table, folder = jump
    options = ImportOptions(channels=(("DNA", "DNA"), ("RNA", "RNA")), labels=("Metadata_pert_iname",))
    source = import_plate(table, folder, tmp_path / "plate", layout_by_name("default"), options, progress=False).path
    copy = convert_plate(source, tmp_path / "copy", layout_by_name("tiff")).path
    assert read_plate_metadata(copy).attributes["pixel_size_um"] == [0.598, 0.598]
    assert (copy / "cropbench_labels.json").read_text() == (source / "cropbench_labels.json").read_text()
    assert list(read_object_table(copy).extra) == list(read_object_table(source).extra)
    write_field = TiffPlateWriter.write_field

    def fails_on_the_last_field(self: TiffPlateWriter, row: str, column: str, site: int, pixels: Any) -> None:
        if (row, column, site) == self.geometry.field_slots()[-1]:
            raise OSError(28, "No space left on device")
        write_field(self, row, column, site, pixels)

    monkeypatch.setattr(TiffPlateWriter, "write_field", fails_on_the_last_field)
    with pytest.raises(OutputError, match="No space left"):
        convert_plate(source, tmp_path / "failed", layout_by_name("tiff-zlib"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cells.parquet", "copy", "images", "plate"]


def test_a_label_column_is_found_by_its_exact_name_before_any_case_variant(
    images: tuple[Path, Any], tmp_path: Path
) -> None:
    folder, names = images
    columns = _cellprofiler_columns(names)
    columns["Metadata_A"] = lambda c: f"upper{c['field']}"
    columns["metadata_a"] = lambda c: f"lower{c['field']}"
    pq.write_table(_table(columns), tmp_path / "cells.parquet")
    plan = plan_import(tmp_path / "cells.parquet", folder, ImportOptions(labels=("Metadata_A",)))
    assert plan.columns["labels"] == {"Metadata_A": "Metadata_A"}
    assert set(plan.objects.column("Metadata_A")) == {"upper0", "upper1", "upper2"}
    with pytest.raises(ImportInputError, match=r"METADATA_A.*matches both .*Metadata_A.* and .*metadata_a"):
        plan_import(tmp_path / "cells.parquet", folder, ImportOptions(labels=("METADATA_A",)))


def test_a_well_column_differing_only_in_case_is_an_error_naming_both(images: tuple[Path, Any], tmp_path: Path) -> None:
    folder, names = images
    columns = _cellprofiler_columns(names)
    well = columns.pop("Metadata_Well")
    columns["Metadata_well"] = well
    columns["Metadata_WELL"] = lambda c: "Z99"
    pq.write_table(_table(columns), tmp_path / "cells.parquet")
    with pytest.raises(ImportInputError, match=r"matches both .*Metadata_well.* and .*Metadata_WELL"):
        plan_import(tmp_path / "cells.parquet", folder)
    columns.pop("Metadata_WELL")
    pq.write_table(_table(columns), tmp_path / "cells.parquet")
    assert plan_import(tmp_path / "cells.parquet", folder).columns["well"] == "Metadata_well"


@pytest.mark.parametrize("column", ["Metadata_Count", "ObjectNumber"])
def test_integers_outside_int64_are_refused_at_import(images: tuple[Path, Any], tmp_path: Path, column: str) -> None:
    folder, names = images
    table = _table(_cellprofiler_columns(names))
    values = pa.array([2**63 + i for i in range(table.num_rows)], pa.uint64())
    pq.write_table(table.append_column(column, values), tmp_path / "cells.parquet")
    labels = (column,) if column.startswith("Metadata") else ()
    with pytest.raises(ImportInputError, match=rf"{column}.*{2**63}.*int64"):
        plan_import(tmp_path / "cells.parquet", folder, ImportOptions(labels=labels))
    small = pa.array(list(range(table.num_rows)), pa.uint64())
    pq.write_table(table.append_column(column, small), tmp_path / "cells.parquet")
    plan = plan_import(tmp_path / "cells.parquet", folder, ImportOptions(labels=labels))
    stored = plan.objects.extra[column]
    assert stored.dtype == np.int64 and stored.tolist() == list(range(table.num_rows))


@pytest.mark.parametrize("kind", ["fifo", "device"])
@pytest.mark.parametrize("what", ["image", "table"])
def test_an_input_that_is_not_a_regular_file_is_refused_by_name_without_opening_it(
    images: tuple[Path, Any], tmp_path: Path, kind: str, what: str
) -> None:
    import os

    folder, names = images
    pq.write_table(_table(_cellprofiler_columns(names)), tmp_path / "cells.parquet")
    target = folder / names[(1, "ER")] if what == "image" else tmp_path / "cells.parquet"
    target.unlink()
    if kind == "fifo":
        os.mkfifo(target)
    else:
        target.symlink_to("/dev/zero")
    with pytest.raises(ImportInputError, match=rf"{target.name}.* not a regular file"):
        plan_import(tmp_path / "cells.parquet", folder)


def test_lower_case_metadata_columns_are_read_and_take_part_in_the_case_check(
    images: tuple[Path, Any], tmp_path: Path
) -> None:
    # The table's column filter used to keep only 'Metadata' spelled so: a lower-case well column was
    # dropped before the lookup, so the lookup could neither use it nor see that it clashed.
    folder, names = images
    columns = _cellprofiler_columns(names, meta="metadata_")
    pq.write_table(_table(columns), tmp_path / "cells.parquet")
    assert plan_import(tmp_path / "cells.parquet", folder).columns["well"] == "metadata_Well"
    columns["METADATA_WELL"] = lambda c: "Z99"
    pq.write_table(_table(columns), tmp_path / "cells.parquet")
    with pytest.raises(ImportInputError, match=r"matches both .*metadata_Well.* and .*METADATA_WELL"):
        plan_import(tmp_path / "cells.parquet", folder)


def _escaping(names: dict[tuple[int, str], str], channel: str, outside: str) -> dict[tuple[int, str], str]:
    """``names`` with the last field's ``channel`` file replaced by ``outside``."""
    return {**names, (len(FIELDS) - 1, channel): outside}


@pytest.mark.parametrize("how", ["parent", "absolute", "link"])
def test_a_file_outside_the_image_folder_is_refused_naming_its_row(
    images: tuple[Path, Any], tmp_path: Path, how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, names = images
    other = tmp_path / "other.tif"  # beside --images: readable, a TIFF of the right shape
    tifffile.imwrite(other, _pixels(0, 0))
    outside = {"parent": "../other.tif", "absolute": str(other), "link": "link.tif"}[how]
    (folder / "link.tif").symlink_to(other)
    pq.write_table(_table(_cellprofiler_columns(_escaping(names, "ER", outside))), tmp_path / "cells.parquet")
    arguments = ["import", "--table", str(tmp_path / "cells.parquet"), "--images", str(folder)]
    assert main([*arguments, "--out", str(tmp_path / "p.zarr"), "--no-progress"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("cropbench: error: table row 4 names image file") and "\n" not in error
    assert "(channel ER)" in error and "outside --images" in error
    assert not (tmp_path / "p.zarr").exists()


def test_a_recorded_folder_outside_the_image_folder_is_not_read(images: tuple[Path, Any], tmp_path: Path) -> None:
    folder, names = images
    elsewhere = tmp_path / "elsewhere"
    _write_named_tiffs(elsewhere)
    for path in elsewhere.iterdir():  # same names, other pixels: the plate must hold --images' pixels
        tifffile.imwrite(path, np.full((HEIGHT, WIDTH), 7, np.uint16))
    columns = _cellprofiler_columns(names)
    for channel in CHANNELS:
        columns[f"Image_PathName_{channel}"] = lambda c: str(elsewhere)
    pq.write_table(_table(columns), tmp_path / "cells.parquet")
    imported = import_plate(
        tmp_path / "cells.parquet", folder, tmp_path / "p.zarr", layout_by_name("default"), progress=False
    )
    _check_plate(imported.path)
