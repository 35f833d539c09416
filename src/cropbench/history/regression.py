"""Does ``asv continuous`` catch regressions in the crop path, and stay quiet when nothing changed?

In a temporary clone of this repository (with the working tree's benchmarks/ and asv.conf.json
committed on top), this makes a base commit, an identical-code commit (a README line), and one
commit per injected regression, each a small edit of cropbench's source applied with ``git apply``
from ``scripts/gate_patches/<kind>.patch`` (see ``INJECTIONS``):

- ``double-decode``: the direct reader reads and decodes every chunk it loads twice, the first result discarded;
- ``cache``: the default decoded-chunk cache is 16 times smaller (32 MiB -> 2 MiB);
- ``extra-copy``: assembling a crop copies each whole decoded chunk before cutting its piece out;
- ``sampler``: the samplers spend 50 microseconds on every index they yield;
- ``slow-getitem``: every ``CropDataset.__getitem__`` takes ``--slowdown`` times as long (a busy wait).

Then either ``asv continuous`` (``continuous``, in a real asv virtualenv environment reused from
``--env-dir``, built there on first use, ~2 min) or ``asv run --python=same`` per commit and
``asv compare`` (``same``: seconds, no environment to build), with the gate README recommends
(``GATE_FACTOR``, ``GATE_BENCH``, ``GATE_ATTRIBUTES``, exit code 1 = flagged) unless told otherwise.

``--campaign`` runs ``--identical`` identical-code comparisons and ``--per-kind`` comparisons of
each kind in ``--kinds``, in a seeded random order, records the load average around each, measures
each regression's real slowdown in crops/s (base and injected commit in alternating processes),
and writes the table of false-positive and detection rates to ``--out``:

    .venv/bin/python scripts/asv_regression.py --campaign --out results/gate
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from cropbench.history import REPO
from cropbench.metrics import SAMPLES_PER_S
from cropbench.records import Record

#: The repository's own asv environments (asv.conf.json "env_dir"): reused, not rebuilt.
DEFAULT_ENV_DIR = Path(os.environ.get("CROPBENCH_ASV_ENV_DIR", REPO / ".asv" / "env"))
MACHINE = "cropbench-regression"
#: The gate README recommends: the factor, the benchmarks (random access on the direct reader:
#: relative cost at both cache sizes, the decode step's work, the stage split) and one round
#: (asv keeps only the last round's value of a ``track_*`` benchmark, so more rounds add nothing).
GATE_FACTOR = 1.2
GATE_BENCH = r"^track1\.(Fetch\.track_relative_cost|Decoding\.track_\w+|Stages\.track_\w+)\('random', 'direct'"
GATE_ATTRIBUTES = ("rounds=1",)
#: The direct reader's instructions per crop (benchmarks/instructions.py), gated by scripts/gate.sh in
#: an ``asv continuous`` call of their own with the instruction factor (scripts/library_gate.py
#: ``INSTRUCTIONS_FACTOR``); the campaign below measures the wall-clock gate above.
GATE_INSTRUCTIONS_BENCH = r"^instructions\.DirectReads\.track_instructions_per_crop\('random'\)"
SLOWDOWN_PATCH = """

# --- injected by scripts/asv_regression.py: every crop takes {factor} times as long ---
import time as _regression_time  # noqa: E402

_regression_original_getitem = CropDataset.__getitem__


def _regression_slow_getitem(self, index):  # type: ignore[no-untyped-def]
    started = _regression_time.perf_counter()
    item = _regression_original_getitem(self, index)
    deadline = started + {factor} * (_regression_time.perf_counter() - started)
    while _regression_time.perf_counter() < deadline:
        pass
    return item


CropDataset.__getitem__ = _regression_slow_getitem  # type: ignore[method-assign]
"""


#: The injected regressions, one patch file each (``git apply`` in the clone); tests/test_gate_patches.py
#: checks that every one still applies to the tree, so a refactor of the lines they edit fails there
#: instead of silently leaving the gate without its check.
PATCHES = REPO / "scripts" / "gate_patches"


@dataclass(frozen=True)
class Injection:
    """A regression as a patch of cropbench's source: ``PATCHES / f"{kind}.patch"``."""

    kind: str
    description: str

    @property
    def patch(self) -> Path:
        return PATCHES / f"{self.kind}.patch"

    @property
    def files(self) -> tuple[str, ...]:
        """The files the patch edits, relative to the repository."""
        lines = self.patch.read_text().splitlines()
        return tuple(line.removeprefix("+++ b/") for line in lines if line.startswith("+++ b/"))


