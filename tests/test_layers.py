"""The package imports downward only: no module imports a higher layer, and there are no cycles.

Layers, lowest first: core (errors, config, records) → objects → formats (pure I/O) → plates → data →
measure → harness → tracks → report and history (asv and the gates, over the checkout) → the command line,
the API and the package's lazy public names.

Within ``tracks/`` each track is one module or package named by its track, listed in the one table
(:data:`cropbench.tracks.TRACKS`), and no track imports another.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "cropbench"

LAYERS: dict[str, int] = {
    "cropbench.errors": 0,
    "cropbench.config": 0,
    "cropbench.records": 0,
    "cropbench.metrics": 0,
    "cropbench.scratch": 0,
    "cropbench.objects": 1,
    "cropbench.formats": 2,
    "cropbench.plates": 3,
    "cropbench.data": 4,
    "cropbench.measure": 5,
    "cropbench.harness": 6,
    "cropbench.tracks": 7,
    "cropbench.report": 8,
    "cropbench.history": 8,
    "cropbench.cli": 9,
    "cropbench.__main__": 9,
    "cropbench": 9,
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> int:
    best = max((prefix for prefix in LAYERS if module == prefix or module.startswith(prefix + ".")), key=len)
    return LAYERS[best]


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module imported, names imported from it) for every import in the file, function-level ones too."""
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("cropbench"):
            found.append((node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found.extend((alias.name, []) for alias in node.names if alias.name.startswith("cropbench"))
    return found


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def test_every_module_has_a_layer() -> None:
    assert all(_layer(module) >= 0 for module in MODULES)
    assert {"cropbench.plates.generate", "cropbench.data.dataset", "cropbench.tracks.dataset"} <= set(MODULES)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_downward_and_never_at_private_names(module: str) -> None:
    own = _layer(module)
    for imported, names in _imports(MODULES[module]):
        target = imported
        if imported == "cropbench" and names:  # ``from cropbench import x``: x is a subpackage or module
            target = f"cropbench.{names[0]}"
        assert _layer(target) <= own, f"{module} (layer {own}) imports {target} (layer {_layer(target)})"
        private = [name for name in names if name.startswith("_") and not name.startswith("__")]
        assert not private, f"{module} imports private {private} from {imported}"


def test_no_import_cycles() -> None:
    graph = {
        module: {imp for imp, _ in _imports(path) if imp in MODULES and imp != module}
        for module, path in MODULES.items()
    }
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*trail, node, nxt]))
            if nxt not in state:
                visit(nxt, [*trail, node])
        state[node] = 2

    for module in graph:
        if module not in state:
            visit(module, [])


TRACKS_PACKAGE = PACKAGE / "tracks"


def _track_of(module: str) -> str | None:
    """The track module or package ``module`` belongs to (``cropbench.tracks.NAME``), or None."""
    parts = module.split(".")
    return ".".join(parts[:3]) if len(parts) > 2 and parts[:2] == ["cropbench", "tracks"] else None


def _track_modules() -> set[str]:
    """Every module or package directly under ``tracks/`` (but the table in its ``__init__``)."""
    found = {path.stem for path in TRACKS_PACKAGE.glob("*.py") if path.name != "__init__.py"}
    found |= {path.name for path in TRACKS_PACKAGE.iterdir() if (path / "__init__.py").is_file()}
    return found


def _imported_modules(imported: str, names: list[str]) -> list[str]:
    """The modules an import reaches: ``from package import module`` reaches the module, not the package."""
    submodules = [f"{imported}.{name}" for name in names if f"{imported}.{name}" in MODULES]
    return submodules or [imported]


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _track_of(m) is not None))
def test_no_track_imports_another_track(module: str) -> None:
    own = _track_of(module)
    for imported, names in _imports(MODULES[module]):
        for target in _imported_modules(imported, names):
            other = _track_of(target)
            assert other in (None, own), f"{module} imports {target}: a track imports only what lies below tracks/"


