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
results; a temporary one by default), and whose environment, benchmarks and cropbench are this
repository's, so the environment asv built for the history is reused. ``--repo`` points it at a
maintainer's own clone of the library instead of the release history:

    .venv/bin/python scripts/library_gate.py zarr v3.1.5 v3.1.6
    .venv/bin/python scripts/library_gate.py zarr main my-branch --repo ~/src/zarr-python
    .venv/bin/python scripts/library_gate.py ome-arrow v0.0.11 v0.1.0 --dry-run    # print the command

Exit code: asv's (1 when a gated benchmark got worse by more than the factor, 0 otherwise), 2 for
bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: The factor of the instruction counts (benchmarks/instructions.py): four runs of each case agreed
#: within 0.21 % on a busy 2-core machine (docs/results/gate.md, "Instruction counts"), so 1.03
#: leaves a margin of more than ten times that and flags a 3 % change of the CPU work in the read path.
INSTRUCTIONS_FACTOR = 1.03


class GateError(RuntimeError):
    """An argument of the gate is not usable (a results folder holding results, a missing repository)."""


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
            if getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be above 1 (a ratio after / before), got {getattr(self, name)}")
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


def private_config(gate: LibraryGate, results_dir: Path, repo: Path | str | None = None) -> dict[str, Any]:
    """``asv.<library>.conf.json`` for a run from ``results_dir``, with this repository's environment and suites.

    asv resolves relative paths and ``{conf_dir}`` from the configuration's folder, which is now
    ``results_dir``'s parent: every path becomes absolute, and ``{conf_dir}`` (the clone whose
    branch ``main`` is installed as the harness) becomes this repository.
    """
    config = read_config(REPO / gate.config)
    source = str(repo) if repo is not None else config["repo"]
    if "://" not in source:
        source = str((REPO / Path(source).expanduser()).resolve())
    config["repo"] = source
    config["benchmark_dir"] = str(REPO / config.get("benchmark_dir", "benchmarks"))
    config["env_dir"] = str(REPO / config.get("env_dir", "env"))
    config["results_dir"] = str(results_dir)
    config["html_dir"] = str(results_dir.parent / "html")
    for key in ("build_command", "install_command", "uninstall_command"):
        config[key] = [command.replace("{conf_dir}", str(REPO)) for command in config.get(key, [])]
    return config


def check_results_dir(results_dir: Path) -> None:
    """Refuse a results folder that holds anything: its results would be compared as if measured now."""
    if results_dir.exists() and (not results_dir.is_dir() or any(results_dir.iterdir())):
        raise GateError(
            f"--results-dir {results_dir} is not empty: asv continuous would compare results saved there earlier "
            "as if measured now; give a new folder"
        )


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
    return f"python scripts/library_gate.py {gate.library} BASE HEAD"


@dataclass(frozen=True)
class GateRun:
    """One gate run: asv's exit code, the benchmarks it marked worse, its output, and where results went."""

    returncode: int
    worse: tuple[str, ...]
    output: str
    results_dir: Path


def worse_rows(output: str) -> tuple[str, ...]:
    """Benchmarks (with parameters) that asv marked ``+`` (worse) in a continuous/compare table."""
    rows = re.finditer(r"^\|\s*\+\s*\|.*\|\s*([\w.]+(?:\(.*\))?)\s*\|\s*$", output, re.MULTILINE)
    return tuple(sorted({row.group(1) for row in rows}))


Runner = Callable[[Sequence[str], dict[str, str]], "subprocess.CompletedProcess[str]"]


