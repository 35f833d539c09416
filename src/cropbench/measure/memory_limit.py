"""A measurement inside a memory limit that also bounds its page cache: plates larger than memory.

A plate that sits in the page cache measures memory, not the disk. A cgroup's memory limit
counts the page cache its processes fill, so a reader in a cgroup limited to a quarter of the
plate keeps at most that much of it cached and random access really goes to the block device.
:func:`run_limited` runs one function in a forked child inside a temporary cgroup made under this
process's own (cgroup v2 ``memory.max``, or v1 ``memory.limit_in_bytes`` where the machine mounts
the v1 memory controller), and removes the cgroup afterwards, on error and on Ctrl-C too. Where no
cgroup can be written it runs the child without a limit and says so (``mechanism="fadvise"``): the
function's own eviction (``posix_fadvise``) is then all that keeps the plate out of memory.

Pages already cached and charged to another cgroup are not charged again, so the function evicts
the plate's files before it reads (:func:`cropbench.measure.protocol.evict`). Bytes read from the
block device come from ``/proc/self/io`` (``read_bytes``, what the process caused to be fetched from
storage, read-ahead included) and, under cgroup v2, the cgroup's ``io.stat``.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from cropbench import metrics as m
from cropbench.errors import ConfigError, CropbenchError
from cropbench.scratch import process_alive

#: How the limit was applied: a cgroup (v2 or v1), or no limit and eviction only.
CGROUP_V2, CGROUP_V1, FADVISE = "cgroup-v2", "cgroup-v1", "fadvise"
MECHANISMS = (CGROUP_V2, CGROUP_V1, FADVISE)
#: Prefix of the temporary cgroups: ``cropbench-<pid of the process that made it>-<token>``.
CGROUP_PREFIX = "cropbench-"
#: The smallest limit accepted: below it the interpreter and its libraries alone do not fit.
MIN_LIMIT_BYTES = 64 * 2**20
#: Seconds to wait for the processes left in a cgroup to die before it is removed.
DRAIN_SECONDS = 10.0


class MemoryLimitError(CropbenchError):
    """A limited run could not be set up, or its child was killed (out of memory, a signal)."""


@dataclass(frozen=True)
class CgroupParent:
    """Where temporary cgroups are made: this process's cgroup folder in the memory hierarchy."""

    path: Path
    version: int

    @property
    def mechanism(self) -> str:
        return CGROUP_V2 if self.version == 2 else CGROUP_V1


def _mounts(mountinfo: str) -> list[tuple[str, str, str, str]]:
    """(mount root, mount point, filesystem type, super options) of each line of ``/proc/self/mountinfo``."""
    mounts = []
    for line in mountinfo.splitlines():
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) >= 5 and len(tail) >= 3:
            mounts.append((fields[3], fields[4], tail[0], tail[2]))
    return mounts


def _inside(mount_root: str, mount_point: str, cgroup_path: str) -> Path | None:
    """The folder of ``cgroup_path`` under a hierarchy mounted at ``mount_point`` from ``mount_root``."""
    root = mount_root.rstrip("/")
    if root and not (cgroup_path == root or cgroup_path.startswith(root + "/")):
        return None
    return Path(mount_point) / cgroup_path[len(root) :].lstrip("/")


def find_cgroup_parent(proc_cgroup: str, mountinfo: str) -> CgroupParent | str:
    """This process's memory cgroup folder, or why there is none (text of ``/proc/self/cgroup`` and
    ``/proc/self/mountinfo``). The v1 memory controller wins where both are mounted: it is the one
    that limits memory on such a machine."""
    mounts = _mounts(mountinfo)
    v2_path = None
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if "memory" in controllers.split(","):
            for root, point, kind, options in mounts:
                if kind == "cgroup" and "memory" in options.split(","):
                    folder = _inside(root, point, path)
                    if folder is not None:
                        return CgroupParent(folder, 1)
        if controllers == "":
            v2_path = path
    if v2_path is not None:
        for root, point, kind, _ in mounts:
            if kind == "cgroup2":
                folder = _inside(root, point, v2_path)
                if folder is None:
                    continue
                available = _read(folder / "cgroup.controllers")
                if available is not None and "memory" in available.split():
                    return CgroupParent(folder, 2)
                return f"the cgroup v2 hierarchy at {point} has no memory controller"
    return "no memory cgroup is mounted"


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def cgroup_parent() -> CgroupParent | str:
    """Where this process can make a limited cgroup, or why it cannot (a reason for the row)."""
    proc_cgroup, mountinfo = _read(Path("/proc/self/cgroup")), _read(Path("/proc/self/mountinfo"))
    if proc_cgroup is None or mountinfo is None:
        return "/proc/self/cgroup is unreadable (not Linux?)"
    found = find_cgroup_parent(proc_cgroup, mountinfo)
    if isinstance(found, str):
        return found
    if not os.access(found.path, os.W_OK):
        return f"{found.path} is not writable (cgroups need root or a delegated cgroup)"
    return found


