"""``cropbench release-history``: a git history of releases from sdists, built here from fake sdists (no network)."""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from cropbench.history import releases as history

REPO = Path(__file__).resolve().parents[1]

UTC = dt.UTC
#: Three releases of a made-up library: a file changes, one is removed, one is added, one is git-ignored.
FAKE_RELEASES = {
    "1.0.0": {"pkg/__init__.py": "VERSION = '1.0.0'\n", "pkg/old.py": "OLD = True\n", "PKG-INFO": "Version: 1.0.0\n"},
    "1.1.0": {
        "pkg/__init__.py": "VERSION = '1.1.0'\n",
        "PKG-INFO": "Version: 1.1.0\n",
        ".gitignore": "pkg/_version.py\n",
        "pkg/_version.py": "version = '1.1.0'\n",
    },
    "1.10.0": {
        "pkg/__init__.py": "VERSION = '1.10.0'\n",
        "pkg/new.py": "NEW = True\n",
        "PKG-INFO": "Version: 1.10.0\n",
    },
}
DATES = {"1.0.0": dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC), "1.10.0": dt.datetime(2025, 6, 1, tzinfo=UTC)}


def _write_sdist(
    directory: Path, name: str, version: str, files: dict[str, str], extra: tarfile.TarInfo | None = None
) -> Path:
    """An sdist of ``files``; ``extra``, a member of any name or kind (a file holds ``escaped``), added last."""
    path = directory / f"{name.replace('-', '_')}-{version}.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for relative, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{name.replace('-', '_')}-{version}/{relative}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        if extra is not None:
            archive.addfile(extra, io.BytesIO(b"escaped\n") if extra.isfile() else None)
    return path


def _git(path: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture()
def fake_cache(tmp_path: Path) -> Path:
    cache = tmp_path / "sdists"
    cache.mkdir()
    for version, files in FAKE_RELEASES.items():
        _write_sdist(cache, "fake-lib", version, files)
    return cache


@pytest.fixture()
def offline_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry's versions and upload dates of the fake library, without the network."""
    monkeypatch.setattr(history, "available_versions", lambda name: list(FAKE_RELEASES))
    monkeypatch.setattr(history, "upload_dates", lambda name: DATES)


def _offline_fetch(name: str, version: str, cache: Path) -> Path:
    found = history.find_sdist(cache, name, version)
    assert found is not None, f"the test's cache lacks {name} {version}"
    return found


def test_parse_pip_index_output_and_select_a_range_in_version_order() -> None:
    output = "fake-lib (1.10.0)\nAvailable versions: 1.10.0, 1.2.0rc1, 1.1.0, 1.0.0, 0.9\n  INSTALLED: 1.0.0\n"
    versions = history.parse_available_versions(output)
    assert versions == ["1.10.0", "1.2.0rc1", "1.1.0", "1.0.0", "0.9"]
    assert history.select_range(versions, "1.0.0", "1.10.0") == ["1.0.0", "1.1.0", "1.10.0"]
    assert history.select_range(versions, "1.0.0", "1.10.0", pre=True) == ["1.0.0", "1.1.0", "1.2.0rc1", "1.10.0"]


@pytest.mark.parametrize(("first", "last", "message"), [("1.1.0", "1.0.0", "newer than"), ("1.0.0", "2.0", "2.0 not")])
def test_select_range_rejects_a_reversed_or_unknown_bound(first: str, last: str, message: str) -> None:
    with pytest.raises(history.HistoryError, match=message):
        history.select_range(["1.0.0", "1.1.0"], first, last)


def test_parse_available_versions_says_what_pip_printed_when_the_line_is_missing() -> None:
    with pytest.raises(history.HistoryError, match="no 'Available versions:'"):
        history.parse_available_versions("ERROR: No matching distribution found for nothing-here\n")


def test_upload_dates_prefer_the_sdist_and_skip_releases_without_files() -> None:
    project_json = {
        "releases": {
            "1.0.0": [
                {"packagetype": "bdist_wheel", "upload_time_iso_8601": "2025-01-01T00:00:00.000000Z"},
                {"packagetype": "sdist", "upload_time_iso_8601": "2025-01-02T03:04:05.000000Z"},
            ],
            "1.1.0": [{"packagetype": "bdist_wheel", "upload_time_iso_8601": "2025-02-01T00:00:00Z"}],
            "1.2.0": [],
        }
    }
    dates = history.parse_upload_dates(project_json)
    assert dates == {
        "1.0.0": dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC),
        "1.1.0": dt.datetime(2025, 2, 1, tzinfo=UTC),
    }