def _run_asv(command: Sequence[str], environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
    asv = [sys.executable, "-m", "asv", *command[1:]]
    return subprocess.run(asv, env=environment, capture_output=True, text=True)


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
) -> GateRun:
    """``asv continuous`` of each step of the gate (or of step ``only``), each from an empty results folder
    under ``workdir`` (``results`` for the wall-clock step, ``results-instructions`` for the instruction counts).

    The exit code is the first one that is neither 0 nor 1 (asv failed), else 1 if any step flagged.
    """
    steps = gate.steps(factor, only)
    folders = [workdir / ("results" if name == "wall-time" else f"results-{name}") for name, _, _ in steps]
    for folder in folders:
        check_results_dir(folder)
    environment = {**os.environ, **({"HOME": str(home)} if home is not None else {})}
    environment.pop("CROPBENCH_ASV_FULL", None)  # the full grid never runs in a gate
    codes, outputs = [], []
    for (name, bench, step_factor), results_dir in zip(steps, folders, strict=True):
        results_dir.mkdir(parents=True, exist_ok=True)
        config_path = workdir / f"asv.{gate.library}.gate.{name}.conf.json"
        config_path.write_text(json.dumps(private_config(gate, results_dir, repo), indent=4) + "\n")
        result = runner(asv_command(gate, config_path, base, head, step_factor, machine, bench), environment)
        codes.append(result.returncode)
        outputs.append(f"library_gate: {name} (factor {step_factor})\n{result.stdout}{result.stderr}")
    failed = [code for code in codes if code not in (0, 1)]
    output = "".join(outputs)
    returncode = failed[0] if failed else max(codes)
    return GateRun(returncode=returncode, worse=worse_rows(output), output=output, results_dir=folders[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("library", choices=sorted(LIBRARY_GATES))
    parser.add_argument("base", help="the commit, tag or branch to compare against (e.g. v3.1.5, main)")
    parser.add_argument("head", help="the commit, tag or branch under test")
    parser.add_argument("--repo", help="the library's repository (default: the configuration's release history)")
    parser.add_argument("--factor", type=float, help="asv --factor of the wall-clock step (default: the gate's, 1.2)")
    parser.add_argument("--machine", help="asv machine name (default: asv's)")
    parser.add_argument(
        "--results-dir", type=Path, help="keep the configuration and results here (a new or empty folder)"
    )
    parser.add_argument(
        "--step",
        choices=("instructions", "wall-time"),
        help="run only this step of the gate (default: both, the instruction counts first)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the asv command and configuration, run nothing")
    args = parser.parse_args(argv)
    gate = LIBRARY_GATES[args.library]
    if args.factor is not None and args.factor <= 1.0:
        parser.error(f"--factor must be above 1, got {args.factor}")
    if args.repo is not None and "://" not in args.repo and not Path(args.repo).expanduser().is_dir():
        parser.error(f"--repo {args.repo} is not a folder (a clone of {args.library}, or a URL)")
    try:
        if args.results_dir is not None:
            check_results_dir(args.results_dir)
            args.results_dir.mkdir(parents=True, exist_ok=True)
            run = _gate_or_dry_run(gate, args, args.results_dir.resolve())
        else:
            with tempfile.TemporaryDirectory(prefix=f"library-gate-{args.library}-") as scratch:
                run = _gate_or_dry_run(gate, args, Path(scratch))
    except GateError as error:
        print(f"library_gate: error: {error}", file=sys.stderr)
        return 2
    if run is None:
        return 0
    print(run.output, end="")
    print(f"library_gate: {gate.library} {args.base} -> {args.head}: exit {run.returncode}, worse: {len(run.worse)}")
    return run.returncode


def _gate_or_dry_run(gate: LibraryGate, args: argparse.Namespace, workdir: Path) -> GateRun | None:
    """Run the gate in ``workdir`` (configuration and results), or print what it would run."""
    if args.dry_run:
        for name, bench, factor in gate.steps(args.factor, args.step):
            config_path = workdir / f"asv.{gate.library}.gate.{name}.conf.json"
            command = asv_command(gate, config_path, args.base, args.head, factor, args.machine, bench)
            print(" ".join(_quote(part) for part in command))
        print(json.dumps(private_config(gate, workdir / "results", args.repo), indent=4))
        return None
    return run_gate(gate, args.base, args.head, workdir, args.repo, args.factor, args.machine, only=args.step)


def _quote(part: str) -> str:
    return f'"{part}"' if re.search(r"[\s()|'\\]", part) else part


if __name__ == "__main__":
    raise SystemExit(main())
