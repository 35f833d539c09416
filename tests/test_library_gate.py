"""``cropbench library-gate`` and ``library-campaign``: the format libraries' gates and the zarr gate's campaign.

Nothing here runs asv: the command and the private configuration are checked as data, and the run
goes through a fake runner that looks at what asv would find on disk. The campaign's injected
regressions are checked against the installed zarr's source, its branches on a fake release
history holding that source, and its speed measurement imports each branch's zarr.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from cropbench.history import campaign as campaign_module
from cropbench.history import library_gate as gate_module

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the benchmarks package, which asv imports from the checkout

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


@pytest.fixture(autouse=True)
def private_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME of the test's own: the gate writes asv's machine entry there, never to the user's."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.fixture(scope="module")
def library_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A library's repository with two releases, ``v1.0.0`` and ``v1.1.0``."""
    repo = tmp_path_factory.mktemp("library") / "repo"
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    for version in ("1.0.0", "1.1.0"):
        commit = ["-c", "user.name=t", "-c", "user.email=t@localhost", "commit", "-q", "--allow-empty"]
        subprocess.run(["git", "-C", str(repo), *commit, "-m", version], check=True)
        subprocess.run(["git", "-C", str(repo), "tag", f"v{version}"], check=True)
    return repo


def _commit(repo: Path, ref: str) -> str:
    commit = gate_module.commit_of(repo, ref)
    assert commit is not None
    return commit


def save_results(results_dir: Path, commit: str, values: dict[str, float | None], machine: str = "fake") -> None:
    """``values`` (benchmark with parameters -> value) saved for ``commit`` as asv saves a run's results."""
    from asv.results import Results
    from asv.runner import BenchmarkResult
    from asv.util import write_json

    write_json(str(results_dir / machine / "machine.json"), {"machine": machine}, api_version=1)
    results = Results({"machine": machine}, {}, commit, 0, "3.11", "env", {})
    grouped: dict[str, list[tuple[tuple[str, ...], float | None]]] = {}
    for name, value in values.items():
        key, _, rest = name.partition("(")
        grouped.setdefault(key, []).append((tuple(rest.removesuffix(")").split(", ")) if rest else (), value))
    for key, cases in grouped.items():
        # one value per parameter combination, in asv's order (the product of each parameter's values)
        columns = [list(dict.fromkeys(case[index] for case, _ in cases)) for index in range(len(cases[0][0]))]
        found = dict(cases)
        combinations = list(itertools.product(*columns))
        result = BenchmarkResult(
            [found.get(combination) for combination in combinations],
            [None] * len(combinations),
            [None] * len(combinations),
            0,
            "",
            None,
        )
        results.add_result({"name": key, "version": "1", "params": columns}, result)
    results.save(str(results_dir))


#: What the fake asv measures: benchmark -> (before, after), the gate's regular expressions pick each step's.
VALUES: dict[str, tuple[float | None, float | None]] = {
    "track1.Fetch.track_relative_cost('random', 'zarr', 'bounded')": (58.3, 88.5),
    "zarr_stages.ZarrCounts.track_store_reads_per_crop('random')": (2.0, 1.0),
    "instructions.ZarrReads.track_instructions_per_crop('random')": (1_000_000.0, 1_030_900.0),
}


class _FakeAsv:
    """Stands in for asv: records the command and what the results folder held when asv started, saves
    ``values`` for the two commits as asv would, and prints ``table`` line by line."""

    def __init__(
        self,
        table: str = "",
        returncode: int = 0,
        values: dict[str, tuple[float | None, float | None]] | None = None,
    ) -> None:
        self.table, self.returncode = table, returncode
        self.values = VALUES if values is None else values
        self.commands: list[list[str]] = []
        self.found: list[list[str]] = []

    def __call__(
        self, command: Sequence[str], environment: dict[str, str], progress: gate_module.Progress
    ) -> subprocess.CompletedProcess[str]:
        config = json.loads(Path(command[command.index("--config") + 1]).read_text())
        results = Path(config["results_dir"])
        self.found.append(sorted(str(path.relative_to(results)) for path in results.rglob("*")))
        self.commands.append(list(command))
        assert "CROPBENCH_ASV_FULL" not in environment
        bench = command[command.index("-b") + 1]
        for index, ref in enumerate(command[-2:]):
            measured = {name: pair[index] for name, pair in self.values.items() if re.search(bench, name)}
            if measured and self.returncode in (0, 1):
                save_results(results, _commit(Path(config["repo"]), ref), measured)
        for line in self.table.splitlines():
            progress.line(line)
        return subprocess.CompletedProcess(list(command), self.returncode, self.table, "")