def test_find_sdist_matches_normalised_names_and_exact_versions(fake_cache: Path) -> None:
    assert history.find_sdist(fake_cache, "Fake.Lib", "1.1.0") == fake_cache / "fake_lib-1.1.0.tar.gz"
    assert history.find_sdist(fake_cache, "fake-lib", "1.1") is None
    assert history.find_sdist(fake_cache, "other", "1.1.0") is None


def test_history_has_one_tagged_commit_per_release_in_order_with_release_dates(
    fake_cache: Path,
    tmp_path: Path,
) -> None:
    versions = history.select_range(list(FAKE_RELEASES), "1.0.0", "1.10.0")
    releases = history.collect_releases("fake-lib", versions, fake_cache, DATES, fetch=_offline_fetch)
    destination = tmp_path / "history"
    commits = history.build_history("fake-lib", releases, destination)

    assert _git(destination, "rev-list", "--reverse", "main").split() == commits
    assert [_git(destination, "rev-parse", f"v{version}^{{commit}}") for version in versions] == commits
    assert _git(destination, "log", "-1", "--format=%aI %cI", "v1.0.0") == (
        "2025-01-02T03:04:05+00:00 2025-01-02T03:04:05+00:00"
    )
    assert _git(destination, "log", "-1", "--format=%aI", "v1.10.0") == "2025-06-01T00:00:00+00:00"
    # Each commit holds its sdist: removed files go, files the sdist's .gitignore names stay out.
    assert _git(destination, "ls-tree", "-r", "--name-only", "v1.0.0").split() == [
        "PKG-INFO",
        "pkg/__init__.py",
        "pkg/old.py",
    ]
    assert _git(destination, "ls-tree", "-r", "--name-only", "v1.1.0").split() == [
        ".gitignore",
        "PKG-INFO",
        "pkg/__init__.py",
    ]
    assert _git(destination, "ls-tree", "-r", "--name-only", "v1.10.0").split() == [
        "PKG-INFO",
        "pkg/__init__.py",
        "pkg/new.py",
    ]
    assert _git(destination, "show", "v1.10.0:pkg/__init__.py") == "VERSION = '1.10.0'"
    assert _git(destination, "status", "--porcelain") == ""
    # A git range walks the releases after the first, as `asv run v1.0.0..v1.10.0` does.
    assert _git(destination, "rev-list", "--first-parent", "v1.0.0..v1.10.0").split() == commits[:0:-1]


def test_an_existing_history_is_replaced_only_when_forced(fake_cache: Path, tmp_path: Path) -> None:
    releases = history.collect_releases("fake-lib", ["1.0.0"], fake_cache, {}, fetch=_offline_fetch)
    destination = tmp_path / "history"
    history.build_history("fake-lib", releases, destination)
    with pytest.raises(history.HistoryError, match="--force"):
        history.build_history("fake-lib", releases, destination)
    (commit,) = history.build_history("fake-lib", releases, destination, force=True)
    assert _git(destination, "rev-list", "main") == commit


def test_release_dates_must_carry_a_time_zone(fake_cache: Path) -> None:
    with pytest.raises(history.HistoryError, match="time zone"):
        history.Release(version="1.0.0", sdist=fake_cache / "fake_lib-1.0.0.tar.gz", date=dt.datetime(2025, 1, 1))


