"""The repository's tools as ``cropbench`` commands (cli/tools.py), and scripts/*.py as their old names."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cropbench.cli import build_parser, main
from cropbench.cli.tools import TOOLS, Tool

REPO = Path(__file__).resolve().parents[1]
ENVIRONMENT = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), *sys.path])}


def _help(command: str) -> int | str | None:
    """The exit code of ``cropbench COMMAND --help`` (argparse exits, a tool without a parser returns)."""
    try:
        return main([command, "--help"])
    except SystemExit as done:
        return done.code


@pytest.mark.parametrize("tool", TOOLS, ids=lambda tool: tool.command)
def test_every_argument_of_a_tool_reaches_its_own_parser(tool: Tool, capsys: pytest.CaptureFixture[str]) -> None:
    command = tool.command
    assert build_parser().parse_args([command, "--help", "--", "-x"]).arguments == ["--help", "--", "-x"]
    assert _help(command) == 0
    assert f"usage: cropbench {command}" in capsys.readouterr().out


def test_the_library_gate_keeps_its_exit_code_for_a_bad_argument(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["library-gate", "no-such-library", "v1", "v2"])
    assert done.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("library_gate: error: argument library") and error.count("\n") == 1


def test_parsing_a_tool_imports_neither_its_module_nor_asv_nor_torch() -> None:
    code = (
        "import sys; from cropbench.cli import build_parser; build_parser().parse_args(['library-gate', 'zarr']); "
        "print(sorted(name for name in ('asv', 'torch', 'cropbench.history.library_gate') if name in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENVIRONMENT, check=True)
    assert result.stdout.strip() == "[]"


def _command_of(script: Path) -> str | None:
    """The command a thin entry point runs: the first string of the list it hands ``main``."""
    for node in ast.walk(ast.parse(script.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "main" and node.args:
            first = node.args[0]
            if isinstance(first, ast.List) and isinstance(first.elts[0], ast.Constant):
                return str(first.elts[0].value)
    return None


@pytest.mark.parametrize("script", sorted((REPO / "scripts").glob("*.py")), ids=lambda path: path.name)
def test_every_python_script_is_the_command_of_its_name(script: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _command_of(script) == script.stem.replace("_", "-"), f"{script.name}: its logic belongs in src/cropbench"
    assert len(script.read_text(encoding="utf-8").splitlines()) <= 10, "an entry point is a few lines"
    assert _help(script.stem.replace("_", "-")) == 0 and "usage: cropbench" in capsys.readouterr().out


def test_an_old_script_name_runs_the_command_with_its_exit_code() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gpu_table.py")], capture_output=True, text=True, env=ENVIRONMENT
    )
    assert result.returncode == 2 and result.stderr.startswith("usage: cropbench gpu-table RESULTS_JSONL")
