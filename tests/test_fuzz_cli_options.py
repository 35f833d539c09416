"""Hostile command-line options, generated: the options of ``scale``, ``import`` and ``run`` given nan,
inf, negative, huge, empty and wrongly typed values, paths that climb out of their folder and store
URLs with credentials. Every case ends in one of:

- exit 2 with one ``cropbench: error:`` line (a usage error or a CropbenchError), or
- the command reaching its work (scale and run: the measuring itself is replaced by a stub that
  stops there, since only the options are under test) or, for ``import``, a plate whose pixels
  are the source's;

never a traceback, and a password never reaches what the command prints.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import tifffile
from test_importing import CHANNELS, FIELDS, _cellprofiler_columns, _pixels, _table, _write_named_tiffs

from cropbench import api
from cropbench.cli import main
from cropbench.formats import open_plate
from cropbench.formats.sources import is_url
from cropbench.plates import scale as scale_plates
from cropbench.plates.scale import check_fits_in_memory

#: The fuzz tier's fixed seed and cases per command.
SEED, CASES = 20261204, 60
PASSWORD = "hunter2-secret"
#: Values every option is tried with, beside its own valid ones.
HOSTILE = (
    "nan", "inf", "-inf", "-1", "0", "-0", "1e400", "99999999999999999999999", "", " ", "abc", "1.5", "0x10",
    "1e3", "--", "-",
)  # fmt: skip


class Reached(Exception):
    """The command got past its options to the work a stub replaces."""


def _generate_stub(path: Any, spec: Any, *_: Any, **__: Any) -> Any:
    check_fits_in_memory(spec)  # the one check generate_scale_plate makes before writing
    raise Reached


def _run_stub(plate: Any, *_: Any, **__: Any) -> Any:
    is_url(str(plate))  # the API's first check of a plate URL (a malformed one is a ConfigError)
    raise Reached


def _sweep_stub(*_: Any, **__: Any) -> Any:
    raise Reached


@pytest.fixture
def stubs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(scale_plates, "generate_scale_plate", _generate_stub)
    monkeypatch.setattr(api, "sweep_scale", _sweep_stub)
    monkeypatch.setattr(api, "compare_out_of_memory", _sweep_stub)
    monkeypatch.setattr(api, "run", _run_stub)
    inner = tmp_path / "a" / "b"
    inner.mkdir(parents=True)
    monkeypatch.chdir(inner)  # relative paths that climb ("../x") stay inside the test's folder


def _case(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run one case in this process: 'refused', 'reached' or 'succeeded'; anything else fails the test."""
    capsys.readouterr()
    try:
        code: Any = main(argv)
    except SystemExit as stop:  # argparse's usage errors
        code = stop.code
    except Reached:
        code = "reached"
    captured = capsys.readouterr()
    assert PASSWORD not in captured.out + captured.err, argv
    if code == "reached" or code == 0:
        return "reached" if code == "reached" else "succeeded"
    error = captured.err.strip()
    assert code == 2, (argv, code, captured.err)
    assert error.startswith("cropbench: error: ") and "\n" not in error, (argv, captured.err)
    return "refused"


def _mutated(rng: random.Random, base: list[str], options: dict[str, tuple[str, ...]]) -> list[str]:
    """``base`` with one to three of ``options`` given a hostile or valid value each."""
    argv = list(base)
    for option in rng.sample(sorted(options), rng.randint(1, min(3, len(options)))):
        pool = options[option] + HOSTILE
        argv += [f"{option}={rng.choice(pool)}"]
    return argv


SIZES = ("64", "100", "16384", "16385", "300000")
FIELD_KNOBS = {
    "--field-size": SIZES,
    "--channels": ("1", "8", "9"),
    "--distinct-fields": ("0", "1", "100000"),
    "--seed": ("0", "4294967295", "4294967296", "-1"),
}
SCALE_COMMANDS: dict[str, tuple[list[str], dict[str, tuple[str, ...]]]] = {
    "generate": (
        ["scale", "generate", "--out", "../p.zarr", "--objects", "10", "--no-progress"],
        {**FIELD_KNOBS, "--objects": ("1", "2e6", "2000001"), "--layout": ("tiles", "nope"), "--out": ("../../x",)},
    ),
    "sweep": (
        ["scale", "sweep", "--out", "../out", "--work", "../work", "--no-progress"],
        {
            **FIELD_KNOBS,
            "--objects": ("10", "1e6"),
            "--crop-size": ("1", "96", "20000"),
            "--samples": ("1", "10"),
            "--workers": ("0", "256", "257"),
            "--work": ("../../w", "/nonexistent/w"),
        },
    ),
    "out-of-memory": (
        ["scale", "out-of-memory", "--out", "../out", "--work", "../work", "--no-progress"],
        {
            **FIELD_KNOBS,
            "--limit-mib": ("64", "1024", "1e9"),
            "--plate-multiple": ("2", "8", "9", "nan", "inf"),
            "--crop-size": ("1", "96"),
            "--layouts": ("default", "nope"),
        },
    ),
}


