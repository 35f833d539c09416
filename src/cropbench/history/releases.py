"""Build a git repository whose history is a library's releases, from the registry's source distributions.

asv measures a project over its git history. Where the library's own repository cannot be reached
but its package registry can, this makes a stand-in: one commit per release in version order,
holding that release's source distribution as it was published (less what its ``.gitignore``
names), tagged ``v<version>`` (as zarr-python tags upstream), with the release's upload time as
author and committer date, on branch ``main``. ``asv run v3.0.8..v3.1.6`` then walks it as it
would walk upstream. Sdists are fetched with ``pip download --no-deps --no-binary :all:`` (kept in
``--cache`` for reruns); the dates come from the registry's JSON page of the project, one
request, skipped with ``--no-dates`` (commits are then dated now, and their hashes differ).

    .venv/bin/python scripts/release_history.py zarr          # -> .asv/history/zarr, 3.0.8 .. 3.1.6
    .venv/bin/python scripts/release_history.py ome-arrow     # -> .asv/history/ome-arrow, 0.0.2 .. 0.1.0
    .venv/bin/python scripts/release_history.py zarr --first 3.1.0 --last 3.1.6 --dest /tmp/zarr-history

Adding a release: run it again on the existing folder with the new last release (or ``--last
latest``, the newest the index offers). The releases the history lacks are committed on top of
``main`` and tagged; every other branch and tag in it (a maintainer's injected regression, say)
is kept, and the commits already there keep their hashes, so committed results still match:

    .venv/bin/python scripts/release_history.py zarr --last 3.1.7     # adds v3.1.7 to .asv/history/zarr

``--force`` rebuilds a history instead, only one this script built (``MARKER_KEY`` in its git
configuration), never a user's folder or repository; the new one is built beside it and swapped in.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import zipfile
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from cropbench.history import REPO

#: Where built histories and downloaded sdists go (git-ignored, beside asv's environments).
HISTORY_DIR = REPO / ".asv" / "history"
#: The registry's JSON page of a project: release files with their upload times.
JSON_URL = "https://pypi.org/pypi/{name}/json"
#: Release histories the asv configurations of this repository expect (``asv.<name>.conf.json``).
LIBRARIES: dict[str, tuple[str, str]] = {
    "zarr": ("3.0.8", "3.1.6"),
    "ome-arrow": ("0.0.2", "0.1.0"),
}
_AUTHOR = ("release history", "release-history@localhost")
#: The releases the committed results were measured on: per library, version -> upload time and the
#: commit this script builds for it (results name commits by hash). Their dates come from here, not
#: the registry, and a build whose commit differs is an error: asv publish would not draw those results.
RECORDED = REPO / "scripts" / "release_histories.json"
#: Git as every history is built, whoever builds it: no system or user configuration (line-ending
#: conversion, signing, hooks, templates, attributes, another hash function) and no inherited
#: repository, index or identity, so the same sdists and dates give the same commits on any machine.
_HERMETIC = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_AUTHOR_NAME": _AUTHOR[0],
    "GIT_AUTHOR_EMAIL": _AUTHOR[1],
    "GIT_COMMITTER_NAME": _AUTHOR[0],
    "GIT_COMMITTER_EMAIL": _AUTHOR[1],
}
_INHERITED = re.compile(
    r"^GIT_(DIR|WORK_TREE|INDEX_FILE|OBJECT_DIRECTORY|ALTERNATE_OBJECT_DIRECTORIES|CONFIG.*|"
    r"(AUTHOR|COMMITTER)_(NAME|EMAIL|DATE)|NAMESPACE|COMMON_DIR|CEILING_DIRECTORIES)$"
)
#: Settings a history's own configuration could hold that change what a commit holds; pinned on each call.
_PINNED = tuple(
    argument
    for setting in (
        "core.autocrlf=false",
        "core.safecrlf=false",
        "core.fileMode=true",
        "core.symlinks=true",
        f"core.attributesFile={os.devnull}",
        f"core.excludesFile={os.devnull}",
        f"core.hooksPath={os.devnull}",
        "commit.gpgSign=false",
        "tag.gpgSign=false",
        "i18n.commitEncoding=UTF-8",
    )
    for argument in ("-c", setting)
)
#: The git configuration entry (the project's name) that marks a repository as a history this script
#: built: ``--force`` replaces only such a repository, never a user's folder or their own repository.
MARKER_KEY = "cropbench.releaseHistory"
_SDIST_SUFFIXES = (".tar.gz", ".tgz", ".zip")


class HistoryError(RuntimeError):
    """A release, an sdist or the destination is not what a release history needs."""


@dataclass(frozen=True)
class Release:
    """One published release: its version, its sdist on disk, and when it was uploaded (if known)."""

    version: str
    sdist: Path
    date: dt.datetime | None = None

    def __post_init__(self) -> None:
        if self.date is not None and self.date.tzinfo is None:
            raise HistoryError(f"release {self.version}: date {self.date} has no time zone; expected an aware datetime")


def parse_available_versions(pip_index_output: str) -> list[str]:
    """Versions listed by ``pip index versions NAME`` (its ``Available versions:`` line)."""
    match = re.search(r"^Available versions:\s*(.+)$", pip_index_output, re.MULTILINE)
    if match is None:
        raise HistoryError(f"no 'Available versions:' line in pip's output:\n{pip_index_output.strip()}")
    return [version.strip() for version in match.group(1).split(",") if version.strip()]


def select_range(versions: Sequence[str], first: str, last: str, pre: bool = False) -> list[str]:
    """The versions from ``first`` to ``last`` (both included), oldest first; pre-releases only if asked."""
    low, high = parse_version(first, "--first"), parse_version(last, "--last")
    if low > high:
        raise HistoryError(f"first version {first} is newer than last version {last}")
    chosen = []
    for text in versions:
        try:
            version = Version(text)
        except InvalidVersion:
            continue
        if low <= version <= high and (pre or not version.is_prerelease):
            chosen.append(version)
    missing = [bound for bound in (low, high) if bound not in chosen]
    if missing:
        raise HistoryError(f"{', '.join(map(str, missing))} not among the available versions ({', '.join(versions)})")
    return [str(version) for version in sorted(set(chosen))]


def parse_version(text: str, argument: str) -> Version:
    """``text`` as a version, or a HistoryError that names ``argument``."""
    try:
        return Version(text)
    except InvalidVersion:
        raise HistoryError(f"{argument} {text!r} is not a version; expected one such as 3.1.6") from None


def _pip(*args: str) -> str:
    """pip's output in this interpreter; its failure is a HistoryError with pip's last error line."""
    result = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
    if result.returncode != 0:
        lines = [line for line in (result.stderr or result.stdout).splitlines() if line.strip()]
        last = lines[-1].strip() if lines else f"exit code {result.returncode}"
        raise HistoryError(f"pip {' '.join(args)} failed: {last} (is the package index reachable?)")
    return result.stdout


def available_versions(name: str) -> list[str]:
    """Every version of ``name`` the configured package index offers (``pip index versions``)."""
    return parse_available_versions(_pip("index", "versions", name))


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def find_sdist(cache: Path, name: str, version: str) -> Path | None:
    """The sdist of ``name==version`` already in ``cache`` (``ome_arrow-0.1.0.tar.gz`` counts for ome-arrow)."""
    for path in sorted(cache.glob("*")):
        suffix = next((suffix for suffix in _SDIST_SUFFIXES if path.name.endswith(suffix)), None)
        if suffix is None:
            continue
        project, _, found_version = path.name[: -len(suffix)].rpartition("-")
        if _normalise(project) == _normalise(name) and found_version == version:
            return path
    return None


def download_sdist(name: str, version: str, cache: Path) -> Path:
    """``name==version``'s source distribution in ``cache``, fetched with pip unless it is there already."""
    cache.mkdir(parents=True, exist_ok=True)
    found = find_sdist(cache, name, version)
    if found is not None:
        return found
    _pip("download", "--quiet", "--no-deps", "--no-binary", ":all:", "--dest", str(cache), f"{name}=={version}")
    found = find_sdist(cache, name, version)
    if found is None:
        raise HistoryError(f"pip download of {name}=={version} left no sdist in {cache}")
    return found