TABLE = (
    "| Change | Before [a] | After [b] | Ratio | Benchmark (Parameter) |\n"
    "|--------|------------|-----------|-------|-----------------------|\n"
    "| +      | 58.3       | 88.5      | 1.52  | track1.Fetch.track_relative_cost('random', 'zarr', 'bounded') |\n"
    "| -      | 2.0        | 1.0       | 0.5   | zarr_stages.ZarrCounts.track_store_reads_per_crop('random') |\n"
    "\nSOME BENCHMARKS HAVE CHANGED SIGNIFICANTLY.\nPERFORMANCE DECREASED.\n"
)


def test_each_run_starts_from_an_empty_results_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, library_repo: Path
) -> None:
    monkeypatch.setenv("CROPBENCH_ASV_FULL", "1")
    fake = _FakeAsv(TABLE, returncode=1)
    first = gate_module.run_gate(GATES["zarr"], "v1.0.0", "v1.1.0", tmp_path / "one", library_repo, runner=fake)
    second = gate_module.run_gate(GATES["zarr"], "v1.0.0", "v1.1.0", tmp_path / "two", library_repo, runner=fake)
    assert fake.found == [[]] * 4, "asv found no results saved by an earlier run or step"
    assert first.returncode == 1 and first.worse == ("track1.Fetch.track_relative_cost('random', 'zarr', 'bounded')",)
    assert second.results_dir != first.results_dir
    # A folder that already holds results is refused, not reused.
    with pytest.raises(gate_module.GateError, match="not empty"):
        gate_module.run_gate(GATES["zarr"], "v1.0.0", "v1.1.0", tmp_path / "one", library_repo, runner=fake)
    assert len(fake.commands) == 4


def test_the_instruction_counts_are_a_step_of_their_own_with_the_tighter_factor(
    tmp_path: Path, library_repo: Path
) -> None:
    fake = _FakeAsv()
    run = gate_module.run_gate(GATES["zarr"], "v1.0.0", "v1.1.0", tmp_path, library_repo, runner=fake)
    assert run.returncode == 0 and len(fake.commands) == 2
    instructions, wall = ({"bench": c[c.index("-b") + 1], "factor": c[c.index("--factor") + 1]} for c in fake.commands)
    assert instructions == {"bench": GATES["zarr"].instructions_bench, "factor": str(gate_module.INSTRUCTIONS_FACTOR)}
    assert wall == {"bench": GATES["zarr"].bench, "factor": "1.2"}
    assert 1.03 <= gate_module.INSTRUCTIONS_FACTOR <= 1.05
    assert gate_module.gate_commands(GATES["zarr"]).count("asv continuous") == 2
    # --factor changes the wall-clock step only
    assert [factor for _, _, factor in GATES["zarr"].steps(1.3)] == [gate_module.INSTRUCTIONS_FACTOR, 1.3]


def test_one_step_of_the_gate_runs_alone_and_an_unknown_step_is_refused(tmp_path: Path, library_repo: Path) -> None:
    fake = _FakeAsv()
    run = gate_module.run_gate(
        GATES["zarr"], "v1.0.0", "v1.1.0", tmp_path, library_repo, runner=fake, only="instructions"
    )
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


def _step(
    returncode: int = 0, output: str = "", rows: tuple[tuple[float | None, float | None], ...] = ((1.0, 1.0),)
) -> gate_module.StepRun:
    ratios = tuple(gate_module.Ratio(f"b{index}", before, after) for index, (before, after) in enumerate(rows))
    return gate_module.StepRun("wall-time", 1.2, returncode, output, ratios)


MACHINE_MISSING = "· No information stored about machine 'host'. I know about nothing.\n"


