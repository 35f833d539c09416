"""Bad input gets a typed error naming the thing at fault; interrupted runs keep every finished row;
failing workers surface as errors within a bounded time; memory does not grow without bound."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch.utils.data import Dataset

from cropbench.config import CropConfig, LayoutSpec, PlateSpec, layout_by_name, plate_preset
from cropbench.data.dataset import CropDataset
from cropbench.data.loader import LoaderSpec, build_loader
from cropbench.data.sampling import RandomObjectSampler
from cropbench.errors import ConfigError, CropbenchError, ObjectTableError, OutputError, StoreError
from cropbench.formats import open_plate, read_plate_metadata
from cropbench.measure.protocol import rss_bytes
from cropbench.objects import ObjectTable
from cropbench.records import RecordWriter, read_records
from cropbench.tracks.dataset import preset_cases


def _table(plate: Path, **columns: Any) -> ObjectTable:
    base: dict[str, Any] = {
        "well": np.array(["A1"]),
        "field": np.array([0]),
        "centroid_y": np.array([50.0]),
        "centroid_x": np.array([50.0]),
    }
    base.update(columns)
    return ObjectTable.from_columns(**base)


def _parquet_without(tmp: Path, column: str) -> Path:
    data = {"object_id": [1], "well": ["A1"], "field": [0], "centroid_y": [5.0], "centroid_x": [5.0]}
    del data[column]
    path = tmp / f"objects-without-{column}.parquet"
    pq.write_table(pa.table(data), str(path))
    return path


def _corrupt_copy(plate: Path, tmp: Path) -> Path:
    copy = tmp / "corrupt.zarr"
    shutil.copytree(plate, copy)
    shard = copy / read_plate_metadata(copy).fields[0].path / "c" / "0" / "0" / "0"
    data = bytearray(shard.read_bytes())
    data[16:400] = bytes(384)
    shard.write_bytes(bytes(data))
    return copy


#: (case id, call, expected error type, fragment the message must contain)
API_CASES: list[tuple[str, Callable[[Path, Path], Any], type[Exception], str]] = [
    ("missing store", lambda p, t: read_plate_metadata(t / "missing.zarr"), StoreError, "missing.zarr"),
    ("non-plate store", lambda p, t: read_plate_metadata(t), StoreError, "not a zarr group"),
    ("unknown decode path", lambda p, t: open_plate(p, "gpu"), ConfigError, "decode='gpu'"),
    ("unknown channel", lambda p, t: CropDataset(p, CropConfig(channels=("Actin",))), ConfigError, "Actin"),
    ("duplicate channel", lambda p, t: CropDataset(p, CropConfig(channels=("DNA", "0"))), ConfigError, "twice"),
    ("wrong dtype", lambda p, t: CropConfig(dtype="int8"), ConfigError, "dtype='int8'"),
    ("unknown tier", lambda p, t: CropConfig(tier="heavy"), ConfigError, "tier='heavy'"),
    ("zero crop", lambda p, t: CropConfig(crop_size=0), ConfigError, "crop_size"),
    ("uint16 with normalising tier", lambda p, t: CropConfig(tier="light", dtype="uint16"), ConfigError, "float"),
    ("crop larger than field", lambda p, t: CropDataset(p, CropConfig(crop_size=4096)), ConfigError, "4096"),
    ("missing field", lambda p, t: CropDataset(p, objects=_table(p, well=np.array(["H9"]))), ObjectTableError, "H9"),
    ("NaN centroid", lambda p, t: _table(p, centroid_y=np.array([np.nan])), ObjectTableError, "NaN"),
    (
        "centroid outside field",
        lambda p, t: CropDataset(p, objects=_table(p, centroid_x=np.array([9999.0]))),
        ObjectTableError,
        "outside",
    ),
    (
        "table without centroid_x",
        lambda p, t: CropDataset(p, objects=_parquet_without(t, "centroid_x")),
        ObjectTableError,
        "centroid_x",
    ),
    (
        "empty selection",
        lambda p, t: CropDataset(
            p, CropConfig(crop_size=64, border="drop"), objects=_table(p, centroid_y=np.array([1.0]))
        ),
        ObjectTableError,
        "no object",
    ),
    (
        "corrupt chunk",
        lambda p, t: open_plate(_corrupt_copy(p, t), "direct").read_region(0, 0, 8, 0, 8),
        StoreError,
        "A/1/0/0",
    ),
    ("negative workers", lambda p, t: LoaderSpec(num_workers=-1), ConfigError, "num_workers"),
    ("zero batch", lambda p, t: LoaderSpec(batch_size=0), ConfigError, "batch_size"),
    ("negative timeout", lambda p, t: LoaderSpec(timeout_s=-1), ConfigError, "timeout_s"),
    ("unknown preset", lambda p, t: plate_preset("huge"), ConfigError, "preset='huge'"),
    ("unknown track preset", lambda p, t: preset_cases("huge"), ConfigError, "huge"),
    ("unknown layout", lambda p, t: layout_by_name("zip"), ConfigError, "layout='zip'"),
    ("unknown codec", lambda p, t: LayoutSpec(codec="lzma"), ConfigError, "'lzma'"),
    ("shard not a chunk multiple", lambda p, t: LayoutSpec(chunk_yx=64, shard_yx=100), ConfigError, "multiple"),
    ("too many channels", lambda p, t: PlateSpec(channels=12), ConfigError, "channels"),
    ("unwritable output", lambda p, t: RecordWriter("/proc/cropbench/results.jsonl"), OutputError, "/proc/cropbench"),
]


@pytest.mark.parametrize(
    ("call", "error", "fragment"), [case[1:] for case in API_CASES], ids=[case[0] for case in API_CASES]
)
def test_bad_input_raises_a_typed_error_naming_the_culprit(
    tiny_plate: Path,
    tmp_path: Path,
    call: Callable[[Path, Path], Any],
    error: type[Exception],
    fragment: str,
) -> None:
    with pytest.raises(error) as raised:
        call(tiny_plate, tmp_path)
    assert isinstance(raised.value, CropbenchError)
    assert fragment in str(raised.value)


def _cropbench(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cropbench", *args], capture_output=True, text=True, check=False, **kwargs
    )


CLI_CASES = [
    ("missing plate", ["run", "--plate", "{tmp}/missing.zarr", "--out", "{tmp}/out"]),
    ("not a plate", ["run", "--plate", "{tmp}", "--out", "{tmp}/out"]),
    ("unknown track", ["run", "--plate", "{plate}", "--track", "9", "--out", "{tmp}/out"]),
    ("zero repeats", ["run", "--plate", "{plate}", "--repeats", "0", "--out", "{tmp}/out"]),
    ("zero samples", ["run", "--plate", "{plate}", "--samples", "0", "--out", "{tmp}/out"]),
    ("unwritable output directory", ["run", "--plate", "{plate}", "--out", "/proc/cropbench-out"]),
    ("zero channels", ["generate", "--out", "{tmp}/p.zarr", "--channels", "0"]),
    ("negative ram fraction", ["generate", "--out", "{tmp}/p.zarr", "--ram-fraction", "-1"]),
    ("existing plate", ["generate", "--out", "{plate}"]),
    ("missing results", ["plot", "{tmp}/none.jsonl"]),
]


@pytest.mark.slow
@pytest.mark.parametrize("args", [case[1] for case in CLI_CASES], ids=[case[0] for case in CLI_CASES])
def test_cli_bad_input_exits_2_with_one_line(tiny_plate: Path, tmp_path: Path, args: list[str]) -> None:
    result = _cropbench(*(a.format(tmp=tmp_path, plate=tiny_plate) for a in args))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cropbench: error:"), result.stderr


@pytest.mark.parametrize(
    "args", [["run", "--plate", "x", "--preset", "huge"], ["generate", "--out", "x", "--codec", "lzma"]]
)
def test_cli_unknown_choices_exit_2_naming_the_choice(args: list[str]) -> None:
    result = _cropbench(*args)
    assert result.returncode == 2 and "invalid choice" in result.stderr and "Traceback" not in result.stderr


def _wait_for_rows(path: Path, rows: int, process: subprocess.Popen[str], limit_s: float = 120) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and process.poll() is None:
        if path.exists() and path.read_text().count("\n") >= rows:
            return
        time.sleep(0.05)
    raise AssertionError(f"no {rows} rows in {path} (process exit {process.poll()})")


@pytest.mark.slow
@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_interrupted_run_keeps_finished_rows_and_resume_completes(
    tiny_plate: Path,
    tmp_path: Path,
    signal_number: int,
) -> None:
    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "cropbench",
        "run",
        "--plate",
        str(tiny_plate),
        "--out",
        str(out),
        "--samples",
        "200",
        "--no-progress",
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    results = out / "results.jsonl"
    _wait_for_rows(results, 2, process)
    process.send_signal(signal_number)
    process.wait(timeout=60)
    if signal_number == signal.SIGINT:
        assert process.returncode == 130
        assert "interrupted" in (process.stderr.read() if process.stderr else "")
    lines = results.read_text().splitlines()
    assert all(json.loads(line)["metrics"]["count"] == 200 for line in lines), "every kept row is complete"
    finished = len(lines)
    cases = len(preset_cases("smoke"))
    assert 2 <= finished < cases
    resumed = _cropbench(*command[3:], "--resume")
    assert resumed.returncode == 0, resumed.stderr
    records = read_records(results)
    assert len(records) == cases and len({r.key for r in records}) == cases, "resume skips, never repeats"


class _Misbehaving(Dataset[Any]):
    """Hangs or crashes in worker processes; fine in the main process."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.parent = os.getpid()

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> dict[str, Any]:
        if os.getpid() != self.parent:
            if self.mode == "hang":
                time.sleep(600)
            os._exit(3)
        return {"image": torch.zeros(1)}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["hang", "crash"])