def test_main_builds_from_the_cache_without_the_network(
    fake_cache: Path,
    tmp_path: Path,
    offline_registry: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    destination = tmp_path / "history"
    assert (
        history.main(
            ["fake-lib", "--first", "1.0.0", "--last", "1.1.0", "--cache", str(fake_cache), "--dest", str(destination)]
        )
        == 0
    )
    assert _git(destination, "tag", "--list").split() == ["v1.0.0", "v1.1.0"]
    assert "2 commits" in capsys.readouterr().out


def _asv_config(name: str) -> dict[str, Any]:
    """An asv configuration of this repository (whole-line ``//`` comments dropped, as asv allows)."""
    lines = (REPO / name).read_text().splitlines()
    return json.loads("\n".join(line for line in lines if not line.lstrip().startswith("//")))


def test_the_library_configurations_share_one_environment_and_point_at_their_histories() -> None:
    zarr_config, arrow_config = _asv_config("asv.zarr.conf.json"), _asv_config("asv.ome-arrow.conf.json")
    # asv names an environment's folder by python and matrix: equal matrices mean one environment, built once.
    assert zarr_config["matrix"] == arrow_config["matrix"]
    assert zarr_config["pythons"] == arrow_config["pythons"] and zarr_config["env_dir"] == arrow_config["env_dir"]
    for config, library in ((zarr_config, "zarr"), (arrow_config, "ome-arrow")):
        assert config["project"] == library and config["repo"] == f".asv/history/{library}"
        assert library in history.LIBRARIES
        # Neither library sits in the matrix: each commit's wheel is what gets measured.
        assert "zarr" not in config["matrix"]["req"] and "ome-arrow" not in config["matrix"]["req"]
        # Results stay out of results/, which cropbench's own configuration reads recursively.
        assert not config["results_dir"].startswith("results/")


def test_the_same_sdists_and_dates_give_the_same_commit_hashes(fake_cache: Path, tmp_path: Path) -> None:
    """Committed asv results name commits by hash: a history rebuilt elsewhere must match them."""
    # Every release dated: an undated one is committed "now", and two builds a second apart would differ.
    dated = {**DATES, "1.1.0": dt.datetime(2025, 3, 1, tzinfo=UTC)}
    releases = history.collect_releases("fake-lib", list(FAKE_RELEASES), fake_cache, dated, fetch=_offline_fetch)
    first = history.build_history("fake-lib", releases, tmp_path / "one")
    assert history.build_history("fake-lib", releases, tmp_path / "two") == first


def _releases(fake_cache: Path, versions: list[str]) -> list[Any]:
    dated = {**DATES, "1.1.0": dt.datetime(2025, 3, 1, tzinfo=UTC)}
    return history.collect_releases("fake-lib", versions, fake_cache, dated, fetch=_offline_fetch)


def _maintainer_branch(destination: Path, base: str, name: str = "shard-index-per-chunk") -> str:
    """A maintainer's branch off a release with one commit of their own, left checked out."""
    _git(destination, "checkout", "-q", "-b", name, base)
    (destination / "pkg" / "__init__.py").write_text("VERSION = 'mine'\n")
    _git(destination, "commit", "-q", "-am", "an injected regression")
    return _git(destination, "rev-parse", "HEAD")


@pytest.mark.parametrize("checked_out", ["main", "a maintainer's branch"])
def test_adding_a_release_keeps_branches_and_hashes(fake_cache: Path, tmp_path: Path, checked_out: str) -> None:
    everything = history.build_history("fake-lib", _releases(fake_cache, list(FAKE_RELEASES)), tmp_path / "one-go")
    destination = tmp_path / "history"
    first_two = history.build_history("fake-lib", _releases(fake_cache, ["1.0.0", "1.1.0"]), destination)
    branch = _maintainer_branch(destination, "v1.1.0")
    if checked_out == "main":
        _git(destination, "checkout", "-q", "main")
    # Releases already there are passed again, as main() passes the whole range: only the new one is committed.
    added = history.extend_history("fake-lib", _releases(fake_cache, list(FAKE_RELEASES)), destination)

    assert first_two + added == everything, "the same sdists and dates give the same hashes, added or not"
    assert _git(destination, "rev-list", "--reverse", "main").split() == everything
    assert _git(destination, "rev-parse", "v1.10.0^{commit}") == everything[-1]
    assert _git(destination, "rev-parse", "shard-index-per-chunk") == branch, "the maintainer's branch is kept"
    assert history.other_branches(destination) == ["shard-index-per-chunk"]
    # Untracked files are not touched: 1.1.0's git-ignored version file stays where the build left it.
    assert _git(destination, "status", "--porcelain", "--untracked-files=no") == ""
    assert _git(destination, "worktree", "list").count("\n") == 0, "the temporary worktree is gone"
    if checked_out == "main":
        assert (destination / "pkg" / "new.py").exists(), "main's checkout moved to the new release"
    else:
        assert _git(destination, "symbolic-ref", "--short", "HEAD") == "shard-index-per-chunk"
        assert (destination / "pkg" / "__init__.py").read_text() == "VERSION = 'mine'\n", "their checkout is untouched"
    assert history.extend_history("fake-lib", _releases(fake_cache, list(FAKE_RELEASES)), destination) == []


def test_adding_refuses_an_older_release_a_moved_main_and_a_folder_that_is_no_history(
    fake_cache: Path, tmp_path: Path
) -> None:
    destination = tmp_path / "history"
    history.build_history("fake-lib", _releases(fake_cache, ["1.1.0"]), destination)
    with pytest.raises(history.HistoryError, match="1.0.0 older than the newest release"):
        history.extend_history("fake-lib", _releases(fake_cache, ["1.0.0", "1.1.0"]), destination)
    _git(destination, "commit", "-q", "--allow-empty", "-m", "a commit on main")
    with pytest.raises(history.HistoryError, match="not at its newest release v1.1.0"):
        history.extend_history("fake-lib", _releases(fake_cache, ["1.10.0"]), destination)
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "notes.txt").write_text("mine\n")
    with pytest.raises(history.HistoryError, match="not a release history"):
        history.extend_history("fake-lib", _releases(fake_cache, ["1.10.0"]), plain)
    assert (plain / "notes.txt").read_text() == "mine\n"


