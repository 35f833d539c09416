"""Scratch folders cropbench makes in the temporary directory, and the sweep that removes those a killed run left.

A scratch folder is named ``cropbench-KIND-PID-RANDOM``: the creating process's id makes a folder whose
run was killed with SIGKILL (no ``finally`` ran) recognisable to the next run, which removes it
(:func:`sweep_stale_scratch`). Only folders of that exact pattern, owned by this user, whose process no
longer runs, are removed: another program's folder, another user's, or a running one's are left alone.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

#: What every scratch folder's name starts with.
PREFIX = "cropbench-"
#: ``cropbench-KIND-PID-RANDOM``: KIND in lower-case words joined by ``-``, RANDOM as :mod:`tempfile` draws it.
_NAME = re.compile(rf"^{PREFIX}(?P<kind>[a-z]+(?:-[a-z]+)*)-(?P<pid>\d+)-(?P<random>[a-z0-9_]{{6,}})$")


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (one of another user's counts: signalling it is refused, not failed)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _checked_kind(kind: str) -> str:
    if not re.fullmatch(r"[a-z]+(?:-[a-z]+)*", kind):
        raise ValueError(f"a scratch folder's kind is lower-case words joined by '-', got {kind!r}")
    return kind


def make_scratch(kind: str, dir: Path | None = None) -> Path:
    """A new private (0700) scratch folder ``cropbench-KIND-PID-RANDOM``; the caller removes it."""
    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{_checked_kind(kind)}-{os.getpid()}-", dir=dir))


@contextlib.contextmanager
def scratch_folder(kind: str, dir: Path | None = None) -> Iterator[Path]:
    """A scratch folder (:func:`make_scratch`) removed on exit, on error, and (with the CLI's signal
    handling) on SIGINT and SIGTERM; one a SIGKILL left is removed by the next sweep."""
    folder = make_scratch(kind, dir)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def stale_scratch(dir: Path | None = None) -> list[Path]:
    """Scratch folders in ``dir`` (the temporary directory) that this user made and whose process is gone."""
    root = Path(dir or tempfile.gettempdir())
    stale = []
    with contextlib.suppress(OSError):
        for entry in root.iterdir():
            match = _NAME.match(entry.name)
            if match is None or process_alive(int(match["pid"])):
                continue
            with contextlib.suppress(OSError):
                info = entry.lstat()
                if entry.is_dir() and not entry.is_symlink() and info.st_uid == os.geteuid():
                    stale.append(entry)
    return sorted(stale)


def sweep_stale_scratch(dir: Path | None = None) -> list[Path]:
    """Remove :func:`stale_scratch`'s folders (never following a link inside them); returns those removed."""
    removed = []
    for folder in stale_scratch(dir):
        shutil.rmtree(folder, ignore_errors=True)
        if not folder.exists():
            removed.append(folder)
    return removed


__all__ = ["PREFIX", "make_scratch", "process_alive", "scratch_folder", "stale_scratch", "sweep_stale_scratch"]