def parse_upload_dates(project_json: Mapping[str, object]) -> dict[str, dt.datetime]:
    """Version -> upload time of its sdist (of its first file if it has none), from the registry's JSON."""
    dates: dict[str, dt.datetime] = {}
    releases = project_json.get("releases", {})
    if not isinstance(releases, dict):
        raise HistoryError("the registry's JSON has no 'releases' mapping")
    for version, files in releases.items():
        if not files:
            continue
        sdists = [entry for entry in files if entry.get("packagetype") == "sdist"] or files
        stamp = min(str(entry["upload_time_iso_8601"]) for entry in sdists)
        dates[version] = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return dates


def upload_dates(name: str) -> dict[str, dt.datetime]:
    """Version -> upload time for ``name``, one request to the registry's JSON page."""
    url = JSON_URL.format(name=name)
    try:
        with urllib.request.urlopen(url, timeout=60) as response:  # noqa: S310 (fixed https URL)
            document = json.load(response)
    except (OSError, ValueError) as error:
        raise HistoryError(f"cannot read the upload dates from {url}: {error}; pass --no-dates to do without") from None
    if not isinstance(document, dict):
        raise HistoryError(f"{url} holds a JSON {type(document).__name__}, not the registry's project page")
    return parse_upload_dates(document)


def _extract(sdist: Path, destination: Path) -> Path:
    """Unpack ``sdist`` into ``destination``; return its single top-level folder.

    A tarball is unpacked with tarfile's ``data`` filter: a member that would land outside
    ``destination`` (``../``, an absolute path, a link out) stops it, and so does a damaged archive,
    as a HistoryError naming the sdist.
    """
    try:
        if sdist.name.endswith(".zip"):
            with zipfile.ZipFile(sdist) as archive:
                archive.extractall(destination)
        else:
            with tarfile.open(sdist) as archive:
                archive.extractall(destination, filter="data")
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error) as error:
        raise HistoryError(
            f"{sdist}: not a source distribution that can be unpacked safely ({' '.join(str(error).split())}); "
            "remove it from the cache to fetch it again"
        ) from None
    tops = [path for path in destination.iterdir()]
    if len(tops) != 1 or not tops[0].is_dir():
        raise HistoryError(f"{sdist.name}: expected one top-level folder, found {sorted(p.name for p in tops)}")
    return tops[0]