def test_force_refuses_to_delete_a_maintainers_branches(fake_cache: Path, tmp_path: Path) -> None:
    destination = tmp_path / "history"
    history.build_history("fake-lib", _releases(fake_cache, ["1.0.0"]), destination)
    branch = _maintainer_branch(destination, "v1.0.0")
    with pytest.raises(history.HistoryError, match="shard-index-per-chunk"):
        history.build_history("fake-lib", _releases(fake_cache, ["1.0.0"]), destination, force=True)
    assert _git(destination, "rev-parse", "shard-index-per-chunk") == branch


def test_main_adds_the_latest_release_to_an_existing_history_and_fetches_its_tag_into_asvs_clones(
    fake_cache: Path,
    tmp_path: Path,
    offline_registry: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    destination, env_root = tmp_path / "history", tmp_path / "env"
    common = ["fake-lib", "--first", "1.0.0", "--cache", str(fake_cache), "--dest", str(destination)]
    common += ["--env-root", str(env_root)]
    assert history.main([*common, "--last", "1.1.0"]) == 0
    build_clone = env_root / "abc123" / "project"
    subprocess.run(["git", "clone", "-q", "--shared", str(destination), str(build_clone)], check=True)
    _maintainer_branch(destination, "v1.1.0")
    capsys.readouterr()

    assert history.main([*common, "--last", "latest"]) == 0
    out = capsys.readouterr().out
    assert "1 commits added" in out and "kept branches: shard-index-per-chunk" in out
    assert _git(destination, "tag", "--list").split() == ["v1.0.0", "v1.1.0", "v1.10.0"]
    assert "v1.10.0" in _git(build_clone, "tag", "--list").split(), "asv's build clone knows the new tag"
    assert history.main([*common, "--last", "latest"]) == 0
    assert "nothing added" in capsys.readouterr().out


def test_main_says_what_is_wrong_in_one_line(
    fake_cache: Path,
    tmp_path: Path,
    offline_registry: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "notes.txt").write_text("mine\n")
    arguments = ["fake-lib", "--first", "1.0.0", "--last", "1.1.0", "--cache", str(fake_cache), "--dest", str(plain)]
    assert history.main(arguments) == 2
    error = capsys.readouterr().err
    assert error.startswith("release_history: error: ") and error.count("\n") == 1 and str(plain) in error
    assert (plain / "notes.txt").read_text() == "mine\n"


def test_newest_version_skips_pre_releases_unless_asked() -> None:
    assert history.newest_version(["1.0.0", "1.10.0", "2.0.0rc1", "junk"]) == "1.10.0"
    assert history.newest_version(["1.0.0", "2.0.0rc1"], pre=True) == "2.0.0rc1"


def test_a_file_of_the_same_size_and_mtime_is_committed_with_its_new_content(
    fake_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sdist files share an mtime; git's stat check must not take 1.1.0's __init__.py for 1.0.0's."""
    # The coarsest stat check a user's git configuration may ask for: whole-second mtime and size only.
    for index, (key, value) in enumerate((("core.trustCtime", "false"), ("core.checkStat", "minimal"))):
        monkeypatch.setenv(f"GIT_CONFIG_KEY_{index}", key)
        monkeypatch.setenv(f"GIT_CONFIG_VALUE_{index}", value)
    monkeypatch.setenv("GIT_CONFIG_COUNT", "2")
    destination = tmp_path / "history"
    history.build_history("fake-lib", _releases(fake_cache, ["1.0.0", "1.1.0"]), destination)
    assert _git(destination, "show", "v1.1.0:pkg/__init__.py") == "VERSION = '1.1.0'"
    assert _git(destination, "show", "v1.1.0:PKG-INFO") == "Version: 1.1.0"


def _one_line_error(capsys: pytest.CaptureFixture[str], *fragments: str) -> None:
    error = capsys.readouterr().err
    assert error.startswith("release_history: error: ") and error.count("\n") == 1, error
    for fragment in fragments:
        assert fragment in error, error


def test_force_refuses_a_users_folder_and_a_users_repository(
    fake_cache: Path, tmp_path: Path, offline_registry: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """--force replaces only a history this script built: never a folder or a repository of a user's own."""
    folder = tmp_path / "folder"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "notes.txt").write_text("mine\n")
    repository = tmp_path / "repository"
    repository.mkdir()
    (repository / "work.py").write_text("WORK = 1\n")
    _git(repository, "init", "-q", "-b", "main")
    _git(repository, "add", "work.py")
    _git(repository, "-c", "user.name=me", "-c", "user.email=me@localhost", "commit", "-q", "-m", "my work")
    mine = _git(repository, "rev-parse", "main")
    link = tmp_path / "link"
    link.symlink_to(folder)
    common = ["fake-lib", "--first", "1.0.0", "--last", "1.1.0", "--cache", str(fake_cache), "--force"]
    for destination, reason in ((folder, "not a release history"), (repository, "not a release history")):
        assert history.main([*common, "--dest", str(destination)]) == 2
        _one_line_error(capsys, f"--force refuses to replace {destination}", reason)
    assert history.main([*common, "--dest", str(link)]) == 2
    _one_line_error(capsys, "symbolic link")
    assert (folder / "data" / "notes.txt").read_text() == "mine\n"
    assert _git(repository, "rev-list", "main") == mine and (repository / "work.py").exists()
    # A history it built carries its marker and is rebuilt.
    built = tmp_path / "history"
    assert history.main([*common, "--dest", str(built)]) == 0
    assert history.main([*common, "--dest", str(built)]) == 0
    assert _git(built, "config", "--get", history.MARKER_KEY) == "fake-lib"


def test_a_failed_rebuild_leaves_the_history_as_it_was(fake_cache: Path, tmp_path: Path) -> None:
    destination = tmp_path / "history"
    (commit,) = history.build_history("fake-lib", _releases(fake_cache, ["1.0.0"]), destination)
    broken = tmp_path / "broken.tar.gz"
    with tarfile.open(broken, "w:gz") as archive:
        info = tarfile.TarInfo("loose-file.txt")
        archive.addfile(info, io.BytesIO(b""))
    with pytest.raises(history.HistoryError, match="expected one top-level folder"):
        history.build_history("fake-lib", [history.Release("1.1.0", broken)], destination, force=True)
    assert _git(destination, "rev-list", "main") == commit
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith(".")] == [], "no scratch left"


@pytest.mark.parametrize(
    ("arguments", "fragments"),
    [
        (["--first", "banana", "--last", "1.1.0"], ["--first 'banana' is not a version"]),
        (["--first", "1.0.0", "--last", "banana"], ["--last 'banana' is not a version"]),
    ],
)
def test_main_refuses_a_version_that_is_no_version(
    fake_cache: Path,
    tmp_path: Path,
    offline_registry: None,
    capsys: pytest.CaptureFixture[str],
    arguments: list[str],
    fragments: list[str],
) -> None:
    assert history.main(["fake-lib", *arguments, "--cache", str(fake_cache), "--dest", str(tmp_path / "h")]) == 2
    _one_line_error(capsys, *fragments)
    assert not (tmp_path / "h").exists()


@pytest.mark.parametrize("argument", ["--dest", "--cache"])
def test_main_refuses_a_file_as_a_folder(
    fake_cache: Path, tmp_path: Path, offline_registry: None, capsys: pytest.CaptureFixture[str], argument: str
) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("mine\n")
    folders = {"--dest": str(tmp_path / "h"), "--cache": str(fake_cache), argument: str(a_file)}
    arguments = ["fake-lib", "--first", "1.0.0", "--last", "1.1.0", "--dest", folders["--dest"]]
    assert history.main([*arguments, "--cache", folders["--cache"]]) == 2
    _one_line_error(capsys, f"{argument} {a_file} is a file, not a folder")
    assert a_file.read_text() == "mine\n"


def test_an_unreachable_package_index_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """pip's own failure (here: an index nobody listens on) ends in its last error line, not a traceback."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    assert history.main(["fake-lib", "--first", "1.0.0", "--last", "1.1.0", "--dest", str(tmp_path / "h")]) == 2
    _one_line_error(capsys, "pip index versions fake-lib failed", "is the package index reachable?")
    monkeypatch.setattr(history, "JSON_URL", "http://127.0.0.1:9/{name}/json")
    with pytest.raises(history.HistoryError, match="--no-dates"):
        history.upload_dates("fake-lib")


@pytest.mark.parametrize("name", ["../outside", "a/b", "-x", ""])
def test_main_refuses_a_name_that_is_no_project_name(
    tmp_path: Path, offline_registry: None, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """The default --dest is .asv/history/NAME: a name with ../ would build outside it."""
    arguments = ["--first", "1.0.0", "--last", "1.1.0", "--cache", str(tmp_path / "sdists"), "--", name]
    assert history.main(arguments) == 2
    _one_line_error(capsys, "is not a project name")
    assert not (tmp_path / "sdists").exists()


def _escaping(name: str, link: str = "") -> tarfile.TarInfo:
    """A member that would land outside the folder it is unpacked into: by its name, or as a link out."""
    info = tarfile.TarInfo(name)
    if link:
        info.type, info.linkname = tarfile.SYMTYPE, link
    else:
        info.size = len(b"escaped\n")
    return info


@pytest.mark.parametrize(
    "member",
    [
        _escaping("fake_lib-1.0.0/../../escaped.txt"),
        _escaping("fake_lib-1.0.0/out", link="../../../escaped.txt"),
        _escaping("fake_lib-1.0.0/out", link="/etc/passwd"),
    ],
    ids=["parent", "link-up", "link-absolute"],
)
def test_an_sdist_whose_members_escape_is_refused_in_one_line_naming_it(
    member: tarfile.TarInfo,
    tmp_path: Path,
    offline_registry: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cache = tmp_path / "deep" / "er" / "sdists"
    cache.mkdir(parents=True)
    sdist = _write_sdist(cache, "fake-lib", "1.0.0", FAKE_RELEASES["1.0.0"], extra=member)
    destination = tmp_path / "deep" / "history"
    arguments = ["fake-lib", "--first", "1.0.0", "--last", "1.0.0", "--cache", str(cache), "--dest", str(destination)]
    assert history.main(arguments) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"release_history: error: {sdist}: not a source distribution that can be unpacked safely")
    assert error.count("\n") == 1 and "Traceback" not in error
    assert not os.path.lexists(destination), "no history is left half-built"
    assert [path.name for path in tmp_path.rglob("escaped*")] == []


def test_a_damaged_sdist_is_refused_in_one_line_naming_it(
    tmp_path: Path, offline_registry: None, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "sdists"
    cache.mkdir()
    (cache / "fake_lib-1.0.0.tar.gz").write_bytes(b"not a tarball at all")
    arguments = [
        "fake-lib",
        "--first",
        "1.0.0",
        "--last",
        "1.0.0",
        "--cache",
        str(cache),
        "--dest",
        str(tmp_path / "h"),
    ]
    assert history.main(arguments) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"release_history: error: {cache / 'fake_lib-1.0.0.tar.gz'}: ") and error.count("\n") == 1


def test_ctrl_c_ends_in_one_line(
    fake_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(name: str) -> list[str]:
        raise KeyboardInterrupt

    monkeypatch.setattr(history, "available_versions", interrupted)
    assert history.main(["fake-lib", "--first", "1.0.0", "--last", "1.1.0", "--dest", str(tmp_path / "h")]) == 130
    error = capsys.readouterr().err
    assert error.startswith("release_history: interrupted") and error.count("\n") == 1


def _committed_results() -> dict[str, set[str]]:
    """Library -> every commit its committed asv results name (results-<library>*, each machine and run)."""
    named: dict[str, set[str]] = {}
    for library in history.LIBRARIES:
        for path in sorted(REPO.glob(f"results-{library}*/**/*.json")):
            if path.name not in ("machine.json", "benchmarks.json"):
                named.setdefault(library, set()).add(json.loads(path.read_text())["commit_hash"])
    return named


def test_every_committed_result_names_a_recorded_release() -> None:
    """A result whose commit the rebuilt history lacks is not drawn (asv: "Couldn't find ... in branches")."""
    named = _committed_results()
    assert set(named) == set(history.LIBRARIES)
    for library, commits in named.items():
        recorded = history.recorded_releases(library)
        first, last = history.LIBRARIES[library]
        assert list(recorded) == history.select_range(list(recorded), first, last), "the preset range, in order"
        dates = [uploaded for uploaded, _ in recorded.values()]
        assert dates == sorted(dates) and all(date.utcoffset() == dt.timedelta(0) for date in dates)
        unknown = commits - {commit for _, commit in recorded.values()}
        assert not unknown, f"results-{library}* name commits no rebuilt history has: {sorted(unknown)}"


def test_no_user_or_system_git_setting_changes_the_commits(
    fake_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Line-ending conversion, signing, hooks, another identity or hash function: none reaches a history."""
    releases = _releases(fake_cache, list(FAKE_RELEASES))
    clean = history.build_history("fake-lib", releases, tmp_path / "clean")
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "prepare-commit-msg").write_text('#!/bin/sh\necho "signed-off" >> "$1"\n')
    (hooks / "prepare-commit-msg").chmod(0o755)
    hostile = tmp_path / "gitconfig"
    hostile.write_text(
        "[core]\n\tautocrlf = true\n\tfileMode = false\n\thooksPath = " + str(hooks) + "\n"
        "[commit]\n\tgpgSign = true\n[user]\n\tname = someone\n\temail = someone@example.org\n"
        "[init]\n\tdefaultObjectFormat = sha256\n"
    )
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(hostile))
    monkeypatch.setenv("GIT_AUTHOR_NAME", "someone else")
    monkeypatch.setenv("GIT_COMMITTER_DATE", "2000-01-01T00:00:00+00:00")
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "elsewhere"))
    assert history.build_history("fake-lib", releases, tmp_path / "hostile") == clean


