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

import dataclasses
import errno
import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import FUZZ_SPEC, slow_fuzz_seed

from cropbench.cli import main, one_line
from cropbench.config import LAYOUTS, CropConfig
from cropbench.data.dataset import CropDataset
from cropbench.errors import CropbenchError
from cropbench.formats import read_plate_metadata
from cropbench.objects import OBJECT_TABLE_NAME
from cropbench.plates.convert import convert_plate
from cropbench.plates.generate import generate_plate
from cropbench.records import Record, RecordWriter

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
        track="dataset", case=case, config={"crop": {"crop_size": 24}}, metrics={"samples_per_s": 10.0}, environment={}
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


# --- TIFF strips, generated -----------------------------------------------------------------------

#: TIFF tags a strip fuzz case may rewrite, and the values it draws from (beside random ones).
STRIP_TAGS = ("StripByteCounts", "StripOffsets", "RowsPerStrip", "ImageWidth", "ImageLength", "BitsPerSample")
EDGE_VALUES = (0, 1, 63, 64, 65, 4095, 8192, 8193, 2**16 - 1, 2**31, 2**32 - 1)
#: Fixed-seed cases in the fast tier, and randomized ones in the slow tier.
FAST_CASES, SLOW_CASES = 40, 400


class _ReadGuard:
    """Records every read larger than ``limit`` bytes (os.pread, tifffile's reads) instead of failing it:
    an AssertionError raised inside a reader could be turned into a typed error and hide the read."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, limit: int) -> None:
        import os

        import tifffile

        self.too_large: list[int] = []
        real_pread, real_read = os.pread, tifffile.FileHandle.read

        def pread(fd: int, length: int, offset: int) -> bytes:
            if length > limit:
                self.too_large.append(length)
                length = limit
            return real_pread(fd, length, offset)

        def read(handle: Any, size: int = -1) -> bytes:
            if size > limit:
                self.too_large.append(size)
                size = limit
            return real_read(handle, size)

        monkeypatch.setattr(os, "pread", pread)
        monkeypatch.setattr(tifffile.FileHandle, "read", read)


def _strip_case(rng: np.random.Generator, path: Path) -> str:
    """Damage one channel file's strips: a tag rewritten, strip bytes overwritten, or the file cut."""
    import tifffile

    what = rng.choice(["tag", "bytes", "cut"])
    if what == "tag":
        name = str(rng.choice(STRIP_TAGS))
        with tifffile.TiffFile(path, mode="r+b") as tiff:
            tag = tiff.pages.first.tags.get(name)
            if tag is None:
                return f"{name} absent"
            count = tag.count
            value = int(rng.choice(EDGE_VALUES)) if rng.random() < 0.6 else int(rng.integers(0, 2**32))
            if name == "BitsPerSample":
                value = int(rng.choice([1, 7, 8, 12, 16, 32, 64]))
            tag.overwrite((value,) * count if count > 1 else value, dtype="I" if value > 65535 else None)
        return f"{name}={value}"
    if what == "bytes":
        with tifffile.TiffFile(path) as tiff:
            offset, size = int(tiff.pages.first.dataoffsets[0]), int(tiff.pages.first.databytecounts[0])
        data = bytearray(path.read_bytes())
        start = offset + int(rng.integers(0, max(size, 1)))
        length = int(rng.integers(1, 64))
        data[start : start + length] = rng.integers(0, 256, length, dtype=np.uint8).tobytes()
        path.write_bytes(bytes(data))
        return f"bytes {start}+{length}"
    data = path.read_bytes()
    keep = int(rng.integers(0, len(data)))
    path.write_bytes(data[:keep])
    return f"cut at {keep}"


