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
        ([], {}, "measurements/gpu/check"),
        ([], {"OUT": "/elsewhere"}, "measurements/gpu/check"),
        (["measurements/gpu/h200"], {"OUT": "/elsewhere", "OUT_DIR": "/env"}, "measurements/gpu/h200"),
        ([], {"OUT_DIR": "/env"}, "/env"),
    ],
)
def test_rows_go_to_the_argument_else_out_dir_else_results_gpu(
    arguments: list[str], environment: dict[str, str], expected: str
) -> None:
    assert output_folder(arguments, environment) == expected


def test_the_docs_name_the_default_folder() -> None:
    docs = (SCRIPT.parents[1] / "docs" / "how-to" / "gpu.md").read_text()
    assert "measurements/gpu/check" in docs and "first argument" in docs


def test_the_script_parses_and_its_budget_fits_eight_minutes() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    line = next(text for text in SCRIPT.read_text().splitlines() if text.startswith("BUDGET_S="))
    budget = int(line.split(":-")[1].rstrip("}"))
    assert budget + 30 <= 8 * 60, "the budget, the summary and the set-up fit one 8-minute run"


@pytest.mark.slow
def test_the_table_shows_both_pipelines_and_supply_over_demand(tiny_plate: Path, tmp_path: Path) -> None:
    """Rows as a CPU run writes them (the same code a GPU run runs, on device 'cpu'), through the table."""
    import dataclasses
    import sys

    from cropbench.config import CropConfig
    from cropbench.data.loader import LoaderSpec
    from cropbench.harness.context import RunContext
    from cropbench.harness.loader_case import LoaderCase
    from cropbench.harness.runner import run_tracks
    from cropbench.records import RecordWriter
    from cropbench.tracks.loader import Loader, OverheadCase
    from cropbench.tracks.training import ThreadSplit, Training, TrainingCase

    crop = CropConfig(crop_size=32, tier="typical")
    supply = [
        LoaderCase(crop=crop, loader=LoaderSpec(batch_size=256, collate=collate), samples=512, pipeline=pipeline)
        for pipeline, collate in (("dataset", "default"), ("device", "stack"))
    ]
    overhead = OverheadCase(crop=CropConfig(crop_size=32, dtype="uint16"), loader=LoaderSpec(batch_size=8), batches=2)
    loop = TrainingCase(crop=crop, loader=LoaderSpec(batch_size=8), model="smallcnn", steps=2, warmup_steps=1)
    device = dataclasses.replace(loop, pipeline="device")
    plans = {
        "2": [*supply, overhead],
        "3": [dataclasses.replace(loop, compute_only=True), device, ThreadSplit(device, 1)],
    }

    class Planned(Loader):
        def cases(self, preset: str, context: RunContext) -> list:  # type: ignore[override]
            return plans["2"]

    class PlannedLoops(Training):
        def cases(self, preset: str, context: RunContext) -> list:  # type: ignore[override]
            return plans["3"]

    results = tmp_path / "results.jsonl"
    context = RunContext(tiny_plate, environment={"python": "x"}, thread_settings={"torch_threads": 1})
    with RecordWriter(results) as writer:
        run_tracks([Planned(), PlannedLoops()], "smoke", context, writer.write)
    table = subprocess.run(
        [sys.executable, str(SCRIPT.parent / "gpu_table.py"), str(results)], capture_output=True, text=True, check=True
    ).stdout
    supply_section = table.split("## Supply:")[1].split("##")[0]
    supply_rows = [line for line in supply_section.splitlines() if line.startswith("| tiny | direct | typical |")]
    assert (
        len(supply_rows) == 2
        and "| dataset | main | 0 |" in supply_rows[0]
        and "| device | cpu | 0 |" in supply_rows[1]
    )
    over = table.split("## Supply over demand")[1].split("##")[0]
    assert "| tiny | smallcnn | train | fp32 | device | typical | 1 | 0 |" in over, (
        "the row of the most workers: a split's"
    )
    named = "fastest w" in table or "no split to name: every split's row carries a flag" in table
    assert named and "| w0xt1 |" in table and "| w1xt1 |" in table
    assert "## Loader overhead" in table and "| tiny | 0 | 1 | 1 |" in table
