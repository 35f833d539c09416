"""Commands that work on the repository checkout rather than on a plate: the asv release histories, the
gates and their campaigns, the published asv site, the GPU check's tables and the docs' headline table.

``release-history``, ``asv-regression``, ``library-gate``, ``library-campaign``, ``history-spread``,
``asv-offline-html``, ``asv-site-tidy`` and ``gpu-table`` hand every argument to their module's own ``main``,
which keeps its parser, exit codes (``library-gate``: 1 regressed, 3 not measured), signal handling and
one-line messages; ``scripts/<name>.py`` runs the same command under the name it had before it became one.
The modules are imported when their command runs, so this parser imports neither asv nor torch.
"""

from __future__ import annotations

import argparse
import importlib
import os
from dataclasses import dataclass
from pathlib import Path

from cropbench.cli.options import Commands
from cropbench.errors import CropbenchError


@dataclass(frozen=True)
class Tool:
    """A command whose module parses its own arguments: ``module.main(arguments) -> exit code``."""

    command: str
    module: str
    help: str


TOOLS = (
    Tool(
        "release-history",
        "cropbench.history.releases",
        "build the git history of a format library's releases that its asv configuration measures",
    ),
    Tool("asv-regression", "cropbench.history.regression", "does asv flag an injected crop-path regression?"),
    Tool("library-gate", "cropbench.history.library_gate", "gate a format library's change on its read path"),
    Tool("library-campaign", "cropbench.history.campaign", "does the zarr gate catch a zarr-python regression?"),
    Tool(
        "history-spread",
        "cropbench.history.spread",
        "two runs of a release history side by side: how far each release's value repeats",
    ),
    Tool("asv-offline-html", "cropbench.history.offline_html", "make asv's published site load nothing online"),
    Tool("asv-site-tidy", "cropbench.history.site_tidy", "make every benchmark on asv's published site draw"),
    Tool("gpu-table", "cropbench.report.gpu_table", "the GPU check's results.jsonl as Markdown tables"),
)


def cmd_tool(args: argparse.Namespace) -> int:
    """Run the tool's own ``main`` over the arguments it was given, returning its exit code."""
    module = importlib.import_module(args.tool.module)
    return int(module.main(args.arguments))


def cmd_headline(args: argparse.Namespace) -> int:
    """Write (or check, or print) the headline table of track ``targets`` in the docs."""
    from cropbench.history import REPO
    from cropbench.report.headline import PAGE, ROWS_FOLDER, block, current_block, read_rows, regenerate

    rows: Path = args.rows if args.rows is not None else REPO / ROWS_FOLDER
    page: Path = args.page if args.page is not None else REPO / PAGE
    shown = os.path.relpath(page)
    default_rows = rows.resolve() == (REPO / ROWS_FOLDER).resolve()
    if not default_rows and not rows.exists():
        raise CropbenchError(f"--rows {rows} does not exist")
    source = ROWS_FOLDER if default_rows else str(rows)
    if args.print:
        print(block(read_rows(rows), source))
        return 0
    if args.check:
        if current_block(page.read_text(encoding="utf-8"), str(page)) != block(read_rows(rows), source):
            print(f"{shown}: the headline table is not the rendering of {source}: run cropbench headline")
            return 1
        print(f"{shown}: the headline table is current")
        return 0
    changed = regenerate(rows, page, source)
    print(f"{shown}: {'headline table rewritten' if changed else 'headline table already current'}")
    return 0


def add_tool_commands(commands: Commands) -> None:
    """Register the repository's tools (:data:`TOOLS`) and ``headline``."""
    for tool in TOOLS:
        # Every argument, options and ``--help`` included, belongs to the tool's own parser: no prefix
        # character this parser knows, so none is read as its option.
        parser = commands.add_parser(tool.command, help=tool.help, add_help=False, prefix_chars="\0")
        parser.add_argument("arguments", nargs=argparse.REMAINDER)
        parser.set_defaults(handler=cmd_tool, tool=tool, own_exit_codes=True)

    headline = commands.add_parser(
        "headline",
        help="regenerate the docs' headline table of track targets from the committed rows",
        description="Regenerate the headline table of track targets in the docs from the committed rows "
        "(between <!-- headline:start --> and <!-- headline:end -->; nothing else on the page is touched).",
    )
    headline.add_argument("--rows", type=Path, help="rows folder (default: measurements/targets of the checkout)")
    headline.add_argument(
        "--page", type=Path, help="the page with the markers (default: docs/results/decode-paths.md of the checkout)"
    )
    action = headline.add_mutually_exclusive_group()
    action.add_argument("--check", action="store_true", help="only say whether the page's table is current")
    action.add_argument("--print", action="store_true", help="print the table instead of writing the page")
    headline.set_defaults(handler=cmd_headline)