def _fuzz_strips(
    plates: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int, cases: int
) -> dict[str, int]:
    import time

    rng = np.random.default_rng(seed)
    decodes = ("direct", "field", "zarr")
    references = {name: {decode: _crops(plates[name], decode) for decode in decodes} for name in ("tiff", "tiff-zlib")}
    plane_bytes = FUZZ_SPEC.field_height * FUZZ_SPEC.field_width * 2
    counts = {"cases": 0, "typed errors": 0, "correct reads": 0, "different pixels": 0}
    started = time.perf_counter()
    for number in range(cases):
        name = str(rng.choice(["tiff", "tiff-zlib"]))
        plate = tmp_path / f"case{number}"
        shutil.copytree(plates[name], plate)
        files = sorted((plate / "images").iterdir())
        what = _strip_case(rng, files[int(rng.integers(0, len(files)))])
        with monkeypatch.context() as patch:
            guard = _ReadGuard(patch, limit=max(2 * plane_bytes + 4096, files[0].stat().st_size))
            outcome = _assert_outcome(plate, decodes, references[name], strict=False)
        assert not guard.too_large, f"case {number} ({name}, {what}): reads of {guard.too_large} bytes"
        counts["cases"] += 1
        for result in outcome.split("/"):
            key = {"error": "typed errors", "identical": "correct reads", "different": "different pixels"}[result]
            counts[key] += 1
        shutil.rmtree(plate)
    print(
        f"\nfuzz TIFF strips (seed {seed}): {counts} reads over {cases} cases in {time.perf_counter() - started:.1f} s"
    )
    return counts


