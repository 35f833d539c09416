"""``cropbench asv-regression``: asv flags a deliberate crop-path slowdown and leaves identical code alone.

Fast tier: the injections, the clone's commits, the gate's selection, the size of the injected
slowdown (a fake clock) and the whole ``--python=same`` comparison (checkout, each commit's src,
``asv run``, ``asv compare``, the rows read back) on a one-benchmark project whose value each
commit sets, so nothing depends on timing. Slow tier (``bash scripts/test.sh --slow``): the same
comparison over this repository's real benchmark, which must see the real slowdown (about a
minute). The ``asv continuous`` variant needs a virtualenv asv environment (~2 min to build the
first time, reused from .asv/env after that), so it is opt-in as well: ``CROPBENCH_ASV_REGRESSION=1``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cropbench.history import regression

REPO = Path(__file__).resolve().parents[1]

#: One parameter combination of the gating benchmark keeps each asv run to seconds.
BENCH = r"track1\.Fetch\.track_relative_cost\('random', 'direct'"
#: The injected slowdown and the flagging factor. Base and slow commits run in separate asv processes; with
#: two busy loops beside the test, unchanged code measured 1.7-2.3x in relative cost over four runs, so a 1.5x
#: slowdown at factor 1.25 was missed and identical code could be flagged. 3x at 1.6 leaves room both ways.
SLOWDOWN = 3.0
FACTOR = 1.6


@pytest.fixture(scope="module")
def asv_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private HOME holding the regression machine's entry."""
    home = tmp_path_factory.mktemp("regression-home")
    regression.prepare_machine(home)
    return home


@pytest.fixture(scope="module")
def clone_and_home(tmp_path_factory: pytest.TempPathFactory, asv_home: Path) -> Iterator[tuple[regression.Clone, Path]]:
    root = tmp_path_factory.mktemp("regression")
    kinds = ("slow-getitem", *regression.INJECTIONS)
    yield regression.make_clone(root / "clone", SLOWDOWN, regression.DEFAULT_ENV_DIR, kinds), asv_home