INJECTIONS = {
    injection.kind: injection
    for injection in (
        Injection(
            "double-decode", "the direct reader reads and decodes every chunk it loads twice (first result discarded)"
        ),
        Injection("cache", "default decoded-chunk cache 16x smaller (32 MiB -> 2 MiB)"),
        Injection("extra-copy", "assembling a crop copies each whole decoded chunk before cutting its piece"),
        Injection("sampler", "the samplers spend 50 us on every index they yield"),
    )
}
#: The kinds a campaign injects by default.
CAMPAIGN_KINDS = tuple(INJECTIONS)


@dataclass(frozen=True)
class Clone:
    """A throwaway clone and the hashes of its commits: base, identical code, and one per injected kind."""

    path: Path
    base: str
    identical: str
    injected: dict[str, str] = field(default_factory=dict)

    @property
    def slow(self) -> str:
        return self.injected["slow-getitem"]


@dataclass(frozen=True)
class Comparison:
    """One comparison: asv's exit code, the benchmarks it marked as worse, and its output."""

    returncode: int
    worse: tuple[str, ...]
    output: str

    @property
    def flagged(self) -> bool:
        return bool(self.worse)


def _git(path: Path, *args: str) -> str:
    result = subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True, text=True)
    return result.stdout.strip()


def _commit(path: Path, message: str) -> str:
    _git(path, "add", "-A")
    _git(
        path,
        "-c",
        "user.name=regression",
        "-c",
        "user.email=regression@localhost",
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        message,
    )
    return _git(path, "rev-parse", "HEAD")


def make_clone(
    destination: Path,
    slowdown: float = 1.5,
    env_dir: Path | None = None,
    kinds: tuple[str, ...] = ("slow-getitem",),
) -> Clone:
    """Clone HEAD, put the working tree's suite on top, add the identical commit and one commit per kind."""
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(REPO), str(destination)], check=True)
    shutil.rmtree(destination / "benchmarks", ignore_errors=True)
    shutil.copytree(REPO / "benchmarks", destination / "benchmarks", ignore=shutil.ignore_patterns("__pycache__"))
    config = _read_config(REPO / "asv.conf.json")
    if env_dir is not None:
        config["env_dir"] = str(env_dir)
    (destination / "asv.conf.json").write_text(json.dumps(config, indent=4))
    base = _commit(destination, "regression base: working-tree benchmark suite")
    readme = destination / "README.md"
    readme.write_text((readme.read_text() if readme.exists() else "") + "\nAn identical-code commit.\n")
    identical = _commit(destination, "identical code: README only")
    injected = {}
    for kind in kinds:
        _git(destination, "checkout", "-q", base)
        if kind == "slow-getitem":
            dataset = destination / "src" / "cropbench" / "data" / "dataset.py"
            dataset.write_text(dataset.read_text() + SLOWDOWN_PATCH.format(factor=slowdown))
            message = f"deliberate {slowdown}x slowdown of CropDataset.__getitem__"
        else:
            injection = INJECTIONS[kind]
            applied = subprocess.run(
                ["git", "-C", str(destination), "apply", str(injection.patch)], capture_output=True, text=True
            )
            if applied.returncode != 0:
                raise RuntimeError(
                    f"{injection.patch.relative_to(REPO)} no longer applies to HEAD (make the same edit by hand "
                    f"and save it with git diff): {applied.stderr.strip()}"
                )
            message = f"injected regression ({kind}): {injection.description}"
        injected[kind] = _commit(destination, message)
    _git(destination, "checkout", "-q", "-B", "main", identical)
    return Clone(path=destination, base=base, identical=identical, injected=injected)


def _read_config(path: Path) -> dict[str, object]:
    """asv.conf.json allows // comments; drop whole-line comments before parsing."""
    lines = [line for line in path.read_text().splitlines() if not line.lstrip().startswith("//")]
    return json.loads("\n".join(lines))


def _asv(
    clone: Path,
    home: Path,
    *args: str,
    extra_env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "HOME": str(home), **(extra_env or {})}
    environment.pop("CROPBENCH_ASV_FULL", None)
    command = [sys.executable, "-m", "asv", *args]
    return subprocess.run(command, cwd=clone, env=environment, capture_output=True, text=True)


def _worse(output: str) -> tuple[str, ...]:
    """Benchmarks (with parameters) asv marked ``+`` (worse) in a compare/continuous table."""
    rows = re.finditer(r"^\|\s*\+\s*\|.*\|\s*([\w.]+(?:\(.*\))?)\s*\|\s*$", output, re.MULTILINE)
    return tuple(sorted({row.group(1) for row in rows}))