def test_a_history_that_is_not_the_recorded_one_is_an_error(
    fake_cache: Path,
    tmp_path: Path,
    offline_registry: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    destination = tmp_path / "history"
    arguments = ["fake-lib", "--first", "1.0.0", "--last", "1.1.0", "--cache", str(fake_cache), "--dest"]
    assert history.main([*arguments, str(destination)]) == 0
    built = history.released_versions(destination)
    recorded = {
        version: {"uploaded": DATES.get(version, dt.datetime(2025, 3, 1, tzinfo=UTC)).isoformat(), "commit": commit}
        for version, commit in built.items()
    }
    path = tmp_path / "recorded.json"
    path.write_text(json.dumps({"fake-lib": recorded}))
    monkeypatch.setattr(history, "RECORDED", path)
    assert history.differing_commits("fake-lib", destination) == []
    recorded["1.1.0"]["commit"] = "0" * 40
    path.write_text(json.dumps({"fake-lib": recorded}))
    assert history.main([*arguments, str(destination)]) == 1, "a history already there is checked too"
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and f"v1.1.0: {built['1.1.0'][:10]}, recorded 0000000000" in error
    assert "asv publish will not draw those results" in error
    assert history.main([*arguments, str(tmp_path / "other"), "--first", "1.1.0"]) == 0, "another range: no check"


@pytest.mark.slow
@pytest.mark.parametrize("library", sorted(history.LIBRARIES))
def test_the_real_histories_rebuild_as_the_recorded_commits_twice(library: str, tmp_path: Path) -> None:
    """From the registry's sdists (the cache, else pip download), each build gives every recorded commit."""
    recorded = history.recorded_releases(library)
    cache = history.HISTORY_DIR / "sdists"
    try:
        releases = history.collect_releases(
            library, list(recorded), cache, {version: date for version, (date, _) in recorded.items()}
        )
    except history.HistoryError as error:
        pytest.skip(f"the sdists cannot be fetched: {error}")
    for attempt in ("one", "two"):
        built = history.build_history(library, releases, tmp_path / attempt)
        assert built == [commit for _, commit in recorded.values()]
