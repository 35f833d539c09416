"""scripts/gpu_check.sh: where its rows go (the script itself needs a GPU; this checks its output folder rule)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.sh"


def output_folder(arguments: list[str], environment: dict[str, str]) -> str:
    """The folder the script's own ``OUT_DIR=`` line picks, evaluated by bash with these arguments and variables."""
    line = next(text for text in SCRIPT.read_text().splitlines() if text.startswith("OUT_DIR="))
    result = subprocess.run(
        ["bash", "-c", f'{line}; printf %s "$OUT_DIR"', "gpu_check.sh", *arguments],
        env={"PATH": "/usr/bin:/bin", **environment},
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout


@pytest.mark.parametrize(
    ("arguments", "environment", "expected"),
    [
        ([], {}, "results/gpu/check"),
        ([], {"OUT": "/elsewhere"}, "results/gpu/check"),
        (["results/gpu/h200"], {"OUT": "/elsewhere", "OUT_DIR": "/env"}, "results/gpu/h200"),
        ([], {"OUT_DIR": "/env"}, "/env"),
    ],
)
def test_rows_go_to_the_argument_else_out_dir_else_results_gpu(
    arguments: list[str], environment: dict[str, str], expected: str
) -> None:
    assert output_folder(arguments, environment) == expected


def test_the_docs_name_the_default_folder() -> None:
    docs = (SCRIPT.parents[1] / "docs" / "gpu.md").read_text()
    assert "results/gpu/check" in docs and "first argument" in docs