def prepare_machine(home: Path) -> None:
    """A machine entry in a private HOME, so nothing is asked and ~/.asv-machine.json is untouched."""
    home.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "asv", "machine", "--yes", "--machine", MACHINE],
        cwd=REPO,
        env={**os.environ, "HOME": str(home)},
        check=True,
        capture_output=True,
    )


def _selection(bench: str | None) -> list[str]:
    return [] if bench is None else ["-b", bench]


def continuous(
    clone: Clone,
    home: Path,
    other: str,
    bench: str | None = GATE_BENCH,
    factor: float = GATE_FACTOR,
    attributes: tuple[str, ...] = GATE_ATTRIBUTES,
) -> Comparison:
    """``asv continuous base other`` in the (reused) virtualenv environment, with README's gate by default."""
    result = _asv(
        clone.path,
        home,
        "continuous",
        "--machine",
        MACHINE,
        "--factor",
        str(factor),
        *(option for attribute in attributes for option in ("-a", attribute)),
        *_selection(bench),
        clone.base,
        other,
    )
    output = result.stdout + result.stderr
    return Comparison(returncode=result.returncode, worse=_worse(output), output=output)


def compare_same_python(
    clone: Clone, home: Path, other: str, bench: str | None = GATE_BENCH, factor: float = GATE_FACTOR
) -> Comparison:
    """Run base and ``other`` with ``--python=same`` (each commit's src via ASV_PYTHONPATH), compare."""
    for commit in (clone.base, other):
        _git(clone.path, "checkout", "-q", commit)
        result = _asv(
            clone.path,
            home,
            "run",
            "--python=same",
            "--machine",
            MACHINE,
            "--set-commit-hash",
            commit,
            *_selection(bench),
            extra_env={"ASV_PYTHONPATH": str(clone.path / "src")},
        )
        if result.returncode != 0:
            raise RuntimeError(f"asv run --python=same failed for {commit}:\n{result.stdout}{result.stderr}")
    _git(clone.path, "checkout", "-q", "main")
    result = _asv(
        clone.path, home, "compare", "--machine", MACHINE, "--factor", str(factor), "--only-changed", clone.base, other
    )
    output = result.stdout + result.stderr
    return Comparison(returncode=1 if _worse(output) else 0, worse=_worse(output), output=output)


def environment_ready(env_dir: Path) -> bool:
    """Whether an asv virtualenv with torch already exists in ``env_dir`` (reusable, no build)."""
    return any(env_dir.glob("*/lib/python3*/site-packages/torch/__init__.py"))


#: The cases whose crops/s ``real_slowdown`` measures: (label, CropConfig knobs).
SPEED_CASES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("random, cache bounded", {"chunk_cache_bytes": 2**20}),
    ("random, default cache", {}),
)
#: Crops per speed measurement, and alternating base/injected processes per case.
SPEED_CROPS = 1500
SPEED_REPEATS = 3
#: One Track 1 random case through the runner in a fresh process; prints its Record and where
#: ``module`` was imported from (so a measurement of the wrong code tree fails loudly).
TRACK1_SCRIPT = """
import importlib, json, sys
import cropbench
from cropbench.config import CropConfig
from cropbench.tracks.dataset import Dataset, DatasetCase
plate, knobs, samples, module = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
case = DatasetCase(crop=CropConfig(**knobs), access="random", samples=samples, warmup=64, cold_samples=0)
(record,) = cropbench.run(plate, tracks=[Dataset([case])], torch_threads=1)
print(json.dumps({"record": json.loads(record.to_json()), "module": importlib.import_module(module).__file__}))
"""


def track1_random_rate(source: Path, plate: Path, knobs: dict[str, Any], samples: int, module: str) -> float:
    """Samples/s of a Track 1 random case (``CropConfig(**knobs)``) with ``source`` first on the path.

    The runner measures it and returns its Record, so the campaigns quote the same samples/s as
    ``cropbench run``; ``module`` must import from ``source`` (cropbench from a clone, zarr from a
    release-history worktree).
    """
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(source), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-c", TRACK1_SCRIPT, str(plate), json.dumps(knobs), str(samples), module]
    result = subprocess.run(command, env=environment, capture_output=True, text=True, check=True)
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    if not measured["module"].startswith(str(source)):
        raise RuntimeError(f"the speed measurement imported {module} from {measured['module']}, not from {source}")
    record = Record.from_dict(measured["record"])
    return float(record.metrics[SAMPLES_PER_S])


