"""scripts/asv_history.sh refuses bad arguments in one line, before it sets up or runs anything.

A machine name is a folder under results/ (``../`` would write outside the repository), and the
range goes to git through asv (a bad one was asv's traceback).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "asv_history.sh"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--commits", "0"], "--commits must be a positive whole number, got '0'"),
        (["--commits", "x"], "--commits must be a positive whole number, got 'x'"),
        (["--bogus"], "unknown argument '--bogus'"),
        (["--machine", "../../outside"], "--machine '../../outside' is not a machine name"),
        (["--machine", "a..b"], "--machine 'a..b' is not a machine name"),
        (["--machine", "with/slash"], "--machine 'with/slash' is not a machine name"),
        (["--range", "no-such-commit..main"], "--range 'no-such-commit..main' is not a commit range"),
        (["--range", "--all"], "--range '--all' is not a commit range"),
        (["--range", "HEAD..HEAD"], "--range 'HEAD..HEAD' holds no commits"),
        (["--bench", "(unclosed"], "--bench '(unclosed' is not a regular expression"),
    ],
)
def test_bad_arguments_are_one_line_errors(arguments: list[str], message: str) -> None:
    result = subprocess.run(["bash", str(SCRIPT), *arguments], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1
    assert message in result.stderr


def test_the_history_runs_the_default_grid_the_smoke_pass_runs_unless_told_another_selection() -> None:
    text = SCRIPT.read_text()
    assert "source scripts/asv_grid.sh" in text
    assert '--bench "${bench:-$DEFAULT_GRID}"' in text
    assert "source scripts/asv_grid.sh" in (SCRIPT.parent / "asv_smoke.sh").read_text()