@pytest.mark.parametrize("command", sorted(SCALE_COMMANDS))
def test_scale_options_end_in_one_line_or_reach_the_work(
    command: str, stubs: None, capsys: pytest.CaptureFixture[str]
) -> None:
    base, options = SCALE_COMMANDS[command]
    rng = random.Random(f"{SEED}-{command}")
    outcomes = Counter(_case(_mutated(rng, base, options), capsys) for _ in range(CASES))
    assert outcomes["refused"] and outcomes["reached"], outcomes
    print(f"scale {command}: {CASES} inputs, {dict(outcomes)}, 0 crashes")


RUN_OPTIONS: dict[str, tuple[str, ...]] = {
    "--plate": (
        ".",
        "../..",
        "/nonexistent",
        f"http://reader:{PASSWORD}@127.0.0.1:1/p.zarr",
        f"http://reader:{PASSWORD}@127.0.0.1:notaport/p.zarr",
        f"s3://reader:{PASSWORD}@bucket/p.zarr",
        "s3://",
        "http://[::1/p.zarr",
    ),
    "--samples": ("1", "100"),
    "--repeats": ("1", "3"),
    "--torch-threads": ("0", "2"),
    "--crop-size": ("1", "96"),
    "--chunk-cache-bytes": ("0", "1000000"),
    "--decode-threads": ("1", "4"),
    "--in-flight": ("1", "16"),
    "--coalesce-gap": ("0", "4096"),
    "--timeout": ("0.5", "3600", "3601"),
    "--connect-timeout": ("1",),
    "--retries": ("0", "3"),
    "--latency-ms": ("0", "5"),
    "--objects": ("../../cells.parquet", "/nonexistent.parquet"),
    "--track": ("1", "2", "9"),
    "--preset": ("smoke", "nope"),
}


def test_run_options_end_in_one_line_or_reach_the_work(stubs: None, capsys: pytest.CaptureFixture[str]) -> None:
    rng = random.Random(f"{SEED}-run")
    base = ["run", "--plate", ".", "--out", "../out", "--no-progress"]
    outcomes = Counter(_case(_mutated(rng, base, RUN_OPTIONS), capsys) for _ in range(CASES))
    assert outcomes["refused"] and outcomes["reached"], outcomes
    print(f"run: {CASES} inputs, {dict(outcomes)}, 0 crashes")


IMPORT_OPTIONS: dict[str, tuple[str, ...]] = {
    "--plane": ("1", "2"),
    "--pixel-size": ("0.65", "-1", "nan"),
    "--chunk": ("0", "32", "-5"),
    "--clevel": ("1", "9", "10"),
    "--shard": ("-1", "0", "64", "-2"),
    "--channels-per-chunk": ("0", "1", "4"),
    "--channel": ("DNA", "ER=er", "nope", "=x", "DNA="),
    "--label": ("Metadata_Well", "nope"),
    "--compartment": ("Nuclei", "Cells", "nope"),
    "--name": ("plate", "a b", "../x"),
    "--layout": ("default", "tiles", "tiff-zlib", "nope"),
    "--table": ("../../cells.parquet", "../../escaping.parquet", "../../absolute.parquet", "/nonexistent"),
}


def _import_inputs(root: Path) -> None:
    """The image folder and tables: one well formed, one naming ``../outside.tif``, one an absolute path."""
    names = _write_named_tiffs(root / "images")
    tifffile.imwrite(root / "outside.tif", _pixels(0, 0))
    pq.write_table(_table(_cellprofiler_columns(names)), root / "cells.parquet")
    for table, outside in (("escaping", "../outside.tif"), ("absolute", str(root / "outside.tif"))):
        escaping = {**names, (len(FIELDS) - 1, "ER"): outside}
        pq.write_table(_table(_cellprofiler_columns(escaping)), root / f"{table}.parquet")


def _same_pixels(plate: Path, argv: list[str]) -> bool:
    """The imported plate's first field holds the source TIFFs' pixels (of the channels imported)."""
    chosen = [value.split("=", 1)[1] for value in argv if value.startswith("--channel=")]
    sources = [name.partition("=")[0] for name in chosen] or list(CHANNELS)
    expected = np.stack([_pixels(0, CHANNELS.index(name)) for name in sources])
    reader = open_plate(plate, "direct")
    try:
        return bool(np.array_equal(reader.read_field(0), expected))
    finally:
        reader.close()


def test_import_options_end_in_one_line_or_import_the_source_exactly(
    stubs: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _import_inputs(tmp_path)
    rng = random.Random(f"{SEED}-import")
    outcomes: Counter[str] = Counter()
    for number in range(CASES):
        out = tmp_path / f"plate-{number}"
        base = ["import", "--table", "../../cells.parquet", "--images", "../../images", "--out", str(out)]
        argv = _mutated(rng, [*base, "--no-progress"], IMPORT_OPTIONS)
        outcome = _case(argv, capsys)
        if outcome == "succeeded":
            assert _same_pixels(out, argv), argv
            outcome = "correct reads"
        else:
            assert not out.exists(), argv
        outcomes[outcome] += 1
    assert outcomes["refused"] and outcomes["correct reads"], outcomes
    print(f"import: {CASES} inputs, {dict(outcomes)}, 0 crashes")
