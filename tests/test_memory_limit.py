"""Limited runs (measure/memory_limit.py): the cgroup is real where it can be, and always removed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cropbench import metrics as m
from cropbench.errors import ConfigError
from cropbench.measure import memory_limit as ml
from cropbench.measure.environment import storage_of

V1_CGROUP = "4:memory:/jobs/a1\n3:cpu:/\n0::/\n"
V1_MOUNTS = (
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
)
MIB = 2**20


def _parent_or_skip() -> ml.CgroupParent:
    found = ml.cgroup_parent()
    if isinstance(found, str):
        pytest.skip(f"no writable memory cgroup here: {found}")
    return found


def _leftovers(parent: ml.CgroupParent) -> list[str]:
    return sorted(p.name for p in parent.path.glob(f"{ml.CGROUP_PREFIX}{os.getpid()}-*"))


def test_v1_memory_controller_is_found_under_its_mount() -> None:
    found = ml.find_cgroup_parent(V1_CGROUP, V1_MOUNTS)
    assert found == ml.CgroupParent(Path("/sys/fs/cgroup/memory/jobs/a1"), 1)


def test_v2_without_memory_controller_says_so(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu io pids\n")
    mounts = f"41 31 0:38 / {tmp_path} rw - cgroup2 cgroup2 rw\n"
    assert "no memory controller" in str(ml.find_cgroup_parent("0::/\n", mounts))
    (tmp_path / "cgroup.controllers").write_text("cpu io memory pids\n")
    assert ml.find_cgroup_parent("0::/\n", mounts) == ml.CgroupParent(tmp_path, 2)


def test_io_stat_read_bytes_sums_every_device() -> None:
    text = "8:0 rbytes=4096 wbytes=0 rios=1\n259:0 rbytes=8192 wbytes=10 rios=2 dbytes=0\n"
    assert ml.io_stat_read_bytes(text) == 12288


def test_a_small_limit_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match="memory limit must be at least 64 MiB"):
        ml.run_limited(int, (), 1000)


def _my_memory_cgroup() -> str:
    return next(
        line for line in Path("/proc/self/cgroup").read_text().splitlines() if ":memory:" in line or line[:3] == "0::"
    )


def test_the_child_runs_inside_a_limited_cgroup_that_is_then_removed() -> None:
    parent = _parent_or_skip()
    run = ml.run_limited(_my_memory_cgroup, (), 128 * MIB, require_cgroup=True, parent=parent)
    assert ml.CGROUP_PREFIX + str(os.getpid()) in run.value
    assert run.mechanism == parent.mechanism and run.limit_bytes == 128 * MIB and run.note == ""
    assert _leftovers(parent) == []


def _fail() -> None:
    raise ValueError("bad input in the child")


def test_an_error_in_the_child_is_raised_and_the_cgroup_removed() -> None:
    parent = _parent_or_skip()
    with pytest.raises(ValueError, match="bad input in the child"):
        ml.run_limited(_fail, (), 128 * MIB, parent=parent)
    assert _leftovers(parent) == []


def _hog(limit: int) -> int:
    blocks = [bytearray(os.urandom(1)) * (16 * MIB) for _ in range(3 * limit // (16 * MIB))]
    return len(blocks)


def test_running_out_of_memory_is_an_error_naming_the_limit() -> None:
    parent = _parent_or_skip()
    with pytest.raises(ml.MemoryLimitError, match="out of memory inside the 96 MiB limit"):
        ml.run_limited(_hog, (96 * MIB,), 96 * MIB, parent=parent)
    assert _leftovers(parent) == []


def test_a_stale_cgroup_of_a_dead_run_is_removed() -> None:
    parent = _parent_or_skip()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = parent.path / f"{ml.CGROUP_PREFIX}{dead.pid}-deadbeef"
    stale.mkdir()
    try:
        assert stale in ml.remove_stale_cgroups(parent)
        assert not stale.exists()
    finally:
        if stale.exists():
            stale.rmdir()


INTERRUPTED_RUN = """
import signal, sys, time
from cropbench.measure import memory_limit as ml

def child():
    time.sleep(60)

signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
signal.setitimer(signal.ITIMER_REAL, 1.0)
try:
    ml.run_limited(child, (), 128 * 2**20, require_cgroup=True)
except KeyboardInterrupt:
    print("interrupted")
"""


def test_ctrl_c_while_the_child_runs_leaves_no_cgroup_and_no_child() -> None:
    parent = _parent_or_skip()
    before = set(parent.path.glob(f"{ml.CGROUP_PREFIX}*"))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", INTERRUPTED_RUN], capture_output=True, text=True, timeout=50)
    assert done.stdout.strip() == "interrupted", done.stderr
    assert time.monotonic() - started < 45  # the sleeping child was killed, not waited for
    assert set(parent.path.glob(f"{ml.CGROUP_PREFIX}*")) == before


def _read_twice(path: str) -> tuple[int | None, int | None]:
    """Device bytes of a first and a second full read of ``path``, the file evicted before the first."""
    with open(path, "rb") as handle:
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    passes = []
    for _ in range(2):
        start = ml.process_read_bytes()
        with open(path, "rb", buffering=0) as handle:
            while handle.read(4 * MIB):
                pass
        end = ml.process_read_bytes()
        passes.append(None if start is None or end is None else end - start)
    return passes[0], passes[1]


def test_the_limit_bounds_the_page_cache(tmp_path: Path) -> None:
    """A file three times the limit is read again from the device inside the limit, from memory outside it."""
    parent = _parent_or_skip()
    if storage_of(tmp_path).get("medium") in ("tmpfs", "network"):
        pytest.skip(f"{tmp_path} is not on a block device: nothing is read from one")
    size = 3 * 96 * MIB
    path = tmp_path / "big.bin"
    with open(path, "wb") as handle:
        for _ in range(size // (8 * MIB)):
            handle.write(os.urandom(8 * MIB))
        handle.flush()
        os.fsync(handle.fileno())
    limited = ml.run_limited(_read_twice, (str(path),), 96 * MIB, require_cgroup=True, parent=parent).value
    unlimited = ml.run_limited(_read_twice, (str(path),), 96 * MIB, parent="cgroups turned off for the test")
    if limited[0] is None or limited[0] < size / 2:
        pytest.skip(f"/proc/self/io does not count this file system's reads ({limited[0]} bytes for {size})")
    assert limited[1] is not None and limited[1] > size / 2  # the cache could hold a third at most
    assert unlimited.mechanism == ml.FADVISE and "cgroups turned off" in unlimited.note
    assert unlimited.value[1] is not None and unlimited.value[1] < size / 10


def test_without_a_cgroup_the_run_says_fadvise_or_refuses() -> None:
    run = ml.run_limited(os.getpid, (), 128 * MIB, parent="no memory cgroup is mounted")
    assert run.mechanism == ml.FADVISE and run.value != os.getpid()
    assert run.as_metrics()[m.MEMORY_LIMIT_NOTE].startswith("no cgroup (no memory cgroup is mounted)")
    with pytest.raises(ml.MemoryLimitError, match="no memory cgroup is mounted"):
        ml.run_limited(os.getpid, (), 128 * MIB, parent="no memory cgroup is mounted", require_cgroup=True)


def test_a_signal_kill_of_the_child_is_an_error() -> None:
    with pytest.raises(ml.MemoryLimitError, match="exit code -9"):
        ml.run_limited(_kill_self, (), 128 * MIB, parent="none")


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