@pytest.mark.parametrize(
    ("steps", "code", "failure"),
    [
        ([_step()], 0, None),
        ([_step(1, TABLE)], 1, None),
        # asv stops with exit code 1 for its own errors too (no machine entry, an unknown commit): not a regression
        (
            [_step(1, MACHINE_MISSING, ())],
            3,
            "asv exited 1: No information stored about machine 'host'. I know about nothing.",
        ),
        ([_step(2, "a benchmark failed\n")], 3, "asv exited 2: a benchmark failed"),
        ([_step(0, "", ())], 3, "asv measured none of its benchmarks"),
        ([_step(0, "", ((1.0, 1.0), (1.0, None)))], 3, "no value for 1 of 2 benchmarks (b1, ...)"),
        ([_step(1, TABLE), _step(2, "stopped\n")], 1, None),
        ([], 3, None),
    ],
)
def test_the_exit_code_says_whether_it_measured_and_what_it_found(
    steps: list[gate_module.StepRun], code: int, failure: str | None
) -> None:
    assert gate_module.exit_code(steps) == code
    if steps:
        assert steps[0].failure == failure


def test_a_failing_step_measures_nothing_and_exits_3(tmp_path: Path, library_repo: Path) -> None:
    fake = _FakeAsv("Traceback ...\nsome error", returncode=2)
    run = gate_module.run_gate(GATES["ome-arrow"], "v1.0.0", "v1.1.0", tmp_path, library_repo, runner=fake)
    assert run.returncode == gate_module.EXIT_NOT_MEASURED == 3
    assert [step.failure for step in run.steps] == ["asv exited 2: some error"] * 2


def test_each_gated_ratio_is_shown_to_four_decimals_beside_the_factor() -> None:
    rows = [
        gate_module.Ratio("instructions.ZarrReads.track_instructions_per_crop('random')", 1_000_000.0, 1_030_900.0),
        gate_module.Ratio("track1.Fetch.track_relative_cost('random', 'zarr', 'bounded')", 2.0, 3.0, "+"),
        gate_module.Ratio("zarr_stages.ZarrCounts.track_store_reads_per_crop('random')", 2.0, None),
    ]
    lines = gate_module.ratio_table("instructions", 1.03, rows)
    assert lines[0] == "library_gate: instructions: ratio after / before of each gated benchmark, factor 1.03"
    assert lines[1].split() == ["ratio", "factor", "before", "after", "asv", "benchmark"]
    assert lines[2].split() == ["1.0309", "1.03", "1e+06", "1.0309e+06", rows[0].benchmark]
    assert lines[3].split()[:5] == ["1.5000", "1.03", "2", "3", "worse"]
    assert lines[4].split()[:4] == ["n/a", "1.03", "2", "n/a"]
    assert gate_module.ratio_table("wall-time", 1.2, [])[-1] == "  (no gated benchmark has a value)"


def test_the_ratios_are_read_from_asvs_results_of_the_two_commits(tmp_path: Path, library_repo: Path) -> None:
    base, head = _commit(library_repo, "v1.0.0"), _commit(library_repo, "v1.1.0")
    name = "track1.Fetch.track_relative_cost"
    before = {f"{name}('random', 'zarr', 'bounded')": 2.0, f"{name}('grouped-field', 'zarr', 'bounded')": 4.0}
    save_results(tmp_path, base, {**before, "other.Suite.track_x": 1.0})
    save_results(tmp_path, head, {f"{name}('random', 'zarr', 'bounded')": 2.5})
    assert gate_module.measured_values(tmp_path, base) == {**before, "other.Suite.track_x": 1.0}
    rows = gate_module.ratios(
        gate_module.measured_values(tmp_path, base), gate_module.measured_values(tmp_path, head), r"^track1\.", TABLE
    )
    assert [(row.benchmark.split("(")[1], row.ratio) for row in rows] == [
        ("'grouped-field', 'zarr', 'bounded')", None),
        ("'random', 'zarr', 'bounded')", 1.25),
    ]
    assert rows[1].mark == "+"


