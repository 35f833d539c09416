"""scripts/prefetch_bench.py's readers: named by their read-ahead, any depth, bytes in flight and
threads; a name it cannot read is refused in one line before a server starts."""

from __future__ import annotations

from types import ModuleType

import pytest
from conftest import script_module

from cropbench import metrics as m
from cropbench.config import PrefetchConfig
from cropbench.harness.validity import CACHE_HOLDS_PLATE_FLAG

MIB = 2**20


def _script() -> ModuleType:
    return script_module("prefetch_bench")


def test_a_reader_name_is_its_read_ahead() -> None:
    script = _script()
    assert script.store_reader("store") == PrefetchConfig(batches=0)
    assert script.store_reader("store+ahead2/64MiB") == PrefetchConfig(batches=2, bytes_in_flight=64 * MIB)
    assert script.store_reader("store+ahead8/256MiB/6threads") == PrefetchConfig(
        batches=8, bytes_in_flight=256 * MIB, threads=6
    )
    assert all(script.store_reader(name) for name in script.DEFAULT_READERS)


@pytest.mark.parametrize(
    "name", ["local", "store+ahead0/64MiB", "store+ahead2", "store+ahead2/64MB", "store+ahead2/64MiB/0threads", ""]
)
def test_a_reader_it_cannot_read_is_one_line_naming_it(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    script = _script()
    with pytest.raises(ValueError, match="is not a reader"):
        script.store_reader(name)
    with pytest.raises(SystemExit) as exit_info:
        script.main(["--plate", "absent.zarr", "--out", "absent.jsonl", "--readers", name])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--readers" in error and repr(name) in error


@pytest.mark.parametrize(
    ("option", "values"),
    [
        ("--coalesce-gap-kib", ["-1"]),
        ("--coalesce-gap-kib", ["64", "64"]),
        ("--in-flight", ["0"]),
        ("--in-flight", ["16", "16"]),
    ],
)
def test_settings_it_cannot_measure_are_one_line(
    option: str, values: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _script().main(["--plate", "absent.zarr", "--out", "absent.jsonl", option, *values])
    assert exit_info.value.code == 2
    assert option in capsys.readouterr().err.strip().splitlines()[-1]


def test_a_row_whose_reader_held_the_plate_in_its_cache_says_so() -> None:
    script = _script()
    measured = script.Measured(rates=[100.0], round_rates=[90.0], client_cpu_s=1.0, wall_s=1.0)
    context = {"environment": {}}
    held = script.row("local", 2, measured, measured, None, context, (2**30, 1.5))
    assert held["validity_flags"] == [CACHE_HOLDS_PLATE_FLAG] and held["metrics"][m.CACHE_FRACTION_OF_PLATE] == 1.5
    part = script.row("local", 2, measured, measured, None, context, (2**20, 0.25))
    assert part["validity_flags"] == [] and part["metrics"][m.READER_CACHE_BYTES] == 2**20
    assert m.READER_CACHE_BYTES not in script.row("local", 2, measured, measured, None, context)["metrics"]
