"""``cropbench history-spread``: two runs of a release history side by side, and both on the asv site."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from cropbench.history import spread

LIBRARY = "fakelib"
#: The recorded releases of the synthetic library, in release order (scripts/release_histories.json's shape).
COMMITS = {"1.0.0": "a" * 40, "1.1.0": "b" * 40, "1.2.0": "c" * 40}
COLUMNS = ["result", "params", "version", "started_at", "duration"]
FETCH = "track1.Fetch.track_relative_cost"
STORE = "zarr_stages.ZarrStages.track_store"
ENV = "virtualenv-py3.11-numpy"
MACHINE = "bench-box"


def _recorded(tmp_path: Path) -> Path:
    path = tmp_path / "release_histories.json"
    entries = {
        version: {"uploaded": "2025-01-01T00:00:00+00:00", "commit": commit} for version, commit in COMMITS.items()
    }
    path.write_text(json.dumps({LIBRARY: entries}))
    return path


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "asv.fakelib.conf.json"
    path.write_text(
        '{\n    // an asv configuration, comments and all\n    "version": 1,\n    "project": "fakelib"\n}\n'
    )
    return path


def _rows(fetch: list[float] | None, store: float | None) -> dict[str, list[Any]]:
    """asv 0.6's rows: ``Fetch`` over two parameters (random and grouped), ``track_store`` without any."""
    rows: dict[str, list[Any]] = {}
    if fetch is not None:
        rows[FETCH] = [fetch, [["'random'", "'grouped-field'"], ["'zarr'"]], "2", 1, 2.0]
    if store is not None:
        rows[STORE] = [[store], [], "1", 1, 2.0]
    return rows


def _run(
    folder: Path,
    values: dict[str, dict[str, list[Any]]],
    machine: str = MACHINE,
    versions: dict[str, str] | None = None,
) -> Path:
    """An asv results folder with one machine and a result file per release (release -> rows)."""
    (folder / machine).mkdir(parents=True)
    described = {"arch": "x86_64", "cpu": "test", "machine": machine, "num_cpu": "2", "os": "Linux", "ram": "1"}
    (folder / machine / spread.MACHINE_FILE).write_text(json.dumps({**described, "version": 1}))
    suite = {
        FETCH: {"version": "2"},
        STORE: {"version": "1"},
        **{name: {"version": v} for name, v in (versions or {}).items()},
    }
    (folder / spread.SUITE_FILE).write_text(json.dumps({**suite, "version": 2}))
    for release, rows in values.items():
        commit = COMMITS.get(release, release)
        data = {
            "commit_hash": commit,
            "env_name": ENV,
            "date": 1,
            "params": {**described, "python": "3.11"},
            "python": "3.11",
            "requirements": {},
            "env_vars": {},
            "result_columns": COLUMNS,
            "results": rows,
            "durations": {"<build>": 1.0},
            "version": 2,
        }
        (folder / machine / f"{commit[:8]}-env-0123.json").write_text(json.dumps(data))
    return folder


def _spread(tmp_path: Path, *extra: str) -> int:
    return spread.main(
        [
            str(tmp_path / "run-1"),
            str(tmp_path / "run-2"),
            "--config",
            str(_config(tmp_path)),
            "--recorded",
            str(_recorded(tmp_path)),
            *extra,
        ]
    )


