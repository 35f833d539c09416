"""``cropbench scale``: generate, sweep and out-of-memory from the command line."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from cropbench.cli import main
from cropbench.cli.scale import GROWTH_TABLE_NAME, count
from cropbench.config import CropConfig, PlateSpec
from cropbench.errors import ConfigError
from cropbench.harness.work import uninterrupted
from cropbench.plates.scale import FieldSource, ScaleSpec, check_fits_in_memory
from cropbench.records import RESULTS_NAME
from cropbench.tracks import scale as scale_track
from cropbench.tracks.scale import ScaleSweep

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


def _refused(arguments: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``cropbench ARGUMENTS``: it must exit 2 with one ``cropbench: error:`` line; returns that line."""
    try:
        code = main(arguments)
    except SystemExit as stop:  # argparse: a usage error
        code = stop.code  # type: ignore[assignment]
    error = capsys.readouterr().err.strip()
    assert code == 2, error
    assert error.startswith("cropbench: error: ") and "\n" not in error, error
    return error


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--field-size", "300000"),
        ("--field-size", "nan"),
        ("--field-size", "32"),
        ("--channels", "9"),
        ("--channels", "inf"),
        ("--distinct-fields", "-1"),
        ("--crop-size", "0"),
        ("--samples", "1e400"),
        ("--workers", "-2"),
        ("--objects", "3e6"),
    ],
)
def test_a_sweep_option_out_of_range_is_one_line_naming_it_before_any_work(
    option: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    error = _refused(["scale", "sweep", "--out", str(out), "--work", str(work), option, value], capsys)
    assert f"argument {option}:" in error
    assert not out.exists() and not work.exists()


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (["--field-size", "128", "--crop-size", "200"], "crop_size 200 is larger than the field (128 px)"),
        (["--field-size", "16384", "--distinct-fields", "100000", "--objects", "1e6"], "of memory to render"),
        (["--workers", "100000"], "argument --workers: expected a whole number from 0 to 256"),
    ],
)
def test_a_sweep_the_plate_or_machine_cannot_hold_is_refused_before_any_work(
    arguments: list[str], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    assert expected in _refused(["scale", "sweep", "--out", str(out), "--work", str(work), *arguments], capsys)
    assert not out.exists() and not work.exists()


def test_an_out_of_memory_limit_above_the_machines_memory_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    arguments = ["scale", "out-of-memory", "--out", str(tmp_path / "o"), "--work", str(tmp_path / "w")]
    assert "is not below this machine's memory" in _refused([*arguments, "--limit-mib", "1e9"], capsys)
    assert not (tmp_path / "o").exists() and not (tmp_path / "w").exists()


def test_rendering_more_than_the_free_memory_is_refused() -> None:
    spec = ScaleSpec(objects=1000, field_size=1080, channels=5)
    check_fits_in_memory(spec, available=spec.memory_bytes)
    with pytest.raises(ConfigError, match="GiB of memory to render"):
        check_fits_in_memory(spec, available=spec.memory_bytes - 1)


@pytest.mark.parametrize("value", ["-1", "4294967296", "1.5", "ten"])
@pytest.mark.parametrize(
    "command",
    [
        ["scale", "generate", "--out", "x.zarr", "--objects", "300"],
        ["scale", "sweep", "--out", "o", "--work", "w"],
        ["scale", "out-of-memory", "--out", "o", "--work", "w"],
        ["generate", "--out", "x.zarr"],
        ["compare-layouts", "--plate", "p.zarr"],
    ],
)
def test_a_seed_no_generator_accepts_is_one_line_naming_it(
    command: list[str], value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "argument --seed:" in _refused([*command, "--seed", value], capsys)


def test_configs_refuse_a_negative_seed() -> None:
    with pytest.raises(ConfigError, match="seed must be a whole number from 0"):
        ScaleSpec(seed=-1)
    with pytest.raises(ConfigError, match="seed must be a whole number from 0"):
        CropConfig(seed=-1)
    with pytest.raises(ConfigError, match="seed must be a whole number from 0"):
        PlateSpec(seed=2**32)


def _stub_sweep(monkeypatch: pytest.MonkeyPatch, stop_after: int) -> None:
    """A sweep whose counts measure nothing, stopped by SIGTERM as the count after ``stop_after`` rows starts."""
    measured: list[int] = []

    def measure(sweep: ScaleSweep, objects: int, *_: object) -> tuple[dict[str, object], dict[str, object]]:
        if len(measured) == stop_after:
            os.kill(os.getpid(), signal.SIGTERM)
        measured.append(objects)
        return {"objects": objects}, {"objects": objects}

    monkeypatch.setattr(scale_track, "measure_count", measure)


def test_sigterm_ends_a_sweep_in_one_line_keeping_every_finished_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _stub_sweep(monkeypatch, stop_after=2)
    out = tmp_path / "out"
    code = main(["scale", "sweep", "--out", str(out), "--work", str(tmp_path / "w"), "--objects", "1", "2", "3", "4"])
    assert code == 128 + signal.SIGTERM, "the shell's code for a command stopped by SIGTERM"
    assert capsys.readouterr().err.strip() == "cropbench: interrupted (SIGTERM); every finished row is kept"
    rows = [json.loads(line) for line in (out / RESULTS_NAME).read_text().splitlines()]
    assert [row["case"] for row in rows] == ["1 objects", "2 objects"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, "the handler is the caller's again"


def test_sigterm_while_a_plate_is_measured_leaves_no_plate_or_scratch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def measure(plate: Path, sweep: ScaleSweep) -> dict[str, object]:
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM stops the sweep here")

    monkeypatch.setattr(scale_track, "measure_point_in_child", measure)
    work = tmp_path / "work"
    work.mkdir()
    arguments = ["scale", "sweep", "--out", str(tmp_path / "out"), "--work", str(work), "--objects", "100"]
    assert main([*arguments, *SMALL_FIELDS]) == 128 + signal.SIGTERM
    assert list(work.iterdir()) == []


def test_sigterm_while_a_plate_is_written_leaves_no_partial_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = FieldSource.__call__

    def render(self: FieldSource, position: int) -> object:
        if position == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, position)

    monkeypatch.setattr(FieldSource, "__call__", render)
    arguments = ["scale", "sweep", "--out", str(tmp_path / "out"), "--work", str(tmp_path), "--objects", "300"]
    assert main([*arguments, *SMALL_FIELDS]) == 128 + signal.SIGTERM
    assert [path.name for path in tmp_path.iterdir()] == ["out"]


def test_removing_a_plate_is_not_cut_short_by_an_interrupt(tmp_path: Path) -> None:
    finished = []
    # The SIGINT takes effect (Python's handler: KeyboardInterrupt) only once the block has run. Python's
    # own handler is installed here: an earlier test of the session may have left another one.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt), uninterrupted():
            os.kill(os.getpid(), signal.SIGINT)
            finished.append(True)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert finished == [True]


def test_resume_measures_only_the_counts_the_results_lack_and_tables_every_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    measured: list[int] = []

    def measure(sweep: ScaleSweep, objects: int, *_: object) -> tuple[dict[str, object], dict[str, object]]:
        measured.append(objects)
        return {"objects": objects}, {"objects": objects}

    monkeypatch.setattr(scale_track, "measure_count", measure)
    monkeypatch.setattr(
        "cropbench.report.growth.growth_table", lambda rows: "\n".join(str(row["objects"]) for row in rows)
    )
    out, work = tmp_path / "out", tmp_path / "w"
    sweep = ["scale", "sweep", "--out", str(out), "--work", str(work), "--no-progress", "--objects"]
    assert main([*sweep, "1", "2"]) == 0
    assert main([*sweep, "1", "2", "3", "--resume"]) == 0
    assert measured == [1, 2, 3], "the second run measured only the count the results lacked"
    rows = [json.loads(line) for line in (out / RESULTS_NAME).read_text().splitlines()]
    assert [row["case"] for row in rows] == ["1 objects", "2 objects", "3 objects"]
    assert (out / "growth.md").read_text().split() == ["1", "2", "3"], "the table holds the skipped rows too"
    assert main([*sweep, "1", "2"]) == 0 and measured[3:] == [1, 2], "without --resume every count is measured again"