def _checkout(clone: Clone, commit: str) -> None:
    _git(clone.path, "checkout", "-q", commit)


def crops_at(clone: Clone, commit: str, plate: Path, knobs: dict[str, Any]) -> float:
    """Random crops/s of ``commit``'s code (its src/ first on the path)."""
    _checkout(clone, commit)
    return track1_random_rate(clone.path / "src", plate, knobs, SPEED_CROPS, "cropbench")


def real_slowdown(clone: Clone, kind: str, plate: Path) -> dict[str, float]:
    """Base crops/s over injected crops/s per case: medians of processes that alternate base and injected."""
    slowdowns = {}
    for label, knobs in SPEED_CASES:
        base, injected = [], []
        for _ in range(SPEED_REPEATS):
            base.append(crops_at(clone, clone.base, plate, knobs))
            injected.append(crops_at(clone, clone.injected[kind], plate, knobs))
        slowdowns[label] = statistics.median(base) / statistics.median(injected)
        slowdowns[f"{label}, base crops/s"] = statistics.median(base)
    _checkout(clone, "main")
    return slowdowns


def write_plate(clone: Clone, destination: Path) -> Path:
    """The smoke plate in the default layout, written by the base commit's code."""
    _checkout(clone, clone.base)
    script = (
        "import sys; from cropbench.config import LAYOUTS, plate_preset; "
        "from cropbench.plates.generate import generate_plate; "
        "generate_plate(sys.argv[1], plate_preset('smoke'), LAYOUTS['default'], progress=False)"
    )
    environment = {**os.environ, "PYTHONPATH": str(clone.path / "src")}
    subprocess.run([sys.executable, "-c", script, str(destination)], env=environment, check=True)
    _checkout(clone, "main")
    return destination


class Outcome(Protocol):
    """What a tally needs of one gate run: asv's exit code and the benchmarks it marked worse."""

    @property
    def returncode(self) -> int: ...

    @property
    def worse(self) -> tuple[str, ...]: ...


@dataclass
class Tally:
    """Comparisons of one kind: how many, how many the gate flagged (exit 1), and what it flagged."""

    runs: int = 0
    flagged: int = 0
    worse: dict[str, int] = field(default_factory=dict)

    def add(self, comparison: Outcome) -> None:
        self.runs += 1
        self.flagged += comparison.returncode == 1
        for name in comparison.worse:
            self.worse[name] = self.worse.get(name, 0) + 1


def campaign(
    clone: Clone,
    home: Path,
    plate: Path,
    identical: int,
    per_kind: int,
    kinds: tuple[str, ...],
    seed: int,
    out: Path,
) -> dict[str, Any]:
    """The gate over identical-code and injected comparisons in a seeded random order; the table to ``out``."""
    schedule = ["identical"] * identical + [kind for kind in kinds for _ in range(per_kind)]
    random.Random(seed).shuffle(schedule)
    out.mkdir(parents=True, exist_ok=True)
    tallies = {kind: Tally() for kind in ("identical", *kinds)}
    loads: list[float] = []
    started = time.time()
    with (out / "comparisons.jsonl").open("w") as log:
        for number, kind in enumerate(schedule, 1):
            commit = clone.identical if kind == "identical" else clone.injected[kind]
            load_before = os.getloadavg()[0]
            comparison = continuous(clone, home, commit)
            load_after = os.getloadavg()[0]
            loads += [load_before, load_after]
            tallies[kind].add(comparison)
            record = {
                "number": number,
                "kind": kind,
                "exit": comparison.returncode,
                "worse": list(comparison.worse),
                "loadavg_1min": [load_before, load_after],
            }
            log.write(json.dumps(record) + "\n")
            log.flush()
            (out / f"{number:02d}-{kind}.txt").write_text(comparison.output)
            print(json.dumps(record), flush=True)
            shutil.rmtree(clone.path / "results", ignore_errors=True)
    minutes = (time.time() - started) / 60
    slowdowns = {kind: real_slowdown(clone, kind, plate) for kind in kinds}
    summary = {
        "gate": gate_command(),
        "order_seed": seed,
        "minutes": round(minutes, 1),
        "loadavg_1min": {"min": min(loads), "median": statistics.median(loads), "max": max(loads)},
        "tallies": {kind: vars(tally) for kind, tally in tallies.items()},
        "real_slowdown": slowdowns,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "table.md").write_text(table(summary, kinds))
    return summary