def test_a_run_prints_every_ratio_and_keeps_its_output_beside_its_results(tmp_path: Path, library_repo: Path) -> None:
    printed: list[str] = []
    fake = _FakeAsv(TABLE, returncode=1)
    progress = gate_module.Progress(printed.append)
    run = gate_module.run_gate(
        GATES["zarr"], "v1.0.0", "v1.1.0", tmp_path, library_repo, runner=fake, progress=progress
    )
    assert run.returncode == 1
    wall = next(step for step in run.steps if step.name == "wall-time")
    assert [round(row.ratio or 0, 4) for row in wall.ratios] == [1.518, 0.5]
    assert any(line.split()[:2] == ["1.0309", "1.03"] for line in printed), "the instruction ratio, under its factor"
    assert "PERFORMANCE DECREASED." in printed, "asv's own lines as they come"
    assert (tmp_path / gate_module.OUTPUT_FILE).read_text().splitlines() == printed
    assert run.output.splitlines() == printed


def test_asvs_machine_entry_is_written_where_missing_and_kept_where_present(private_home: Path) -> None:
    path = gate_module.machine_file()
    assert path == private_home / ".asv-machine.json"
    name = gate_module.prepare_machine(None, path)
    first = json.loads(path.read_text())
    assert first[name]["machine"] == name and first[name]["num_cpu"]
    assert gate_module.prepare_machine("ci-runner", path) == "ci-runner"
    both = json.loads(path.read_text())
    assert both[name] == first[name] and both["ci-runner"]["machine"] == "ci-runner"
    path.write_text("garbage{")
    with pytest.raises(gate_module.GateError, match="is not asv's machine file"):
        gate_module.prepare_machine(None, path)
    assert path.read_text() == "garbage{", "a damaged file is the user's to fix"


def test_a_run_writes_the_machine_entry_asv_would_ask_for(
    tmp_path: Path, library_repo: Path, private_home: Path
) -> None:
    gate_module.run_gate(GATES["zarr"], "v1.0.0", "v1.1.0", tmp_path / "w", library_repo, runner=_FakeAsv())
    assert json.loads((private_home / ".asv-machine.json").read_text())


def test_progress_streams_each_line_and_says_when_asv_is_quiet() -> None:
    """A line arrives, then nothing until the gate has said asv is still running, then the last line."""
    said_quiet = threading.Event()

    def lines() -> Iterator[str]:
        yield "first\n"
        assert said_quiet.wait(timeout=60)
        yield "last\n"

    seen: list[str] = []

    def quiet(seconds: float) -> None:
        seen.append("quiet")
        said_quiet.set()

    progress = gate_module.Progress(seen.append, quiet, interval_s=0.01)
    assert gate_module.stream(lines(), progress) == ["first", "last"]
    assert seen[0] == "first" and seen[-1] == "last" and "quiet" in seen[1:-1]


def test_a_stopped_gate_stops_the_command_it_runs() -> None:
    """Ctrl-C (or SIGTERM, turned into it) while asv runs: asv is stopped and reaped, not left running."""
    pids: list[int] = []

    def stop(line: str) -> None:
        pids.append(int(line))
        raise KeyboardInterrupt

    command = [sys.executable, "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(600)"]
    with pytest.raises(KeyboardInterrupt):
        gate_module.run_streamed(command, dict(os.environ), gate_module.Progress(stop))
    with pytest.raises(ProcessLookupError):
        os.kill(pids[0], 0)


# --- the command line ---


def _no_work(*args: object, **kwargs: object) -> gate_module.GateRun:
    raise AssertionError("the gate started before its arguments were checked")