def test_each_release_and_case_gets_both_values_and_their_ratio(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _run(tmp_path / "run-1", {"1.0.0": _rows([80.0, 100.0], 20.0), "1.1.0": _rows([90.0, 120.0], 25.0)})
    _run(tmp_path / "run-2", {"1.0.0": _rows([88.0, 95.0], 20.0), "1.1.0": _rows([81.0, 132.0], 30.0)})
    first, second = spread.run_values(tmp_path / "run-1"), spread.run_values(tmp_path / "run-2")
    found = spread.pairs(first, second, spread.release_names(LIBRARY, _recorded(tmp_path)))
    assert [(pair.release, pair.benchmark) for pair in found][:3] == [
        ("1.0.0", f"{FETCH}('grouped-field', 'zarr')"),
        ("1.0.0", f"{FETCH}('random', 'zarr')"),
        ("1.0.0", STORE),
    ]
    ratios = {(pair.release, pair.benchmark): pair.ratio for pair in found}
    assert ratios[("1.0.0", f"{FETCH}('random', 'zarr')")] == pytest.approx(1.1)
    assert ratios[("1.1.0", f"{FETCH}('random', 'zarr')")] == pytest.approx(0.9)
    assert ratios[("1.1.0", STORE)] == pytest.approx(1.2)
    (random,) = [row for row in spread.summaries(found) if row.benchmark == f"{FETCH}('random', 'zarr')"]
    assert (random.releases, random.low, random.high) == (2, pytest.approx(0.9), pytest.approx(1.1))
    assert random.across == pytest.approx(90 / 80)

    assert _spread(tmp_path) == 0
    out = capsys.readouterr().out
    assert f"| 1.0.0 | `{FETCH}('random', 'zarr')` | 80.0 | 88.0 | 1.1000 |" in out
    assert f"| 1.1.0 | `{STORE}` | 25.0 | 30.0 | 1.2000 |" in out
    assert f"| `{FETCH}('random', 'zarr')` | 2 | 0.9000 | 1.0000 | 1.1000 | 1.125 |" in out


def test_a_release_one_run_lacks_is_marked_missing_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _run(tmp_path / "run-1", {"1.0.0": _rows([80.0, 100.0], 20.0), "1.1.0": _rows([90.0, 120.0], 25.0)})
    _run(tmp_path / "run-2", {"1.0.0": _rows([88.0, 95.0], 20.0)})
    site = _run(tmp_path / "site", {})
    assert _spread(tmp_path, "--site", str(site)) == 1
    captured = capsys.readouterr()
    assert f"| 1.1.0 | `{STORE}` | 25.0 | missing |  |" in captured.out
    assert captured.err.startswith("history_spread: incomplete: measured in one run only: 1.1.0 ")
    assert captured.err.count("\n") == 1 and "nothing filed into the site" in captured.err
    assert not (site / f"{MACHINE}{spread.REPEAT_SUFFIX}").exists()


def test_skips_in_both_runs_are_left_out_and_a_skip_in_one_run_shows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nan = math.nan
    _run(tmp_path / "run-1", {"1.0.0": _rows([nan, nan], None), "1.1.0": _rows([2.5, nan], None)})
    _run(tmp_path / "run-2", {"1.0.0": _rows([nan, nan], None), "1.1.0": _rows([2.4, None], None)})
    assert _spread(tmp_path) == 0
    out = capsys.readouterr().out
    assert "| 1.0.0 |" not in out and "skipped in both runs: 1.0.0" in out
    assert f"| 1.1.0 | `{FETCH}('grouped-field', 'zarr')` | skipped | skipped |" not in out
    assert f"| 1.1.0 | `{FETCH}('random', 'zarr')` | 2.50 | 2.40 | 0.9600 |" in out


def test_a_commit_no_release_history_records_is_named_by_its_hash_last(tmp_path: Path) -> None:
    stray = "d" * 40
    _run(tmp_path / "run-1", {stray: _rows(None, 10.0), "1.2.0": _rows(None, 10.0)})
    _run(tmp_path / "run-2", {stray: _rows(None, 11.0), "1.2.0": _rows(None, 10.0)})
    found = spread.pairs(
        spread.run_values(tmp_path / "run-1"),
        spread.run_values(tmp_path / "run-2"),
        spread.release_names(LIBRARY, _recorded(tmp_path)),
    )
    assert [pair.release for pair in found] == ["1.2.0", stray[:10]]


def test_a_folder_without_one_machine_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _run(tmp_path / "run-1", {"1.0.0": _rows(None, 1.0)})
    (tmp_path / "run-2").mkdir()
    assert _spread(tmp_path) == 2
    error = capsys.readouterr().err
    assert error.startswith("history_spread: error: ") and error.count("\n") == 1 and "found none" in error


def test_the_site_gets_run_1_in_place_and_run_2_as_a_second_machine(tmp_path: Path) -> None:
    other = "zarr_stages.ZarrCounts.track_store_reads_per_crop"
    site_rows = {**_rows([70.0, 90.0], 15.0), other: [[6.58], [], "1", 1, 2.0]}
    site = _run(tmp_path / "site", {"1.0.0": site_rows, "1.1.0": site_rows}, versions={other: "1"})
    _run(tmp_path / "run-1", {"1.0.0": _rows([80.0, 100.0], 20.0), "1.1.0": _rows([90.0, 120.0], 25.0)})
    _run(tmp_path / "run-2", {"1.0.0": _rows([88.0, 95.0], 20.0), "1.1.0": _rows([81.0, 132.0], 30.0)})
    done = spread.add_to_site(tmp_path / "run-1", tmp_path / "run-2", site)
    assert done == [
        f"site: run 1 -> {site / MACHINE} (2 result files)",
        f"site: run 2 -> {site / (MACHINE + spread.REPEAT_SUFFIX)} (2 result files)",
    ]
    own = spread.run_values(tmp_path / "run-1")
    first = json.loads((site / MACHINE / f"{'a' * 8}-env-0123.json").read_text())
    assert first["results"][other] == [[6.58], [], "1", 1, 2.0], "the site's other benchmarks are kept"
    assert first["results"][STORE][0] == [20.0] and own[COMMITS["1.0.0"]][STORE] == 20.0
    repeat = site / f"{MACHINE}{spread.REPEAT_SUFFIX}"
    assert json.loads((repeat / spread.MACHINE_FILE).read_text())["machine"] == repeat.name
    second = json.loads((repeat / f"{'b' * 8}-env-0123.json").read_text())
    assert second["params"]["machine"] == repeat.name and second["results"][STORE][0] == [30.0]
    assert set(second["results"]) == {FETCH, STORE}, "the repeat machine holds run 2 alone"
    # Filing again gives the same files: the command can be rerun.
    before = sorted((path.name, path.read_text()) for path in site.rglob("*.json"))
    spread.add_to_site(tmp_path / "run-1", tmp_path / "run-2", site)
    assert sorted((path.name, path.read_text()) for path in site.rglob("*.json")) == before


def test_the_site_refuses_a_run_at_another_benchmark_version_and_writes_nothing(tmp_path: Path) -> None:
    site = _run(tmp_path / "site", {"1.0.0": _rows([70.0, 90.0], 15.0)})
    _run(tmp_path / "run-1", {"1.0.0": _rows([80.0, 100.0], 20.0)})
    stale = _rows([88.0, 95.0], 20.0)
    stale[STORE][2] = "0"
    _run(tmp_path / "run-2", {"1.0.0": stale})
    before = sorted((path, path.read_text()) for path in site.rglob("*.json"))
    with pytest.raises(spread.SpreadError, match=f"{STORE} not at the version of"):
        spread.add_to_site(tmp_path / "run-1", tmp_path / "run-2", site)
    assert sorted((path, path.read_text()) for path in site.rglob("*.json")) == before