def test_injected_commits_compile_and_touch_only_their_file(clone_and_home: tuple[regression.Clone, Path]) -> None:
    clone, _ = clone_and_home
    for kind, injection in regression.INJECTIONS.items():
        changed = subprocess.run(
            ["git", "-C", str(clone.path), "diff", "--name-only", clone.base, clone.injected[kind]],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        assert changed == sorted(injection.files), kind
        for path in injection.files:
            source = subprocess.run(
                ["git", "-C", str(clone.path), "show", f"{clone.injected[kind]}:{path}"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            compile(source, path, "exec")


def test_gate_selects_the_decode_path_benchmarks() -> None:
    selected = [
        "track1.Fetch.track_relative_cost('random', 'direct', 'bounded')",
        "track1.Decoding.track_decode_calls('random', 'direct', 'default')",
        "track1.Stages.track_decode('random', 'direct', 'bounded')",
    ]
    left_out = [
        "track1.Fetch.track_relative_cost('random', 'zarr', 'bounded')",
        "track1.Fetch.peakmem_epoch('random', 'direct', 'bounded')",
        "track2.Loader.track_relative_epoch(0, 64, 'direct', 'none')",
    ]
    assert all(re.search(regression.GATE_BENCH, name) for name in selected)
    assert not any(re.search(regression.GATE_BENCH, name) for name in left_out)
    assert regression.gate_command().startswith(f"asv continuous --factor {regression.GATE_FACTOR} ")


def test_clone_holds_identical_and_slow_commits(clone_and_home: tuple[regression.Clone, Path]) -> None:
    clone, _ = clone_and_home

    def diff(commit: str) -> str:
        return subprocess.run(
            ["git", "-C", str(clone.path), "diff", "--stat", clone.base, commit],
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    assert "README.md" in diff(clone.identical) and "src/" not in diff(clone.identical)
    assert "src/cropbench/data/dataset.py" in diff(clone.slow)


def test_worse_rows_are_read_from_asv_tables() -> None:
    table = (
        "| Change   | Before [a] | After [b] | Ratio | Benchmark (Parameter) |\n"
        "|----------|------------|-----------|-------|-----------------------|\n"
        "| +        | 1.94       | 2.86      | 1.48  | track1.Fetch.track_relative_cost('random', 'direct') |\n"
        "| -        | 2.0        | 1.0       | 0.5   | track1.Fetch.time_fetch('random', 'field') |\n"
        "|          | 1.0        | 1.0       | 1.0   | track2.Loader.time_epoch(0, 64) |\n"
    )
    assert regression._worse(table) == ("track1.Fetch.track_relative_cost('random', 'direct')",)


class _FakeClock:
    """perf_counter for the injected patch: a crop takes ``crop_s``, each clock read ``tick_s``."""

    def __init__(self, tick_s: float) -> None:
        self.now = 0.0
        self.tick_s = tick_s

    def perf_counter(self) -> float:
        self.now += self.tick_s
        return self.now


def test_the_injected_patch_makes_every_crop_take_slowdown_times_as_long() -> None:
    clock = _FakeClock(tick_s=1e-4)
    crop_s = 0.01

    class CropDataset:
        def __getitem__(self, index: int) -> dict[str, int]:
            clock.now += crop_s
            return {"index": index}

    namespace: dict[str, Any] = {"CropDataset": CropDataset}
    exec(compile(regression.SLOWDOWN_PATCH.format(factor=SLOWDOWN), "dataset.py", "exec"), namespace)
    namespace["_regression_time"] = clock
    assert CropDataset()[7] == {"index": 7}, "the crop itself is returned unchanged"
    assert SLOWDOWN * crop_s <= clock.now == pytest.approx(SLOWDOWN * crop_s, rel=0.05), clock.now


#: A one-benchmark asv project whose value is set by each commit's source: named like the gate's benchmark.
MINI_BENCHMARK = """import mini


class Fetch:
    params = (["random", "grouped"], ["direct", "zarr"])
    param_names = ("access", "decode")

    def track_relative_cost(self, access, decode):
        return mini.COST
"""


def _mini_clone(path: Path) -> regression.Clone:
    """A base commit (cost 2), an identical-code commit and a 'slow' commit (cost 2 x SLOWDOWN) off the base."""
    config = {"version": 1, "project": "mini", "repo": ".", "branches": ["main"], "environment_type": "virtualenv"}
    config |= {"benchmark_dir": "benchmarks", "results_dir": "results", "html_dir": "html"}
    (path / "benchmarks").mkdir(parents=True)
    (path / "src" / "mini").mkdir(parents=True)
    (path / "asv.conf.json").write_text(json.dumps(config))
    (path / "benchmarks" / "__init__.py").write_text("")
    (path / "benchmarks" / "track1.py").write_text(MINI_BENCHMARK)
    source = path / "src" / "mini" / "__init__.py"
    source.write_text("COST = 2.0\n")
    subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True)
    base = regression._commit(path, "base")
    (path / "README.md").write_text("An identical-code commit.\n")
    identical = regression._commit(path, "identical code")
    regression._git(path, "checkout", "-q", base)
    source.write_text(f"COST = {2.0 * SLOWDOWN}\n")
    slow = regression._commit(path, "slow")
    regression._git(path, "checkout", "-q", "main")
    return regression.Clone(path=path, base=base, identical=identical, injected={"slow-getitem": slow})


def test_same_python_compare_runs_each_commits_source_and_flags_only_the_change(tmp_path: Path, asv_home: Path) -> None:
    clone = _mini_clone(tmp_path / "mini")
    slow = regression.compare_same_python(clone, asv_home, clone.slow, BENCH, FACTOR)
    assert slow.returncode == 1, slow.output
    assert slow.worse == ("track1.Fetch.track_relative_cost('random', 'direct')",), slow.output
    identical = regression.compare_same_python(clone, asv_home, clone.identical, BENCH, FACTOR)
    assert identical.returncode == 0 and not identical.flagged, identical.output
    assert regression._git(clone.path, "rev-parse", "HEAD") == clone.identical, "main is checked out again"


@pytest.mark.slow
def test_same_python_compare_flags_the_slowdown_only(clone_and_home: tuple[regression.Clone, Path]) -> None:
    clone, home = clone_and_home
    slow = regression.compare_same_python(clone, home, clone.slow, BENCH, FACTOR)
    assert slow.flagged, slow.output
    assert all("track_relative_cost" in name for name in slow.worse)
    identical = regression.compare_same_python(clone, home, clone.identical, BENCH, FACTOR)
    assert not identical.flagged, identical.output


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("CROPBENCH_ASV_REGRESSION") != "1",
    reason="builds or reuses an asv virtualenv (minutes): set CROPBENCH_ASV_REGRESSION=1",
)
def test_asv_continuous_exits_1_on_the_slowdown_and_0_on_identical_code(
    clone_and_home: tuple[regression.Clone, Path],
) -> None:
    clone, home = clone_and_home
    slow = regression.continuous(clone, home, clone.slow, BENCH, FACTOR)
    assert slow.returncode == 1 and slow.flagged, slow.output
    assert "PERFORMANCE DECREASED" in slow.output
    identical = regression.continuous(clone, home, clone.identical, BENCH, FACTOR)
    assert identical.returncode == 0 and not identical.flagged, identical.output