def test_a_failing_worker_surfaces_as_an_error_within_the_timeout(mode: str) -> None:
    spec = LoaderSpec(num_workers=1, batch_size=2, timeout_s=3)
    loader = build_loader(_Misbehaving(mode), spec, RandomObjectSampler(8, seed=0))
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="timed out|exited unexpectedly"):
        next(iter(loader))
    assert time.monotonic() - started < 60, "bounded by the DataLoader timeout, not a silent hang"


@pytest.mark.slow
def test_ten_thousand_samples_do_not_grow_memory_without_bound(tiny_plate: Path) -> None:
    dataset = CropDataset(tiny_plate, CropConfig(crop_size=48, tier="typical"))
    order = np.random.default_rng(0).integers(0, len(dataset), 12_000)
    for index in order[:2_000]:
        dataset[int(index)]
    before = rss_bytes()
    for index in order[2_000:]:
        dataset[int(index)]
    growth = rss_bytes() - before
    assert growth < 64 * 2**20, f"RSS grew by {growth / 2**20:.1f} MiB over 10,000 samples"


def _with_crc32c(plate: Path, tmp: Path) -> Path:
    """A copy whose field arrays carry zarr's crc32c codec, as plates written by other tools do."""
    import zarr
    from zarr.codecs import Crc32cCodec, ZstdCodec

    copy = tmp / "crc32c.zarr"
    shutil.copytree(plate, copy)
    for info in read_plate_metadata(copy).fields:
        array = zarr.open_array(str(copy / info.path), mode="r")
        data, attributes, names = array[:], dict(array.attrs), array.metadata.dimension_names
        rewritten = zarr.create_array(
            str(copy / info.path),
            shape=array.shape,
            chunks=array.chunks,
            dtype=array.dtype,
            compressors=[ZstdCodec(level=1), Crc32cCodec()],
            dimension_names=names,
            attributes=attributes,
            overwrite=True,
        )
        rewritten[:] = data
    return copy


