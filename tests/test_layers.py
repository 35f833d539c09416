"""The package imports downward only: no module imports a higher layer, and there are no cycles.

Layers, lowest first: core (errors, config, records) → objects → formats (pure I/O) → plates → data →
measure → tracks → report → the command line and the package's lazy public names.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "cropbench"

LAYERS: dict[str, int] = {
    "cropbench.errors": 0,
    "cropbench.config": 0,
    "cropbench.records": 0,
    "cropbench.metrics": 0,
    "cropbench.objects": 1,
    "cropbench.formats": 2,
    "cropbench.plates": 3,
    "cropbench.data": 4,
    "cropbench.measure": 5,
    "cropbench.tracks": 6,
    "cropbench.report": 7,
    "cropbench.cli": 8,
    "cropbench.__main__": 8,
    "cropbench": 8,
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
    assert {"cropbench.plates.generate", "cropbench.data.dataset", "cropbench.tracks.track1"} <= set(MODULES)


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
