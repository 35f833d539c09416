"""scripts/setup.sh's heartbeat: a line at least every interval while pip runs, pip's exit code kept.

setup.sh itself installs into .venv; sourced, it only defines its functions, which run here on a
stand-in for pip.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

SETUP = Path(__file__).resolve().parents[1] / "scripts" / "setup.sh"


def _bash(script: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", f'source "{SETUP}"\n{script}', "bash", *arguments], capture_output=True, text=True, timeout=60
    )


def test_sourcing_defines_the_functions_and_does_nothing_else(tmp_path: Path) -> None:
    result = subprocess.run(
        ["bash", "-c", f'source "{SETUP}"; type heartbeat pip_install talk >/dev/null; pwd'],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tmp_path) and not list(tmp_path.iterdir())


def test_a_slow_command_gets_a_line_every_interval_and_keeps_its_exit_code(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    # The stand-in for pip returns 3 once it has seen two heartbeats (4 if none come within a minute).
    script = """
slow() {
  for _ in $(seq 600); do
    [ "$(grep -c 'still working' "$1" 2>/dev/null)" -ge 2 ] && return 3
    sleep 0.1
  done
  return 4
}
rc=0
heartbeat 1 slow "$1" >"$1" || rc=$?
echo "rc=$rc"
"""
    result = _bash(script, str(out))
    assert result.stdout.strip() == "rc=3", result.stdout + result.stderr
    beats = out.read_text().splitlines()
    assert len(beats) >= 2 and all(re.fullmatch(r"setup: pip still working \(\d+ s\)", line) for line in beats)
    seconds = [int(re.findall(r"\d+", line)[0]) for line in beats]
    assert seconds == sorted(seconds) and seconds[0] >= 1


def test_a_quick_command_prints_no_heartbeat_and_leaves_nothing_holding_the_output() -> None:
    # Piped through cat: a heartbeat left running would keep the pipe open for its 30 s interval.
    result = subprocess.run(
        ["bash", "-c", f'source "{SETUP}"; heartbeat 30 echo done | cat'], capture_output=True, text=True, timeout=20
    )
    assert result.returncode == 0 and result.stdout == "done\n", result.stdout + result.stderr


def test_the_remote_extra_leaves_pip_nothing_to_backtrack_through() -> None:
    """s3fs pins its fsspec and aiobotocore a narrow botocore: unbounded, pip tried ~60 aiobotocore versions."""
    import tomllib
    from importlib.metadata import requires, version

    from packaging.requirements import Requirement

    pyproject = tomllib.loads((SETUP.parents[1] / "pyproject.toml").read_text())
    remote = {
        requirement.name: requirement
        for requirement in map(Requirement, pyproject["project"]["optional-dependencies"]["remote"])
    }
    for name in ("s3fs", "aiobotocore"):
        assert len(remote[name].specifier) == 1 and next(iter(remote[name].specifier)).operator == "=="
        assert remote[name].specifier.contains(version(name)), f"the installed {name} is not the pinned one"
    botocore = next(Requirement(text) for text in requires("aiobotocore") or [] if Requirement(text).name == "botocore")
    # Each boto3 release needs the botocore of its own number or newer: boto3's range is aiobotocore's botocore's.
    assert str(remote["boto3"].specifier) == str(botocore.specifier)
    assert remote["boto3"].specifier.contains(version("boto3"))


def _fake_tools(folder: Path, **scripts: str) -> str:
    """A PATH holding only the given stand-ins (and the shell tools apt_optional uses)."""
    folder.mkdir()
    for name in ("id", "cat", "bash"):
        (folder / name).symlink_to(subprocess.run(["which", name], capture_output=True, text=True).stdout.strip())
    for name, body in scripts.items():
        (folder / name).write_text(f"#!/bin/bash\n{body}\n")
        (folder / name).chmod(0o755)
    return str(folder)


def _apt_optional(path: str) -> subprocess.CompletedProcess[str]:
    return _bash(f'PATH="{path}"\napt_optional fakepkg faketool "the fake tests will skip"\necho "rc=$?"')


def test_apt_optional_leaves_an_installed_tool_alone(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    path = _fake_tools(tmp_path / "bin", faketool="", **{"apt-get": f'echo "$*" >> {calls}'})
    result = _apt_optional(path)
    assert result.stdout.strip() == "rc=0" and result.stderr == "" and not calls.exists()


def test_apt_optional_takes_a_file_the_package_installs_for_its_tool(tmp_path: Path) -> None:
    calls, installed = tmp_path / "calls", tmp_path / "module.so"
    path = _fake_tools(
        tmp_path / "bin", sudo=f'echo "$*" >> {calls}; shift; "$@"', **{"apt-get": f'echo "$*" >> {calls}'}
    )
    command = f'PATH="{path}"\napt_optional fakepkg {installed} "the fake tests will skip"\necho "rc=$?"'
    assert _bash(command).stdout.strip() == "rc=0" and "install -y -q fakepkg" in calls.read_text()
    calls.unlink()
    installed.write_bytes(b"")
    assert _bash(command).stdout.strip() == "rc=0" and not calls.exists()


def test_apt_optional_installs_a_missing_tool_with_apt_get(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    log = f'echo "$*" >> {calls}'
    path = _fake_tools(tmp_path / "bin", sudo=f'{log}; shift; "$@"', **{"apt-get": log})
    result = _apt_optional(path)
    assert result.stdout.strip() == "rc=0" and result.stderr == ""
    installs = [line for line in calls.read_text().splitlines() if "install" in line]
    assert installs and installs[-1].endswith("install -y -q fakepkg")


def test_apt_optional_is_never_fatal_and_says_what_skips(tmp_path: Path) -> None:
    failing = _fake_tools(tmp_path / "failing", sudo='shift; "$@"', **{"apt-get": "exit 100"})
    result = _apt_optional(failing)
    assert result.stdout.strip() == "rc=0"
    assert result.stderr == "setup: could not install fakepkg (apt-get install -y fakepkg); the fake tests will skip\n"
    result = _apt_optional(_fake_tools(tmp_path / "bare"))
    assert result.stdout.strip() == "rc=0" and result.stderr.count("\n") == 1 and "no apt-get" in result.stderr
