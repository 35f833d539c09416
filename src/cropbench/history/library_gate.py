"""The gate for a format library: does a commit of zarr-python (or ome-arrow) make its own read path slower?

cropbench's own gate (docs/how-to/gate-a-change.md) watches cropbench's ``direct`` reader, which never calls
zarr-python; a library's gate selects the library's own read path instead (``LIBRARY_GATES``):

- ``zarr``: ``track1.Fetch.track_relative_cost`` with ``decode='zarr'`` (zarr-python slicing of
  the zarr-written smoke plate), random and grouped access, the bounded case (zarr-python has no
  chunk cache); and the counts of ``zarr_stages.ZarrCounts`` (store reads, bytes read and chunks
  decoded per crop, read from zarr's store and codec pipeline), which do not read a clock;
- ``ome-arrow``: ``track1.ArrowFetch.track_relative_cost``, zero-copy ``direct`` and the
  reference script's ``as-py`` (random access; ome-arrow exposes no counts).

Each library's gate also holds its cases of ``instructions`` (instructions per crop counted under
valgrind: ``ZarrReads``, ``ArrowReads``), whose same code repeats within a fraction of a per cent:
they get their own, tighter factor (``INSTRUCTIONS_FACTOR``), so the gate is two ``asv continuous``
calls (asv takes one ``--factor`` per call), the instruction counts first, each from its own empty
results folder. One round (asv keeps only the last round's value of a ``track_*`` benchmark);
factor 1.2 for the wall-clock ratios and counts.

``asv continuous`` compares what it finds in its results folder for the two commits: every
parameter set of the selected benchmarks that any earlier run saved there, not only the ones this
run measured, so a filtered run after an unfiltered one can be flagged by stale values. The gate
therefore runs from a private, empty results folder: it writes a copy of ``asv.<library>.conf.json``
whose ``results_dir`` and ``html_dir`` are that folder (``--results-dir``, which must not hold
results; a new one under ``.asv/library-gate/`` by default), and whose environment, benchmarks and
cropbench are this repository's, so the environment asv built for the history is reused. ``--repo``
points it at a maintainer's own clone of the library instead of the release history:

    .venv/bin/python scripts/library_gate.py zarr v3.1.5 v3.1.6
    .venv/bin/python scripts/library_gate.py zarr main my-branch --repo ~/src/zarr-python
    .venv/bin/python scripts/library_gate.py ome-arrow v0.0.11 v0.1.0 --dry-run    # print the command

asv's own lines stream as it runs (with a line every ``HEARTBEAT_S`` seconds that it stays quiet),
then each step's ratio (after / before) of every gated benchmark, to 4 decimals, beside its factor.
Everything, asv's results included, is kept in the run's folder (``--results-dir``, or a new one
under ``.asv/library-gate/``, git-ignored), named on the first and last line. asv's machine entry is
written where missing (what ``asv machine --yes`` records), so nothing is asked.

Exit code: 0 when every gated benchmark was measured and none got worse by more than its factor,
1 when one did (asv's "PERFORMANCE DECREASED"), 2 for a bad argument (before anything runs),
3 when the gate could not measure (asv failed, or a gated benchmark has no value for a commit),
130 when interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import itertools
import json
import math
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TextIO

from asv.machine import Machine, MachineCollection
from asv.results import iter_results
from asv.util import UserError, load_json

from cropbench.history import REPO

#: The factor of the instruction counts (benchmarks/instructions.py): four runs of each case agreed
#: within 0.21 % on a busy 2-core machine (docs/results/gate.md, "Instruction counts"), so 1.03
#: leaves a margin of more than ten times that and flags a 3 % change of the CPU work in the read path.
INSTRUCTIONS_FACTOR = 1.03
#: Where each run's folder goes when no ``--results-dir`` is given (``.asv/`` is git-ignored).
RUNS_DIR = REPO / ".asv" / "library-gate"
#: Seconds asv may stay quiet before the gate says it is still running (building an environment or
#: counting instructions under valgrind prints nothing for minutes).
HEARTBEAT_S = 30.0
#: What the gate prints and asv writes besides the results, in the run's folder.
OUTPUT_FILE = "gate-output.txt"
#: The exit codes: nothing got worse; a gated benchmark got worse; a bad argument; nothing (or not
#: everything) was measured; interrupted.
EXIT_PASSED, EXIT_WORSE, EXIT_BAD_ARGUMENT, EXIT_NOT_MEASURED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
#: The line asv continuous prints when it flagged a benchmark (its exit code 1 also means "failed early").
DECREASED = "PERFORMANCE DECREASED"


class GateError(RuntimeError):
    """An argument of the gate is not usable (a results folder holding results, a missing repository)."""


def above_one(value: float, name: str) -> float:
    """``value`` when it is a finite ratio above 1, else a ValueError naming ``name``: a factor of nan,
    inf or at most 1 would let asv flag nothing (or everything)."""
    if not (math.isfinite(value) and value > 1.0):
        raise ValueError(f"{name} must be a finite number above 1 (a ratio after / before), got {value}")
    return value


@dataclass(frozen=True)
class LibraryGate:
    """What the gate of one format library runs: its asv configuration, benchmarks, factors and attributes.

    ``bench`` is gated with ``factor``; ``instructions_bench``, where given, with ``instructions_factor``
    in a call of its own (asv continuous takes one factor per call).
    """

    library: str
    config: str
    bench: str
    factor: float = 1.2
    attributes: tuple[str, ...] = ("rounds=1",)
    instructions_bench: str | None = None
    instructions_factor: float = INSTRUCTIONS_FACTOR

    def __post_init__(self) -> None:
        for name in ("factor", "instructions_factor"):
            above_one(getattr(self, name), name)
        re.compile(self.bench)
        if self.instructions_bench is not None:
            re.compile(self.instructions_bench)

    def steps(self, factor: float | None = None, only: str | None = None) -> tuple[tuple[str, str, float], ...]:
        """(name, benchmarks, factor) of each asv continuous call, instruction counts first; ``factor``
        replaces the wall-clock factor only; ``only`` (a step's name) keeps that step alone."""
        wall = ("wall-time", self.bench, factor or self.factor)
        steps = (
            (wall,)
            if self.instructions_bench is None
            else (
                ("instructions", self.instructions_bench, self.instructions_factor),
                wall,
            )
        )
        if only is None:
            return steps
        chosen = tuple(step for step in steps if step[0] == only)
        if not chosen:
            names = ", ".join(step[0] for step in steps)
            raise GateError(f"--step {only!r}: the {self.library} gate has the steps {names}")
        return chosen


LIBRARY_GATES = {
    "zarr": LibraryGate(
        library="zarr",
        config="asv.zarr.conf.json",
        bench=(
            r"^(track1\.Fetch\.track_relative_cost\('(random|grouped-field)', 'zarr', 'bounded'\)"
            r"|zarr_stages\.ZarrCounts\.track_\w+\('(random|grouped-field)'\))"
        ),
        instructions_bench=r"^instructions\.ZarrReads\.track_instructions_per_crop\('(random|grouped-field)'\)",
    ),
    "ome-arrow": LibraryGate(
        library="ome-arrow",
        config="asv.ome-arrow.conf.json",
        bench=r"^track1\.ArrowFetch\.track_relative_cost\('random', '(direct|as-py)'\)",
        instructions_bench=r"^instructions\.ArrowReads\.track_instructions_per_crop\('(direct|as-py)'\)",
    ),
}


def read_config(path: Path) -> dict[str, Any]:
    """An asv configuration (whole-line ``//`` comments dropped, as asv allows)."""
    lines = [line for line in path.read_text().splitlines() if not line.lstrip().startswith("//")]
    config: dict[str, Any] = json.loads("\n".join(lines))
    return config


def library_repository(gate: LibraryGate, repo: Path | str | None = None) -> str:
    """The library's repository the gate builds from: ``repo`` (a URL, or a folder made absolute), else
    the configuration's release history, absolute."""
    source = str(repo) if repo is not None else read_config(REPO / gate.config)["repo"]
    if "://" not in source:
        source = str((REPO / Path(source).expanduser()).resolve())
    return source


def private_config(gate: LibraryGate, results_dir: Path, repo: Path | str | None = None) -> dict[str, Any]:
    """``asv.<library>.conf.json`` for a run from ``results_dir``, with this repository's environment and suites.

    asv resolves relative paths and ``{conf_dir}`` from the configuration's folder, which is now
    ``results_dir``'s parent: every path becomes absolute, and ``{conf_dir}`` (the clone whose
    branch ``main`` is installed as the harness) becomes this repository.
    """
    config = read_config(REPO / gate.config)
    config["repo"] = library_repository(gate, repo)
    config["benchmark_dir"] = str(REPO / config.get("benchmark_dir", "benchmarks"))
    config["env_dir"] = str(REPO / config.get("env_dir", "env"))
    config["results_dir"] = str(results_dir)
    config["html_dir"] = str(results_dir.parent / "html")
    for key in ("build_command", "install_command", "uninstall_command"):
        config[key] = [command.replace("{conf_dir}", str(REPO)) for command in config.get(key, [])]
    return config


def check_results_dir(results_dir: Path) -> None:
    """Refuse a results folder that holds anything: its results would be compared as if measured now."""
    if os.path.lexists(results_dir) and not results_dir.is_dir():
        raise GateError(f"--results-dir {results_dir} is a file, not a folder; give a new or empty folder")
    if results_dir.exists() and any(results_dir.iterdir()):
        raise GateError(
            f"--results-dir {results_dir} is not empty: asv continuous would compare results saved there earlier "
            "as if measured now; give a new folder"
        )


def _is_git_repository(path: Path) -> bool:
    """A clone (``.git``) or a bare repository (``objects``), as asv tells a local repository."""
    return path.is_dir() and ((path / ".git").exists() or (path / "objects").is_dir())


def commit_of(repository: Path, name: str) -> str | None:
    """The commit ``name`` (a tag, branch or hash) names in ``repository``; None where it names none."""
    result = subprocess.run(
        ["git", "-C", str(repository), "rev-parse", "--verify", "-q", f"{name}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    return result.stdout.strip() if result.returncode == 0 and result.stdout.strip() else None


def check_commits(gate: LibraryGate, base: str, head: str, repo: str | None) -> None:
    """The library's repository exists and names two different commits ``base`` and ``head`` (a URL's are
    asv's to find): checked before anything is built or written."""
    source = library_repository(gate, repo)
    if "://" in source:
        return
    path = Path(source)
    if not _is_git_repository(path):
        if repo is not None:
            raise GateError(f"--repo {repo} is not a git repository (a clone of {gate.library}, or a URL)")
        raise GateError(
            f"the release history {path} does not exist; build it with "
            f"'.venv/bin/python scripts/release_history.py {gate.library}', or pass --repo"
        )
    commits = {}
    for argument, name in (("BASE", base), ("HEAD", head)):
        commit = commit_of(path, name) if not name.startswith("-") else None
        if commit is None:
            raise GateError(f"{argument} {name!r} is not a commit, tag or branch of {path}")
        commits[argument] = commit
    if commits["BASE"] == commits["HEAD"]:
        raise GateError(
            f"BASE {base!r} and HEAD {head!r} are the same commit ({commits['BASE'][:10]}); "
            "the gate compares two different commits"
        )


def machine_file(home: Path | None = None) -> Path:
    """asv's machine file (``~/.asv-machine.json``) under ``home`` (default: this user's)."""
    return (home if home is not None else Path.home()) / ".asv-machine.json"


def prepare_machine(machine: str | None, path: Path) -> str:
    """The name of asv's machine, its entry written to ``path`` where missing (what ``asv machine --yes``
    records), so asv asks nothing and does not stop for want of one. Without ``machine``, asv's default
    name (the host's), or the file's only entry, which asv then takes."""
    name = machine or Machine.get_unique_machine_name()
    try:
        known = load_json(str(path), MachineCollection.api_version) if path.exists() else {}
    except (UserError, ValueError, OSError) as error:
        raise GateError(
            f"{path} is not asv's machine file ({' '.join(str(error).split())}); fix or remove it"
        ) from None
    if name in known or (machine is None and len(known) == 1):
        return name
    path.parent.mkdir(parents=True, exist_ok=True)
    MachineCollection.save(name, {**Machine.get_defaults(), "machine": name}, _path=str(path))
    return name


def asv_command(
    gate: LibraryGate,
    config_path: Path,
    base: str,
    head: str,
    factor: float | None = None,
    machine: str | None = None,
    bench: str | None = None,
) -> list[str]:
    """The ``asv continuous`` command line of the gate (base first, then the commit under test);
    ``bench`` and ``factor`` select another step of it (:meth:`LibraryGate.steps`)."""
    command = ["asv", "continuous", "--config", str(config_path), "--factor", str(factor or gate.factor)]
    for attribute in gate.attributes:
        command += ["-a", attribute]
    command += ["-b", bench or gate.bench, "--show-stderr"]
    if machine is not None:
        command += ["--machine", machine]
    return [*command, base, head]


def gate_commands(gate: LibraryGate, base: str = "BASE", head: str = "HEAD", only: str | None = None) -> str:
    """Every asv call of the gate (or of step ``only``) as one line, ``;`` between them (what a campaign's
    summary records)."""
    calls = (
        asv_command(gate, Path(f"CONFIG-{name}"), base, head, factor, bench=bench)
        for name, bench, factor in gate.steps(only=only)
    )
    return "; ".join(" ".join(call) for call in calls)


def maintainer_command(gate: LibraryGate) -> str:
    """The gate as the one line docs/how-to/format-library.md quotes."""
    return f"cropbench library-gate {gate.library} BASE HEAD"


#: asv's marks in a continuous table, as the ratio table names them.
ASV_MARKS = {"+": "worse", "-": "better", "!": "failed", "x": "not comparable"}


def asv_marks(output: str) -> dict[str, str]:
    """Benchmark (with parameters) -> the mark asv gave it (``+`` worse, ``-`` better, ...) in a
    continuous/compare table."""
    rows = re.finditer(r"^\|\s*([+\-!x])\s*\|.*\|\s*([\w.]+(?:\(.*\))?)\s*\|\s*$", output, re.MULTILINE)
    return {row.group(2): row.group(1) for row in rows}


def worse_rows(output: str) -> tuple[str, ...]:
    """Benchmarks (with parameters) that asv marked ``+`` (worse) in a continuous/compare table."""
    return tuple(sorted(name for name, mark in asv_marks(output).items() if mark == "+"))


@dataclass(frozen=True)
class Ratio:
    """One gated benchmark's values before (base) and after (head), and asv's mark of it."""

    benchmark: str
    before: float | None
    after: float | None
    mark: str = ""

    @property
    def ratio(self) -> float | None:
        """after / before, asv's ratio; None where either value is missing or before is 0."""
        if self.before is None or self.after is None or self.before == 0:
            return None
        return self.after / self.before


def _value(value: object) -> float | None:
    """A result value as a number; a failed (None) or skipped (NaN) one as None."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def measured_values(results_dir: Path, commit: str) -> dict[str, float | None]:
    """Benchmark (with parameters, as asv spells it for ``-b``) -> its value for ``commit`` in
    ``results_dir``, read with asv's own reader."""
    values: dict[str, float | None] = {}
    if not results_dir.is_dir():
        return values
    for result in iter_results(str(results_dir)):
        if result.commit_hash != commit:
            continue
        for key in result.get_all_result_keys():
            params = result.get_result_params(key)
            combinations = list(itertools.product(*params))
            found = result.get_result_value(key, params)
            for combination, value in zip(combinations, found, strict=False):
                name = f"{key}({', '.join(combination)})" if combination else key
                values[name] = _value(value)
    return values


def ratios(
    before: dict[str, float | None], after: dict[str, float | None], bench: str, output: str
) -> tuple[Ratio, ...]:
    """Every benchmark ``bench`` selects, measured for either commit, with asv's mark from ``output``."""
    marks = asv_marks(output)
    names = sorted(name for name in before.keys() | after.keys() if re.search(bench, name))
    return tuple(Ratio(name, before.get(name), after.get(name), marks.get(name, "")) for name in names)


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.6g}"


def ratio_table(step: str, factor: float, rows: Sequence[Ratio]) -> list[str]:
    """The lines that show each gated benchmark's ratio to 4 decimals beside the step's factor."""
    lines = [f"library_gate: {step}: ratio after / before of each gated benchmark, factor {factor:g}"]
    lines.append(f"  {'ratio':>8}  {'factor':>6}  {'before':>12}  {'after':>12}  {'asv':<6}  benchmark")
    for row in rows:
        ratio = "n/a" if row.ratio is None else f"{row.ratio:.4f}"
        mark = ASV_MARKS.get(row.mark, "")
        lines.append(
            f"  {ratio:>8}  {factor:>6g}  {_number(row.before):>12}  {_number(row.after):>12}  {mark:<6}  "
            f"{row.benchmark}"
        )
    if not rows:
        lines.append("  (no gated benchmark has a value)")
    return lines


@dataclass(frozen=True)
class StepRun:
    """One step of a gate run: asv's exit code and output, and the ratio of each gated benchmark."""

    name: str
    factor: float
    returncode: int
    output: str
    ratios: tuple[Ratio, ...] = ()

    @property
    def regressed(self) -> bool:
        """asv flagged a gated benchmark (its exit code 1 alone also means it stopped early)."""
        return self.returncode == 1 and DECREASED in self.output

    @property
    def failure(self) -> str | None:
        """Why this step measured nothing or not everything; None where it did (or found a regression)."""
        if self.regressed:
            return None
        if self.returncode != 0:
            return f"asv exited {self.returncode}: {_last_line(self.output)}"
        if not self.ratios:
            return "asv measured none of its benchmarks"
        missing = [row.benchmark for row in self.ratios if row.ratio is None]
        if missing:
            return f"no value for {len(missing)} of {len(self.ratios)} benchmarks ({missing[0]}, ...)"
        return None


def _last_line(output: str) -> str:
    """asv's last line (where it says why it stopped), without its bullets."""
    lines = [line.strip().lstrip("·").strip() for line in output.splitlines()]
    lines = [line for line in lines if line]
    return lines[-1][:300] if lines else "no output"


@dataclass(frozen=True)
class GateRun:
    """One gate run: its exit code, the benchmarks asv marked worse, its output, where results went, its steps."""

    returncode: int
    worse: tuple[str, ...]
    output: str
    results_dir: Path
    steps: tuple[StepRun, ...] = field(default=())


def exit_code(steps: Sequence[StepRun]) -> int:
    """1 when a step found a gated benchmark worse (a sure answer, whatever another step did), else 3 when
    a step could not measure, else 0."""
    if any(step.regressed for step in steps):
        return EXIT_WORSE
    if not steps or any(step.failure is not None for step in steps):
        return EXIT_NOT_MEASURED
    return EXIT_PASSED


@dataclass(frozen=True)
class Progress:
    """Where a running gate's lines go: ``line`` gets each (asv's and the gate's), ``quiet`` the seconds
    asv has printed nothing, after each ``interval_s`` of that."""

    line: Callable[[str], None] = lambda line: None
    quiet: Callable[[float], None] = lambda seconds: None
    interval_s: float = HEARTBEAT_S


def stream(lines: Iterable[str], progress: Progress) -> list[str]:
    """Hand each of ``lines`` to ``progress.line`` as it comes, ``progress.quiet`` while none comes; all of them."""
    arrived: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        try:
            for line in lines:
                arrived.put(line.rstrip("\n"))
        except (OSError, ValueError):  # closed under it: the gate was stopped
            pass
        finally:
            arrived.put(None)

    threading.Thread(target=read, daemon=True).start()
    seen: list[str] = []
    last = time.monotonic()
    while True:
        try:
            line = arrived.get(timeout=progress.interval_s)
        except queue.Empty:
            progress.quiet(time.monotonic() - last)
            continue
        if line is None:
            return seen
        seen.append(line)
        progress.line(line)
        last = time.monotonic()


Runner = Callable[[Sequence[str], dict[str, str], Progress], "subprocess.CompletedProcess[str]"]


def _run_asv(
    command: Sequence[str], environment: dict[str, str], progress: Progress
) -> subprocess.CompletedProcess[str]:
    """asv in this interpreter (``command`` as :func:`asv_command` spells it), its output streamed."""
    return run_streamed([sys.executable, "-m", "asv", *command[1:]], environment, progress)


def run_streamed(
    command: Sequence[str], environment: dict[str, str], progress: Progress
) -> subprocess.CompletedProcess[str]:
    """``command``'s output (stderr with stdout) handed to ``progress`` line by line as it comes, stdin
    closed (nothing is asked); the command is stopped when the gate is (Ctrl-C, SIGTERM)."""
    process = subprocess.Popen(
        command,
        env={**environment, "PYTHONUNBUFFERED": "1"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    try:
        assert process.stdout is not None
        output = stream(process.stdout, progress)
        returncode = process.wait()
    except BaseException:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        raise
    finally:
        if process.stdout is not None:
            process.stdout.close()
    return subprocess.CompletedProcess(list(command), returncode, "".join(f"{line}\n" for line in output), "")


def run_gate(
    gate: LibraryGate,
    base: str,
    head: str,
    workdir: Path,
    repo: Path | str | None = None,
    factor: float | None = None,
    machine: str | None = None,
    home: Path | None = None,
    runner: Runner = _run_asv,
    only: str | None = None,
    progress: Progress | None = None,
) -> GateRun:
    """``asv continuous`` of each step of the gate (or of step ``only``), each from an empty results folder
    under ``workdir`` (``results`` for the wall-clock step, ``results-instructions`` for the instruction
    counts), then the ratio of each gated benchmark read from those results.

    Every line (asv's, each step's ratio table) goes to ``progress`` as it comes and to ``workdir``'s
    ``OUTPUT_FILE``. The exit code is :func:`exit_code`'s.
    """
    progress = progress or Progress()
    steps = gate.steps(factor, only)
    folders = [workdir / ("results" if name == "wall-time" else f"results-{name}") for name, _, _ in steps]
    for folder in folders:
        check_results_dir(folder)
    prepare_machine(machine, machine_file(home))
    environment = {**os.environ, **({"HOME": str(home)} if home is not None else {})}
    environment.pop("CROPBENCH_ASV_FULL", None)  # the full grid never runs in a gate
    workdir.mkdir(parents=True, exist_ok=True)
    runs: list[StepRun] = []
    lines: list[str] = []
    with (workdir / OUTPUT_FILE).open("a", buffering=1) as transcript:

        def emit(line: str) -> None:
            lines.append(line)
            transcript.write(line + "\n")
            progress.line(line)

        for (name, bench, step_factor), results_dir in zip(steps, folders, strict=True):
            results_dir.mkdir(parents=True, exist_ok=True)
            config_path = workdir / f"asv.{gate.library}.gate.{name}.conf.json"
            config = private_config(gate, results_dir, repo)
            config_path.write_text(json.dumps(config, indent=4) + "\n")
            command = asv_command(gate, config_path, base, head, step_factor, machine, bench)
            emit(f"library_gate: {name} (factor {step_factor}): {' '.join(_quote(part) for part in command)}")
            started = time.monotonic()

            def quiet(seconds: float, name: str = name, started: float = started) -> None:
                minutes = (time.monotonic() - started) / 60
                emit(f"library_gate: {name}: asv still running ({minutes:.1f} min in, quiet for {seconds:.0f} s)")

            result = runner(command, environment, Progress(emit, quiet, progress.interval_s))
            output = result.stdout + result.stderr
            found = _step_ratios(config, base, head, results_dir, bench, output)
            step = StepRun(name, step_factor, result.returncode, output, found)
            for line in ratio_table(name, step_factor, step.ratios):
                emit(line)
            runs.append(step)
    output = "\n".join(lines) + "\n"
    worse = tuple(sorted({name for step in runs for name in worse_rows(step.output)}))
    return GateRun(exit_code(runs), worse, output, folders[-1], tuple(runs))


def _step_ratios(
    config: dict[str, Any], base: str, head: str, results_dir: Path, bench: str, output: str
) -> tuple[Ratio, ...]:
    """Each gated benchmark's ratio from a step's results: the commits as the library's repository names
    them (a URL's in asv's mirror of it, beside the configuration)."""
    source = config["repo"]
    repository = Path(source) if "://" not in source else results_dir.parent / str(config.get("project", "project"))
    before, after = commit_of(repository, base), commit_of(repository, head)
    if before is None or after is None:
        return ()
    return ratios(measured_values(results_dir, before), measured_values(results_dir, after), bench, output)


def _quote(part: str) -> str:
    return f'"{part}"' if re.search(r"[\s()|'\\]", part) else part


def run_dir(library: str, base: str, head: str, create: bool = True) -> Path:
    """A new folder under ``RUNS_DIR`` for one run, named by its time (UTC), library and commits; only
    its name where ``create`` is false (a dry run)."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    name = "-".join([stamp, library, *(re.sub(r"[^\w.-]+", "_", ref)[:40] for ref in (base, head))])
    for number in itertools.count(1):
        path = RUNS_DIR / (name if number == 1 else f"{name}-{number}")
        if not create:
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise AssertionError("unreachable")


def verdict(run: GateRun, library: str, base: str, head: str, workdir: Path) -> str:
    """The run's last line: what its exit code means, and where its results are."""
    where = f"results and asv's output in {workdir}"
    failures = "; ".join(f"{step.name}: {step.failure}" for step in run.steps if step.failure is not None)
    comparison = f"{library} {base} -> {head}"
    if run.returncode == EXIT_WORSE:
        names = ", ".join(run.worse) or "rows marked + in asv's table"
        also = f"; not measured: {failures}" if failures else ""
        worse = f"a gated benchmark got worse by more than its factor ({names})"
        return f"library_gate: FAILED: {comparison}: {worse}{also}; {where}"
    if run.returncode == EXIT_NOT_MEASURED:
        return f"library_gate: error: {comparison}: the gate could not measure, no verdict ({failures}); {where}"
    measured = sum(len(step.ratios) for step in run.steps)
    passed = f"none of {measured} gated benchmarks got worse by more than its factor"
    return f"library_gate: passed: {comparison}: {passed}; {where}"


def say(line: str, stream: TextIO | None = None) -> None:
    """Print ``line``; a reader that went away (``| head``) ends the printing quietly, not the gate."""
    stream = stream or sys.stdout
    try:
        print(line, file=stream, flush=True)
    except BrokenPipeError:
        _drop(stream)


def _drop(stream: TextIO) -> None:
    """Send what ``stream`` still holds and will get to the null device (its reader is gone)."""
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line, like every other refused argument."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_ARGUMENT, f"library_gate: error: {message} (see '{self.prog} --help')\n")


def _factor(text: str) -> float:
    try:
        return above_one(float(text), "the factor")
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a finite number above 1 (a ratio after / before), got {text!r}"
        ) from None


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="cropbench library-gate", description=__doc__.split("\n\n")[0])
    parser.add_argument("library", choices=sorted(LIBRARY_GATES))
    parser.add_argument("base", help="the commit, tag or branch to compare against (e.g. v3.1.5, main)")
    parser.add_argument("head", help="the commit, tag or branch under test")
    parser.add_argument("--repo", help="the library's repository (default: the configuration's release history)")
    parser.add_argument(
        "--factor",
        type=_factor,
        help="asv --factor of the wall-clock step, a number above 1 (default: the gate's, 1.2)",
    )
    parser.add_argument("--machine", help="asv machine name (default: asv's; its entry is written where missing)")
    parser.add_argument(
        "--results-dir",
        type=Path,
        help="keep the configuration, results and output here (a new or empty folder; default: a new one "
        "under .asv/library-gate/)",
    )
    parser.add_argument(
        "--step",
        choices=("instructions", "wall-time"),
        help="run only this step of the gate (default: both, the instruction counts first)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the asv command and configuration, run nothing")
    return parser


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # --help | head
        _drop(sys.stdout)
        return 0


def _main(argv: list[str] | None) -> int:
    on_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if on_main_thread else None
    workdir: Path | None = None
    started = False  # an OSError before the run is a bad argument (a path), after it a failure to measure
    try:
        args = _parser().parse_args(argv)
        gate = LIBRARY_GATES[args.library]
        repo = args.repo if args.repo is None or "://" in args.repo else str(Path(args.repo).expanduser().resolve())
        if args.results_dir is not None:
            check_results_dir(args.results_dir)
        gate.steps(args.factor, args.step)
        check_commits(gate, args.base, args.head, repo)
        if args.dry_run:
            workdir = (
                args.results_dir.resolve() if args.results_dir else run_dir(args.library, args.base, args.head, False)
            )
            _dry_run(gate, args, repo, workdir)
            return EXIT_PASSED
        if args.results_dir is not None:
            args.results_dir.mkdir(parents=True, exist_ok=True)
            workdir = args.results_dir.resolve()
        else:
            workdir = run_dir(args.library, args.base, args.head)
        say(f"library_gate: {gate.library} {args.base} -> {args.head}: results and asv's output go to {workdir}")
        started = True
        run = run_gate(
            gate, args.base, args.head, workdir, repo, args.factor, args.machine, only=args.step, progress=Progress(say)
        )
    except GateError as error:
        say(f"library_gate: error: {error}", sys.stderr)
        return EXIT_BAD_ARGUMENT
    except OSError as error:
        path = " -> ".join(str(name) for name in (error.filename, error.filename2) if name)
        say(f"library_gate: error: {path or 'the run folder'}: {error.strerror or error}", sys.stderr)
        return EXIT_NOT_MEASURED if started else EXIT_BAD_ARGUMENT
    except KeyboardInterrupt:
        kept = f"; what was measured is kept in {workdir}" if workdir is not None and workdir.exists() else ""
        say(f"library_gate: interrupted{kept}", sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    say(
        verdict(run, gate.library, args.base, args.head, workdir),
        sys.stderr if run.returncode == EXIT_NOT_MEASURED else None,
    )
    return run.returncode


def _dry_run(gate: LibraryGate, args: argparse.Namespace, repo: str | None, workdir: Path) -> None:
    """Print what the gate would run in ``workdir`` (created by no one)."""
    for name, bench, factor in gate.steps(args.factor, args.step):
        config_path = workdir / f"asv.{gate.library}.gate.{name}.conf.json"
        command = asv_command(gate, config_path, args.base, args.head, factor, args.machine, bench)
        say(" ".join(_quote(part) for part in command))
    say(json.dumps(private_config(gate, workdir / "results", repo), indent=4))


if __name__ == "__main__":
    raise SystemExit(main())
