"""mkdocs hook: the API and command-line reference pages are generated from the code, never typed.

A page holding ``<!-- generated:api -->`` gets one mkdocstrings block per public name of
``cropbench`` (``cropbench._PUBLIC``: the names ``import cropbench`` exports, each with the module
that defines it), grouped by that module, so a name added to the package appears in the reference
and one moved to another module follows it; then the rest of ``cropbench.api.__all__`` (the fixed
runs the command line offers), and the track runners: every class under ``src/cropbench/tracks/``
with the runner's ``cases``, ``decode`` and ``measure``, found by reading the source, so a runner
renamed or added follows without importing the tracks' optional libraries. A page holding
``<!-- generated:cli -->`` gets the ``--help`` of every ``cropbench`` command, as the parser prints it.
The docstrings' Sphinx roles (``:class:`~x.Y```) are shown as Sphinx shows them. Both read this
checkout's ``src/``, not whichever cropbench the building Python has installed.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import os
import re
import sys
from pathlib import Path
from typing import Any

API_MARKER = "<!-- generated:api -->"
CLI_MARKER = "<!-- generated:cli -->"
#: Where most readers start (``cropbench.run``, ``CropDataset``); the other modules follow in ``_PUBLIC``'s order.
FIRST_MODULES = ("cropbench.api", "cropbench.data.dataset")
#: A Sphinx cross-reference role as the docstrings write it (:class:`~cropbench.config.StoreConfig`),
#: once rendered: mkdocstrings keeps the role's name in front of the code span.
_SPHINX_ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|exc):<code>(~?)([\w.]+)</code>")
#: The width the help text is wrapped at, so the page does not depend on the building terminal.
HELP_COLUMNS = "100"


def _use_checkout_sources(config: Any) -> None:
    source = str(Path(config["config_file_path"]).resolve().parent / "src")
    if source not in sys.path:
        sys.path.insert(0, source)


def api_blocks() -> str:
    """One section per defining module, one mkdocstrings block per public name in it."""
    public: dict[str, str] = importlib.import_module("cropbench")._PUBLIC
    by_module: dict[str, list[str]] = {module: [] for module in FIRST_MODULES}
    for name, module in public.items():
        by_module.setdefault(module, []).append(name)
    sections = []
    for module, names in by_module.items():
        if not names:
            continue
        blocks = "\n\n".join(f"::: {module}.{name}" for name in sorted(names))
        listed = ", ".join(f"`cropbench.{name}`" for name in sorted(names))
        sections.append(f"## `{module}`\n\n{listed}\n\n{blocks}")
    return "\n\n".join([*sections, _more_api(set(public)), _track_runners()])


#: The methods the runner calls on a track (``cropbench.harness.runner.Track``).
RUNNER_METHODS = frozenset({"cases", "decode", "measure"})


def _more_api(exported: set[str]) -> str:
    """The names of ``cropbench.api.__all__`` that ``import cropbench`` does not export."""
    names = sorted(set(importlib.import_module("cropbench.api").__all__) - exported)
    blocks = "\n\n".join(f"::: cropbench.api.{name}" for name in names)
    return (
        "## More of `cropbench.api`\n\n"
        "The fixed runs the command line offers besides `run` and `advise`, imported from `cropbench.api`.\n\n" + blocks
    )


def _track_runners() -> str:
    """One block per track runner class under ``src/cropbench/tracks/``, in module order."""
    tracks = Path(importlib.import_module("cropbench.tracks").__file__ or "").parent
    blocks = []
    for source in sorted(tracks.rglob("*.py")):
        module = ".".join(("cropbench", *source.relative_to(tracks.parent).with_suffix("").parts))
        module = module.removesuffix(".__init__")
        for node in ast.parse(source.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                methods = {item.name for item in node.body if isinstance(item, ast.FunctionDef)}
                if methods >= RUNNER_METHODS:
                    blocks.append(f"::: {module}.{node.name}")
    return (
        "## Track runners\n\n"
        "What `cropbench.run` and the commands build for each track (`cropbench.tracks.TRACKS` names them): "
        "the runner asks a track for its `cases` of a preset, skips those whose `decode` path the plate "
        "lacks, and records the rows `measure` yields.\n\n" + "\n\n".join(blocks)
    )


def _commands(parser: argparse.ArgumentParser, prefix: str) -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(prefix, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.extend(_commands(sub, f"{prefix} {name}"))
    return found


def cli_blocks() -> str:
    """Each command's ``--help``, in the order the parser lists them."""
    os.environ["COLUMNS"] = HELP_COLUMNS
    parser = importlib.import_module("cropbench.cli.parser").build_parser()
    sections = []
    for command, sub in _commands(parser, "cropbench"):
        sections.append(f"## `{command}`\n\n```text\n{sub.format_help().rstrip()}\n```")
    return "\n\n".join(sections)


def without_sphinx_roles(html: str) -> str:
    """The rendered docstrings with ``:class:`~a.b.C``` shown as Sphinx shows it: ``C`` (``a.b.C`` without ``~``)."""

    def name(match: re.Match[str]) -> str:
        shown = match.group(2).rsplit(".", 1)[-1] if match.group(1) else match.group(2)
        return f"<code>{shown}</code>"

    return _SPHINX_ROLE.sub(name, html)


def on_config(config: Any) -> Any:
    _use_checkout_sources(config)
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if API_MARKER in markdown:
        markdown = markdown.replace(API_MARKER, api_blocks())
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_blocks())
    return markdown


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    return without_sphinx_roles(html)