def io_stat_read_bytes(text: str) -> int:
    """Bytes read over every device of a cgroup v2 ``io.stat`` (its ``rbytes=`` fields)."""
    return sum(int(item[7:]) for line in text.splitlines() for item in line.split() if item.startswith("rbytes="))


def process_read_bytes(pid: int | str = "self") -> int | None:
    """Bytes a process caused to be read from storage (``read_bytes`` of ``/proc/PID/io``); None if unknown."""
    text = _read(Path(f"/proc/{pid}/io"))
    for line in (text or "").splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    return None


class Cgroup:
    """A temporary cgroup with a memory limit; :meth:`remove` kills what is left inside and deletes it."""

    def __init__(self, parent: CgroupParent, limit_bytes: int) -> None:
        self.parent, self.limit_bytes = parent, limit_bytes
        remove_stale_cgroups(parent)
        self.path = parent.path / f"{CGROUP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            if parent.version == 2:
                self._enable_memory_controller()
            self.path.mkdir()
        except OSError as error:
            raise MemoryLimitError(f"cannot make a cgroup under {parent.path}: {error.strerror or error}") from error
        try:
            if parent.version == 2:
                (self.path / "memory.max").write_text(str(limit_bytes))
                with contextlib.suppress(OSError):
                    (self.path / "memory.swap.max").write_text("0")
            else:
                (self.path / "memory.limit_in_bytes").write_text(str(limit_bytes))
                with contextlib.suppress(OSError):  # absent without swap accounting
                    (self.path / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))
        except OSError as error:
            self.remove()
            raise MemoryLimitError(f"cannot set the memory limit of {self.path}: {error.strerror or error}") from error

    def _enable_memory_controller(self) -> None:
        control = self.parent.path / "cgroup.subtree_control"
        if "memory" not in (_read(control) or "").split():
            control.write_text("+memory")

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def pids(self) -> list[int]:
        return [int(pid) for pid in (_read(self.path / "cgroup.procs") or "").split()]

    def peak_bytes(self) -> int | None:
        """The most memory (page cache included) the cgroup held, where the kernel records it."""
        name = "memory.peak" if self.parent.version == 2 else "memory.max_usage_in_bytes"
        text = _read(self.path / name)
        return int(text) if text and text.strip().isdigit() else None

    def oom_kills(self) -> int:
        """Processes of the cgroup the kernel killed for want of memory."""
        name = "memory.events" if self.parent.version == 2 else "memory.oom_control"
        for line in (_read(self.path / name) or "").splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
        return 0

    def read_bytes(self) -> int | None:
        """Bytes the cgroup read from block devices (cgroup v2 ``io.stat``); None under v1."""
        if self.parent.version != 2:
            return None
        text = _read(self.path / "io.stat")
        return None if text is None else io_stat_read_bytes(text)

    def remove(self) -> None:
        """Kill any process left inside, wait for it to leave, and delete the cgroup."""
        deadline = time.monotonic() + DRAIN_SECONDS
        while self.path.exists():
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            try:
                self.path.rmdir()
                return
            except OSError as error:
                if time.monotonic() > deadline:
                    raise MemoryLimitError(
                        f"cannot remove the cgroup {self.path}: {error.strerror or error}; remove it with rmdir"
                    ) from error
                time.sleep(0.05)


def remove_stale_cgroups(parent: CgroupParent) -> list[Path]:
    """Remove cropbench's cgroups whose maker is gone (a run killed with SIGKILL) and that are empty."""
    removed = []
    with contextlib.suppress(OSError):
        for folder in parent.path.glob(f"{CGROUP_PREFIX}*-*"):
            maker = folder.name[len(CGROUP_PREFIX) :].split("-", 1)[0]
            if not maker.isdigit() or process_alive(int(maker)) or (_read(folder / "cgroup.procs") or "").strip():
                continue
            with contextlib.suppress(OSError):
                folder.rmdir()
                removed.append(folder)
    return removed


@contextlib.contextmanager
def temporary_cgroup(limit_bytes: int, parent: CgroupParent | None = None) -> Iterator[Cgroup]:
    """A cgroup limited to ``limit_bytes``, removed on leaving (error and Ctrl-C included)."""
    found = parent or cgroup_parent()
    if isinstance(found, str):
        raise MemoryLimitError(f"cannot limit memory with a cgroup: {found}")
    group = Cgroup(found, limit_bytes)
    try:
        yield group
    finally:
        group.remove()


