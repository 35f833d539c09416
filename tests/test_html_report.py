"""The HTML report: one self-contained page (nothing loaded from elsewhere) with the verdict, figures, rows and
environment, every string escaped."""

from __future__ import annotations

import base64
from html.parser import HTMLParser
from pathlib import Path

import pytest

from cropbench import api
from cropbench import metrics as m
from cropbench.cli import main
from cropbench.errors import OutputError
from cropbench.records import Record, RecordWriter
from cropbench.report.html import REPORT_NAME, render_report, write_report
from cropbench.report.verdict import HEADING

HOSTILE = '<script>alert("x")</script> & <img src=http://example.com/x.png>'
#: The smallest valid PNG: one transparent pixel.
PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)


class Page(HTMLParser):
    """Every tag and attribute of a page, and its visible text."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attributes: list[tuple[str, str, str]] = []
        self.text: list[str] = []
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attributes += [(tag, name, value or "") for name, value in attrs]

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def records() -> list[Record]:
    clean = Record(
        track="dataset",
        case="random/direct/none/96px/all/float32",
        config={"access": "random", "crop": {"decode": "direct"}},
        metrics={m.SAMPLES_PER_S: 1234.0, m.P95_MS: 2.5, m.VALIDITY_FLAGS: []},
        environment={"python": "3.11", "cpu_model": HOSTILE, "packages": {"torch": "2.5"}},
        run_id="run-a",
    )
    flagged = Record(
        track="dataset",
        case=HOSTILE,
        config={"access": "random", "crop": {"decode": "zarr"}},
        metrics={m.SAMPLES_PER_S: 9000.0, m.P95_MS: 0.5, m.VALIDITY_FLAGS: ["cache>=plate"]},
        environment={"python": "3.11", "cpu_model": HOSTILE, "packages": {"torch": "2.5"}},
        run_id="run-a",
    )
    return [clean, flagged]


def test_the_page_is_self_contained_and_embeds_its_figures(tmp_path: Path) -> None:
    figure = tmp_path / "track1_latency_throughput.png"
    figure.write_bytes(PIXEL)
    page = Page(render_report(records(), [figure], preset="smoke"))
    assert not {"script", "link", "iframe", "object", "embed"} & set(page.tags)
    sources = [value for _, name, value in page.attributes if name in {"src", "href", "srcset", "action"}]
    assert sources and all(value.startswith("data:image/png;base64,") for value in sources), sources
    assert base64.b64decode(sources[0].split(",", 1)[1]) == PIXEL


def test_every_string_is_escaped(tmp_path: Path) -> None:
    page = render_report(records())
    assert HOSTILE not in page and "<script" not in page and "example.com/x.png>" not in page
    text = "".join(Page(page).text)
    assert text.count(HOSTILE) == 2, "the hostile case label and CPU model read back as text, once each"


def test_the_page_holds_the_verdict_the_rows_and_the_environment() -> None:
    page = render_report(records(), preset="smoke")
    text = " ".join(Page(page).text)
    assert HEADING in text and "--preset full" in text
    assert "best random/direct/none/96px/all/float32: 1,234 samples/s" in text, "the flagged faster row is not best"
    assert "1 of 2 configurations carry no flag" in text
    assert 'class="flagged"' in page and page.count('class="flagged"') == 1
    assert "cache>=plate" in text and "packages.torch" in text and "2.5" in text
    every_row_flagged = [records()[1]]
    assert "no row of this run is a measurement to quote" in " ".join(Page(render_report(every_row_flagged)).text)


def test_write_report_writes_beside_the_results_and_names_a_bad_path(tmp_path: Path) -> None:
    path = write_report(records(), tmp_path / "out")
    assert path == tmp_path / "out" / REPORT_NAME and "cropbench report" in path.read_text()
    blocker = tmp_path / "file"
    blocker.write_text("the user's own file")
    with pytest.raises(OutputError, match=str(blocker)):
        write_report(records(), blocker)
    assert blocker.read_text() == "the user's own file"
    with pytest.raises(OutputError, match="missing.png"):
        render_report(records(), [tmp_path / "missing.png"])


def _written(out: Path) -> list[Record]:
    """The sample rows, written to OUT/results.jsonl as a run writes them."""
    with RecordWriter(out / "results.jsonl") as writer:
        return [writer.write(record) or record for record in records()]


def test_smoke_and_run_end_in_the_verdict_and_write_the_report_beside_the_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fake_smoke(out_dir: Path, **_: object) -> api.SmokeRun:
        return api.SmokeRun(Path(out_dir) / api.SMOKE_PLATE, None, _written(Path(out_dir)))

    def fake_run(plate: str, tracks: list[str], preset: str, out_dir: Path, **_: object) -> list[Record]:
        return _written(Path(out_dir))

    monkeypatch.setattr(api, "smoke", fake_smoke)
    monkeypatch.setattr(api, "run", fake_run)
    assert main(["smoke", "--out", str(tmp_path / "smoke"), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    verdict_block = printed[printed.index(f"\n{HEADING}\n") :].strip().splitlines()
    assert verdict_block[0] == HEADING and "--preset full" in "\n".join(verdict_block)
    assert verdict_block[-1].strip().startswith("- "), "the verdict is the last thing printed"
    page = (tmp_path / "smoke" / REPORT_NAME).read_text()
    assert "data:image/png;base64," in page and HEADING in page
    plate = tmp_path / "p.zarr"  # run checks that the plate is there before the (faked) measurement
    plate.mkdir()
    assert main(["run", "--plate", str(plate), "--out", str(tmp_path / "run"), "--no-progress", "--plot"]) == 0
    assert HEADING in capsys.readouterr().out and (tmp_path / "run" / REPORT_NAME).is_file()
    assert main(["run", "--plate", str(plate), "--out", str(tmp_path / "bare"), "--no-progress"]) == 0
    assert HEADING in capsys.readouterr().out and not (tmp_path / "bare" / REPORT_NAME).exists(), "no plots, no page"


def test_summary_of_a_results_file_ends_in_its_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _written(tmp_path)
    assert main(["summary", str(tmp_path / "results.jsonl")]) == 0
    printed = capsys.readouterr().out
    assert f"\n{HEADING}\n" in printed and "best random/direct/none/96px/all/float32: 1,234 samples/s" in printed


def test_the_page_gives_the_targets_ratios_and_explains_impossible_in_targets_terms() -> None:
    config = {
        "access": "random",
        "reader_name": "direct-batched-2t",
        "reference_name": "ceiling-2t",
        "reader": {"decode_threads": 2},
        "reference": {"threads": 2},
    }
    metrics = {
        m.RATIO_MEDIAN: 1.3,
        m.RATIO_Q1: 1.2,
        m.RATIO_Q3: 1.4,
        m.PAIRED_BLOCKS: 16,
        m.CEILING_THREADS: 2,
        m.VALIDITY_FLAGS: ["impossible"],
    }
    ratio = Record(
        track="targets", case="random/direct-batched-2t/over/ceiling-2t", config=config, metrics=metrics, environment={}
    )
    text = " ".join(Page(render_report([ratio])).text)
    assert "random, over the copy ceiling at the same thread count: 1.30x [1.20-1.40] with 2 decode threads" in text
    assert "the ceiling or the timing is wrong" in text and "compute-only" not in text
    assert "no configuration measured a number" not in text