def _git_config(path: Path, key: str) -> str | None:
    """The value of ``key`` in the git configuration of the repository at ``path`` (None if unset)."""
    result = subprocess.run(["git", "-C", str(path), "config", "--get", key], capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else None


def replace_refusal(destination: Path) -> str | None:
    """Why ``--force`` may not replace ``destination`` (None: it may): only a history this script built."""
    if destination.is_symlink():
        return "it is a symbolic link"
    if not destination.is_dir():
        return "it is a file, not a folder"
    if not (destination / ".git").is_dir() or _git_config(destination, MARKER_KEY) is None:
        return f"it is not a release history this script built (no {MARKER_KEY} in its git configuration)"
    others = other_branches(destination)
    if others:
        return f"it holds branches besides main ({', '.join(others)}) that --force would delete"
    return None


def _git(path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """git in the repository at ``path``, as :data:`_HERMETIC` and :data:`_PINNED` say; its output."""
    inherited = {key: value for key, value in os.environ.items() if not _INHERITED.match(key)}
    result = subprocess.run(
        ["git", *_PINNED, "-C", str(path), *args],
        check=True,
        capture_output=True,
        text=True,
        env={**inherited, **_HERMETIC, **(env or {})},
    )
    return result.stdout.strip()


def _clear_worktree(path: Path) -> None:
    for entry in path.iterdir():
        if entry.name == ".git":
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def build_history(name: str, releases: Sequence[Release], destination: Path, force: bool = False) -> list[str]:
    """A new git repository at ``destination``: one tagged commit per release, in the order given.

    Each commit holds the sdist's files less those its own ``.gitignore`` names (a version file
    that setuptools-scm or hatch-vcs writes at build time, for example), as upstream's repository
    holds them: a committed version file is rewritten by the build, the checkout turns dirty and
    the wheel is named for a dev version its metadata does not have. Nothing else is consulted
    (no global excludes), so the same sdists and dates give the same commit hashes on any machine,
    and results measured on one machine's history match another's. Returns the hashes, oldest first.
    """
    if not releases:
        raise HistoryError(f"no releases of {name} to commit")
    check_destination(destination, force)
    destination.parent.mkdir(parents=True, exist_ok=True)
    # Built beside the destination and swapped in when complete: a failure leaves the old one as it was.
    scratch = Path(tempfile.mkdtemp(prefix=f".{destination.name}.", suffix=".partial", dir=destination.parent))
    try:
        built = scratch / destination.name
        built.mkdir()
        _git(built, "init", "-q", "-b", "main", "--object-format=sha1", "--template=")
        _git(built, "config", "user.name", _AUTHOR[0])
        _git(built, "config", "user.email", _AUTHOR[1])
        _git(built, "config", "core.excludesFile", os.devnull)
        _git(built, "config", MARKER_KEY, name)
        commits = []
        for release in releases:
            commits.append(_commit_release(built, name, release))
            _git(built, "tag", f"v{release.version}")
        check_destination(destination, force)
        if os.path.lexists(destination):
            os.rename(destination, scratch / "replaced")
        os.rename(built, destination)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return commits


def check_destination(destination: Path, force: bool) -> None:
    """Raise HistoryError unless a new history may go to ``destination``: free, empty, or (forced) ours."""
    if not os.path.lexists(destination) or (
        destination.is_dir() and not destination.is_symlink() and not any(destination.iterdir())
    ):
        return
    if not force:
        raise HistoryError(
            f"{destination} exists and is not empty; run without --force on a release history to add "
            "releases to it, or pass --force to rebuild it"
        )
    reason = replace_refusal(destination)
    if reason:
        raise HistoryError(
            f"--force refuses to replace {destination}: {reason}; remove it yourself or choose another --dest"
        )


def _commit_release(worktree: Path, name: str, release: Release) -> str:
    """Replace ``worktree``'s files with ``release``'s sdist and commit them on its HEAD; the new hash."""
    _clear_worktree(worktree)
    with tempfile.TemporaryDirectory(prefix="release-history-") as scratch:
        top = _extract(release.sdist, Path(scratch))
        for entry in top.iterdir():
            shutil.move(str(entry), worktree / entry.name)
    # Empty the index first so that git hashes every file: sdists give files fixed mtimes (often 0),
    # and a file of a release with the size of the last release's one, on a reused inode, would
    # otherwise look unchanged to git's stat check and be committed with the last release's content.
    _git(worktree, "read-tree", "--empty")
    _git(worktree, "add", "--all", ".")
    dates = {}
    if release.date is not None:
        stamp = release.date.isoformat()
        dates = {"GIT_AUTHOR_DATE": stamp, "GIT_COMMITTER_DATE": stamp}
    _git(
        worktree,
        "commit",
        "-q",
        "--no-verify",
        "--allow-empty",
        "-m",
        f"{name} {release.version}\n\nThe source distribution {release.sdist.name} as published.",
        env=dates,
    )
    return _git(worktree, "rev-parse", "HEAD")


def other_branches(destination: Path) -> list[str]:
    """Local branches of the repository at ``destination`` other than ``main``."""
    names = _git(destination, "for-each-ref", "--format=%(refname:short)", "refs/heads").split()
    return sorted(name for name in names if name != "main")


def released_versions(destination: Path) -> dict[str, str]:
    """Version -> commit of every ``v<version>`` tag in the history at ``destination``."""
    tags = _git(destination, "for-each-ref", "--format=%(refname:short) %(objectname)", "refs/tags").splitlines()
    versions = {}
    for line in tags:
        tag, _, _ = line.partition(" ")
        try:
            Version(tag.removeprefix("v"))
        except InvalidVersion:
            continue
        if tag.startswith("v"):
            versions[tag[1:]] = _git(destination, "rev-parse", f"{tag}^{{commit}}")
    return versions


def _require_repository(destination: Path) -> None:
    if not (destination / ".git").exists():
        raise HistoryError(
            f"{destination} exists and is not a release history (no git repository); choose another --dest"
        )


def extend_history(name: str, releases: Sequence[Release], destination: Path) -> list[str]:
    """Commit the releases the history at ``destination`` lacks on top of its ``main``; their hashes.

    Every other branch and tag is kept and the commits already there keep their hashes (a history
    built in one go from the same sdists and dates has the same ones). The new commits are made in
    a temporary worktree, so a maintainer's checkout of another branch is left alone; where ``main``
    is checked out, it is fast-forwarded (refused while it has uncommitted changes).
    """
    _require_repository(destination)
    try:
        tip = _git(destination, "rev-parse", "--verify", "-q", "refs/heads/main")
    except subprocess.CalledProcessError:
        raise HistoryError(f"{destination} has no branch main; it is not a release history") from None
    present = released_versions(destination)
    if not present:
        raise HistoryError(f"{destination} has no v<version> tags; it is not a release history")
    newest = max(present, key=Version)
    if present[newest] != tip:
        raise HistoryError(
            f"branch main of {destination} is at {tip[:10]}, not at its newest release v{newest} "
            f"({present[newest][:10]}); keep your own commits on a branch of their own"
        )
    new = [release for release in releases if release.version not in present]
    older = [release.version for release in new if Version(release.version) < Version(newest)]
    if older:
        raise HistoryError(
            f"{', '.join(older)} older than the newest release in {destination} (v{newest}): a history is in "
            "version order; build one that includes them into another --dest"
        )
    if not new:
        return []
    on_main = _git(destination, "symbolic-ref", "-q", "HEAD") == "refs/heads/main"
    if on_main and _git(destination, "status", "--porcelain"):
        raise HistoryError(f"{destination} has uncommitted changes on main; commit or remove them first")
    commits = []
    with tempfile.TemporaryDirectory(prefix="release-history-worktree-") as scratch:
        worktree = Path(scratch) / "main"
        _git(destination, "worktree", "add", "-q", "--detach", str(worktree), tip)
        try:
            for release in new:
                commits.append(_commit_release(worktree, name, release))
        finally:
            _git(destination, "worktree", "remove", "--force", str(worktree))
    if on_main:
        _git(destination, "merge", "-q", "--ff-only", commits[-1])
    else:
        _git(destination, "update-ref", "refs/heads/main", commits[-1], tip)
    for release, commit in zip(new, commits, strict=True):
        _git(destination, "tag", f"v{release.version}", commit)
    return commits


def refresh_build_clones(destination: Path, env_root: Path) -> list[Path]:
    """Fetch the history's tags into asv's build clones of it (``env_root/*/project``); the clones updated.

    asv clones the history once per environment (``git clone --shared``) and later only checks out
    commits in that clone: a release added since is found, but not its tag, so its wheel would get a
    development version number.
    """
    updated = []
    for clone in sorted(env_root.glob("*/project")):
        try:
            origin = _git(clone, "config", "--get", "remote.origin.url")
        except subprocess.CalledProcessError:
            continue
        if Path(origin).resolve() == destination.resolve():
            _git(clone, "fetch", "-q", "--tags", "origin")
            updated.append(clone)
    return updated


def collect_releases(
    name: str,
    versions: Sequence[str],
    cache: Path,
    dates: dict[str, dt.datetime],
    fetch: Callable[[str, str, Path], Path] = download_sdist,
) -> list[Release]:
    """Each version's sdist (fetched into ``cache`` when missing) and its date where one is known."""
    return [
        Release(version=version, sdist=fetch(name, version, cache), date=dates.get(version)) for version in versions
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cropbench release-history", description=__doc__.split("\n\n")[0])
    parser.add_argument("name", help=f"project name on the package index (presets: {', '.join(LIBRARIES)})")
    parser.add_argument("--first", help="oldest release to include (default: the preset's)")
    parser.add_argument("--last", help="newest release to include, or 'latest' (default: the preset's)")
    parser.add_argument("--dest", type=Path, help="repository to create (default: .asv/history/NAME)")
    parser.add_argument("--cache", type=Path, default=HISTORY_DIR / "sdists", help="sdist cache (default: %(default)s)")
    parser.add_argument("--no-dates", action="store_true", help="do not ask the registry for upload times")
    parser.add_argument("--pre", action="store_true", help="include pre-releases in the range")
    parser.add_argument(
        "--force",
        action="store_true",
        help="rebuild the repository at --dest instead of adding releases to it; only a history this script "
        "built, and refused while it holds branches besides main (if its hashes change, delete asv's build "
        "clones, .asv/env/*/project: they share its objects but keep the old tags, so builds get dev versions)",
    )
    parser.add_argument(
        "--env-root",
        type=Path,
        default=REPO / ".asv" / "env",
        help="asv's environments, whose build clones get a new release's tags (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    first, last = LIBRARIES.get(args.name, (None, None))
    first, last = args.first or first, args.last or last
    if first is None or last is None:
        parser.error(f"{args.name} has no preset range; pass --first and --last")
    destination = args.dest or HISTORY_DIR / args.name
    try:
        check_arguments(args.name, first, last, destination, args.cache, args.force)
        return _run(args, first, last, destination)
    except HistoryError as error:
        print(f"release_history: error: {error}", file=sys.stderr)
    except subprocess.CalledProcessError as error:
        detail = " ".join(str(error.stderr or "").split()) or f"exit code {error.returncode}"
        print(f"release_history: error: {' '.join(map(str, error.cmd))} failed: {detail}", file=sys.stderr)
    except OSError as error:
        print(f"release_history: error: {error.filename or destination}: {error.strerror or error}", file=sys.stderr)
    except KeyboardInterrupt:
        print("release_history: interrupted; run the same command again to finish", file=sys.stderr)
        return 130
    return 2


#: A project name as the package index spells it (PEP 508); the default --dest is a folder of that name.
_PROJECT_NAME = re.compile(r"^([A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9._-]*[A-Za-z0-9])$")


def check_arguments(name: str, first: str, last: str, destination: Path, cache: Path, force: bool) -> None:
    """Every argument checked before anything is asked of the package index or written."""
    if not _PROJECT_NAME.match(name):
        raise HistoryError(f"{name!r} is not a project name; expected letters, digits, '.', '-' and '_', such as zarr")
    parse_version(first, "--first")
    if last != "latest":
        parse_version(last, "--last")
    for path, argument in ((destination, "--dest"), (cache, "--cache")):
        if os.path.lexists(path) and not path.is_dir():
            raise HistoryError(f"{argument} {path} is a file, not a folder; expected a folder or a new path")
    if force:
        check_destination(destination, force=True)
    elif destination.exists() and any(destination.iterdir()):
        _require_repository(destination)


def recorded_releases(name: str, path: Path | None = None) -> dict[str, tuple[dt.datetime, str]]:
    """Version -> (upload time, commit) of the releases of ``name`` the committed results were measured on
    (in ``path``, default :data:`RECORDED`)."""
    path = path or RECORDED
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        return {
            version: (dt.datetime.fromisoformat(entry["uploaded"]), str(entry["commit"]))
            for version, entry in document.get(name, {}).items()
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise HistoryError(f"{path}: not the recorded releases this script reads ({error})") from None


def differing_commits(name: str, destination: Path, path: Path | None = None) -> list[str]:
    """The releases of the history at ``destination`` whose commit is not the recorded one, each as
    ``vX: built, recorded``; none when the history does not start at the first recorded release
    (a range of one's own has commits of its own)."""
    recorded = recorded_releases(name, path)
    present = released_versions(destination)
    if not recorded or min(recorded, key=Version) not in present:
        return []
    return [
        f"v{version}: {present[version][:10]}, recorded {commit[:10]}"
        for version, (_, commit) in sorted(recorded.items(), key=lambda item: Version(item[0]))
        if version in present and present[version] != commit
    ]


def _run(args: argparse.Namespace, first: str, last: str, destination: Path) -> int:
    recorded = recorded_releases(args.name)
    # The releases the committed results cover need no request to the index.
    covered = last != "latest" and {first, last} <= set(recorded)
    available = list(recorded) if covered else available_versions(args.name)
    if last == "latest":
        last = newest_version(available, pre=args.pre)
    versions = select_range(available, first, last, pre=args.pre)
    print(f"{args.name}: {len(versions)} releases, {versions[0]} .. {versions[-1]}: {', '.join(versions)}", flush=True)
    adding = destination.exists() and any(destination.iterdir()) and not args.force
    if adding:
        present = released_versions(destination) if (destination / ".git").exists() else {}
        versions = [version for version in versions if version not in present]
        if not versions:
            print(f"{destination}: every release up to {last} is there already; nothing added")
            return _check_recorded(args.name, destination, args.cache)
    dates = {version: uploaded for version, (uploaded, _) in recorded.items()}
    if not args.no_dates and not set(versions) <= set(dates):
        dates = {**upload_dates(args.name), **dates}
    releases = collect_releases(args.name, versions, args.cache, dates)
    if adding:
        commits = extend_history(args.name, releases, destination)
    else:
        commits = build_history(args.name, releases, destination, force=args.force)
    for release, commit in zip(releases, commits, strict=True):
        when = release.date.date().isoformat() if release.date else "date unknown"
        print(f"  v{release.version}  {commit[:10]}  {when}  {release.sdist.name}")
    verb = "added" if adding else "committed"
    print(f"{destination}: branch main, {len(commits)} commits {verb}, tags v{versions[0]} .. v{versions[-1]}")
    if adding:
        for clone in refresh_build_clones(destination, args.env_root):
            print(f"  fetched the new tags into asv's build clone {clone}")
        others = other_branches(destination)
        if others:
            print(f"  kept branches: {', '.join(others)}")
    return _check_recorded(args.name, destination, args.cache)


def _check_recorded(name: str, destination: Path, cache: Path) -> int:
    """1, saying which, when releases of the history at ``destination`` are not the recorded commits; else 0."""
    differing = differing_commits(name, destination)
    if not differing:
        return 0
    print(
        f"release_history: error: {destination} holds {len(differing)} release(s) as other commits than the "
        f"committed results name ({'; '.join(differing)}): asv publish will not draw those results; rebuild it "
        f"with --force (if it stays, remove the sdists from {cache} to fetch them again)",
        file=sys.stderr,
    )
    return 1


def newest_version(versions: Sequence[str], pre: bool = False) -> str:
    """The newest of ``versions`` (pre-releases only if asked): ``--last latest``."""
    parsed = []
    for text in versions:
        try:
            version = Version(text)
        except InvalidVersion:
            continue
        if pre or not version.is_prerelease:
            parsed.append(version)
    if not parsed:
        raise HistoryError(f"no release among the available versions ({', '.join(versions)})")
    return str(max(parsed))


if __name__ == "__main__":
    raise SystemExit(main())
