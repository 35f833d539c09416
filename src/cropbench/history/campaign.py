"""Does the zarr gate catch a zarr-python regression, and stay quiet when nothing changed?

Like ``scripts/asv_regression.py --campaign`` for cropbench's own gate, against the library: in a
temporary clone of the zarr release history (``scripts/release_history.py zarr``), one branch per
injected regression on the newest release, each a patch of zarr-python's source from
``scripts/library_gate_patches/<kind>.patch`` (``INJECTIONS``), and an identical-code branch (a
comment). Each regression's slowdown is measured outside asv first: random 96 px crops of the
smoke plate through zarr-python (``decode='zarr'``), crops/s of the release and of the branch in
alternating processes, each importing zarr from that branch's source. Then the gate
(``scripts/library_gate.py``, from an empty results folder each time) runs ``--identical`` times
on the identical branch and ``--per-kind`` times per regression, in a seeded random order, with
the load average around each run. The table, a summary and every comparison's output go to
``--out``:

    .venv/bin/python scripts/library_campaign.py --out results-gate/zarr-library-$(date +%F)

About 4 minutes a comparison on a 2-core machine once asv's environment is built
(``asv.zarr.conf.json``'s, in .asv/env); 20 comparisons by default. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cropbench.history import REPO, library_gate, regression

HISTORY = REPO / ".asv" / "history" / "zarr"
PATCHES = REPO / "scripts" / "library_gate_patches"
#: The file of zarr-python's source the identical-code branch adds a comment to.
IDENTICAL_FILE = "src/zarr/__init__.py"


class Injection(regression.Injection):
    """A regression of zarr-python as a patch of its source: ``PATCHES / f"{kind}.patch"`` (``src/zarr/...``)."""

    @property
    def patch(self) -> Path:
        return PATCHES / f"{self.kind}.patch"


INJECTIONS = {
    injection.kind: injection
    for injection in (
        Injection("shard-index", "the sharding codec reads the shard index again for every chunk it reads"),
        Injection("extra-copy", "the codec pipeline copies every decoded chunk once more"),
        Injection("slow-store", "the local store reads every byte range twice (the first read discarded)"),
        Injection("store-latency", "every get of the local store waits 0.15 ms first (a slower store round trip)"),
        Injection(
            "indexer-work",
            "the orthogonal indexer rebuilds each chunk's coordinates 14 times more (Python work per chunk)",
        ),
        Injection(
            "buffer-conversion", "every byte range read is widened to 16 bits and back before it becomes a buffer"
        ),
    )
}
#: What a campaign injects unless told: the injections that cost zarr-python 1.25x or more outside asv
#: (``extra-copy`` and ``slow-store`` cost about 1.05x, below what the gate's 1.2 factor resolves).
DEFAULT_KINDS = ("shard-index", "store-latency")


class CampaignError(RuntimeError):
    """The history or a patch is not what the campaign needs."""


def _git(path: Path, *args: str) -> str:
    result = subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True, text=True)
    return result.stdout.strip()


def _commit(path: Path, message: str) -> str:
    _git(path, "add", "-A")
    _git(path, "-c", "user.name=library gate", "-c", "user.email=library-gate@localhost", "commit", "-q", "-m", message)
    return _git(path, "rev-parse", "HEAD")


def newest_release(history: Path) -> str:
    """The newest ``v<version>`` tag of the history (what ``git describe`` of main names)."""
    try:
        return _git(history, "describe", "--tags", "--abbrev=0", "main")
    except subprocess.CalledProcessError:
        raise CampaignError(f"{history} has no release tag on a branch main; it is not a release history") from None


def check_history(history: Path, release: str | None) -> str:
    """The release the campaign starts from, once ``history`` is a release history that has it."""
    if not (history / ".git").exists():
        raise CampaignError(
            f"--history {history} is not a release history (no git repository there); "
            "build it with .venv/bin/python scripts/release_history.py zarr"
        )
    if release is None:
        return newest_release(history)
    found = subprocess.run(
        ["git", "-C", str(history), "rev-parse", "--verify", "-q", f"refs/tags/{release}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if found.returncode != 0:
        tags = _git(history, "tag", "--list", "--sort=-version:refname").split()
        raise CampaignError(
            f"--release {release!r} is not a release tag of {history}; expected one of {', '.join(tags[:5]) or 'none'}"
        )
    return release


def check_arguments(args: argparse.Namespace) -> tuple[tuple[str, ...], str]:
    """The kinds and the release, once every argument is checked (before anything is built or measured)."""
    kinds = tuple(kind for kind in args.kinds.split(",") if kind)
    unknown = [kind for kind in kinds if kind not in INJECTIONS]
    if unknown:
        raise CampaignError(f"--kinds: unknown {', '.join(unknown)} (known: {', '.join(INJECTIONS)})")
    for name in ("identical", "per_kind"):
        if getattr(args, name) < 0:
            flag = "--" + name.replace("_", "-")
            raise CampaignError(f"{flag} must be 0 or more comparisons, got {getattr(args, name)}")
    if args.identical + args.per_kind * len(kinds) == 0:
        raise CampaignError("the campaign has no comparisons: give --identical or --per-kind (with --kinds) above 0")
    if os.path.lexists(args.out) and not args.out.is_dir():
        raise CampaignError(f"--out {args.out} is a file, not a folder; give a new folder")
    if args.out.exists() and any(args.out.iterdir()):
        raise CampaignError(f"--out {args.out} is not empty; give a new folder (nothing there is replaced)")
    return kinds, check_history(args.history, args.release)


@dataclass(frozen=True)
class Branches:
    """The clone of the history and its branches: the release, identical code, one per injected kind."""

    clone: Path
    base: str
    identical: str
    injected: dict[str, str] = field(default_factory=dict)

    def branch(self, kind: str) -> str:
        return self.identical if kind == "identical" else self.injected[kind]


def make_branches(history: Path, destination: Path, base: str, kinds: tuple[str, ...]) -> Branches:
    """Clone ``history`` to ``destination`` and branch off ``base``: ``gate-identical`` and ``gate-<kind>`` each."""
    if not (history / ".git").exists():
        raise CampaignError(
            f"{history} is not a release history; build it with .venv/bin/python scripts/release_history.py zarr"
        )
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(history), str(destination)], check=True)
    _git(destination, "checkout", "-q", "-b", "gate-identical", base)
    identical_file = destination / IDENTICAL_FILE
    identical_file.write_text(identical_file.read_text() + "# an identical-code commit: this comment only\n")
    _commit(destination, "identical code: a comment")
    injected = {}
    for kind in kinds:
        injection = INJECTIONS[kind]
        _git(destination, "checkout", "-q", "-b", f"gate-{kind}", base)
        applied = subprocess.run(
            ["git", "-C", str(destination), "apply", str(injection.patch)], capture_output=True, text=True
        )
        if applied.returncode != 0:
            raise CampaignError(
                f"{injection.patch.name} does not apply to {base}: {applied.stderr.strip()} "
                "(make the same edit by hand in that release's source and save it with git diff)"
            )
        _commit(destination, f"injected regression ({kind}): {injection.description}")
        injected[kind] = f"gate-{kind}"
    _git(destination, "checkout", "-q", base)
    return Branches(clone=destination, base=base, identical="gate-identical", injected=injected)


#: Random crops per speed measurement, and alternating release/branch processes.
SPEED_CROPS = 600
SPEED_REPEATS = 3
#: zarr-python's read path with a bounded chunk cache: what the injected regressions slow down.
SPEED_KNOBS = {"decode": "zarr", "chunk_cache_bytes": 2**20}


def source_tree(branches: Branches, ref: str, scratch: Path) -> Path:
    """A worktree of ``ref`` whose ``src/`` imports as zarr (with the version file a build would write)."""
    worktree = scratch / f"source-{ref.replace('/', '-')}"
    if not worktree.exists():
        _git(branches.clone, "worktree", "add", "-q", "--detach", str(worktree), ref)
        version = branches.base.removeprefix("v")
        (worktree / "src" / "zarr" / "_version.py").write_text(f'__version__ = version = "{version}"\n')
    return worktree / "src"


def zarr_crops_at(source: Path, plate: Path) -> float:
    """Random crops/s through zarr-python imported from ``source`` (a worktree's ``src/``), via the runner.

    A measurement of the wrong zarr is a CampaignError, so the campaign ends in its one-line message."""
    try:
        return regression.track1_random_rate(source, plate, SPEED_KNOBS, SPEED_CROPS, "zarr")
    except RuntimeError as error:
        raise CampaignError(str(error)) from error


def slowdown(base_rate: Callable[[], float], injected_rate: Callable[[], float], repeats: int) -> dict[str, float]:
    """Release crops/s over branch crops/s: medians of processes that alternate the two."""
    base, injected = [], []
    for _ in range(repeats):
        base.append(base_rate())
        injected.append(injected_rate())
    return {
        "slowdown": statistics.median(base) / statistics.median(injected),
        "base_crops_per_s": statistics.median(base),
        "injected_crops_per_s": statistics.median(injected),
    }


#: The access whose instructions per crop calibrate an injection: random, the case the timings calibrate
#: with too; each comparison's asv output holds the grouped case's ratio as well (two more children
#: under valgrind per injection, minutes each on a busy machine, would add nothing the gate does not show).
CALIBRATION_ACCESSES = ("random",)
#: Crops of the smaller counted run (the gate's ``instructions.ZarrReads`` reads as many).
INSTRUCTION_CROPS = 20


@functools.cache
def instructions_at(source: Path, plate: Path, access: str) -> float:
    """Instructions per crop through zarr-python imported from ``source`` (a worktree's ``src/``), under valgrind
    (a count: the release's is measured once and reused for every injection)."""
    from cropbench.measure.instructions import InstructionWorkload, measure_instructions

    workload = InstructionWorkload(str(plate), decode="zarr", access=access, crops=INSTRUCTION_CROPS)
    return measure_instructions(workload, library_path=(str(source),)).per_crop


def instruction_slowdown(base_source: Path, injected_source: Path, plate: Path) -> dict[str, float]:
    """Branch instructions per crop over the release's, per access: a count, so one child pair each."""
    result: dict[str, float] = {}
    for access in CALIBRATION_ACCESSES:
        base = instructions_at(base_source, plate, access)
        injected = instructions_at(injected_source, plate, access)
        result[f"{access}_base_instructions_per_crop"] = base
        result[f"{access}_injected_instructions_per_crop"] = injected
        result[f"{access}_slowdown"] = injected / base
    result["slowdown"] = min(result[f"{access}_slowdown"] for access in CALIBRATION_ACCESSES)
    return result


def write_plate(destination: Path) -> Path:
    """The smoke plate in the default layout (written by the installed zarr)."""
    from cropbench.config import LAYOUTS, plate_preset
    from cropbench.plates.generate import generate_plate

    generate_plate(destination, plate_preset("smoke"), LAYOUTS["default"], progress=False)
    return destination


Gate = Callable[[str, str, Path], library_gate.GateRun]


def schedule(identical: int, per_kind: int, kinds: tuple[str, ...], seed: int) -> list[str]:
    """The comparisons in a seeded random order."""
    order = ["identical"] * identical + [kind for kind in kinds for _ in range(per_kind)]
    random.Random(seed).shuffle(order)
    return order


def campaign(
    branches: Branches,
    gate: Gate,
    slowdowns: dict[str, dict[str, float]],
    order: list[str],
    out: Path,
    scratch: Path,
    step: str | None = None,
    calibrated_by: str = "crops",
) -> dict[str, Any]:
    """Run the gate over ``order``; write every comparison, the summary and the table to ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    kinds = tuple(dict.fromkeys(kind for kind in order if kind != "identical"))
    tallies = {kind: regression.Tally() for kind in ("identical", *kinds)}
    loads: list[float] = []
    started = time.time()
    with (out / "comparisons.jsonl").open("w") as log:
        for number, kind in enumerate(order, 1):
            load_before = os.getloadavg()[0]
            run = gate(branches.base, branches.branch(kind), scratch / f"run-{number:02d}")
            load_after = os.getloadavg()[0]
            loads += [load_before, load_after]
            tallies[kind].add(run)
            record = {"number": number, "kind": kind, "exit": run.returncode, "worse": list(run.worse)}
            record["loadavg_1min"] = [load_before, load_after]
            log.write(json.dumps(record) + "\n")
            log.flush()
            (out / f"{number:02d}-{kind}.txt").write_text(run.output)
            print(json.dumps(record), flush=True)
            shutil.rmtree(run.results_dir.parent, ignore_errors=True)
    summary = {
        "gate": library_gate.gate_commands(library_gate.LIBRARY_GATES["zarr"], only=step),
        "release": branches.base,
        "order": order,
        "minutes": round((time.time() - started) / 60, 1),
        "loadavg_1min": {"min": min(loads), "median": statistics.median(loads), "max": max(loads)} if loads else {},
        "tallies": {kind: vars(tally) for kind, tally in tallies.items()},
        "slowdown_outside_asv": slowdowns,
        "slowdown_measured_by": calibrated_by,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "table.md").write_text(table(summary))
    return summary


#: How an injection's slowdown outside asv is measured (``--calibrate-by``), as the table's header says it.
SLOWDOWN_UNITS = {
    "crops": "random crops/s",
    "instructions": "random, instructions per crop",
}


def table(summary: dict[str, Any]) -> str:
    """The campaign table: injection, slowdown outside asv, flagged k/n, and identical code's k/n."""
    identical = summary["tallies"]["identical"]
    measured_by = summary.get("slowdown_measured_by", "crops")
    digits = 3 if measured_by == "instructions" else 2  # counts repeat to a fraction of a per cent
    lines = [
        f"Release {summary['release']}; identical code (a comment) flagged {identical['flagged']}/{identical['runs']}.",
        "",
        f"| injection | slowdown outside asv ({SLOWDOWN_UNITS[measured_by]}) | flagged (exit 1) "
        "| benchmarks flagged (times) |",
        "| --- | --- | --- | --- |",
    ]
    for kind, tally in summary["tallies"].items():
        if kind == "identical":
            description, effect = "identical code (a comment)", "none"
        else:
            description = f"`{kind}`: {INJECTIONS[kind].description}"
            effect = f"x{summary['slowdown_outside_asv'][kind]['slowdown']:.{digits}f}"
        flagged = ", ".join(f"`{name}` ({count})" for name, count in sorted(tally["worse"].items())) or "none"
        lines.append(f"| {description} | {effect} | {tally['flagged']}/{tally['runs']} | {flagged} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cropbench library-campaign", description=__doc__.split("\n\n")[0])
    parser.add_argument("--history", type=Path, default=HISTORY, help="the zarr release history (default: %(default)s)")
    parser.add_argument("--release", help="the release the branches start from (default: the newest)")
    parser.add_argument(
        "--kinds",
        default=",".join(DEFAULT_KINDS),
        help=f"comma-separated, of {', '.join(INJECTIONS)} (default: %(default)s)",
    )
    parser.add_argument("--identical", type=int, default=10, help="identical-code comparisons (default: %(default)s)")
    parser.add_argument("--per-kind", type=int, default=5, help="comparisons per injection (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random order (default: %(default)s)")
    parser.add_argument("--machine", help="asv machine name (default: asv's)")
    parser.add_argument("--out", type=Path, required=True, help="where the table and every comparison go")
    parser.add_argument(
        "--step",
        choices=("instructions", "wall-time"),
        help="run only this step of the gate (default: both)",
    )
    parser.add_argument(
        "--calibrate-by",
        choices=tuple(SLOWDOWN_UNITS),
        default="crops",
        help="measure each injection outside asv by random crops/s (a clock) or by instructions per crop "
        "(valgrind; the unit of the gate's instruction step) (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    try:
        kinds, release = check_arguments(args)
        with tempfile.TemporaryDirectory(prefix="library-campaign-") as name:
            scratch = Path(name)
            branches = make_branches(args.history, scratch / "zarr", release, kinds)
            plate = write_plate(scratch / "smoke.zarr")
            base_source = source_tree(branches, branches.base, scratch)
            slowdowns = {}
            for kind in kinds:
                injected_source = source_tree(branches, branches.injected[kind], scratch)
                if args.calibrate_by == "instructions":
                    slowdowns[kind] = instruction_slowdown(base_source, injected_source, plate)
                else:
                    slowdowns[kind] = slowdown(
                        functools.partial(zarr_crops_at, base_source, plate),
                        functools.partial(zarr_crops_at, injected_source, plate),
                        SPEED_REPEATS,
                    )
                print(f"{kind}: x{slowdowns[kind]['slowdown']:.3f} outside asv ({args.calibrate_by})", flush=True)
            zarr_gate = library_gate.LIBRARY_GATES["zarr"]

            def gate(base: str, head: str, workdir: Path) -> library_gate.GateRun:
                return library_gate.run_gate(
                    zarr_gate, base, head, workdir, branches.clone, machine=args.machine, only=args.step
                )

            order = schedule(args.identical, args.per_kind, kinds, args.seed)
            summary = campaign(branches, gate, slowdowns, order, args.out, scratch, args.step, args.calibrate_by)
    except (CampaignError, library_gate.GateError) as error:
        print(f"library_campaign: error: {error}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as error:
        detail = " ".join(str(error.stderr or "").split()) or f"exit code {error.returncode}"
        print(f"library_campaign: error: {' '.join(map(str, error.cmd))} failed: {detail}", file=sys.stderr)
        return 2
    print(table(summary), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
