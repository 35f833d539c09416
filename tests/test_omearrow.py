"""OME-Arrow layouts (optional extra [arrow]): exact crops on every decode path, inline objects,
the slice-offset trap, and a clear error without the extra."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cropbench.config import layout_by_name
from cropbench.errors import ConfigError
from cropbench.formats import open_plate, plate_objects, read_plate_metadata
from cropbench.formats.omearrow import IMAGES_NAME, OmeArrowReader, _FieldChunks, require_ome_arrow
from cropbench.harness.context import RunContext
from cropbench.harness.runner import run_tracks
from cropbench.objects import OBJECT_TABLE_NAME, read_object_table
from cropbench.plates.convert import convert_plate
from cropbench.tracks.layouts import LayoutComparison, Layouts

pytest.importorskip(
    "ome_arrow", reason="the OME-Arrow layouts need the optional extra [arrow]: .venv/bin/pip install -e '.[arrow]'"
)
LAYOUT_NAMES = ("ome-arrow", "ome-arrow-zstd", "ome-arrow-zstd-objects")


@pytest.fixture(scope="module")
def arrow_plates(tiny_plate: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ome-arrow")
    return {name: convert_plate(tiny_plate, root / name, layout_by_name(name)).path for name in LAYOUT_NAMES}


@pytest.mark.parametrize("name", LAYOUT_NAMES)
def test_every_decode_path_returns_the_omezarr_crops(
    arrow_plates: dict[str, Path], tiny_plate: Path, name: str
) -> None:
    reference = open_plate(tiny_plate, "zarr")
    for decode in ("direct", "field", "as-py"):
        reader = open_plate(arrow_plates[name], decode)
        for field in range(4):
            np.testing.assert_array_equal(reader.read_field(field), reference.read_field(field))
            np.testing.assert_array_equal(
                reader.read_region(field, 190, 200, 3, 240, np.array([4, 2])),
                reference.read_region(field, 190, 200, 3, 240, np.array([4, 2])),
            )


def test_one_row_and_row_group_per_field_in_the_ome_arrow_schema(arrow_plates: dict[str, Path]) -> None:
    import ome_arrow

    parquet = pq.ParquetFile(str(arrow_plates["ome-arrow-zstd"] / IMAGES_NAME))
    assert parquet.metadata.num_row_groups == 4 and parquet.metadata.num_rows == 4
    assert parquet.metadata.row_group(0).column(0).compression == "UNCOMPRESSED"  # chunk-level zstd only
    table = parquet.read()
    assert table.column_names == ["plate", "well", "row", "column", "field", "image"]
    assert table.schema.field("image").type == ome_arrow.OME_ARROW_BYTE_STRUCT
    image = table.column("image")[0].as_py()
    assert {c["compression"] for c in image["chunks"]} == {"zstd"}
    assert [c["name"] for c in image["pixels_meta"]["channels"]] == ["DNA", "ER", "RNA", "AGP", "Mito"]
    raw = pq.read_table(str(arrow_plates["ome-arrow"] / IMAGES_NAME), columns=["image"]).column("image")[0].as_py()
    assert {c["compression"] for c in raw["chunks"]} == {None}


def test_objects_can_live_beside_the_images(arrow_plates: dict[str, Path], tiny_plate: Path) -> None:
    plate = arrow_plates["ome-arrow-zstd-objects"]
    assert not (plate / OBJECT_TABLE_NAME).exists()
    inline, source = plate_objects(plate), read_object_table(tiny_plate)
    order = np.argsort(inline.object_id)
    assert inline.object_id[order].tolist() == source.object_id.tolist()
    np.testing.assert_array_equal(inline.centroid_x[order], source.centroid_x)
    np.testing.assert_array_equal(inline.bbox[order], source.bbox)
    assert inline.well[order].tolist() == source.well.tolist() and inline.field[order].tolist() == source.field.tolist()


def test_sliced_rows_find_their_own_chunks(arrow_plates: dict[str, Path]) -> None:
    """Raw buffers and list .values ignore a slice offset; the reader flattens, so row 2 reads row 2."""
    metadata = read_plate_metadata(arrow_plates["ome-arrow"])
    images = pq.read_table(str(arrow_plates["ome-arrow"] / IMAGES_NAME), columns=["image"]).column("image")
    row = images.combine_chunks().slice(2, 1)
    chunks = _FieldChunks(row, metadata.field_shape)
    expected = open_plate(arrow_plates["ome-arrow"], "as-py").read_field(2)
    first = chunks.data.slice(int(chunks.starts[0]), int(chunks.ends[0] - chunks.starts[0]))
    tile = np.frombuffer(first, dtype="<u2").reshape(int(chunks.shape_y[0]), int(chunks.shape_x[0]))
    np.testing.assert_array_equal(tile, expected[int(chunks.c[0]), : tile.shape[0], : tile.shape[1]])
    # The trap: a list's .values ignores the slice (every row's chunks), flatten() applies it.
    assert len(row.field("chunks").values) == 4 * chunks.count and len(row.field("chunks").flatten()) == chunks.count


def test_direct_reader_decodes_only_touched_tiles(arrow_plates: dict[str, Path]) -> None:
    reader = open_plate(arrow_plates["ome-arrow-zstd"], "direct", chunk_cache_bytes=0)
    assert isinstance(reader, OmeArrowReader) and reader.grain() == (200, 240)  # 256 tiles, clipped to the field
    reader.read_region(1, 10, 40, 10, 40, np.array([0, 3]))
    assert reader.stats.chunks_decoded == 2


def test_comparison_reports_the_as_py_gap(tiny_plate: Path, tmp_path: Path) -> None:
    comparison = LayoutComparison(layouts=("ome-arrow-zstd",), samples=40, warmup=5, repeats=1, crop_size=32)
    records = run_tracks([Layouts(comparison, tmp_path)], "smoke", RunContext(tiny_plate), lambda record: None)
    metrics = records[1].metrics
    assert records[1].config["layout_label"] == "ome-arrow-zstd1-yx256"
    assert metrics["as_py_random_crops_per_s"] > 0 and metrics["random_crops_per_s"] > 0


def test_without_the_extra_the_error_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ome_arrow", None)
    with pytest.raises(ConfigError, match=r"\.venv/bin/pip install -e '\.\[arrow\]'"):
        require_ome_arrow()
    assert pa is not None