@pytest.mark.parametrize("factor", ["nan", "inf", "-inf", "0.5", "1", "-2", "abc", ""])
def test_a_factor_that_is_no_finite_ratio_above_one_is_refused_in_one_line(
    factor: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gate_module, "run_gate", _no_work)
    with pytest.raises(SystemExit) as stopped:
        gate_module.main(["zarr", "v3.1.5", "v3.1.6", f"--factor={factor}"])
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("library_gate: error: argument --factor: expected a finite number above 1")
    assert error.count("\n") == 1 and repr(factor) in error


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["v1.0.0", "v1.1.0", "--repo", "{tmp}/missing"], "--repo {tmp}/missing is not a git repository"),
        (["v1.0.0", "v1.1.0", "--repo", "{tmp}"], "--repo {tmp} is not a git repository"),
        (["v1.0.0", "v9.9.9", "--repo", "{repo}"], "HEAD 'v9.9.9' is not a commit, tag or branch of {repo}"),
        (["nope", "v1.1.0", "--repo", "{repo}"], "BASE 'nope' is not a commit, tag or branch of {repo}"),
        (["v1.1.0", "main", "--repo", "{repo}"], "BASE 'v1.1.0' and HEAD 'main' are the same commit"),
        (
            ["v1.0.0", "v1.1.0", "--repo", "{repo}", "--results-dir", "{tmp}/a-file"],
            "--results-dir {tmp}/a-file is a file",
        ),
    ],
)
def test_the_command_line_checks_every_argument_before_any_work_in_one_line(
    arguments: list[str],
    message: str,
    tmp_path: Path,
    library_repo: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gate_module, "run_gate", _no_work)
    monkeypatch.setattr(gate_module, "RUNS_DIR", tmp_path / "runs")
    (tmp_path / "a-file").write_text("mine\n")
    filled = [argument.format(tmp=tmp_path, repo=library_repo) for argument in arguments]
    assert gate_module.main(["zarr", *filled]) == 2
    error = capsys.readouterr().err
    assert error.startswith("library_gate: error: ") and error.count("\n") == 1, error
    assert message.format(tmp=tmp_path, repo=library_repo) in error
    assert not (tmp_path / "runs").exists() and (tmp_path / "a-file").read_text() == "mine\n"


def test_a_missing_release_history_names_the_command_that_builds_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(gate_module, "REPO", tmp_path)  # a clone where no history was built
    monkeypatch.setattr(gate_module, "run_gate", _no_work)
    (tmp_path / "asv.zarr.conf.json").write_text((REPO / "asv.zarr.conf.json").read_text())
    assert gate_module.main(["zarr", "v3.1.5", "v3.1.6"]) == 2
    error = capsys.readouterr().err
    assert "scripts/release_history.py zarr" in error and error.count("\n") == 1


def test_the_command_line_refuses_a_results_folder_with_results_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], library_repo: Path
) -> None:
    kept = tmp_path / "kept"
    (kept / "machine").mkdir(parents=True)
    (kept / "machine" / "old.json").write_text("{}")
    assert gate_module.main(["zarr", "v1.0.0", "v1.1.0", "--repo", str(library_repo), "--results-dir", str(kept)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("library_gate: error: --results-dir") and error.count("\n") == 1
    assert (kept / "machine" / "old.json").read_text() == "{}", "nothing of the user's is deleted"


def test_a_dry_run_prints_the_command_and_runs_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], library_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gate_module, "RUNS_DIR", tmp_path / "runs")
    arguments = ["ome-arrow", "v1.0.0", "v1.1.0", "--dry-run", "--repo", str(library_repo)]
    assert gate_module.main([*arguments, "--results-dir", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("asv continuous --config ") and "v1.0.0 v1.1.0" in out and str(tmp_path / "d") in out
    assert gate_module.main(arguments) == 0
    assert f"--config {tmp_path / 'runs'}" in capsys.readouterr().out
    assert not (tmp_path / "d").exists() and not (tmp_path / "runs").exists()


def _main_with(fake: _FakeAsv, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(gate_module, "run_gate", functools.partial(gate_module.run_gate, runner=fake))
    monkeypatch.setattr(gate_module, "RUNS_DIR", tmp_path / "runs")


def test_by_default_a_run_keeps_everything_in_a_new_folder_it_names_first_and_last(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], library_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _main_with(_FakeAsv(), monkeypatch, tmp_path)
    assert gate_module.main(["zarr", "v1.0.0", "v1.1.0", "--repo", str(library_repo)]) == 0
    out = capsys.readouterr().out.splitlines()
    (folder,) = (tmp_path / "runs").iterdir()
    assert folder.name.endswith("-zarr-v1.0.0-v1.1.0")
    assert out[0].endswith(f"go to {folder}") and out[-1].startswith("library_gate: passed: zarr v1.0.0 -> v1.1.0")
    assert out[-1].endswith(f"in {folder}") and "none of 3 gated benchmarks got worse" in out[-1]
    assert sorted(path.name for path in folder.iterdir()) == [
        "asv.zarr.gate.instructions.conf.json",
        "asv.zarr.gate.wall-time.conf.json",
        gate_module.OUTPUT_FILE,
        "results",
        "results-instructions",
    ]
    assert "1.0309" in (folder / gate_module.OUTPUT_FILE).read_text()


def test_the_default_run_folder_is_git_ignored() -> None:
    """A run's results never show up as changes of the repository (nor under the committed results/)."""
    assert gate_module.RUNS_DIR.is_relative_to(REPO / ".asv")
    ignored = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", str(gate_module.RUNS_DIR / "run" / "x")])
    assert ignored.returncode == 0


def test_a_run_that_could_not_measure_exits_3_and_says_why_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], library_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _main_with(_FakeAsv(MACHINE_MISSING, returncode=1), monkeypatch, tmp_path)
    assert gate_module.main(["zarr", "v1.0.0", "v1.1.0", "--repo", str(library_repo)]) == 3
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.err.startswith("library_gate: error: zarr v1.0.0 -> v1.1.0")
    assert "the gate could not measure, no verdict" in captured.err
    assert "instructions: asv exited 1: No information stored about machine" in captured.err
    assert "worse" not in captured.err and "exit 1" not in captured.out


def test_a_regression_exits_1_and_names_the_benchmark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], library_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _main_with(_FakeAsv(TABLE, returncode=1), monkeypatch, tmp_path)
    assert gate_module.main(["zarr", "v1.0.0", "v1.1.0", "--repo", str(library_repo)]) == 1
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("library_gate: FAILED: zarr v1.0.0 -> v1.1.0: a gated benchmark got worse")
    assert "track1.Fetch.track_relative_cost('random', 'zarr', 'bounded')" in last


def test_an_interrupted_run_ends_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], library_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(*args: object, **kwargs: object) -> gate_module.GateRun:
        raise KeyboardInterrupt

    monkeypatch.setattr(gate_module, "run_gate", interrupted)
    monkeypatch.setattr(gate_module, "RUNS_DIR", tmp_path / "runs")
    assert gate_module.main(["zarr", "v1.0.0", "v1.1.0", "--repo", str(library_repo)]) == 130
    error = capsys.readouterr().err
    assert error.startswith("library_gate: interrupted; what was measured is kept in ") and error.count("\n") == 1