def gate_command() -> str:
    """The gate as a command line (docs/how-to/gate-a-change.md quotes it; scripts/gate.sh runs it)."""
    attributes = " ".join(f"-a {attribute}" for attribute in GATE_ATTRIBUTES)
    return f'asv continuous --factor {GATE_FACTOR} {attributes} -b "{GATE_BENCH}" BASE HEAD'


def table(summary: dict[str, Any], kinds: tuple[str, ...]) -> str:
    """The false-positive and detection table as Markdown."""
    labels = [label for label, _ in SPEED_CASES]
    lines = [
        f"| change | real effect, crops/s ({'; '.join(labels)}) | flagged (exit 1) | benchmarks flagged (times) |",
        "| --- | --- | --- | --- |",
    ]
    for kind in ("identical", *kinds):
        tally = summary["tallies"][kind]
        if kind == "identical":
            change, effect = "identical code (a README line)", "none"
        else:
            change = INJECTIONS[kind].description if kind in INJECTIONS else "every crop takes longer (a busy wait)"
            effect = "; ".join(f"x{summary['real_slowdown'][kind][label]:.2f} slower" for label in labels)
        flagged = ", ".join(f"`{name}` ({count})" for name, count in sorted(tally["worse"].items())) or "none"
        lines.append(f"| {change} | {effect} | {tally['flagged']}/{tally['runs']} | {flagged} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cropbench asv-regression", description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("continuous", "same"), default="continuous")
    parser.add_argument("--pairs", type=int, default=1, help="comparisons of each kind (default: %(default)s)")
    parser.add_argument("--slowdown", type=float, default=1.5)
    parser.add_argument("--factor", type=float, default=GATE_FACTOR, help="asv --factor (default: %(default)s)")
    parser.add_argument("--bench", default=GATE_BENCH, help="asv -b regex (default: the gate's)")
    parser.add_argument("--env-dir", type=Path, default=DEFAULT_ENV_DIR)
    parser.add_argument("--log-dir", type=Path, help="write each comparison's asv output here")
    parser.add_argument(
        "--kinds",
        help=f"comma-separated: identical, slow-getitem, {', '.join(INJECTIONS)} "
        f"(default: identical,slow-getitem; with --campaign: {','.join(CAMPAIGN_KINDS)})",
    )
    parser.add_argument("--campaign", action="store_true", help="the gate's false-positive and detection rates")
    parser.add_argument("--identical", type=int, default=10, help="campaign: identical-code comparisons")
    parser.add_argument("--per-kind", type=int, default=5, help="campaign: comparisons per injected kind")
    parser.add_argument("--seed", type=int, default=0, help="campaign: seed of the random order")
    parser.add_argument("--out", type=Path, default=Path("gate-campaign"), help="campaign: where the table goes")
    args = parser.parse_args(argv)
    default_kinds = ",".join(CAMPAIGN_KINDS) if args.campaign else "identical,slow-getitem"
    kinds = tuple(kind for kind in (args.kinds or default_kinds).split(",") if kind)
    injected = tuple(kind for kind in kinds if kind != "identical")
    with tempfile.TemporaryDirectory(prefix="cropbench-regression-") as scratch:
        root = Path(scratch)
        home = root / "home"
        prepare_machine(home)
        if args.campaign:
            clone = make_clone(root / "clone", args.slowdown, args.env_dir, injected)
            plate = write_plate(clone, root / "speed.zarr")
            summary = campaign(clone, home, plate, args.identical, args.per_kind, injected, args.seed, args.out)
            print(table(summary, injected), end="")
            return 0
        clone = make_clone(root / "clone", args.slowdown, args.env_dir if args.mode == "continuous" else None, injected)
        compare = continuous if args.mode == "continuous" else compare_same_python
        tallies = {kind: Tally() for kind in kinds}
        for pair in range(args.pairs):
            for kind in kinds:
                commit = clone.identical if kind == "identical" else clone.injected[kind]
                comparison = compare(clone, home, commit, args.bench, args.factor)
                tallies[kind].add(comparison)
                print(f"pair {pair + 1} {kind:13s} exit={comparison.returncode} worse={list(comparison.worse)}")
                if args.log_dir is not None:
                    args.log_dir.mkdir(parents=True, exist_ok=True)
                    (args.log_dir / f"pair{pair + 1}-{kind}.txt").write_text(comparison.output)
                shutil.rmtree(clone.path / "results", ignore_errors=True)
        for kind, tally in tallies.items():
            print(f"{kind}: flagged {tally.flagged}/{tally.runs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
