"""scripts/asv_publish.sh replaces only a site it published, and says in one line what is wrong."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from cropbench.history import offline_html as offline

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "asv_publish.sh"


def _publish(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *arguments], capture_output=True, text=True, timeout=120)


def _config(tmp_path: Path) -> Path:
    """This repository's asv configuration with its results and site in ``tmp_path`` (no results but the suite list)."""
    from asv import util

    config = util.load_json(str(REPO / "asv.conf.json"), js_comments=True)
    results = tmp_path / "results"
    results.mkdir()
    shutil.copyfile(REPO / "results" / "benchmarks.json", results / "benchmarks.json")
    config.update(repo=str(REPO), results_dir=str(results), html_dir=str(tmp_path / "html"))
    path = tmp_path / "asv.conf.json"
    path.write_text(json.dumps(config))
    return path


def _one_line_error(result: subprocess.CompletedProcess[str], message: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith("asv_publish: error: ") and result.stderr.count("\n") == 1, result.stderr
    assert message in result.stderr


def test_a_users_folder_is_refused_and_kept(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    result = _publish("--config", str(_config(tmp_path)), "--html-dir", str(mine), "--no-pull")
    _one_line_error(result, f"refusing to replace {mine}: it holds files and no {offline.SITE_MARKER}")
    assert (mine / "notes.txt").read_text() == "mine\n"


def test_a_file_or_a_link_as_the_site_folder_is_refused(tmp_path: Path) -> None:
    config = _config(tmp_path)
    (tmp_path / "a-file").write_text("mine\n")
    _one_line_error(_publish("--config", str(config), f"--html-dir={tmp_path / 'a-file'}"), "it is a file")
    (tmp_path / "target").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "target")
    _one_line_error(_publish("--config", str(config), "-o", str(tmp_path / "link")), "symbolic link")


@pytest.mark.parametrize(
    ("text", "message"),
    [("garbage{", 'Unexpected "g"'), ("[1, 2]", "No version specified"), ('{"version": 1}', "No repo specified")],
)
def test_a_garbage_configuration_is_one_line(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "garbage.json"
    config.write_text(text)
    _one_line_error(_publish("--config", str(config)), f"{config} is not an asv configuration")
    assert message in _publish("--config", str(config)).stderr


def test_the_site_it_published_is_marked_and_replaced_on_the_next_publish(tmp_path: Path) -> None:
    config = _config(tmp_path)
    site = tmp_path / "html"
    first = _publish("--config", str(config), "--no-pull")
    assert first.returncode == 0, first.stdout + first.stderr
    assert (site / "index.html").is_file() and (site / offline.SITE_MARKER).is_file()
    (site / "stale.txt").write_text("from an earlier publish\n")
    second = _publish("--config", str(config), "--no-pull")
    assert second.returncode == 0, second.stdout + second.stderr
    assert (site / offline.SITE_MARKER).is_file() and not (site / "stale.txt").exists()


def test_refusal_allows_only_a_new_an_empty_or_a_marked_folder(tmp_path: Path) -> None:
    assert offline.refusal(tmp_path / "new") is None
    assert offline.refusal(tmp_path) is None
    (tmp_path / offline.SITE_MARKER).write_text("not json")
    assert offline.refusal(tmp_path) is not None
    (tmp_path / offline.SITE_MARKER).write_text(json.dumps({"cropbench_site": 1}))
    assert offline.refusal(tmp_path) is None


def _measured_points(graph: Path) -> int:
    return sum(
        any(isinstance(cell, int | float) for cell in (entry[1] if isinstance(entry[1], list) else [entry[1]]))
        for entry in json.loads(graph.read_text())
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", ["asv.conf.json", "asv.zarr.conf.json", "asv.ome-arrow.conf.json"])
def test_the_committed_results_publish_without_a_warning_and_every_graph_draws_a_line(
    tmp_path: Path, name: str
) -> None:
    from asv import util

    config = util.load_json(str(REPO / name), js_comments=True)
    repo = REPO / config["repo"]
    if not repo.is_dir():
        pytest.skip(f"{name} measures {config['repo']}, not built here (scripts/release_history.py)")
    config.update(repo=str(repo), results_dir=str(REPO / config["results_dir"]), html_dir=str(tmp_path / "html"))
    (tmp_path / name).write_text(json.dumps(config))
    result = _publish("--config", str(tmp_path / name), "--no-pull")
    assert result.returncode == 0, result.stdout + result.stderr
    warnings = [
        line
        for line in (result.stdout + result.stderr).splitlines()
        if "Couldn't find" in line or "Skipping" in line or "arning" in line
    ]
    assert warnings == []
    site = tmp_path / "html"
    graphs = [graph for graph in (site / "graphs").rglob("*.json") if graph.name != "summary.json"]
    assert graphs and all(_measured_points(graph) >= 2 for graph in graphs)
    listed = json.loads((site / "index.json").read_text())["benchmarks"]
    left_out = json.loads((site / "left-out.json").read_text())
    suite = set(json.loads(Path(config["results_dir"], "benchmarks.json").read_text())) - {"version"}
    assert not set(listed) & set(left_out) and set(listed) | set(left_out) == suite, "each drawn or said why not"
    for summary in (site / "graphs").rglob("summary.json"):
        assert all(row["last_value"] is not None for row in json.loads(summary.read_text()))
