"""``cropbench asv-site-tidy``: every benchmark on the published site draws a line (the others are listed with the
reason), summary.json holds measured rows only, wide series open on a log axis."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import asv
import pytest

from cropbench.history import site_tidy as tidy

REPO = Path(__file__).resolve().parents[1]

ASV_WWW = Path(asv.__file__).parent / "www"
GRAPHS = Path("graphs") / "arch-x86_64" / "branch-main" / "machine-m"


def _site(tmp_path: Path, graphs: dict[str, list[object] | None]) -> Path:
    """asv's page files, an index listing ``graphs``' benchmarks, and a graph file for each that has points."""
    html = tmp_path / "html"
    shutil.copytree(ASV_WWW, html)
    benchmarks = {name: {"name": name, "params": [], "unit": "x"} for name in graphs}
    (html / "index.json").write_text(json.dumps({"benchmarks": benchmarks}))
    for name, points in graphs.items():
        if points is None:
            continue
        for folder in (html / GRAPHS, html / "graphs" / "summary"):
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{name}.json").write_text(json.dumps(points))
    return html


def test_benchmarks_without_a_line_leave_the_site_with_the_reason_and_wide_series_open_on_a_log_axis(
    tmp_path: Path,
) -> None:
    html = _site(
        tmp_path,
        {
            "track1.Fetch.track_relative_cost": [[1, [6.7, 81.0, None]], [2, [7.6, 99.0, None]]],
            "track1.Stages.track_decode": [[1, [1.0, 2.0]], [2, [1.1, 2.1]]],
            "track1.Latency.time_fetch": [],
            "track1.FullFetch.track_relative_cost": None,
            "scale.OutOfMemory.track_crops_per_s": [[1, 300.0], [2, None]],
            "scale.OutOfMemory.track_device_bytes_per_crop": [[1, 300.0], [2, 310.0]],
        },
    )
    summary = html / GRAPHS / "summary.json"
    summary.write_text(
        json.dumps(
            [
                {"name": "track1.Stages.track_decode", "idx": 0, "last_value": 1.1},
                {"name": "track1.Stages.track_decode", "idx": 1, "last_value": None},
                {"name": "scale.OutOfMemory.track_crops_per_s", "idx": None, "last_value": 300.0},
                {"name": "track1.Latency.time_fetch", "idx": 0, "last_value": None},
            ]
        )
    )
    done = tidy.tidy(html)
    assert done.left_out == {
        "scale.OutOfMemory.track_crops_per_s": "measured at one commit only: a line needs two",
        "track1.FullFetch.track_relative_cost": "in no published result: outside the grid the results ran",
        "track1.Latency.time_fetch": "in the results, but skipped or failed wherever it ran: no measured value",
    }
    assert done.logged == ["track1.Fetch.track_relative_cost"]
    assert done.summary_rows == (4, 1)
    index = json.loads((html / "index.json").read_text())["benchmarks"]
    assert set(index) == {
        "track1.Fetch.track_relative_cost",
        "track1.Stages.track_decode",
        "scale.OutOfMemory.track_device_bytes_per_crop",
    }
    assert index["track1.Fetch.track_relative_cost"]["log_scale"] is True
    assert "log_scale" not in index["track1.Stages.track_decode"]
    assert sorted(path.stem for path in (html / GRAPHS).glob("*.*.*.json")) == sorted(index), "no graph without a line"
    assert sorted(path.stem for path in (html / "graphs" / "summary").glob("*.json")) == sorted(index)
    assert [row["name"] for row in json.loads(summary.read_text())] == ["track1.Stages.track_decode"]
    grid = (html / "summarygrid.js").read_text()
    assert tidy.LOG_LINK in grid and tidy.SUMMARY_LINK not in grid
    page = (html / tidy.LEFT_OUT_PAGE).read_text()
    for name, reason in done.left_out.items():
        assert f"<code>{name}</code></td><td>{reason}</td>" in page
    front = (html / "index.html").read_text()
    assert front.count('href="left-out.html">Not drawn (3)</a>') == 1

    again = tidy.tidy(html)
    assert (again.left_out, again.logged, again.summary_rows) == ({}, done.logged, (1, 1)), (
        "a second pass changes nothing"
    )
    assert (html / "summarygrid.js").read_text() == grid
    assert (html / tidy.LEFT_OUT_PAGE).read_text() == page, "the second pass keeps the first one's list"
    assert (html / "index.html").read_text() == front


def test_a_folder_that_is_no_site_and_a_changed_asv_page_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert tidy.main([str(tmp_path)]) == 2
    assert capsys.readouterr().out.startswith("asv_site_tidy: error: ")
    html = _site(tmp_path, {"a.B.track_c": [[1, [1.0]], [2, [1.0]]]})
    (html / "summarygrid.js").write_text("// another asv")
    with pytest.raises(tidy.TidyError, match="front-page link"):
        tidy.tidy(html)
    html = _site(tmp_path / "other", {"a.B.track_c": [[1, [1.0]], [2, [1.0]]]})
    (html / "index.html").write_text("<html>another asv</html>")
    with pytest.raises(tidy.TidyError, match="navigation bar"):
        tidy.tidy(html)
    assert (html / "graphs" / "summary" / "a.B.track_c.json").exists(), "nothing is changed before the checks pass"