@pytest.fixture(scope="module")
def strip_plates(plates: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fuzz-strips")
    zlib_plate = convert_plate(plates["ome-zarr"], root / "tiff-zlib", LAYOUTS["tiff-zlib"]).path
    return {"tiff": plates["tiff"], "tiff-zlib": zlib_plate}


def test_damaged_tiff_strips_are_typed_errors_or_crops_of_the_right_shape_read_within_bounds(
    strip_plates: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counts = _fuzz_strips(strip_plates, tmp_path, monkeypatch, seed=0, cases=FAST_CASES)
    assert counts["cases"] == FAST_CASES and counts["typed errors"] > 0 and counts["correct reads"] > 0


@pytest.mark.slow
def test_damaged_tiff_strips_randomized(
    strip_plates: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fuzz_strips(strip_plates, tmp_path, monkeypatch, seed=slow_fuzz_seed(), cases=SLOW_CASES)


# --- HTTP and S3 sources, generated -------------------------------------------------------------

#: What a hostile server answers: each mode is drawn per case.
SERVER_MODES = (
    "ok",
    "status",
    "drip",
    "stall",
    "short",
    "close",
    "wrong range",
    "garbage listing",
    "looping listing",
    "traversing keys",
)
#: The object every case asks for, as the honest server holds it.
OBJECT = bytes(range(256)) * 4
#: Seconds each request attempt may take in the fuzz cases.
FUZZ_TIMEOUT_S = 0.25


def _server(state: Any, mode: str, rng: np.random.Generator) -> None:
    """Set ``state.respond`` for ``mode``."""
    from test_sources import drip, listing, send

    status = int(rng.choice([400, 401, 403, 404, 416, 418, 500, 503]))
    keys = ["zarr.json", str(rng.choice(["../up.json", "/abs.json", "a/../../up.json", "a//b.json", "."]))]

    def respond(handler: Any) -> None:
        path = handler.path
        if "list-type=2" in path:
            if mode == "garbage listing":
                return send(200, rng.integers(0, 256, int(rng.integers(0, 64)), dtype=np.uint8).tobytes())(handler)
            if mode == "looping listing":
                return send(200, listing(["zarr.json"], token="same"))(handler)
            return send(200, listing(keys if mode == "traversing keys" else ["zarr.json"]))(handler)
        if path.endswith("cropbench_index.json"):
            names = keys if mode == "traversing keys" else ["zarr.json"]
            return send(200, json.dumps({"objects": [[k, 4] for k in names]}).encode())(handler)
        if mode == "status":
            return send(status, b"<Error><Code>Nope</Code></Error>")(handler)
        if mode == "drip":
            return drip(state, interval_s=0.1)(handler)
        if mode == "stall":
            handler.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n")
            handler.wfile.flush()
            state.stop.wait(5.0)
            return None
        if mode == "close":
            handler.close_connection = True
            return None
        body = OBJECT
        start, end = 0, len(OBJECT)
        ranged = handler.headers.get("Range", "")
        if ranged.startswith("bytes=-"):
            start = max(0, len(OBJECT) - int(ranged[7:]))
        elif ranged.startswith("bytes="):
            first, _, last = ranged[6:].partition("-")
            start, end = int(first), min(int(last) + 1, len(OBJECT))
        body = OBJECT[start:end]
        if mode == "wrong range" and ranged:  # (a whole object of another size is not detectably wrong)
            body = body[: len(body) // 2]
        if mode == "short":
            handler.send_response(206 if ranged else 200)
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            handler.wfile.write(body[: len(body) // 2])
            handler.close_connection = True
            return None
        return send(206 if ranged else 200, body)(handler)

    state.respond = respond


def _source_case(rng: np.random.Generator, endpoint: str, tmp_path: Path) -> tuple[str, Callable[[], Any], Any]:
    """(what, the call, its correct result) for one drawn operation on one drawn source."""
    from cropbench.config import StoreConfig
    from cropbench.formats.sources import RemoteSource, mirror_metadata

    retries = int(rng.integers(0, 2))
    s3 = bool(rng.integers(0, 2))
    config = StoreConfig(timeout_s=FUZZ_TIMEOUT_S, retries=retries, in_flight=int(rng.integers(1, 4)))
    if s3:
        url, config = "s3://bucket/plate", dataclasses.replace(config, endpoint=endpoint, anonymous=True)
    else:
        url = endpoint.replace("http://", "http://user:s3cr3t@") + "/plate"
    source = RemoteSource(url, config)
    start, length = int(rng.integers(0, len(OBJECT))), int(rng.integers(1, 300))
    length = min(length, len(OBJECT) - start)
    operation = str(rng.choice(["get", "range", "suffix", "many", "mirror"]))
    calls: dict[str, tuple[Callable[[], Any], Any]] = {
        "get": (lambda: source.get("zarr.json"), OBJECT),
        "range": (lambda: source.get_range("zarr.json", start, length), OBJECT[start : start + length]),
        "suffix": (lambda: source.get_suffix("zarr.json", length), OBJECT[-length:]),
        "many": (
            lambda: source.get_many([("zarr.json", start, length), ("zarr.json", 0, -1)]),
            [OBJECT[start : start + length], OBJECT],
        ),
        "mirror": (lambda: mirror_metadata(url, config, cache_dir=tmp_path / "cache").name, None),
    }
    call, expected = calls[operation]
    return f"{'s3' if s3 else 'http'} {operation} retries={retries}", call, expected


def _fuzz_sources(tmp_path: Path, seed: int, cases: int) -> dict[str, int]:
    import time

    from test_sources import Hostile, serve

    rng = np.random.default_rng(seed)
    counts = {"cases": 0, "typed errors": 0, "correct reads": 0}
    started = time.perf_counter()
    for number in range(cases):
        mode = str(rng.choice(SERVER_MODES))
        state = Hostile()
        _server(state, mode, rng)
        with serve(state) as endpoint:
            what, call, expected = _source_case(rng, endpoint, tmp_path / f"case{number}")
            retries = int(what.rsplit("=", 1)[1])
            began = time.perf_counter()
            try:
                result = call()
            except CropbenchError as error:
                message = one_line(error)
                assert "\n" not in message and "s3cr3t" not in message, f"case {number} ({mode}, {what}): {message}"
                counts["typed errors"] += 1
            else:
                correct = expected is None or result == expected or (mode == "status" and result is None)
                assert correct, f"case {number} ({mode}, {what}): a wrong answer read as right: {result!r:.80}"
                counts["correct reads"] += 1
            elapsed = time.perf_counter() - began
            # 'many' and 'mirror' make two requests one after the other; each has its own deadline.
            limit = 2 * (retries + 1) * FUZZ_TIMEOUT_S + 1.0
            assert elapsed < limit, f"case {number} ({mode}, {what}): {elapsed:.2f} s, over {limit:.2f} s"
            escaped = [p for p in tmp_path.rglob("*.json") if "cache" not in p.relative_to(tmp_path).parts[1:2]]
            assert not escaped, f"case {number} ({mode}, {what}): wrote {escaped}"
        counts["cases"] += 1
    print(f"\nfuzz HTTP/S3 sources (seed {seed}): {counts} in {time.perf_counter() - started:.1f} s")
    return counts


def test_hostile_servers_end_in_typed_errors_or_correct_bytes_within_the_deadline(tmp_path: Path) -> None:
    counts = _fuzz_sources(tmp_path, seed=0, cases=FAST_CASES)
    assert counts["cases"] == FAST_CASES and counts["typed errors"] > 0 and counts["correct reads"] > 0


@pytest.mark.slow
def test_hostile_servers_randomized(tmp_path: Path) -> None:
    _fuzz_sources(tmp_path, seed=slow_fuzz_seed(), cases=SLOW_CASES)
