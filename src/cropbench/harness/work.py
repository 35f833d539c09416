"""Folders the comparisons write plates into, and the guards that keep an interrupt from leaving half a
plate behind: removing is never cut short, and a forked child leaves Ctrl-C to its parent."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cropbench.config import DECODE_PATHS


class WorkFolder:
    """Where a comparison writes its converted plates; without ``keep`` it removes only what this run wrote.

    A plate already at ``root/NAME`` (kept by an earlier run, perhaps with the user's files beside its
    pixels) is never written over or removed by a run without ``keep``: that run writes into a fresh
    hidden folder beside it instead. ``root`` itself is removed at the end only if this run created it
    and it is empty.
    """

    def __init__(self, root: str | Path, keep: bool = False) -> None:
        self.root, self.keep = Path(root), keep
        self.existed = self.root.exists()

    def destination(self, name: str) -> Path:
        """Where to write layout ``name``: ``root/name``, unless that is taken and the plate will not be kept."""
        target = self.root / name
        if self.keep or not os.path.lexists(target):
            return target
        return Path(tempfile.mkdtemp(prefix=f".{name}.", dir=self.root)) / name

    def done(self, path: Path) -> None:
        """Remove ``path`` (what :meth:`destination` gave) unless ``keep``, and ``root`` if this run made it."""
        if self.keep:
            return
        scratch = path.parent if path.parent != self.root else None
        shutil.rmtree(scratch or path, ignore_errors=True)
        if not self.existed:
            with contextlib.suppress(OSError):
                self.root.rmdir()


#: Signals that stop a sweep (Ctrl-C, ``kill``), held back while a plate is removed.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def deaf_to_stops(function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)`` in a forked child that leaves Ctrl-C to its parent: the terminal sends it to
    the whole process group, and the parent ends the child itself, with no traceback from the child."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return function(*args)


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the block has run, then take effect as they would have: removing
    a plate is never cut short with part of it left behind."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = {number: signal.signal(number, lambda n, _: received.append(n)) for number in STOP_SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        if received:
            signal.raise_signal(received[0])


@contextlib.contextmanager
def work_folder(work_dir: str | Path, keep: bool) -> Iterator[WorkFolder]:
    """A :class:`WorkFolder`; on leaving (an interrupt too), its root is
    removed if this run made it and nothing is left in it."""
    work = WorkFolder(work_dir, keep)
    try:
        yield work
    finally:
        if not work.existed:
            with contextlib.suppress(OSError):
                work.root.rmdir()


@dataclass(eq=False)
class WorkSite:
    """Where a track that writes its own plates runs (``scale``, ``out-of-memory``): a work folder, not
    one plate. Such a track's cases name their plates in full (spec and layout), so a case's identity
    needs no plate fingerprint, and each row's config names the plate it wrote; ``layout`` is the
    run's layout, or ``""`` where each case names its own."""

    work: WorkFolder
    layout: str = ""
    environment: dict[str, Any] = field(default_factory=dict)
    report: Callable[[str], None] | None = None

    #: What a run on a plate has and a work folder has not: crop overrides, a store, a plate fingerprint.
    overrides = None
    server_requests_per_s = None
    remote = None
    fingerprint = ""

    @property
    def thread_settings(self) -> dict[str, Any]:
        """None pinned: these tracks measure with the threads a user's process starts with."""
        return {}

    @property
    def local(self) -> WorkSite | None:
        """No copy on local disk to measure beside: the plates are local already."""
        return None

    @property
    def location(self) -> str:
        return str(self.work.root)

    @property
    def decodes(self) -> tuple[str, ...]:
        return tuple(DECODE_PATHS)

    def progress(self, message: str) -> None:
        if self.report is not None:
            self.report(message)
