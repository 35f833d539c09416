"""Plates and images written by others: ome-zarr-py (the NGFF reference implementation) writes them,
cropbench reads every field with the right channel names, shapes and pixels through every decode path,
and cuts crops from them with centroids the user supplies (no cropbench object table)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import zarr

from cropbench.config import CropConfig
from cropbench.data.dataset import CropDataset
from cropbench.errors import ObjectTableError
from cropbench.formats import open_plate, read_plate_metadata, supported_decodes

ome_zarr_format = pytest.importorskip("ome_zarr.format", reason="ome-zarr (dev dependency) is not installed")
ome_zarr_writer = pytest.importorskip("ome_zarr.writer", reason="ome-zarr (dev dependency) is not installed")

CHANNELS = ("DAPI", "GFP", "RFP")
WELLS = ("A/1", "B/3")
SHAPE = (3, 100, 120)


def _field(well: int, site: int) -> np.ndarray:
    return np.random.default_rng((well, site)).integers(0, 4000, SHAPE, dtype=np.uint16)


def _omero() -> dict[str, Any]:
    return {
        "channels": [
            {"label": name, "color": "FFFFFF", "window": {"start": 0, "end": 4000, "min": 0, "max": 65535}}
            for name in CHANNELS
        ]
    }


def _write_plate(path: Path, fmt: Any) -> Path:
    root = zarr.open_group(str(path), mode="w", zarr_format=fmt.zarr_format)
    ome_zarr_writer.write_plate_metadata(
        root, ["A", "B"], ["1", "3"], list(WELLS), fmt=fmt, name="theirs", field_count=2
    )
    for well_number, well_path in enumerate(WELLS):
        row, column = well_path.split("/")
        well = root.require_group(row).require_group(column)
        ome_zarr_writer.write_well_metadata(well, [{"path": "0"}, {"path": "1"}], fmt=fmt)
        for site in range(2):
            ome_zarr_writer.write_image(
                _field(well_number, site),
                well.require_group(str(site)),
                axes="cyx",
                fmt=fmt,
                scale_factors=[2],
                storage_options={"chunks": (1, 64, 64)},
                omero=_omero(),
            )
    return path


@pytest.fixture(scope="module", params=["0.4", "0.5"])
def their_plate(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    fmt = ome_zarr_format.FormatV04() if request.param == "0.4" else ome_zarr_format.FormatV05()
    return _write_plate(tmp_path_factory.mktemp("ome-zarr-py") / f"plate-{request.param}.zarr", fmt)


def test_ome_zarr_py_plates_read_with_names_shapes_and_pixels(their_plate: Path) -> None:
    metadata = read_plate_metadata(their_plate)
    assert metadata.name == "theirs" and metadata.format == "ome-zarr"
    assert metadata.channel_names == CHANNELS
    assert metadata.field_shape == SHAPE and metadata.dtype == "uint16"
    assert [(f.well, f.field) for f in metadata.fields] == [("A1", 0), ("A1", 1), ("B3", 0), ("B3", 1)]
    assert supported_decodes(metadata) == ("zarr", "direct", "field")
    for decode in supported_decodes(metadata):
        reader = open_plate(their_plate, decode)
        for info in metadata.fields:
            expected = _field(WELLS.index(f"{info.row}/{info.column}"), info.field)
            np.testing.assert_array_equal(reader.read_field(info.index), expected, err_msg=f"{decode} {info}")
            np.testing.assert_array_equal(
                reader.read_region(info.index, 30, 97, 50, 119, np.array([2, 0])), expected[[2, 0], 30:97, 50:119]
            )


def test_plates_without_an_object_table_take_user_centroids(their_plate: Path, tmp_path: Path) -> None:
    with pytest.raises(ObjectTableError, match="does not exist"):
        CropDataset(their_plate)
    table = pa.table(
        {
            "well": ["B3", "A1", "A1"],
            "field": [1, 0, 1],
            "centroid_y": [50.0, 20.5, 99.0],
            "centroid_x": [60.0, 10.0, 119.9],
        }
    )
    pq.write_table(table, tmp_path / "cells.parquet")
    dataset = CropDataset(their_plate, CropConfig(crop_size=32, dtype="uint16"), objects=tmp_path / "cells.parquet")
    assert dataset.object_id.tolist() == [0, 1, 2]  # numbered when the table has no object_id
    np.testing.assert_array_equal(dataset.read_raw(0), _field(1, 1)[:, 35:67, 45:77])  # centre (50.5, 60.5)
    corner = dataset.read_raw(2)
    np.testing.assert_array_equal(corner[:, :16, :16], _field(0, 1)[:, 84:100, 104:120])
    assert not corner[:, 16:].any() and not corner[:, :, 16:].any()  # padded outside the field


def test_a_plain_image_is_a_one_field_plate_and_needs_only_centroids(tmp_path: Path) -> None:
    pixels = np.random.default_rng(5).integers(0, 60000, (1, 3, 1, 90, 70), dtype=np.uint16)
    root = zarr.open_group(str(tmp_path / "image.zarr"), mode="w", zarr_format=3)
    ome_zarr_writer.write_image(
        pixels, root, axes="tczyx", fmt=ome_zarr_format.FormatV05(), scale_factors=[2], omero=_omero()
    )
    metadata = read_plate_metadata(tmp_path / "image.zarr")
    assert len(metadata.fields) == 1 and metadata.field_shape == (3, 90, 70) and metadata.channel_names == CHANNELS
    pacsv.write_csv(pa.table({"centroid_y": [40.0, 45.0], "centroid_x": [30.0, 35.0]}), tmp_path / "cells.csv")
    for decode in ("zarr", "direct", "field"):
        dataset = CropDataset(
            tmp_path / "image.zarr",
            CropConfig(crop_size=16, dtype="uint16", decode=decode, channels=("RFP",)),
            objects=tmp_path / "cells.csv",
        )
        np.testing.assert_array_equal(dataset.read_raw(1), pixels[0, 2:3, 0, 38:54, 28:44])
