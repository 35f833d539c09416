"""The gate's injected regressions (scripts/gate_patches/*.patch) still apply to the tree.

cropbench.history.regression applies each patch with ``git apply`` to a clone of HEAD; a refactor of
the lines a patch edits would make that fail in the gate's own check, so it fails here first.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from cropbench.history import regression

REPO = Path(__file__).resolve().parents[1]


def _apply(patch: Path, where: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "apply", *options, str(patch)], cwd=where, capture_output=True, text=True)


def test_every_patch_file_is_an_injection() -> None:
    assert sorted(path.stem for path in regression.PATCHES.glob("*.patch")) == sorted(regression.INJECTIONS)


@pytest.mark.parametrize("kind", sorted(regression.INJECTIONS))
def test_each_patch_applies_to_the_tree(kind: str) -> None:
    injection = regression.INJECTIONS[kind]
    assert injection.files and all(path.startswith("src/cropbench/") for path in injection.files), injection.files
    result = _apply(injection.patch, REPO, "--check")
    assert result.returncode == 0, f"{injection.patch.name} no longer applies; redo its edit: {result.stderr}"


@pytest.mark.parametrize("kind", sorted(regression.INJECTIONS))
def test_each_patch_gives_code_that_compiles_and_fails_on_a_changed_line(kind: str, tmp_path: Path) -> None:
    injection = regression.INJECTIONS[kind]
    for name in injection.files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / name, tmp_path / name)
    changed = tmp_path / "changed"
    shutil.copytree(tmp_path, changed, ignore=shutil.ignore_patterns("changed"))
    result = _apply(injection.patch, tmp_path)
    assert result.returncode == 0, result.stderr
    for name in injection.files:
        patched = (tmp_path / name).read_text()
        assert patched != (REPO / name).read_text()
        compile(patched, name, "exec")
    body = injection.patch.read_text().split("@@", 2)[2].splitlines()[1:]
    kept = next(line[1:] for line in body if line[:1] in " -" and line[1:].strip())  # a line the patch expects
    target = changed / injection.files[0]
    target.write_text(target.read_text().replace(kept, kept.replace(" ", "  ", 1)))  # as a refactor would
    assert _apply(injection.patch, changed, "--check").returncode != 0
