"""The CLI: help everywhere, user errors exit 2 with one line, the main job writes rows.

Tests taking ``cropbench_cli`` run twice: through ``cli.main`` in this process (fast tier) and as
``python -m cropbench`` (slow tier); ``test_every_subcommand_has_help`` runs the entry point in the fast tier.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import CliRunner
from test_robustness import CLI_CASES

from cropbench.cli import build_parser, main
from cropbench.records import Record, RecordWriter, read_records
from cropbench.tracks import TRACKS, TrackInfo

SUBCOMMANDS = ("generate", "run", "plot", "report", "export", "env", "smoke")


def cropbench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cropbench", *args], capture_output=True, text=True, check=False)


def test_every_subcommand_has_help() -> None:
    result = cropbench("--help")
    assert result.returncode == 0 and all(name in result.stdout for name in SUBCOMMANDS)
    for name in SUBCOMMANDS:
        with pytest.raises(SystemExit) as exit_info:
            build_parser().parse_args([name, "--help"])
        assert exit_info.value.code == 0


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--plate", "/nonexistent/plate.zarr"],
        ["generate", "--out", "/tmp/x.zarr", "--channels", "0"],
        ["generate", "--out", "/tmp/x.zarr", "--shard", "100", "--chunk", "64"],
        ["plot", "/nonexistent/results.jsonl"],
        ["report", "/nonexistent/results.jsonl"],
    ],
)
def test_user_errors_exit_2_with_one_line_and_no_traceback(args: list[str], cropbench_cli: CliRunner) -> None:
    result = cropbench_cli(*args)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("cropbench: error:")


def test_generate_refuses_to_overwrite_without_force(tmp_path: Path, tiny_plate: Path) -> None:
    assert main(["generate", "--out", str(tiny_plate), "--no-progress"]) == 2


def test_generate_run_export_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plate = tmp_path / "p.zarr"
    assert (
        main(
            [
                "generate",
                "--out",
                str(plate),
                "--rows",
                "1",
                "--columns",
                "1",
                "--fields",
                "2",
                "--height",
                "192",
                "--width",
                "192",
                "--cells",
                "20",
                "--chunk",
                "64",
                "--no-progress",
            ]
        )
        == 0
    )
    assert "ratio" in capsys.readouterr().out
    out = tmp_path / "out"
    assert main(["run", "--plate", str(plate), "--out", str(out), "--samples", "30", "--no-progress", "--plot"]) == 0
    printed = capsys.readouterr().out
    assert "samples/s" in printed and "track1_latency_throughput.png" in printed
    rows = read_records(out / "results.jsonl")
    assert rows and all(r.track == "dataset" for r in rows)
    assert rows[0].environment["storage"]["path"] and rows[0].environment["packages"]["torch"]
    assert (out / "results.csv").read_text().count("\n") == len(rows) + 1
    assert main(["run", "--plate", str(plate), "--out", str(out), "--samples", "30", "--no-progress", "--resume"]) == 0
    assert len(read_records(out / "results.jsonl")) == len(rows), "resume skips recorded cases"
    assert main(["export", str(out / "results.jsonl"), "--csv", str(tmp_path / "x.csv")]) == 0


def test_report_writes_the_page_and_figures_of_an_existing_results_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "run" / "results.jsonl"
    with RecordWriter(results) as writer:
        for decode, rate, run in (("zarr", 100.0, "old"), ("direct", 900.0, "new"), ("zarr", 400.0, "new")):
            metrics = {"samples_per_s": rate, "p95_ms": 2.0, "validity_flags": []}
            config = {"access": "random", "crop": {"decode": decode}}
            writer.write(
                Record(
                    track="dataset", case=f"random/{decode}", config=config, metrics=metrics, environment={}, run_id=run
                )
            )
    before = results.read_bytes()
    assert main(["report", str(results), "--out", str(tmp_path / "page")]) == 0
    printed = capsys.readouterr().out
    page = (tmp_path / "page" / "report.html").read_text()
    assert (tmp_path / "page" / "plots" / "track1_latency_throughput.png").is_file()
    assert "data:image/png;base64," in page
    assert page.count("<tr") == 4, "the page lists every row of the file (a header and three rows)"
    assert "track dataset (Dataset __getitem__): best random/direct: 900 samples/s\n" in printed, printed
    assert "all 2 configurations carry no flag" in printed
    assert results.read_bytes() == before, "the results file is read, never written"
    assert main(["report", str(results)]) == 0 and (results.parent / "report.html").is_file()
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["report", str(empty)]) == 2
    assert capsys.readouterr().err.startswith(f"cropbench: error: {empty} holds no rows")


def test_report_and_summary_judge_every_row_of_a_resumed_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run interrupted and resumed leaves two run ids in one file: the verdict covers both, and the
    figures draw the latest row of every configuration."""
    from cropbench.report.plots import latest_runs

    results = tmp_path / "out" / "results.jsonl"
    decodes = [("zarr", 100.0), ("field", 300.0), ("direct", 900.0), ("tiff", 50.0)]
    for part in (decodes[:3], decodes[3:]):  # the first run, interrupted; then --resume: one writer each
        with RecordWriter(results) as writer:
            for decode, rate in part:
                metrics = {"samples_per_s": rate, "p95_ms": 2.0, "validity_flags": []}
                config = {"access": "random", "crop": {"decode": decode}}
                case = f"random/{decode}"
                writer.write(
                    Record(track="dataset", case=case, case_id=case, config=config, metrics=metrics, environment={})
                )
    rows = read_records(results)
    assert len({r.run_id for r in rows}) == 2
    assert len(latest_runs(rows)) == 4, "the resumed fragment and the rows before it are drawn alike"
    assert main(["report", str(results)]) == 0
    printed = capsys.readouterr().out
    assert "best random/direct: 900 samples/s" in printed and "all 4 configurations carry no flag" in printed, printed
    assert main(["summary", str(results)]) == 0
    printed = capsys.readouterr().out
    assert "all 4 configurations carry no flag" in printed and "random/tiff" in printed, printed


