"""scripts/library_gate.py and library_campaign.py: the format libraries' gates and the zarr gate's campaign.

Nothing here runs asv: the command and the private configuration are checked as data, and the run
goes through a fake runner that looks at what asv would find on disk. The campaign's injected
regressions are checked against the installed zarr's source, its branches on a fake release
history holding that source, and its speed measurement imports each branch's zarr.
"""

from __future__ import annotations

import importlib
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO))

import library_campaign as campaign_module  # noqa: E402
import library_gate as gate_module  # noqa: E402

GATES = gate_module.LIBRARY_GATES


def _benchmark_names() -> list[str]:
    """Every benchmark of benchmarks/ with its parameters, spelt as asv spells them (what ``-b`` searches)."""
    names = []
    for path in sorted((REPO / "benchmarks").glob("*.py")):
        if path.stem in ("__init__", "common"):
            continue
        module = importlib.import_module(f"benchmarks.{path.stem}")
        for class_name, suite in sorted(vars(module).items()):
            if not (isinstance(suite, type) and suite.__module__ == module.__name__):
                continue
            methods = [name for name in vars(suite) if name.split("_", 1)[0] in ("time", "track", "peakmem")]
            combinations = list(itertools.product(*getattr(suite, "params", ())))
            for method in methods:
                for combination in combinations:
                    arguments = ", ".join(repr(value) for value in combination)
                    names.append(f"{path.stem}.{class_name}.{method}({arguments})")
    return names


def _selected(library: str) -> list[str]:
    return [name for name in _benchmark_names() if re.search(GATES[library].bench, name)]


def test_the_zarr_gate_selects_zarr_pythons_own_read_path_random_and_grouped() -> None:
    selected = _selected("zarr")
    assert "track1.Fetch.track_relative_cost('random', 'zarr', 'bounded')" in selected
    assert "track1.Fetch.track_relative_cost('grouped-field', 'zarr', 'bounded')" in selected
    counts = [name for name in selected if name.startswith("zarr_stages.ZarrCounts.")]
    assert {name.split("(")[1] for name in counts} == {"'random')", "'grouped-field')"}, counts
    # cropbench's own reader never calls zarr-python: none of its cases are in the library's gate.
    assert not [name for name in selected if "'direct'" in name or "'default'" in name]
    assert not [name for name in selected if name.startswith(("remote.", "track2.", "track3."))]
    # The stage timings are for reading where a regression lives, not for gating (their noise is unmeasured).
    assert not [name for name in selected if name.startswith("zarr_stages.ZarrStages.")]


def test_the_ome_arrow_gate_selects_its_two_read_paths() -> None:
    assert sorted(_selected("ome-arrow")) == [
        "track1.ArrowFetch.track_relative_cost('random', 'as-py')",
        "track1.ArrowFetch.track_relative_cost('random', 'direct')",
    ]


@pytest.mark.parametrize("library", sorted(GATES))
def test_the_private_configuration_reuses_the_environment_and_suites_but_not_the_results(
    library: str, tmp_path: Path
) -> None:
    gate = GATES[library]
    original = gate_module.read_config(REPO / gate.config)
    config = gate_module.private_config(gate, tmp_path / "results")
    assert config["results_dir"] == str(tmp_path / "results") and config["html_dir"].startswith(str(tmp_path))
    # Same matrix and env_dir as the library's own configuration: asv finds the environment it built.
    assert config["matrix"] == original["matrix"] and config["pythons"] == original["pythons"]
    assert config["env_dir"] == str(REPO / original["env_dir"])
    assert config["benchmark_dir"] == str(REPO / "benchmarks")
    assert config["repo"] == str(REPO / original["repo"])
    assert all("{conf_dir}" not in command for command in config["install_command"])
    assert any(f"git+file://{REPO}@main" in command for command in config["install_command"])
    mine = gate_module.private_config(gate, tmp_path / "results", tmp_path / "my-clone")
    assert mine["repo"] == str(tmp_path / "my-clone")
    assert gate_module.private_config(gate, tmp_path, "https://example.org/lib.git")["repo"].startswith("https://")


