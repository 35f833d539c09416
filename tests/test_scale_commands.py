"""``cropbench scale``: generate, sweep and out-of-memory from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cropbench.cli import main
from cropbench.cli.scale import GROWTH_TABLE_NAME, count
from cropbench.records import RESULTS_NAME

SMALL_FIELDS = ["--field-size", "128", "--channels", "2", "--distinct-fields", "2", "--no-progress"]


@pytest.mark.parametrize(("text", "value"), [("1000", 1000), ("1e6", 10**6), ("10_000", 10**4)])
def test_counts_are_whole_numbers_in_any_spelling(text: str, value: int) -> None:
    assert count(text) == value


def test_a_bad_count_is_one_line_naming_the_argument(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["scale", "generate", "--out", "x.zarr", "--objects", "2.5"])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("cropbench: error: argument --objects:") and "\n" not in error


def test_generate_writes_the_plate_and_refuses_to_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plate = tmp_path / "scale.zarr"
    assert main(["scale", "generate", "--out", str(plate), "--objects", "300", *SMALL_FIELDS]) == 0
    assert "300 objects" in capsys.readouterr().out
    assert main(["scale", "generate", "--out", str(plate), "--objects", "300", *SMALL_FIELDS]) == 2
    assert "already exists" in capsys.readouterr().err


@pytest.mark.slow
def test_sweep_writes_rows_and_the_growth_table(tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    arguments = ["scale", "sweep", "--out", str(out), "--work", str(work), "--objects", "100", "300"]
    assert main([*arguments, "--samples", "40", "--workers", "0", "--crop-size", "32", *SMALL_FIELDS]) == 0
    rows = [json.loads(line) for line in (out / RESULTS_NAME).read_text().splitlines()]
    assert [row["case"] for row in rows] == ["100 objects", "300 objects"]
    assert {row["track"] for row in rows} == {"scale"}
    assert "| 300 | " in (out / GROWTH_TABLE_NAME).read_text()
    assert not work.exists()
