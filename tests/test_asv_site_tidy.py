"""scripts/asv_site_tidy.py: the published front page shows only measured benchmarks, wide series on a log axis."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import asv
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import asv_site_tidy as tidy  # noqa: E402

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


def test_unmeasured_benchmarks_leave_the_front_page_and_wide_series_open_on_a_log_axis(tmp_path: Path) -> None:
    html = _site(
        tmp_path,
        {
            "track1.Fetch.track_relative_cost": [[1, [6.7, 81.0, None]], [2, [7.6, 99.0, None]]],
            "track1.Stages.track_decode": [[1, [1.0, 2.0]], [2, [1.1, 2.1]]],
            "track1.Latency.time_fetch": [[1, [None, None]], [2, [None, None]]],
            "track1.FullFetch.track_relative_cost": None,
            "scale.OutOfMemory.track_crops_per_s": [[1, 300.0], [2, None]],
        },
    )
    dropped, logged = tidy.tidy(html)
    assert dropped == ["track1.FullFetch.track_relative_cost", "track1.Latency.time_fetch"]
    assert logged == ["track1.Fetch.track_relative_cost"]
    index = json.loads((html / "index.json").read_text())["benchmarks"]
    assert set(index) == {
        "track1.Fetch.track_relative_cost",
        "track1.Stages.track_decode",
        "scale.OutOfMemory.track_crops_per_s",
    }
    assert index["track1.Fetch.track_relative_cost"]["log_scale"] is True
    assert "log_scale" not in index["track1.Stages.track_decode"]
    grid = (html / "summarygrid.js").read_text()
    assert tidy.LOG_LINK in grid and tidy.SUMMARY_LINK not in grid
    assert tidy.tidy(html) == ([], logged), "a second pass changes nothing"
    assert (html / "summarygrid.js").read_text() == grid


def test_a_folder_that_is_no_site_and_a_changed_asv_page_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert tidy.main([str(tmp_path)]) == 2
    assert capsys.readouterr().out.startswith("asv_site_tidy: error: ")
    html = _site(tmp_path, {"a.B.track_c": [[1, [1.0]]]})
    (html / "summarygrid.js").write_text("// another asv")
    with pytest.raises(tidy.TidyError, match="front-page link"):
        tidy.tidy(html)
