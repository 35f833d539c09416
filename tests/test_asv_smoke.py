"""scripts/asv_smoke.sh: its summary says what ran, what was skipped and why, what failed, and ends with a verdict."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "asv_smoke.sh"

#: The shape of `asv run --quick --show-stderr` output: one benchmark that ran, one whose parameter sets skipped.
LOG = """· Running 2 total benchmarks (1 commits * 1 environments * 2 benchmarks)
[ 0.00%] ·· Benchmarking existing-py_.venv_bin_python
[ 2.50%] ··· Setting up common:105                                           ok
[25.00%] ··· track1.Fetch.track_relative_cost                                ok
[25.00%] ··· ======== ====
              access
             -------- ----
              random   2.1
             ======== ====

[50.00%] ··· track1.Latency.time_fetch                                       {status}
[50.00%] ··· ======== =====
              random   n/a
              grouped  n/a
             ======== =====

[50.00%] ···· For parameters: 'random'
              asv: skipped: NotImplementedError('raw wall-clock values; they run with CROPBENCH_ASV_FULL=1')

              For parameters: 'grouped'
              asv: skipped: NotImplementedError('raw wall-clock values; they run with CROPBENCH_ASV_FULL=1')
"""


def summary(tmp_path: Path, status: str) -> subprocess.CompletedProcess[str]:
    log = tmp_path / "asv.log"
    log.write_text(LOG.format(status=status), encoding="utf-8")
    return subprocess.run(["bash", str(SCRIPT), "--summarise", str(log)], capture_output=True, text=True)


def test_the_summary_names_what_ran_what_skipped_and_why_and_ends_ok(tmp_path: Path) -> None:
    result = summary(tmp_path, "ok")
    lines = result.stdout.strip().splitlines()
    assert result.returncode == 0, result.stderr
    assert "ran:     1 benchmarks, every parameter set: track1.Fetch.track_relative_cost" in result.stdout
    assert "skipped: 1 benchmarks (2 parameter sets)" in result.stdout
    assert "raw wall-clock values; they run with CROPBENCH_ASV_FULL=1" in result.stdout
    assert result.stdout.count("asv: skipped") == 0, "one line per reason, not asv's blocks"
    assert lines[-1].startswith("asv smoke: OK")


def test_a_failed_benchmark_makes_the_last_line_failed(tmp_path: Path) -> None:
    result = summary(tmp_path, "failed")
    assert result.returncode != 0
    assert "failed:  1 benchmarks: track1.Latency.time_fetch" in result.stdout
    assert result.stdout.strip().splitlines()[-1].startswith("asv smoke: FAILED")


def test_the_run_leaves_out_exactly_the_full_grid_classes() -> None:
    import re
    import sys

    sys.path.insert(0, str(SCRIPT.parents[1]))
    from benchmarks import common, track1, track2, track3

    pattern = re.search(r"^DEFAULT_GRID='(.*)'$", (SCRIPT.parent / "asv_grid.sh").read_text(), re.MULTILINE)
    assert pattern is not None
    names = {
        f"{module.__name__.split('.')[-1]}.{name}.{method}": isinstance(suite, type)
        and getattr(suite, "setup_cache", None) is common.make_full_plates
        for module in (track1, track2, track3)
        for name, suite in vars(module).items()
        if isinstance(suite, type) and not name.startswith("_") and hasattr(suite, "params")
        for method in vars(suite)
        if method.split("_", 1)[0] in ("time", "track", "peakmem")
    }
    full = {name for name, is_full in names.items() if is_full}
    assert full and len(full) < len(names)
    assert {name for name in names if not re.search(pattern.group(1), name)} == full
