"""Does ``asv continuous`` catch a slowdown in the crop path, and stay quiet when nothing changed?

In a temporary clone of this repository (with the working tree's benchmarks/ and asv.conf.json
committed on top), this makes three commits: a base, an identical-code commit (a README line),
and a commit that makes every ``CropDataset.__getitem__`` take ``--slowdown`` times as long (a
busy wait appended to src/cropbench/data/dataset.py, no environment variable involved). Then:

- ``continuous``: ``asv continuous base identical`` and ``asv continuous base slow``, in a real
  asv virtualenv environment that is reused from ``--env-dir`` (built there on first use, ~2 min);
- ``same``: ``asv run --python=same --set-commit-hash`` for each commit, importing that commit's
  ``src`` via ``ASV_PYTHONPATH``, then ``asv compare``; seconds, no environment to build.

``--pairs N`` repeats each comparison N times and prints the false-positive rate (identical code
flagged) and the detection rate (slowdown flagged). The test suite calls the same functions.

    flock /tmp/cropbench-cpu.lock .venv/bin/python scripts/asv_regression.py --mode continuous --pairs 5
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: The repository's own asv environments (asv.conf.json "env_dir"): reused, not rebuilt.
DEFAULT_ENV_DIR = Path(os.environ.get("CROPBENCH_ASV_ENV_DIR", REPO / ".asv" / "env"))
MACHINE = "cropbench-regression"
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


@dataclass(frozen=True)
class Clone:
    """A throwaway clone and the hashes of its three commits."""

    path: Path
    base: str
    identical: str
    slow: str


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


def make_clone(destination: Path, slowdown: float = 1.5, env_dir: Path | None = None) -> Clone:
    """Clone HEAD, put the working tree's suite on top, and add the identical and slow commits."""
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
    _git(destination, "checkout", "-q", base)
    dataset = destination / "src" / "cropbench" / "data" / "dataset.py"
    dataset.write_text(dataset.read_text() + SLOWDOWN_PATCH.format(factor=slowdown))
    slow = _commit(destination, f"deliberate {slowdown}x slowdown of CropDataset.__getitem__")
    _git(destination, "checkout", "-q", "-B", "main", slow)
    return Clone(path=destination, base=base, identical=identical, slow=slow)


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


def continuous(clone: Clone, home: Path, other: str, bench: str | None = None, factor: float = 1.1) -> Comparison:
    """``asv continuous base other`` in the (reused) virtualenv environment; all benchmarks by default."""
    result = _asv(
        clone.path,
        home,
        "continuous",
        "--machine",
        MACHINE,
        "--factor",
        str(factor),
        *_selection(bench),
        clone.base,
        other,
    )
    output = result.stdout + result.stderr
    return Comparison(returncode=result.returncode, worse=_worse(output), output=output)


def compare_same_python(
    clone: Clone, home: Path, other: str, bench: str | None = None, factor: float = 1.1
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("continuous", "same"), default="continuous")
    parser.add_argument("--pairs", type=int, default=1, help="comparisons of each kind (default: %(default)s)")
    parser.add_argument("--slowdown", type=float, default=1.5)
    parser.add_argument("--factor", type=float, default=1.1, help="asv --factor (default: %(default)s)")
    parser.add_argument("--bench", help="asv -b regex (default: every benchmark, as `asv continuous` runs)")
    parser.add_argument("--env-dir", type=Path, default=DEFAULT_ENV_DIR)
    parser.add_argument("--log-dir", type=Path, help="write each comparison's asv output here")
    parser.add_argument(
        "--kinds",
        choices=("both", "identical", "slow"),
        default="both",
        help="which comparisons to make in each pair (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="cropbench-regression-") as scratch:
        root = Path(scratch)
        home = root / "home"
        prepare_machine(home)
        clone = make_clone(root / "clone", args.slowdown, args.env_dir if args.mode == "continuous" else None)
        compare = continuous if args.mode == "continuous" else compare_same_python
        false_positives = detections = 0
        for pair in range(args.pairs):
            for kind, commit in (("identical", clone.identical), ("slow", clone.slow)):
                if args.kinds not in ("both", kind):
                    continue
                comparison = compare(clone, home, commit, args.bench, args.factor)
                flagged = comparison.flagged and comparison.returncode == 1
                print(
                    f"pair {pair + 1} {kind:9s} exit={comparison.returncode} worse={list(comparison.worse)}", flush=True
                )
                if args.log_dir is not None:
                    args.log_dir.mkdir(parents=True, exist_ok=True)
                    (args.log_dir / f"pair{pair + 1}-{kind}.txt").write_text(comparison.output)
                if kind == "identical":
                    false_positives += flagged
                else:
                    detections += flagged
                shutil.rmtree(clone.path / "results", ignore_errors=True)
        if args.kinds != "slow":
            print(f"false positives: {false_positives}/{args.pairs} identical-code comparisons")
        if args.kinds != "identical":
            print(f"detections: {detections}/{args.pairs} comparisons with a {args.slowdown}x slowdown")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
