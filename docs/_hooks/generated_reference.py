"""mkdocs hook: the API and command-line reference pages are generated from the code, never typed.

A page holding ``<!-- generated:api -->`` gets one mkdocstrings block per public name of
``cropbench`` (``cropbench._PUBLIC``: the names ``import cropbench`` exports, each with the module
that defines it), grouped by that module, so a name added to the package appears in the reference
and one moved to another module follows it. A page holding ``<!-- generated:cli -->`` gets the
``--help`` of every ``cropbench`` command, as the parser prints it. The docstrings' Sphinx roles
(``:class:`~x.Y```) are shown as Sphinx shows them. Both read this checkout's
``src/``, not whichever cropbench the building Python has installed.
"""

from __future__ import annotations

import argparse
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
    return "\n\n".join(sections)


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