@pytest.mark.parametrize("decode", ["direct", "field"])
def test_crc32c_is_verified_on_the_direct_paths(tiny_plate: Path, tmp_path: Path, decode: str) -> None:
    plate = _with_crc32c(tiny_plate, tmp_path)
    expected = open_plate(tiny_plate, "zarr").read_region(0, 0, 200, 0, 240)
    assert np.array_equal(open_plate(plate, decode).read_region(0, 0, 200, 0, 240), expected)
    chunk = next(p for p in (plate / read_plate_metadata(plate).fields[0].path / "c").rglob("*") if p.is_file())
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x01  # still a valid zstd frame length-wise; only the checksum can tell
    chunk.write_bytes(bytes(data))
    with pytest.raises(StoreError, match=r"chunk .* of A/1/0/0 .*(crc32c|corrupt)"):
        open_plate(plate, decode).read_region(0, 0, 200, 0, 240)


def test_a_plate_whose_fields_differ_in_shape_is_refused_up_front(tiny_plate: Path, tmp_path: Path) -> None:
    import zarr

    copy = tmp_path / "mixed.zarr"
    shutil.copytree(tiny_plate, copy)
    path = copy / read_plate_metadata(copy).fields[1].path
    array = zarr.open_array(str(path), mode="r")
    smaller = zarr.create_array(
        str(path),
        shape=(*array.shape[:-2], 100, 100),
        chunks=array.chunks,
        dtype=array.dtype,
        dimension_names=array.metadata.dimension_names,
        attributes=dict(array.attrs),
        overwrite=True,
    )
    smaller[:] = 1
    with pytest.raises(StoreError, match=r"shape .*100, 100.*first field"):
        read_plate_metadata(copy)


