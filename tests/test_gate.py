"""scripts/gate.sh: the pull-request gate, runnable from a fresh clone without a terminal.

The checks run the script itself in a shallow clone of this repository (its tip is origin/main, as
in a fresh clone), with the working tree's gate files copied in. asv is a stand-in that records its
arguments and answers as ``asv continuous`` does; the machine entry is asv's own, in a private HOME
with stdin closed. A real gate builds asv's environment (gigabytes, minutes): docs/how-to/gate-a-change.md.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cropbench.history import library_gate
from cropbench.history import regression as asv_regression

REPO = Path(__file__).resolve().parents[1]

#: What the gate needs from the working tree (it may differ from what is committed), beside the package
#: (its settings are cropbench.history.regression's and cropbench.history.library_gate's).
GATE_FILES = ("scripts/gate.sh", "asv.conf.json")
#: asv continuous's table of a gated benchmark that got 1.5x worse, and its exit code 1.
WORSE_TABLE = """\
| Change | Before [abc] | After [def] | Ratio | Benchmark (Parameter)                                           |
|--------|--------------|-------------|-------|-----------------------------------------------------------------|
| +      | 2.00         | 3.00        | 1.50  | track1.Fetch.track_relative_cost('random', 'direct', 'bounded') |

SOME BENCHMARKS HAVE CHANGED SIGNIFICANTLY.
PERFORMANCE DECREASED.
"""


def _git(path: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture()
def clone(tmp_path: Path) -> Path:
    """A fresh shallow clone with the working tree's gate and package, this venv's python, and a stand-in asv."""
    destination = tmp_path / "clone"
    subprocess.run(
        ["git", "clone", "-q", "--depth", "3", "--branch", "main", f"file://{REPO}", str(destination)], check=True
    )
    for name in GATE_FILES:
        shutil.copyfile(REPO / name, destination / name)
    package = destination / "src" / "cropbench"
    shutil.copytree(
        REPO / "src" / "cropbench", package, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__")
    )
    bin_dir = destination / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text(
        f'#!/usr/bin/env bash\nPYTHONPATH={destination / "src"} exec {sys.executable} "$@"\n'
    )
    (bin_dir / "asv").write_text(
        "#!/usr/bin/env bash\n"
        'printf "%s\\n" "$@" > "$(dirname "$0")/asv-arguments"\n'
        'printf "%s\\n" "$*" >> "$(dirname "$0")/asv-calls"\n'
        'cat > "$(dirname "$0")/asv-stdin"\n'
        'if [ -n "${GATE_TEST_WORSE:-}" ]; then cat "$GATE_TEST_WORSE"; exit 1; fi\n'
        'echo "BENCHMARKS NOT SIGNIFICANTLY CHANGED."\n'
    )
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    (tmp_path / "home").mkdir()
    return destination


def _gate(clone: Path, *arguments: str, **environment: str) -> subprocess.CompletedProcess[str]:
    """The gate with stdin closed and a private HOME (no machine entry there)."""
    env = {**os.environ, "HOME": str(clone.parent / "home"), **environment}
    return subprocess.run(
        ["bash", str(clone / "scripts" / "gate.sh"), *arguments],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--bogus"], "unknown option '--bogus'"),
        (["a", "b", "c"], "too many arguments (a b c)"),
        (["no-such-commit"], "BASE 'no-such-commit' is not a commit"),
        (["HEAD~1", "no-such-commit"], "HEAD 'no-such-commit' is not a commit"),
        (["HEAD", "HEAD"], "BASE 'HEAD' and HEAD 'HEAD' are the same commit"),
        # The command README used to quote: in a fresh clone, main is HEAD.
        (["main", "HEAD"], "BASE 'main' and HEAD 'HEAD' are the same commit"),
    ],
)
def test_bad_arguments_are_one_line_before_anything_runs(clone: Path, arguments: list[str], message: str) -> None:
    result = _gate(clone, *arguments)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith("gate: error: ") and result.stderr.count("\n") == 1, result.stderr
    assert message in result.stderr
    assert not (clone / ".venv" / "bin" / "asv-arguments").exists() and not (clone / ".asv").exists()


def test_without_asv_it_says_how_to_set_up(clone: Path) -> None:
    (clone / ".venv" / "bin" / "asv").unlink()
    result = _gate(clone)
    assert result.returncode == 2 and "scripts/setup.sh" in result.stderr and result.stderr.count("\n") == 1


def test_a_fresh_clone_compares_the_commit_before_head_without_a_terminal(clone: Path) -> None:
    result = _gate(clone)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "EOFError" not in result.stderr and "Traceback" not in result.stderr
    arguments = (clone / ".venv" / "bin" / "asv-arguments").read_text().splitlines()
    base, head = _git(clone, "rev-parse", "HEAD~1"), _git(clone, "rev-parse", "HEAD")
    assert arguments[0] == "continuous" and arguments[-2:] == [base, head]
    assert arguments[arguments.index("--factor") + 1] == str(asv_regression.GATE_FACTOR)
    assert arguments[arguments.index("-b") + 1] == asv_regression.GATE_BENCH
    assert arguments[arguments.index("-a") + 1] == " ".join(asv_regression.GATE_ATTRIBUTES)
    assert (clone / ".venv" / "bin" / "asv-stdin").read_text() == "", "asv reads nothing from a terminal"
    # The machine entry asv would have asked for, recorded without asking.
    machines = json.loads((clone.parent / "home" / ".asv-machine.json").read_text())
    assert machines["gate"]["machine"] == "gate" and machines["gate"]["num_cpu"]
    # Results and the configuration in a new git-ignored folder; asv's environment is the repository's.
    config = json.loads(Path(arguments[arguments.index("--config") + 1]).read_text())
    run_dir = Path(config["results_dir"]).parent
    assert run_dir.parent == (clone / ".asv" / "gate").resolve()
    assert config["env_dir"] == str((clone / ".asv" / "env").resolve())
    assert _git(clone, "check-ignore", str(run_dir / "results" / "gate" / "machine.json"))
    assert _git(clone, "status", "--porcelain", "--untracked-files=all", "--", ".asv", "results") == ""
    assert "BENCHMARKS NOT SIGNIFICANTLY CHANGED." in result.stdout and "gate: passed" in result.stdout
    assert (run_dir / "continuous.txt").read_text().startswith("BENCHMARKS NOT SIGNIFICANTLY CHANGED.")


def test_the_instruction_counts_are_gated_first_in_a_call_with_their_own_factor(clone: Path) -> None:
    assert _gate(clone).returncode == 0
    calls = (clone / ".venv" / "bin" / "asv-calls").read_text().splitlines()
    assert len(calls) == 2
    assert f"--factor {library_gate.INSTRUCTIONS_FACTOR} " in calls[0]
    assert f"-b {asv_regression.GATE_INSTRUCTIONS_BENCH} " in calls[0]
    assert f"--factor {asv_regression.GATE_FACTOR} " in calls[1] and f"-b {asv_regression.GATE_BENCH} " in calls[1]
    configs = [json.loads(Path(call.split("--config ")[1].split()[0]).read_text()) for call in calls]
    assert configs[0]["results_dir"] != configs[1]["results_dir"], "each call from its own empty results folder"


def test_base_defaults_to_origin_main_when_head_moved_past_it(clone: Path) -> None:
    _git(clone, "-c", "user.name=t", "-c", "user.email=t@localhost", "commit", "-q", "--allow-empty", "-m", "mine")
    assert _gate(clone).returncode == 0
    arguments = (clone / ".venv" / "bin" / "asv-arguments").read_text().splitlines()
    assert arguments[-2:] == [_git(clone, "rev-parse", "origin/main"), _git(clone, "rev-parse", "HEAD")]


def test_a_regression_prints_asvs_table_and_exits_1(clone: Path, tmp_path: Path) -> None:
    table = tmp_path / "table.txt"
    table.write_text(WORSE_TABLE)
    result = _gate(clone, "HEAD~2", "HEAD", GATE_TEST_WORSE=str(table))
    assert result.returncode == 1, result.stdout + result.stderr
    assert WORSE_TABLE in result.stdout and "gate: FAILED: a gated benchmark got worse" in result.stdout


def test_dry_run_prints_the_command_and_runs_nothing(clone: Path) -> None:
    result = _gate(clone, "--dry-run", "HEAD~2")
    assert result.returncode == 0, result.stderr
    assert "continuous" in result.stdout and not (clone / ".venv" / "bin" / "asv-arguments").exists()


def test_a_damaged_machine_file_is_one_line(clone: Path) -> None:
    (clone.parent / "home" / ".asv-machine.json").write_text("garbage{")
    result = _gate(clone)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "is not asv's machine file" in result.stderr
