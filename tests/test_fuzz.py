"""Hostile inputs, generated: every kind of file a plate, a layout, an object table or a results
file holds is truncated, bit-flipped or deleted; every metadata document is replaced by malformed
JSON; the disk fills up mid-write. Each case must end in one of:

- a CropbenchError (the CLI's one line, exit 2), or
- byte-identical crops, or, where the bytes carry no checksum (raw or checksum-free codecs, a
  deleted chunk that zarr fills with zeros), crops of the right shape and type;

and nothing outside the case's own copy is touched. Pixel chunks of the crc32c plate are strict:
an error or identical crops.
"""

from __future__ import annotations

import errno
import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cropbench.cli import main, one_line
from cropbench.config import LAYOUTS, CropConfig, PlateSpec
from cropbench.data.dataset import CropDataset
from cropbench.errors import CropbenchError
from cropbench.formats import read_plate_metadata
from cropbench.objects import OBJECT_TABLE_NAME
from cropbench.plates.convert import convert_plate
from cropbench.plates.generate import generate_plate
from cropbench.records import Record, RecordWriter

FUZZ_SPEC = PlateSpec(
    name="fuzz",
    rows=1,
    columns=1,
    fields_per_well=2,
    channels=2,
    field_height=64,
    field_width=64,
    cells_per_field=6,
    seed=3,
)
DECODES = {"ome-zarr": ("zarr", "direct"), "tiff": ("direct", "zarr"), "memmap": ("direct",)}
MUTATIONS = ("truncate", "flip", "delete")
BAD_JSON = ("", "{", "[]", "null", "{}", '{"zarr_format": 3, "node_type": "group", "attributes": []}')


