"""Array metadata (``zarr.json``, ``.zarray``) is validated once, when a plate is opened: every bad
value is one CropbenchError naming the file and the key, on every decode path."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cropbench.errors import CropbenchError, StoreError
from cropbench.formats import open_plate, read_plate_metadata
from cropbench.formats.metadata import parse_array_metadata


def _set(document: dict[str, Any], path: str, value: Any) -> None:
    """Set a dotted key (list positions as numbers) of a JSON document."""
    *parents, last = path.split(".")
    node: Any = document
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


def _edited(plate: Path, tmp_path: Path, path: str, value: Any) -> Path:
    """A copy of the plate with ``path`` set to ``value`` in every field's zarr.json."""
    copy = tmp_path / plate.name
    shutil.copytree(plate, copy)
    for info in read_plate_metadata(copy).fields:
        document_path = copy / info.path / "zarr.json"
        document = json.loads(document_path.read_text())
        _set(document, path, value)
        document_path.write_text(json.dumps(document))
    return copy


#: (plate, dotted key, value, the key the error must name)
BAD_VALUES = [
    ("tiles", "chunk_grid.configuration.chunk_shape", [2, 0, 32], "chunk_shape"),
    ("tiles", "chunk_grid.configuration.chunk_shape", [2, -32, 32], "chunk_shape"),
    ("tiles", "chunk_grid.configuration.chunk_shape", [2, 2**40, 32], "chunk_shape"),
    ("tiles", "chunk_grid.configuration.chunk_shape", [2, 32.0, 32], "chunk_shape"),
    ("tiles", "chunk_grid.configuration.chunk_shape", [2, 32], "chunk_shape"),
    ("tiles", "shape", ["2", "64", "64"], "shape"),
    ("tiles", "shape", [2, 2**62, 64], "shape"),
    ("tiles", "shape", [2, -64, 64], "shape"),
    ("tiles", "data_type", "uint17", "data_type"),
    ("tiles", "data_type", {"name": "uint16"}, "data_type"),
    ("tiles", "codecs", [], "codecs"),
    ("tiles", "codecs", {"name": "bytes"}, "codecs"),
    ("tiles", "codecs.0.name", 7, "codecs"),
    ("tiles", "codecs.0.configuration.endian", "middle", "endian"),
    ("tiles", "fill_value", -1, "fill_value"),
    ("tiles", "fill_value", 2**70, "fill_value"),
    ("tiles", "fill_value", "NaN", "fill_value"),
    ("tiles", "fill_value", 1.5, "fill_value"),
    ("tiles", "fill_value", True, "fill_value"),
    ("tiles", "fill_value", None, "fill_value"),
    ("tiles", "chunk_key_encoding.name", "v7", "chunk_key_encoding"),
    ("sharded", "codecs.0.configuration.chunk_shape", [2, 0, 16], "chunk_shape"),
    ("sharded", "codecs.0.configuration.chunk_shape", [2, -16, 16], "chunk_shape"),
    ("sharded", "codecs.0.configuration.chunk_shape", [2, 24, 16], "chunk_shape"),
    ("sharded", "codecs.0.configuration.codecs", [], "codecs"),
    ("sharded", "codecs.0.configuration.index_location", "middle", "index_location"),
    ("sharded", "codecs.0.configuration.index_codecs", [{"name": "blosc"}], "index_codecs"),
]


@pytest.mark.parametrize(
    ("plate_name", "key", "value", "named"), BAD_VALUES, ids=[f"{k}={v}" for _, k, v, _ in BAD_VALUES]
)
@pytest.mark.parametrize("decode", ["direct", "field", "zarr"])
def test_a_bad_metadata_value_is_one_error_naming_the_file_and_key_on_every_path(
    hostile_plates: dict[str, Path], tmp_path: Path, plate_name: str, key: str, value: Any, named: str, decode: str
) -> None:
    plate = _edited(hostile_plates[plate_name], tmp_path, key, value)
    with pytest.raises(CropbenchError) as raised:
        reader = open_plate(plate, decode)
        reader.read_region(0, 0, 8, 0, 8)
        reader.read_field(1)
    message = str(raised.value)
    assert "\n" not in message
    assert "zarr.json" in message and named in message, message


def test_a_field_too_large_for_memory_is_refused_on_the_field_path_only(
    hostile_plates: dict[str, Path], tmp_path: Path
) -> None:
    """A valid shape whose whole field cannot be held: the field path says so before allocating it."""
    plate = _edited(hostile_plates["tiles"], tmp_path, "shape", [2, 2**21, 2**21])
    with pytest.raises(CropbenchError, match="decode='field'"):
        open_plate(plate, "field").read_region(0, 0, 8, 0, 8)
    np.testing.assert_array_equal(
        open_plate(plate, "direct").read_region(0, 0, 8, 0, 8),
        open_plate(hostile_plates["tiles"], "direct").read_region(0, 0, 8, 0, 8),
    )


def _document(**changes: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": [2, 64, 64],
        "data_type": "uint16",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 32, 32]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0,
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zstd"}],
    }
    document.update(changes)
    return document


def test_sound_documents_parse_into_typed_metadata() -> None:
    metadata = parse_array_metadata(_document(), Path("a/zarr.json"))
    assert metadata.shape == (2, 64, 64) and metadata.chunk == (2, 32, 32)
    assert metadata.dtype == np.dtype("<u2") and metadata.fill_value == 0
    assert [codec.name for codec in metadata.codecs] == ["bytes", "zstd"]
    floats = parse_array_metadata(_document(data_type="float32", fill_value="NaN"), Path("a/zarr.json"))
    assert np.isnan(floats.fill_value)
    v2 = {
        "zarr_format": 2,
        "shape": [2, 64, 64],
        "chunks": [1, 64, 64],
        "dtype": ">u2",
        "compressor": {"id": "zstd", "level": 1},
        "fill_value": None,
        "order": "C",
        "filters": None,
    }
    parsed = parse_array_metadata(v2, Path("a/.zarray"))
    assert parsed.dtype == np.dtype(">u2") and parsed.fill_value == 0 and parsed.chunk == (1, 64, 64)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"zarr_format": 4}, "zarr_format"),
        ({"shape": "64"}, "shape"),
        ({"shape": [64, 64]}, "shape"),
        ({"shape": [True, 64, 64]}, "shape"),
        ({"chunk_grid": {"name": "rectilinear"}}, "chunk_grid"),
        ({"data_type": "complex64"}, "data_type"),
        ({"fill_value": "0x7fc00000"}, "fill_value"),
        ({"chunk_key_encoding": {"name": "default", "configuration": {"separator": "|"}}}, "separator"),
    ],
)
def test_bad_documents_name_the_file_and_key(changes: dict[str, Any], named: str) -> None:
    with pytest.raises(StoreError, match=f"a/zarr.json.*{named}"):
        parse_array_metadata(_document(**changes), Path("a/zarr.json"))