def test_tracks_are_named_by_the_table() -> None:
    """Each module under tracks/ is a track in the table, and each track in the table has its module."""
    from cropbench.tracks import TRACKS

    named = {info.name.replace("-", "_") for info in TRACKS.values()}
    assert _track_modules() - named == set(), "modules under tracks/ that are not a track in cropbench.tracks.TRACKS"
    assert named - _track_modules() == set(), "tracks in cropbench.tracks.TRACKS without a module of their name"
    for info in TRACKS.values():
        assert info.module == f"cropbench.tracks.{info.name.replace('-', '_')}"
        assert info.module in MODULES


def test_a_track_is_one_word_its_module_class_command_and_record_value() -> None:
    from cropbench.tracks import TRACKS, track_named

    for info in TRACKS.values():
        if info.runner_class is None:
            assert info.command, f"track {info.name} has neither a runner class nor a command"
            continue
        for name in (info.name, *info.aliases):
            assert track_named(name) is info
        assert info.build().name == info.name
        assert info.runner_class.lower() == info.name.replace("-", ""), "the runner class is the name as a noun"


def test_a_track_started_by_its_own_command_names_its_runner_class_as_the_noun_too() -> None:
    """``layouts``'s runner class is ``Layouts``, ``out-of-memory``'s ``OutOfMemory``: its settings take
    another name (``LayoutComparison``, ``OutOfMemoryComparison``)."""
    import importlib

    from cropbench.tracks import TRACKS

    for info in TRACKS.values():
        module = importlib.import_module(info.module)
        runners = [
            value.__name__
            for value in vars(module).values()
            if isinstance(value, type)
            and value.__module__ == module.__name__
            and getattr(value, "name", None) == info.name
        ]
        assert all(runner.lower() == info.name.replace("-", "") for runner in runners), (info.name, runners)


def test_a_module_belongs_to_the_track_it_lies_under() -> None:
    """Modules inside a track package belong to that track; the harness and the table belong to none."""
    assert _track_of("cropbench.tracks.loader") == "cropbench.tracks.loader"
    assert _track_of("cropbench.tracks.training.loop") == "cropbench.tracks.training"
    assert _track_of("cropbench.harness.runner") is None
    assert _track_of("cropbench.tracks") is None
    assert _imported_modules("cropbench.tracks", ["scale"]) == ["cropbench.tracks.scale"]
    assert _imported_modules("cropbench.tracks", ["TRACKS"]) == ["cropbench.tracks"]


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("cropbench.report")))
def test_the_report_reads_the_track_table_not_track_internals(module: str) -> None:
    """Names and constants a table or figure needs live in metrics, config or the harness: a track's
    module can change without the report following it."""
    for imported, names in _imports(MODULES[module]):
        for target in _imported_modules(imported, names):
            assert _track_of(target) is None, f"{module} imports {target}, a track's internals"


def test_every_table_of_what_a_track_means_is_keyed_by_a_track_of_the_table() -> None:
    """A track's validity rules and its report (columns, verdict rule, figures) are each registered under its
    name in :data:`cropbench.tracks.TRACKS`, so renaming a track that a table still spells the old way fails here."""
    from cropbench.harness.validity import TRACK_VALIDITY
    from cropbench.report.tracks import REPORTS
    from cropbench.tracks import TRACKS

    for name, table in (("TRACK_VALIDITY", TRACK_VALIDITY), ("REPORTS", REPORTS)):
        assert set(table) <= set(TRACKS), f"{name} holds {sorted(set(table) - set(TRACKS))}, which no track is named"


def test_every_figure_a_track_names_is_a_figure_maker_and_every_maker_is_named_once() -> None:
    """The figures of :data:`cropbench.report.tracks.REPORTS` are names, so that reading the table loads no
    plotting library: each must be a maker of :mod:`cropbench.report.plots`, and no maker goes undrawn."""
    from cropbench.report.plots import FIGURE_MAKERS
    from cropbench.report.tracks import REPORTS

    named = [figure for report in REPORTS.values() for figure in report.figures]
    assert sorted(named) == sorted(FIGURE_MAKERS)


def test_reading_the_table_of_reports_loads_no_plotting_library() -> None:
    """The verdict and the summary read the table on every run; only drawing figures loads matplotlib."""
    code = "import sys, cropbench.report.verdict; print('matplotlib' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
