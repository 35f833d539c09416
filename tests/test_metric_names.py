"""No metric name is spelled as a string outside the metrics modules: every other module uses the constant,
in the package and in the asv suites and scripts beside it (:data:`FOLDERS`).

The metric names are the upper-case string constants of every ``metrics.py`` under ``src/cropbench``
(``cropbench.metrics`` today). A name that is also an ordinary word (``objects``, ``decode``,
``device``) or the name of something else (:data:`OTHER_NAMESPACES`) appears as such in many places,
so it is checked only where a metrics mapping is built or read: among the keys of a dict that is keyed
by metric constants, in a subscript or ``get`` of ``metrics`` (``record.metrics[...]``), and as an
argument of ``prefixed``. Every other name is checked in every string but docstrings and ``__all__``
(a constant defined with a metric's value is such a string).
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "src" / "cropbench"
#: The folders beside the package whose Python reads or writes metrics: the asv suites and the scripts.
FOLDERS = ("benchmarks", "scripts")
METRICS_MODULES = sorted(PACKAGE.rglob("metrics.py"))
#: Metric names that also name something other than a metric key, each with what: checked like words.
OTHER_NAMESPACES = {
    "in_flight": "StoreConfig's field, which the row's metric copies",
    "stored_bytes": "a field of a plate-in-a-store's pointer document",
    "bytes_decoded": "a ReadStats attribute, a field of the native tally and of a rank's report",
    "bytes_delivered": "a field of a rank's report",
    "missing_chunks": "a ReadStats attribute",
    "library_version": "a field of a crop store's manifest",
    "gpu_name": "a field of the environment a record was measured in",
    "world_size": "a field of a rank row's configuration",
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


METRICS_MODULE_NAMES = {_module_name(path) for path in METRICS_MODULES}


def metric_names() -> dict[str, str]:
    """Metric name -> the constant that holds it, over every metrics module."""
    names: dict[str, str] = {}
    for module_name in sorted(METRICS_MODULE_NAMES):
        module = importlib.import_module(module_name)
        for constant, value in vars(module).items():
            if constant.isupper() and isinstance(value, str):
                names.setdefault(value, f"{module_name}.{constant}")
    return names


def is_word(name: str) -> bool:
    """Whether a metric name is checked only where a metrics mapping is built or read."""
    return name.isalpha() or name in OTHER_NAMESPACES


class _MetricsReferences:
    """How one file names the metrics modules: aliases of the modules, and constants imported from them."""

    def __init__(self, tree: ast.Module) -> None:
        self.modules: set[str] = set()
        self.constants: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    if f"{node.module}.{alias.name}" in METRICS_MODULE_NAMES:
                        self.modules.add(alias.asname or alias.name)
                    elif node.module in METRICS_MODULE_NAMES:
                        self.constants.add(alias.asname or alias.name)
            elif isinstance(node, ast.Import):
                self.modules.update(
                    alias.asname for alias in node.names if alias.name in METRICS_MODULE_NAMES and alias.asname
                )

    def names_metric(self, node: ast.expr) -> bool:
        """``m.NAME``, a constant imported from a metrics module, or a call of a metrics-module function."""
        if isinstance(node, ast.Call):
            return self.names_metric(node.func)
        if isinstance(node, ast.Attribute):
            return isinstance(node.value, ast.Name) and node.value.id in self.modules
        return isinstance(node, ast.Name) and node.id in self.constants

    def builds_family_key(self, function: ast.expr) -> bool:
        """``m.prefixed``: both its arguments are metric names (the other helpers take stages and accesses)."""
        named = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", "")
        return named == "prefixed" and self.names_metric(function)


def _docstrings(tree: ast.Module) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _is_metrics_container(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "metrics") or (
        isinstance(node, ast.Attribute) and node.attr == "metrics"
    )


def _where_metrics_are_keyed(tree: ast.Module, references: _MetricsReferences) -> Iterator[ast.Constant]:
    """String constants in the places a metric name keys a metrics mapping."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict) and any(key is not None and references.names_metric(key) for key in node.keys):
            yield from (key for key in node.keys if isinstance(key, ast.Constant))
        elif isinstance(node, ast.Subscript) and _is_metrics_container(node.value):
            if isinstance(node.slice, ast.Constant):
                yield node.slice
        elif isinstance(node, ast.Call):
            function = node.func
            reads_metrics = (
                isinstance(function, ast.Attribute)
                and function.attr in ("get", "pop", "setdefault")
                and _is_metrics_container(function.value)
            )
            if reads_metrics or references.builds_family_key(function):
                yield from (argument for argument in node.args if isinstance(argument, ast.Constant))