def _snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.blake2b(p.read_bytes(), digest_size=8).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _mutate(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "delete":
        path.unlink()
    elif how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    else:
        flipped = bytearray(data)
        if flipped:
            flipped[len(flipped) // 2] ^= 0x10
        path.write_bytes(bytes(flipped))


def _crops(plate: Path, decode: str) -> list[np.ndarray]:
    dataset = CropDataset(plate, CropConfig(crop_size=24, dtype="uint16", decode=decode))
    return [dataset.read_raw(i) for i in range(len(dataset))]


def _with_crc32c(plate: Path) -> None:
    import zarr
    from zarr.codecs import Crc32cCodec, ZstdCodec

    for info in read_plate_metadata(plate).fields:
        array = zarr.open_array(str(plate / info.path), mode="r")
        data, attributes, names = array[:], dict(array.attrs), array.metadata.dimension_names
        zarr.create_array(
            str(plate / info.path),
            shape=array.shape,
            chunks=array.chunks,
            dtype=array.dtype,
            compressors=[ZstdCodec(level=1), Crc32cCodec()],
            dimension_names=names,
            attributes=attributes,
            overwrite=True,
        )[:] = data


@pytest.fixture(scope="module")
def plates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fuzz-plates")
    source = root / "ome-zarr"
    generate_plate(source, FUZZ_SPEC, LAYOUTS["tiles"] if "tiles" in LAYOUTS else LAYOUTS["default"], progress=False)
    convert_plate(source, root / "tiff", LAYOUTS["tiff"])
    convert_plate(source, root / "memmap", LAYOUTS["memmap"])
    shutil.copytree(source, root / "crc32c")
    _with_crc32c(root / "crc32c")
    return {name: root / name for name in ("ome-zarr", "tiff", "memmap", "crc32c")}


def _plate_cases() -> list[tuple[str, str, str]]:
    """(plate, file kind, mutation): every kind of file each plate holds, each mutation."""
    kinds = {
        "ome-zarr": ["zarr.json", "well zarr.json", "image zarr.json", "array zarr.json", "chunk", OBJECT_TABLE_NAME],
        "crc32c": ["chunk"],
        "tiff": ["cropbench_layout.json", "tif", OBJECT_TABLE_NAME],
        "memmap": ["cropbench_layout.json", "pixels", OBJECT_TABLE_NAME],
    }
    return [(plate, kind, how) for plate, names in kinds.items() for kind in names for how in MUTATIONS]


def _file_of(plate: Path, kind: str) -> Path:
    info = read_plate_metadata(plate).fields[-1]
    array = plate / info.path
    named = {
        "zarr.json": plate,
        "well zarr.json": array.parent.parent,
        "image zarr.json": array.parent,
        "array zarr.json": array,
    }
    if kind in named:
        return named[kind] / "zarr.json"
    if kind == "chunk":
        return sorted(p for p in (array / "c").rglob("*") if p.is_file())[-1]
    if kind in ("tif", "pixels"):
        return sorted(
            p
            for p in plate.rglob("*")
            if p.is_file() and (p.suffix in (".tif", ".tiff") if kind == "tif" else p.suffix == ".raw")
        )[-1]
    return plate / kind


def _assert_outcome(plate: Path, decodes: tuple[str, ...], reference: dict[str, list[np.ndarray]], strict: bool) -> str:
    outcomes = []
    for decode in decodes:
        try:
            crops = _crops(plate, decode)
        except CropbenchError as error:
            message = one_line(error)
            assert message and "\n" not in message
            outcomes.append("error")
            continue
        expected = reference[decode]
        assert len(crops) == len(expected)
        assert all(c.shape == e.shape and c.dtype == e.dtype for c, e in zip(crops, expected, strict=True))
        identical = all(np.array_equal(c, e) for c, e in zip(crops, expected, strict=True))
        assert identical or not strict, f"{decode}: silently different pixels"
        outcomes.append("identical" if identical else "different")
    return "/".join(outcomes)


@pytest.mark.parametrize(("name", "kind", "how"), _plate_cases(), ids=["-".join(c) for c in _plate_cases()])
def test_a_damaged_plate_file_is_an_error_or_the_same_crops(
    plates: dict[str, Path],
    tmp_path: Path,
    name: str,
    kind: str,
    how: str,
) -> None:
    decodes = DECODES["ome-zarr" if name == "crc32c" else name]
    reference = {decode: _crops(plates[name], decode) for decode in decodes}
    before = _snapshot(plates[name])
    plate = tmp_path / name
    shutil.copytree(plates[name], plate)
    _mutate(_file_of(plate, kind), how)
    damaged = _snapshot(plate)
    _assert_outcome(plate, decodes, reference, strict=name == "crc32c" and how != "delete")
    assert _snapshot(plate) == damaged and _snapshot(plates[name]) == before, "reading touches no file"


def _documents(plate: Path) -> list[Path]:
    return sorted(p for p in plate.rglob("*.json"))


@pytest.mark.parametrize("name", ["ome-zarr", "tiff"])
@pytest.mark.parametrize("text", BAD_JSON, ids=[f"json{i}" for i in range(len(BAD_JSON))])
def test_malformed_json_in_every_metadata_document_is_an_error_or_the_same_crops(
    plates: dict[str, Path],
    tmp_path: Path,
    name: str,
    text: str,
) -> None:
    decodes = DECODES[name]
    reference = {decode: _crops(plates[name], decode) for decode in decodes}
    plate = tmp_path / name
    shutil.copytree(plates[name], plate)
    for document in _documents(plate):
        original = document.read_bytes()
        document.write_text(text)
        _assert_outcome(plate, decodes, reference, strict=False)
        document.write_bytes(original)


def _record(case: str) -> Record:
    return Record(
        track="1", case=case, config={"crop": {"crop_size": 24}}, metrics={"samples_per_s": 10.0}, environment={}
    )


RESULTS_DAMAGE: dict[str, Callable[[bytes], bytes]] = {
    "truncate": lambda data: data[: len(data) // 2],
    "flip": lambda data: data[: len(data) // 3] + b"\x00" + data[len(data) // 3 + 1 :],
    "garbage line": lambda data: data + b"garbage\n",
    "non-object": lambda data: b"[1, 2]\n" + data,
    "metrics null": lambda data: (
        data + json.dumps({**json.loads(data.splitlines()[0]), "metrics": None}).encode() + b"\n"
    ),
    "other schema": lambda data: data + b'{"schema_version": 7}\n',
    "not utf-8": lambda data: data + b"\xff\xfe\n",
    "empty": lambda data: b"",
}


@pytest.mark.parametrize("command", ["summary", "export", "writer"])
@pytest.mark.parametrize("damage", sorted(RESULTS_DAMAGE))
def test_a_damaged_results_file_is_one_line_or_works(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    damage: str,
) -> None:
    out = tmp_path / "out"
    results = out / "results.jsonl"
    with RecordWriter(results) as writer:
        for case in "abc":
            writer.write(_record(case))
    results.write_bytes(RESULTS_DAMAGE[damage](results.read_bytes()))
    outside = _snapshot(tmp_path)
    capsys.readouterr()
    if command == "writer":
        try:
            with (
                pytest.warns(RuntimeWarning, match="torn") if damage == "truncate" else _no_warning(),
                RecordWriter(results) as writer,
            ):
                writer.write(_record("d"))
            code = 0
        except CropbenchError as error:
            code, message = 2, one_line(error)
            assert "\n" not in message
    else:
        args = {"summary": ["summary", str(results)], "export": ["export", str(results), "--csv", str(out / "x.csv")]}[
            command
        ]
        with pytest.warns(RuntimeWarning) if damage == "truncate" else _no_warning():
            code = main(args)
        err = capsys.readouterr().err.strip().splitlines()
        assert code in (0, 2)
        if code == 2:
            assert len(err) == 1 and err[0].startswith("cropbench: error:"), err
    changed = {k for k, v in _snapshot(tmp_path).items() if outside.get(k) != v}
    assert all(k.startswith("out/") for k in changed), f"touched outside the output: {changed}"
    if damage in ("garbage line", "non-object", "metrics null", "other schema", "not utf-8"):
        assert code == 2, "a bad line is an error, never skipped"


class _no_warning:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.mark.parametrize("where", ["results", "tiff plate", "memmap plate"])
def test_a_full_disk_is_one_line_and_leaves_no_partial_output(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    where: str,
) -> None:
    def full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    outside = _snapshot(tmp_path)
    if where == "results":
        results = tmp_path / "out" / "results.jsonl"
        with RecordWriter(results) as writer:
            writer.write(_record("a"))
            monkeypatch.setattr("os.fsync", full)
            with pytest.raises(CropbenchError, match="No space left"):
                writer.write(_record("b"))
            monkeypatch.undo()
        assert results.read_text().count("\n") == 1 and results.read_text().endswith("\n"), "no torn row"
        return
    import cropbench.formats.memmap as memmap_format
    import cropbench.formats.tiff as tiff_format

    if where == "tiff plate":
        monkeypatch.setattr(tiff_format.tifffile, "imwrite", full)
    else:
        monkeypatch.setattr(memmap_format.np, "memmap", full)
    layout = "tiff" if where == "tiff plate" else "memmap"
    code = main(
        [
            "generate",
            "--out",
            str(tmp_path / "out" / "p"),
            "--layout",
            layout,
            "--rows",
            "1",
            "--columns",
            "1",
            "--fields",
            "1",
            "--height",
            "64",
            "--width",
            "64",
            "--no-progress",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "No space left" in err[0], err
    assert not (tmp_path / "out" / "p").exists() and not [p for p in (tmp_path / "out").iterdir()]
    assert _snapshot(tmp_path) == outside