def test_a_disk_that_fills_during_the_run_is_a_failure_to_measure_not_a_bad_argument(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], library_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(*args: object, **kwargs: object) -> gate_module.GateRun:
        raise OSError(28, "No space left on device", str(tmp_path / "runs" / "results"))

    monkeypatch.setattr(gate_module, "run_gate", full)
    monkeypatch.setattr(gate_module, "RUNS_DIR", tmp_path / "runs")
    assert gate_module.main(["zarr", "v1.0.0", "v1.1.0", "--repo", str(library_repo)]) == 3
    error = capsys.readouterr().err
    assert error == f"library_gate: error: {tmp_path / 'runs' / 'results'}: No space left on device\n"


def test_a_closed_output_ends_a_dry_run_quietly(library_repo: Path) -> None:
    read, write = os.pipe()
    os.close(read)  # the reader (`| head`) is gone before the first line
    script = str(REPO / "scripts" / "library_gate.py")
    arguments = [sys.executable, script, "zarr", "v1.0.0", "v1.1.0", "--repo", str(library_repo), "--dry-run"]
    result = subprocess.run(arguments, stdout=write, stderr=subprocess.PIPE, text=True)
    os.close(write)
    assert result.returncode == 0 and result.stderr == ""


def test_factor_must_be_a_ratio_above_one() -> None:
    for factor in (0.8, 1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="factor must be a finite number above 1"):
            gate_module.LibraryGate("zarr", "asv.zarr.conf.json", "x", factor=factor)
    with pytest.raises(ValueError, match="instructions_factor must be a finite number above 1"):
        gate_module.LibraryGate("zarr", "asv.zarr.conf.json", "x", instructions_bench="y", instructions_factor=1.0)


# --- the detection campaign (cropbench.history.campaign) ---

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
        "tallies": {"identical": vars(campaign_module.regression.Tally())},
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

    monkeypatch.setattr(campaign_module.regression, "track1_random_rate", wrong_tree)
    with pytest.raises(campaign_module.CampaignError, match="imported zarr from /elsewhere"):
        campaign_module.zarr_crops_at(tmp_path / "src", tmp_path / "plate.zarr")