def test_the_asv_command_is_the_documented_gate(tmp_path: Path) -> None:
    gate = GATES["zarr"]
    command = gate_module.asv_command(gate, tmp_path / "c.json", "v3.1.5", "v3.1.6", machine="m")
    assert command[:2] == ["asv", "continuous"] and command[-2:] == ["v3.1.5", "v3.1.6"]
    assert command[command.index("--factor") + 1] == "1.2" and command[command.index("-a") + 1] == "rounds=1"
    assert command[command.index("-b") + 1] == gate.bench and command[command.index("--machine") + 1] == "m"
    docs = (REPO / "docs" / "how-to" / "format-library.md").read_text()
    for library in GATES:
        assert gate_module.maintainer_command(GATES[library]).replace("BASE HEAD", "") in docs


class _FakeAsv:
    """Stands in for asv: records the command and what the results folder held when asv started."""

    def __init__(self, table: str = "", returncode: int = 0) -> None:
        self.table, self.returncode = table, returncode
        self.commands: list[list[str]] = []
        self.found: list[list[str]] = []

    def __call__(self, command: Sequence[str], environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
        config = json.loads(Path(command[command.index("--config") + 1]).read_text())
        results = Path(config["results_dir"])
        self.found.append(sorted(str(path.relative_to(results)) for path in results.rglob("*")))
        self.commands.append(list(command))
        assert "CROPBENCH_ASV_FULL" not in environment
        (results / "machine").mkdir(exist_ok=True)
        (results / "machine" / "abc-env.json").write_text("{}")  # what a run leaves behind
        return subprocess.CompletedProcess(list(command), self.returncode, self.table, "")


TABLE = (
    "| Change | Before [a] | After [b] | Ratio | Benchmark (Parameter) |\n"
    "|--------|------------|-----------|-------|-----------------------|\n"
    "| +      | 58.3       | 88.5      | 1.52  | track1.Fetch.track_relative_cost('random', 'zarr', 'bounded') |\n"
    "| -      | 2.0        | 1.0       | 0.5   | zarr_stages.ZarrCounts.track_store_reads_per_crop('random') |\n"
)


def test_each_run_starts_from_an_empty_results_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CROPBENCH_ASV_FULL", "1")
    fake = _FakeAsv(TABLE, returncode=1)
    first = gate_module.run_gate(GATES["zarr"], "v3.0.9", "v3.0.10", tmp_path / "one", runner=fake)
    second = gate_module.run_gate(GATES["zarr"], "v3.0.9", "v3.0.10", tmp_path / "two", runner=fake)
    assert fake.found == [[]] * 4, "asv found no results saved by an earlier run or step"
    assert first.returncode == 1 and first.worse == ("track1.Fetch.track_relative_cost('random', 'zarr', 'bounded')",)
    assert second.results_dir != first.results_dir
    # A folder that already holds results is refused, not reused.
    with pytest.raises(gate_module.GateError, match="not empty"):
        gate_module.run_gate(GATES["zarr"], "v3.0.9", "v3.0.10", tmp_path / "one", runner=fake)
    assert len(fake.commands) == 4


def test_the_instruction_counts_are_a_step_of_their_own_with_the_tighter_factor(tmp_path: Path) -> None:
    fake = _FakeAsv()
    run = gate_module.run_gate(GATES["zarr"], "v3.1.5", "v3.1.6", tmp_path, runner=fake)
    assert run.returncode == 0 and len(fake.commands) == 2
    instructions, wall = ({"bench": c[c.index("-b") + 1], "factor": c[c.index("--factor") + 1]} for c in fake.commands)
    assert instructions == {"bench": GATES["zarr"].instructions_bench, "factor": str(gate_module.INSTRUCTIONS_FACTOR)}
    assert wall == {"bench": GATES["zarr"].bench, "factor": "1.2"}
    assert 1.03 <= gate_module.INSTRUCTIONS_FACTOR <= 1.05
    assert gate_module.gate_commands(GATES["zarr"]).count("asv continuous") == 2
    # --factor changes the wall-clock step only
    assert [factor for _, _, factor in GATES["zarr"].steps(1.3)] == [gate_module.INSTRUCTIONS_FACTOR, 1.3]


def test_one_step_of_the_gate_runs_alone_and_an_unknown_step_is_refused(tmp_path: Path) -> None:
    fake = _FakeAsv()
    run = gate_module.run_gate(GATES["zarr"], "v3.1.5", "v3.1.6", tmp_path, runner=fake, only="instructions")
    assert run.returncode == 0 and len(fake.commands) == 1
    command = fake.commands[0]
    assert command[command.index("-b") + 1] == GATES["zarr"].instructions_bench
    assert command[command.index("--factor") + 1] == str(gate_module.INSTRUCTIONS_FACTOR)
    assert gate_module.gate_commands(GATES["zarr"], only="instructions").count("asv continuous") == 1
    with pytest.raises(gate_module.GateError, match="--step 'timings'.*instructions, wall-time"):
        GATES["zarr"].steps(only="timings")


@pytest.mark.parametrize(
    ("library", "expected"),
    [
        (
            "zarr",
            [
                "ZarrReads.track_instructions_per_crop('grouped-field')",
                "ZarrReads.track_instructions_per_crop('random')",
            ],
        ),
        (
            "ome-arrow",
            ["ArrowReads.track_instructions_per_crop('as-py')", "ArrowReads.track_instructions_per_crop('direct')"],
        ),
    ],
)
def test_each_library_gates_its_own_instruction_counts(library: str, expected: list[str]) -> None:
    bench = GATES[library].instructions_bench
    assert bench is not None
    selected = sorted(name for name in _benchmark_names() if re.search(bench, name))
    assert selected == [f"instructions.{name}" for name in expected]
    assert not [name for name in selected if re.search(GATES[library].bench, name)], "each step its own benchmarks"


def test_a_failing_step_is_the_gates_exit_code(tmp_path: Path) -> None:
    fake = _FakeAsv(TABLE, returncode=2)
    assert gate_module.run_gate(GATES["ome-arrow"], "a", "b", tmp_path, runner=fake).returncode == 2


def test_the_command_line_refuses_a_results_folder_with_results_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kept = tmp_path / "kept"
    (kept / "machine").mkdir(parents=True)
    (kept / "machine" / "old.json").write_text("{}")
    assert gate_module.main(["zarr", "v3.1.5", "v3.1.6", "--results-dir", str(kept)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("library_gate: error: --results-dir") and error.count("\n") == 1
    assert (kept / "machine" / "old.json").read_text() == "{}", "nothing of the user's is deleted"


def test_a_dry_run_prints_the_command_and_runs_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert gate_module.main(["ome-arrow", "v0.0.11", "v0.1.0", "--dry-run", "--results-dir", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("asv continuous --config ") and "v0.0.11 v0.1.0" in out
    assert not any((tmp_path / "d").iterdir())


def test_factor_must_be_a_ratio_above_one() -> None:
    with pytest.raises(ValueError, match="above 1"):
        gate_module.LibraryGate("zarr", "asv.zarr.conf.json", "x", factor=0.8)
    with pytest.raises(ValueError, match="instructions_factor must be above 1"):
        gate_module.LibraryGate("zarr", "asv.zarr.conf.json", "x", instructions_bench="y", instructions_factor=1.0)


# --- the detection campaign (scripts/library_campaign.py) ---

ZARR_SOURCE = Path(importlib.import_module("zarr").__file__).parent
INJECTIONS = campaign_module.INJECTIONS


def _apply(patch: Path, where: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "apply", *options, str(patch)], cwd=where, capture_output=True, text=True)


def _installed_source(destination: Path, files: Sequence[str]) -> None:
    """The installed zarr's files laid out as in its source tree (``src/zarr/...``)."""
    for name in files:
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ZARR_SOURCE / Path(name).relative_to("src/zarr"), target)


def test_every_patch_file_is_an_injection() -> None:
    assert sorted(path.stem for path in campaign_module.PATCHES.glob("*.patch")) == sorted(INJECTIONS)


def test_the_default_kinds_are_injections_and_an_unknown_kind_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert campaign_module.DEFAULT_KINDS and set(campaign_module.DEFAULT_KINDS) <= set(INJECTIONS)
    assert campaign_module.main(["--kinds", "shard-index,no-such-kind", "--out", "unused"]) == 2
    assert "--kinds: unknown no-such-kind" in capsys.readouterr().err


@pytest.mark.parametrize("kind", sorted(INJECTIONS))
def test_each_patch_applies_to_the_installed_zarrs_source_and_compiles(kind: str, tmp_path: Path) -> None:
    injection = INJECTIONS[kind]
    assert injection.files and all(name.startswith("src/zarr/") for name in injection.files), injection.files
    _installed_source(tmp_path, injection.files)
    check = _apply(injection.patch, tmp_path, "--check")
    assert check.returncode == 0, f"{injection.patch.name} no longer applies to zarr's source: {check.stderr}"
    assert _apply(injection.patch, tmp_path).returncode == 0
    for name in injection.files:
        patched = (tmp_path / name).read_text()
        assert "injected regression" in patched
        assert patched != (ZARR_SOURCE / Path(name).relative_to("src/zarr")).read_text()
        compile(patched, name, "exec")


@pytest.fixture(scope="module")
def fake_history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A release history holding the installed zarr's whole package as ``src/zarr``, tagged ``v3.1.6`` on main."""
    history = tmp_path_factory.mktemp("history") / "zarr"
    shutil.copytree(ZARR_SOURCE, history / "src" / "zarr", ignore=shutil.ignore_patterns("__pycache__", "_version.py"))
    (history / ".gitignore").write_text("src/zarr/_version.py\n")
    subprocess.run(["git", "init", "-q", "-b", "main", str(history)], check=True)
    campaign_module._commit(history, "zarr 3.1.6")
    campaign_module._git(history, "tag", "v3.1.6")
    return history


@pytest.fixture(scope="module")
def branches(fake_history: Path, tmp_path_factory: pytest.TempPathFactory) -> campaign_module.Branches:
    destination = tmp_path_factory.mktemp("campaign") / "zarr"
    return campaign_module.make_branches(fake_history, destination, "v3.1.6", tuple(INJECTIONS))


def test_branches_differ_from_the_release_only_by_their_patch(
    fake_history: Path, branches: campaign_module.Branches
) -> None:
    assert campaign_module.newest_release(fake_history) == "v3.1.6"

    def changed(ref: str) -> list[str]:
        return campaign_module._git(branches.clone, "diff", "--name-only", "v3.1.6", ref).split()

    assert changed(branches.identical) == [campaign_module.IDENTICAL_FILE]
    for kind, injection in INJECTIONS.items():
        assert changed(branches.injected[kind]) == sorted(injection.files), kind
    assert campaign_module._git(fake_history, "branch", "--list").split() == ["*", "main"], "the history is untouched"


@pytest.mark.slow
def test_the_speed_measurement_imports_each_branchs_zarr_and_the_shard_index_injection_reads_more(
    branches: campaign_module.Branches, tiny_plate: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(campaign_module, "SPEED_CROPS", 20)
    base = campaign_module.source_tree(branches, branches.base, tmp_path)
    injected = campaign_module.source_tree(branches, branches.injected["shard-index"], tmp_path)
    assert campaign_module.zarr_crops_at(base, tiny_plate) > 0
    reads = {}
    script = (
        "import sys, json; from cropbench.config import CropConfig; from cropbench.data.dataset import CropDataset; "
        "from cropbench.measure.zarr_stages import measure_stages; import zarr; "
        "d = CropDataset(sys.argv[1], CropConfig(crop_size=64, decode='zarr')); [d[i] for i in range(len(d))]; "
        "m = measure_stages(d.__getitem__, list(range(len(d)))); print(json.dumps([zarr.__file__, m.store_reads]))"
    )
    for name, source in (("base", base), ("shard-index", injected)):
        environment = {**os.environ, "PYTHONPATH": str(source)}
        result = subprocess.run(
            [sys.executable, "-c", script, str(tiny_plate)], env=environment, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr
        module, reads[name] = json.loads(result.stdout.strip().splitlines()[-1])
        assert module.startswith(str(source))
    assert reads["shard-index"] > reads["base"], reads


def test_slowdown_is_the_ratio_of_medians_of_alternating_processes() -> None:
    calls: list[str] = []
    rates = iter([100.0, 50.0, 90.0, 60.0, 110.0, 40.0])

    def rate(name: str) -> float:
        calls.append(name)
        return next(rates)

    measured = campaign_module.slowdown(lambda: rate("base"), lambda: rate("injected"), 3)
    assert calls == ["base", "injected"] * 3
    assert measured["slowdown"] == pytest.approx(100.0 / 50.0)


def test_an_instruction_calibration_is_the_lower_ratio_of_the_two_accesses(monkeypatch: pytest.MonkeyPatch) -> None:
    counts = {("base", "random"): 1000.0, ("hurt", "random"): 1080.0}
    counts |= {("base", "grouped-field"): 2000.0, ("hurt", "grouped-field"): 2100.0}
    monkeypatch.setattr(campaign_module, "instructions_at", lambda source, plate, access: counts[(source.name, access)])
    monkeypatch.setattr(campaign_module, "CALIBRATION_ACCESSES", ("random", "grouped-field"))
    measured = campaign_module.instruction_slowdown(Path("base"), Path("hurt"), Path("plate"))
    assert measured["random_slowdown"] == pytest.approx(1.08) and measured["grouped-field_slowdown"] == pytest.approx(
        1.05
    )
    assert measured["slowdown"] == pytest.approx(1.05)
    summary = {"release": "v3.1.6", "slowdown_outside_asv": {"extra-copy": measured}}
    summary |= {
        "slowdown_measured_by": "instructions",
        "tallies": {"identical": vars(campaign_module.asv_regression.Tally())},
    }
    summary["tallies"]["extra-copy"] = {"runs": 1, "flagged": 1, "worse": {}}
    assert "instructions per crop" in campaign_module.table(summary) and "| x1.050 | 1/1 |" in campaign_module.table(
        summary
    )


def test_campaign_tallies_each_kind_and_writes_the_table(tmp_path: Path, branches: campaign_module.Branches) -> None:
    order = campaign_module.schedule(3, 2, ("shard-index", "extra-copy"), seed=1)
    assert sorted(order) == ["extra-copy"] * 2 + ["identical"] * 3 + ["shard-index"] * 2
    assert order == campaign_module.schedule(3, 2, ("shard-index", "extra-copy"), seed=1)
    seen: list[tuple[str, str]] = []

    def gate(base: str, head: str, workdir: Path) -> gate_module.GateRun:
        seen.append((base, head))
        (workdir / "results").mkdir(parents=True)
        flagged = head == "gate-shard-index"
        table = TABLE if flagged else ""
        return gate_module.GateRun(int(flagged), gate_module.worse_rows(table), table, workdir / "results")

    slowdowns = {kind: {"slowdown": 1.4} for kind in ("shard-index", "extra-copy")}
    summary = campaign_module.campaign(branches, gate, slowdowns, order, tmp_path / "out", tmp_path / "scratch")
    assert all(base == "v3.1.6" for base, _ in seen) and len(seen) == len(order)
    assert summary["tallies"]["identical"]["flagged"] == 0 and summary["tallies"]["identical"]["runs"] == 3
    assert summary["tallies"]["shard-index"]["flagged"] == 2 and summary["tallies"]["extra-copy"]["flagged"] == 0
    written = (tmp_path / "out" / "table.md").read_text()
    assert "identical code (a comment) flagged 0/3" in written and "| x1.40 | 2/2 |" in written
    assert len((tmp_path / "out" / "comparisons.jsonl").read_text().splitlines()) == len(order)
    assert not list((tmp_path / "scratch").iterdir()), "each run's results folder is removed after it"


def test_the_campaign_refuses_an_out_folder_that_holds_anything(tmp_path: Path) -> None:
    (tmp_path / "kept.txt").write_text("mine\n")
    assert campaign_module.main(["--out", str(tmp_path)]) == 2
    assert (tmp_path / "kept.txt").read_text() == "mine\n"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--history", "{tmp}/missing"], "--history {tmp}/missing is not a release history"),
        (["--history", "{tmp}/plain"], "--history {tmp}/plain is not a release history"),
        (["--release", "v9.9.9"], "--release 'v9.9.9' is not a release tag of {history}; expected one of v3.1.6"),
        (["--out", "{tmp}/a-file"], "--out {tmp}/a-file is a file, not a folder"),
        (["--identical", "-1"], "--identical must be 0 or more comparisons, got -1"),
        (["--per-kind", "-3"], "--per-kind must be 0 or more comparisons, got -3"),
        (["--identical", "0", "--per-kind", "0"], "the campaign has no comparisons"),
        (["--identical", "0", "--kinds", ""], "the campaign has no comparisons"),
    ],
)
def test_the_campaign_checks_every_argument_before_it_starts_in_one_line(
    fake_history: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    arguments: list[str],
    message: str,
) -> None:
    (tmp_path / "plain").mkdir()
    (tmp_path / "a-file").write_text("mine\n")

    def no_work(*args: object, **kwargs: object) -> None:
        raise AssertionError("the campaign started before its arguments were checked")

    monkeypatch.setattr(campaign_module, "make_branches", no_work)
    filled = [argument.format(tmp=tmp_path) for argument in arguments]
    out = ["--out", str(tmp_path / "out")] if "--out" not in arguments else []
    assert campaign_module.main(["--history", str(fake_history), *out, *filled]) == 2
    error = capsys.readouterr().err
    assert error.startswith("library_campaign: error: ") and error.count("\n") == 1, error
    assert message.format(tmp=tmp_path, history=fake_history) in error
    assert not (tmp_path / "out").exists(), "nothing is written"
    assert (tmp_path / "a-file").read_text() == "mine\n"


def test_the_workflow_gates_every_library_when_a_release_appears() -> None:
    import yaml

    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "library-gate.yml").read_text())
    assert {"schedule", "workflow_dispatch"} <= set(workflow[True])  # PyYAML reads `on` as True
    job = workflow["jobs"]["gate"]
    assert sorted(entry["library"] for entry in job["strategy"]["matrix"]["include"]) == sorted(GATES)
    steps = " ".join(step.get("run", "") for step in job["steps"])
    assert 'scripts/release_history.py "$LIBRARY" --last latest' in steps
    assert 'scripts/library_gate.py "$LIBRARY"' in steps and "--results-dir" in steps


@pytest.mark.parametrize("library", sorted(GATES))
def test_asv_reads_the_private_configuration_from_another_folder(library: str, tmp_path: Path) -> None:
    """asv resolves paths from the configuration's folder: the copy must still find the suites."""
    config = gate_module.private_config(GATES[library], tmp_path / "results", repo=REPO)
    (tmp_path / "gate.conf.json").write_text(json.dumps(config))
    environment = {key: value for key, value in os.environ.items() if key != "CROPBENCH_ASV_FULL"}
    result = subprocess.run(
        [sys.executable, "-m", "asv", "check", "--config", str(tmp_path / "gate.conf.json"), "--python=same"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0 and "No problems found" in result.stdout, result.stdout + result.stderr
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())


def test_a_speed_measurement_of_the_wrong_zarr_ends_the_campaign_in_its_one_line_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def wrong_tree(*args: object) -> float:
        raise RuntimeError("the speed measurement imported zarr from /elsewhere, not from the worktree")

    monkeypatch.setattr(campaign_module.asv_regression, "track1_random_rate", wrong_tree)
    with pytest.raises(campaign_module.CampaignError, match="imported zarr from /elsewhere"):
        campaign_module.zarr_crops_at(tmp_path / "src", tmp_path / "plate.zarr")