def _exports(tree: ast.Module) -> set[int]:
    """The strings of ``__all__``: names of this module's objects, which may share a metric's name."""
    found = set()
    for statement in tree.body:
        if isinstance(statement, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in statement.targets
        ):
            found.update(id(node) for node in ast.walk(statement.value) if isinstance(node, ast.Constant))
    return found


def spelled_metric_names(source: str, names: dict[str, str]) -> list[tuple[int, str]]:
    """(line, name) of each metric name spelled as a string in ``source`` (see the module docstring)."""
    tree = ast.parse(source)
    skipped = _docstrings(tree) | _exports(tree)
    keyed = {id(node) for node in _where_metrics_are_keyed(tree, _MetricsReferences(tree))}
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names):
            continue
        if id(node) in keyed or (id(node) not in skipped and not is_word(node.value)):
            found.append((node.lineno, node.value))
    return sorted(found)


def test_there_is_a_metrics_module_and_the_names_that_name_other_things_are_metric_names() -> None:
    names = metric_names()
    assert "cropbench.metrics" in METRICS_MODULE_NAMES and "samples_per_s" in names
    assert sorted(set(OTHER_NAMESPACES) - set(names)) == [], "an entry no metric is named any more"


def test_no_module_spells_a_metric_name_outside_the_metrics_modules() -> None:
    names = metric_names()
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {name!r} (use {names[name]})"
        for path in sorted(PACKAGE.rglob("*.py"))
        if _module_name(path) not in METRICS_MODULE_NAMES
        for line, name in spelled_metric_names(path.read_text(encoding="utf-8"), names)
    ]
    assert not found, "metric names spelled as strings:\n" + "\n".join(found)


@pytest.mark.parametrize("folder", FOLDERS)
def test_no_suite_or_script_spells_a_metric_name(folder: str) -> None:
    names = metric_names()
    paths = sorted((REPO / folder).rglob("*.py"))
    assert paths, f"no Python files under {folder}/"
    found = [
        f"{path.relative_to(REPO)}:{line}: {name!r} (use {names[name]})"
        for path in paths
        for line, name in spelled_metric_names(path.read_text(encoding="utf-8"), names)
    ]
    assert not found, "metric names spelled as strings:\n" + "\n".join(found)


PLANTED = '''
"""A module whose docstring may say objects and samples_per_s."""
from cropbench import metrics as m

__all__ = ["samples_per_s"]
SAMPLES = "samples_per_s"


def row(record, config):
    config["objects"] = 3  # a configuration's key: an ordinary word
    rate = {m.OBJECTS: 1, "objects": 2}
    return record.metrics["objects"], record.metrics.get("device"), m.prefixed(m.IO, "count"), "p95_ms"
'''


def test_the_check_finds_names_spelled_where_they_key_metrics_and_specific_names_anywhere() -> None:
    names = metric_names()
    found = spelled_metric_names(PLANTED, names)
    assert sorted(name for _, name in found) == ["count", "device", "objects", "objects", "p95_ms", "samples_per_s"]
    configuration_line = (
        PLANTED.splitlines().index('    config["objects"] = 3  # a configuration\'s key: an ordinary word') + 1
    )
    assert configuration_line not in {line for line, _ in found}


@pytest.mark.parametrize("name", ["objects", "decode", "in_flight"])
def test_words_and_names_of_other_things_are_left_alone_outside_metrics_mappings(name: str) -> None:
    assert is_word(name)
    assert spelled_metric_names(f"settings = {{{name!r}: 1}}\nvalue = settings[{name!r}]\n", metric_names()) == []
