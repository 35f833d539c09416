"""What every nginx cropbench starts has in common, so that serving a plate never serves anything else.

- **A private copy, readable by one unprivileged account.** The served folder is a scratch copy of what
  was asked for: links are copied as links (never followed, so a link in a plate cannot pull a file
  into the copy), and the copy is owned by this user and readable by the serving account's group
  alone (folders 0750, files 0640).
- **Workers without privileges.** Started as root, nginx's workers run as :data:`SERVING_USER`, and
  ``disable_symlinks on`` refuses any link on a served path: a worker reads only what that account
  can read inside the copy.
- **Gone with its parent.** Started as root, nginx runs as the first process of a process namespace
  of its own (``unshare --pid --kill-child``), and the ``unshare`` that holds it dies with the Python
  thread that started it (``PR_SET_PDEATHSIG``): when the measuring process dies, even by SIGKILL,
  the kernel ends nginx's master and workers together.
"""

from __future__ import annotations

import contextlib
import ctypes
import grp
import os
import pwd
import shutil
import signal
import stat
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from cropbench.errors import ConfigError
from cropbench.formats.sources import write_index
from cropbench.scratch import scratch_folder

#: The account nginx's workers run as when it is started as root.
SERVING_USER = "nobody"
#: What every server block adds: a path with a link anywhere in it is refused, never followed.
NO_SYMLINKS = "disable_symlinks on;"
#: ``prctl`` option: the signal the kernel sends a process when the thread that forked it dies.
_PR_SET_PDEATHSIG = 1


def serving_account() -> tuple[str, str] | None:
    """The (user, group) names nginx's workers run as when started as root; None when not root (they
    then run as this user, who owns the copy)."""
    if os.geteuid() != 0:
        return None
    try:
        user = pwd.getpwnam(SERVING_USER)
        group = grp.getgrgid(user.pw_gid).gr_name
    except KeyError as error:
        raise ConfigError(
            f"nginx's workers run as the unprivileged account {SERVING_USER!r}, which this machine lacks "
            f"(its user or primary group): create it (useradd --system {SERVING_USER})"
        ) from error
    return user.pw_name, group


def user_directive() -> str:
    """nginx's ``user`` line: the unprivileged account when started as root, nothing otherwise."""
    account = serving_account()
    return f"user {account[0]} {account[1]};" if account else ""


def _readable_by_serving_group(root: Path) -> None:
    """Folders 0750 and files 0640 with the serving account's group, links left as they are (and unread)."""
    account = serving_account()
    gid = grp.getgrnam(account[1]).gr_gid if account else -1
    for folder, folders, files in os.walk(root):
        for name in (folder, *(os.path.join(folder, entry) for entry in (*folders, *files))):
            info = os.lstat(name)
            if stat.S_ISLNK(info.st_mode):
                continue
            os.chown(name, -1, gid, follow_symlinks=False)
            os.chmod(name, 0o750 if stat.S_ISDIR(info.st_mode) else 0o640)


def served_sources(root: Path | Mapping[str, Path]) -> dict[str, Path]:
    """What a server is asked to serve, by the relative path it is served at: a folder's contents at the
    root, or folders by their paths."""
    if isinstance(root, (str, os.PathLike)):
        return {"": Path(root)}
    return {relative: Path(source) for relative, source in root.items()}


@contextlib.contextmanager
def served_copy(root: Path | Mapping[str, Path], *, index: bool = False) -> Iterator[Path]:
    """A scratch folder holding a private copy of each source folder at its relative path (links copied
    as links), readable by the serving account alone; with ``index``, each copy gets the key index a
    plate served over HTTP needs (HTTP cannot list). The sources are read, never changed."""
    with scratch_folder("served") as copy:
        for relative, source in served_sources(root).items():
            if not source.is_dir():
                raise ConfigError(f"{str(source)!r} is not a folder to serve")
            target = copy / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)
            if index:
                write_index(target)
        _readable_by_serving_group(copy)
        yield copy


def _die_with_parent() -> None:
    """Run in the child before it execs: SIGKILL it when the thread that started it ends."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def start_server(command: Sequence[str]) -> subprocess.Popen[bytes]:
    """Start ``command`` (nginx, in the foreground) so that it and every process it forks end when this
    process dies (see the module docstring); as root, in a process namespace of its own."""
    wrapped = list(command)
    if os.geteuid() == 0 and shutil.which("unshare"):
        wrapped = ["unshare", "--pid", "--fork", "--kill-child", *wrapped]
    return subprocess.Popen(wrapped, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent)


def _children(pid: int) -> list[int]:
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    children.append(int(entry.name))
    return children


def server_processes(process: subprocess.Popen[bytes]) -> tuple[int, tuple[int, ...]]:
    """nginx's master process id and its workers' of a server :func:`start_server` started."""
    master = process.pid
    for _ in range(3):  # unshare, then the command it runs (ip netns exec execs nginx in place)
        with contextlib.suppress(OSError):
            if Path(f"/proc/{master}/exe").resolve().name == "nginx":
                break
        children = _children(master)
        if not children:
            break
        master = children[0]
    return master, tuple(_children(master))


__all__ = [
    "NO_SYMLINKS",
    "SERVING_USER",
    "server_processes",
    "served_copy",
    "served_sources",
    "serving_account",
    "start_server",
    "user_directive",
]