@dataclass(frozen=True)
class LimitedRun:
    """What a limited child returned, and how the limit was applied."""

    value: Any
    limit_bytes: int
    mechanism: str
    #: Why no cgroup was used (fadvise), empty otherwise.
    note: str
    peak_bytes: int | None
    #: Bytes the child read from the block device over its whole run (``/proc/<pid>/io``).
    device_read_bytes: int | None
    device_read_source: str
    #: Bytes the cgroup read from block devices over the child's run (cgroup v2 ``io.stat``; None otherwise).
    cgroup_read_bytes: int | None = None

    def as_metrics(self) -> dict[str, Any]:
        return {
            m.MEMORY_LIMIT_BYTES: self.limit_bytes,
            m.MEMORY_LIMIT_MECHANISM: self.mechanism,
            m.MEMORY_LIMIT_NOTE: self.note,
            m.CGROUP_PEAK_BYTES: self.peak_bytes,
            m.DEVICE_READ_BYTES: self.device_read_bytes,
            m.DEVICE_READ_SOURCE: self.device_read_source,
            m.CGROUP_READ_BYTES: self.cgroup_read_bytes,
        }


def _child(connection: Connection, procs: str | None, function: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """The forked child: join the cgroup first, then run ``function`` and send back what it gives."""
    try:
        if procs is not None:
            Path(procs).write_text(str(os.getpid()))
        start = process_read_bytes()
        value = function(*args)
        end = process_read_bytes()
        read = None if start is None or end is None else end - start
        connection.send(("ok", value, read))
    except BaseException as error:  # noqa: BLE001 - every failure goes back to the parent, named
        with contextlib.suppress(Exception):
            connection.send(("error", error, None))
    finally:
        connection.close()


def run_limited(
    function: Callable[..., Any],
    args: tuple[Any, ...],
    limit_bytes: int,
    *,
    require_cgroup: bool = False,
    parent: CgroupParent | str | None = None,
) -> LimitedRun:
    """``function(*args)`` in a forked child inside a cgroup limited to ``limit_bytes``.

    Without a writable cgroup the child runs unlimited and the result says ``fadvise`` and why,
    unless ``require_cgroup`` (then it is an error). The cgroup is gone when this returns or raises.
    """
    if not isinstance(limit_bytes, int) or limit_bytes < MIN_LIMIT_BYTES:
        raise ConfigError(
            f"the memory limit must be at least {MIN_LIMIT_BYTES // 2**20} MiB (the interpreter alone needs "
            f"that much), got {limit_bytes!r} bytes"
        )
    found = cgroup_parent() if parent is None else parent
    group: Cgroup | None = None
    if not isinstance(found, str):
        try:
            group = Cgroup(found, limit_bytes)
        except MemoryLimitError as error:
            found = str(error)
    if group is None and require_cgroup:
        raise MemoryLimitError(f"cannot limit memory with a cgroup: {found}")
    try:
        value, device_bytes = _run_child(function, args, group)
        peak = None if group is None else group.peak_bytes()
        cgroup_read = None if group is None else group.read_bytes()
    finally:
        if group is not None:
            group.remove()
    return LimitedRun(
        value=value,
        limit_bytes=limit_bytes,
        mechanism=FADVISE if group is None else group.parent.mechanism,
        note=f"no cgroup ({found}): eviction only, the page cache was not bounded" if group is None else "",
        peak_bytes=peak,
        device_read_bytes=device_bytes,
        device_read_source="/proc/self/io",
        cgroup_read_bytes=cgroup_read,
    )


def run_in_child(function: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, int | None]:
    """``function(*args)`` in a fresh forked child, no limit: its value and the device bytes it read.

    What a measurement allocates (and the allocator keeps) then leaves with the child, so a memory
    figure of one measurement is not raised by the ones before it.
    """
    return _run_child(function, args, None)


def _run_child(function: Callable[..., Any], args: tuple[Any, ...], group: Cgroup | None) -> tuple[Any, int | None]:
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    procs = None if group is None else str(group.path / "cgroup.procs")
    # Not a daemon: the function may start processes of its own (DataLoader workers); the parent
    # kills the child on the way out whatever happens.
    child = context.Process(target=_child, args=(sender, procs, function, args))
    child.start()
    sender.close()
    try:
        try:
            status, value, device_bytes = receiver.recv()
        except EOFError:
            child.join()
            oom = group is not None and group.oom_kills() > 0
            cause = (
                f"it ran out of memory inside the {group.limit_bytes / 2**20:.0f} MiB limit (raise the limit)"
                if oom and group is not None
                else f"exit code {child.exitcode}"
            )
            raise MemoryLimitError(f"the limited child process died: {cause}") from None
        child.join()
    finally:
        receiver.close()
        if child.is_alive():
            child.kill()
            child.join()
    if status == "error":
        raise value
    return value, device_bytes


__all__ = [
    "CGROUP_V1",
    "CGROUP_V2",
    "FADVISE",
    "MECHANISMS",
    "Cgroup",
    "CgroupParent",
    "LimitedRun",
    "MemoryLimitError",
    "cgroup_parent",
    "find_cgroup_parent",
    "io_stat_read_bytes",
    "process_read_bytes",
    "remove_stale_cgroups",
    "run_in_child",
    "run_limited",
    "temporary_cgroup",
]