@pytest.mark.parametrize(
    ("column", "values", "fragment"),
    [
        ("field", [0.5], "whole number"),
        ("field", [None], "null"),
        ("centroid_y", ["abc"], "needs numbers"),
        ("centroid_x", [1.0, None], "None"),
    ],
)
def test_object_tables_have_strict_types(tmp_path: Path, column: str, values: list[Any], fragment: str) -> None:
    from cropbench.objects import read_object_table

    rows = len(values)
    data: dict[str, list[Any]] = {
        "object_id": list(range(rows)),
        "well": ["A1"] * rows,
        "field": [0] * rows,
        "centroid_y": [5.0] * rows,
        "centroid_x": [5.0] * rows,
    }
    data[column] = values
    path = tmp_path / "objects.parquet"
    pq.write_table(pa.table(data), str(path))
    with pytest.raises(ObjectTableError, match=rf"{column}.*{fragment}"):
        read_object_table(path)


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
@pytest.mark.parametrize("layout", ["default", "tiles"])
@pytest.mark.parametrize("decode", ["direct", "field", "zarr"])
def test_a_chunk_or_shard_that_is_not_a_regular_file_is_refused_not_read(
    tiny_plate: Path, tmp_path: Path, decode: str, layout: str, kind: str
) -> None:
    from conftest import TEST_LAYOUTS, TINY_SPEC
    from test_sources import bounded, make_special

    from cropbench.plates.generate import generate_plate

    if layout == "default":
        plate = Path(shutil.copytree(tiny_plate, tmp_path / "p.zarr"))
    else:
        plate = generate_plate(tmp_path / "p.zarr", TINY_SPEC, TEST_LAYOUTS[layout], progress=False).path
    chunk = make_special(plate / read_plate_metadata(plate).fields[0].path / "c" / "0" / "0" / "0", kind)
    error, _ = bounded(
        lambda: open_plate(plate, decode).read_region(0, 0, 50, 0, 50), 5.0, release=chunk if kind == "fifo" else None
    )
    assert isinstance(error, StoreError) and "not a regular file" in str(error), repr(error)
    assert "\n" not in str(error)
