"""The ``cropbench`` parser: every command group's commands, and usage errors in one line."""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

from cropbench.cli.advise import add_advise_commands
from cropbench.cli.comparisons import add_comparison_commands
from cropbench.cli.plates import add_plate_commands
from cropbench.cli.results import add_result_commands
from cropbench.cli.runs import add_run_commands
from cropbench.cli.scale import add_scale_commands
from cropbench.cli.stores import add_store_commands
from cropbench.cli.tools import add_tool_commands

EXIT_USER_ERROR = 2


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line with a hint, like every other user error (its subcommands inherit it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USER_ERROR, f"cropbench: error: {message} (see '{self.prog} --help')\n")

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> Any:
        # argparse drops a value of "--" (``--seed=--``) and hands the option an empty list, unconverted.
        if action.nargs is None and action.option_strings and arg_strings == ["--"]:
            self.error(f"argument {'/'.join(action.option_strings)}: expected one value, got '--'")
        return super()._get_values(action, arg_strings)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every ``cropbench`` command; each sets ``handler``, the function that runs it."""
    parser = _Parser(
        prog="cropbench",
        description="Benchmark single-cell crop loading from OME-Zarr plates into PyTorch.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_plate_commands(commands)
    add_run_commands(commands)
    add_comparison_commands(commands)
    add_advise_commands(commands)
    add_result_commands(commands)
    add_scale_commands(commands)
    add_store_commands(commands)
    add_tool_commands(commands)
    return parser