def test_summary_refuses_an_unknown_metric_and_shows_no_interval_from_one_sample(
    tmp_path: Path, cropbench_cli: CliRunner
) -> None:
    results = tmp_path / "results.jsonl"
    with RecordWriter(results) as writer:
        writer.write(Record(track="dataset", case="c", config={}, environment={}, metrics={"samples_per_s": 7897.9}))
    typo = cropbench_cli("summary", str(results), "--metric", "samples_per_sec")
    assert typo.returncode == 2 and typo.stderr.startswith("cropbench: error:") and "samples_per_s" in typo.stderr
    once = cropbench_cli("summary", str(results))
    assert once.returncode == 0, once.stderr
    row = once.stdout.splitlines()[1]
    assert "7,897.9" in row and "[" not in row and "%" not in row


def test_help_lists_values_compactly(cropbench_cli: CliRunner) -> None:
    run_help = cropbench_cli("run", "--help").stdout
    usage = run_help.split("\n\n")[0]
    assert "--layout NAME" in usage and "channel-tiles-blosc-zstd" not in usage
    assert "--track NAME" in usage and "training or 3 (training loop)" in " ".join(run_help.split())
    smoke_help = cropbench_cli("smoke", "--help").stdout
    assert "validity flags" in smoke_help


@pytest.mark.parametrize(
    "args",
    [["run", "--plate", "x", "--preset", "huge"], ["bogus"], ["run"], ["generate", "--out", "x", "--rows", "two"]],
)
def test_usage_errors_are_one_line_with_a_hint(args: list[str], cropbench_cli: CliRunner) -> None:
    result = cropbench_cli(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cropbench: error:") and "--help" in lines[0], result.stderr


def test_compare_layouts_by_url_refuses_options_it_would_ignore(tmp_path: Path, cropbench_cli: CliRunner) -> None:
    for flag, value in (("--decode", "zarr"), ("--repeats", "5"), ("--objects", "objects.csv")):
        result = cropbench_cli("compare-layouts", "--plate", "s3://bucket/p.zarr", flag, value, "--out", str(tmp_path))
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert result.stderr.startswith("cropbench: error:")
        assert all(text in result.stderr for text in ("s3://bucket/p.zarr", flag, "local plate only")), result.stderr
    assert not any(tmp_path.iterdir()), "nothing is written before the error"


@pytest.mark.parametrize("cropbench_cli", ["in-process"], indirect=True)  # as a subprocess: tests/test_robustness.py
@pytest.mark.parametrize("args", [case[1] for case in CLI_CASES], ids=[case[0] for case in CLI_CASES])
def test_bad_input_exits_2_with_one_line(
    tiny_plate: Path, tmp_path: Path, args: list[str], cropbench_cli: CliRunner
) -> None:
    result = cropbench_cli(*(arg.format(tmp=tmp_path, plate=tiny_plate) for arg in args))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cropbench: error:"), result.stderr


def test_bad_knobs_exit_2_with_one_line_and_leave_nothing(
    tiny_plate: Path, tmp_path: Path, cropbench_cli: CliRunner
) -> None:
    for args in (
        ["run", "--plate", str(tiny_plate), "--torch-threads", "-3", "--out", str(tmp_path / "o")],
        [
            "generate",
            "--out",
            str(tmp_path / "p.zarr"),
            "--channels-per-chunk",
            "3",
            "--shard",
            "-1",
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
        ],
    ):
        result = cropbench_cli(*args, "--no-progress")
        assert result.returncode == 2, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("cropbench: error:")
    assert not (tmp_path / "p.zarr").exists() and not list(tmp_path.glob(".p.zarr*"))


def test_an_os_error_is_one_line_naming_the_path(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from cropbench.cli import runs

    def read_only(args: object) -> int:
        raise PermissionError(13, "Permission denied", "/data/out/results.csv")

    monkeypatch.setattr(runs, "cmd_env", read_only)
    assert main(["env"]) == 2
    assert capsys.readouterr().err == "cropbench: error: Permission denied: /data/out/results.csv\n"


def test_a_worker_error_is_unwrapped_to_its_cause() -> None:
    from torch._utils import ExceptionWrapper

    from cropbench.cli import one_line
    from cropbench.errors import StoreError

    try:
        raise StoreError("chunk c/0/1/1 of A/1/0/0 cannot be decoded (corrupt chunk): crc32c checksum mismatch")
    except StoreError:
        wrapped = ExceptionWrapper(where="in DataLoader worker process 0")
    with pytest.raises(StoreError) as raised:
        wrapped.reraise()
    assert len(str(raised.value).splitlines()) > 2, "torch's wrapping: the cause is on the last line"
    assert one_line(raised.value) == (
        "chunk c/0/1/1 of A/1/0/0 cannot be decoded (corrupt chunk): crc32c checksum mismatch"
    )


def test_an_interrupt_dropped_by_a_destructor_still_stops_the_run_at_the_next_case() -> None:
    """Python reports and drops an exception raised in a destructor or callback; Ctrl-C landing there
    must not be lost (the run would finish with exit 0)."""
    from cropbench.cli import progress

    bar = progress.ProgressBar(False, "cases")
    progress.INTERRUPTED.clear()
    try:
        with contextlib.suppress(KeyboardInterrupt):  # where a destructor would drop it
            progress.on_interrupt(signal.SIGINT, None)
        with pytest.raises(KeyboardInterrupt):
            bar("track 1 next case", None)
    finally:
        progress.INTERRUPTED.clear()


def test_the_progress_bar_counts_planned_cases_and_shows_the_time_left(capsys: pytest.CaptureFixture[str]) -> None:
    from cropbench.cli import progress

    bar = progress.ProgressBar(True, "cases")
    try:
        bar.cases(0, 4)
        bar("track 1 a case", None)
        bar.cases(3, 4, 125.0)
        bar("track 1 a case", Record(track="dataset", case="a", case_id="x", config={}, metrics={}, environment={}))
    finally:
        bar.close()
    shown = capsys.readouterr().err.split("\r")[-1]
    assert "3/4" in shown and "about 02:0" in shown and "left" in shown, f"cases done/total and time left: {shown!r}"


@pytest.mark.parametrize(
    "arguments",
    [
        ["--plate", "/nonexistent/plate.zarr"],
        ["--plate", ".", "--objects", "/nonexistent/cells.parquet"],
        ["--plate", "s3://bucket/plate.zarr", "--local-plate", "/nonexistent/plate.zarr"],
    ],
)
def test_run_refuses_a_missing_path_before_importing_torch(arguments: list[str], tmp_path: Path) -> None:
    # Importing torch takes seconds: a typo in a path is reported without waiting for it.
    program = (
        "import sys\nfrom cropbench.cli import main\n"
        f"code = main(['run', *{arguments!r}, '--out', {str(tmp_path / 'out')!r}])\n"
        "print(code, 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=False)
    assert done.stdout.split() == ["2", "False"], done.stderr
    assert done.stderr.startswith("cropbench: error: --") and "does not exist" in done.stderr
    assert done.stderr.count("\n") == 1


@pytest.mark.parametrize("option", ["--seed", "--plate-multiple", "--limit-mib"])
def test_an_option_given_a_bare_double_dash_is_a_usage_error(option: str, capsys: pytest.CaptureFixture[str]) -> None:
    # argparse hands "--" on as an empty list, unconverted: OutOfMemoryComparison then compared a list with 2.
    with pytest.raises(SystemExit) as stop:
        main(["scale", "out-of-memory", "--out", "o", "--work", "w", f"{option}=--"])
    assert stop.value.code == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"cropbench: error: argument {option}: expected one value") and "\n" not in error


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (["--ram-fraction", "nan"], "ram_fraction must be > 0 and at most 16, got nan"),
        (["--ram-fraction", "inf"], "ram_fraction must be > 0 and at most 16, got inf"),
        (["--height", "1000000000"], "field_height and field_width must be 64 to 16384"),
        (["--seed", "-1"], "argument --seed: expected a whole number from 0"),
    ],
)
def test_generate_refuses_sizes_no_machine_holds_in_one_line(
    arguments: list[str], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # These were a ValueError, an OverflowError and numpy's 1.96 TiB allocation, each a traceback.
    try:
        code = main(["generate", "--out", str(tmp_path / "p.zarr"), "--no-progress", *arguments])
    except SystemExit as stop:
        code = stop.code  # type: ignore[assignment]
    error = capsys.readouterr().err.strip()
    assert code == 2 and expected in error and error.startswith("cropbench: error: ") and "\n" not in error
    assert not (tmp_path / "p.zarr").exists()


# Runs cropbench as `python -m cropbench` does, sending itself SIGNAL when it starts importing the command line and
# its commands: a signal that lands while the command loads, at a moment no scheduling can move.
_SIGNAL_WHILE_LOADING = """
import builtins, os, runpy, sys
signum, real_import = int(sys.argv.pop(1)), builtins.__import__
def hooked(name, *args, **kwargs):
    if name == "cropbench.cli" and "cropbench.cli" not in sys.modules:
        os.kill(os.getpid(), signum)
    return real_import(name, *args, **kwargs)
builtins.__import__ = hooked
runpy.run_module("cropbench", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("moment", ["loading", "working"])
def test_a_stop_signal_while_loading_or_working_ends_in_one_line(tmp_path: Path, signum: int, moment: str) -> None:
    """A stop signal ends in one line and no traceback, whether it lands while the command line loads
    (before its own handlers are in place) or once the work has started."""
    arguments = ["generate", "--preset", "full", "--out", str(tmp_path / "p.zarr")]
    if moment == "loading":
        command = [sys.executable, "-c", _SIGNAL_WHILE_LOADING, str(int(signum)), *arguments]
    else:
        command = [sys.executable, "-m", "cropbench", *arguments]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if moment == "working":
        while child.poll() is None and not list(tmp_path.glob(".p.zarr.*")):
            time.sleep(0.01)  # the plate's scratch folder: generating has begun
        child.send_signal(signum)
    _, err = child.communicate(timeout=300)
    name = "" if signum == signal.SIGINT else f" ({signal.Signals(signum).name})"
    assert child.returncode == 128 + signum, err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith(f"cropbench: interrupted{name}")
    assert not list(tmp_path.glob(".p.zarr.*")), "the plate's scratch folder is removed"
    # An interrupt that a worker thread swallowed stops the command once the plate is whole.
    if (tmp_path / "p.zarr").exists():
        from cropbench.formats import read_plate_metadata

        assert len(read_plate_metadata(tmp_path / "p.zarr").fields) == 16, "a plate in place is a whole plate"


@pytest.mark.parametrize("info", [info for info in TRACKS.values() if info.command], ids=lambda info: info.name)
def test_every_track_started_by_a_command_of_its_own_names_a_command_the_parser_has(
    info: TrackInfo, capsys: pytest.CaptureFixture[str]
) -> None:
    """The table's ``command`` of a track is what the CLI offers: its words parse, its options exist."""
    words = str(info.command).split()
    path = [word for word in words if not word.startswith("-") and not word.isupper()]
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args([*path, "--help"])
    assert done.value.code == 0
    printed = capsys.readouterr().out
    assert all(option in printed for option in words if option.startswith("--")), printed
