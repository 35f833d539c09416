"""compare-layouts: one record per layout with size, write time, crops/s and the memmap ratio."""

from __future__ import annotations

from pathlib import Path

import pytest

from cropbench import metrics as m
from cropbench.cli import main
from cropbench.errors import ConfigError
from cropbench.harness.context import RunContext
from cropbench.harness.runner import run_tracks
from cropbench.records import Record, parse_record, read_records
from cropbench.tracks.layouts import LayoutComparison, Layouts


def test_rows_carry_sizes_throughputs_amplification_and_ratios(tiny_plate: Path, tmp_path: Path) -> None:
    comparison = LayoutComparison(
        layouts=("tiles-zstd", "tiff-zlib", "sharded-none"), samples=60, warmup=10, repeats=2, crop_size=32
    )
    emitted: list[Record] = []
    records = run_tracks([Layouts(comparison, tmp_path / "work")], "smoke", RunContext(tiny_plate), emitted.append)
    assert (
        [r.case for r in records] == ["memmap", "tiles-zstd", "tiff-zlib", "sharded-none"] == [r.case for r in emitted]
    )
    by_case = {r.case: r.metrics for r in records}
    assert by_case["memmap"][m.ratio_to_memmap("random")] == 1.0
    assert by_case["memmap"][m.COMPRESSION_RATIO] == pytest.approx(1.0, rel=0.01)
    assert by_case["tiles-zstd"][m.COMPRESSION_RATIO] > 1.0
    for metrics in by_case.values():
        assert metrics[m.access_crops_per_s_key("random")] > 0 and metrics[m.access_crops_per_s_key("grouped")] > 0
        assert metrics[m.ratio_to_memmap("random")] == pytest.approx(
            metrics[m.access_crops_per_s_key("random")] / by_case["memmap"][m.access_crops_per_s_key("random")]
        )
        assert metrics[m.WRITE_SECONDS] > 0 and metrics[m.STORED_BYTES] > 0
        lowest, highest = m.access_crops_per_s_spread_keys("random")
        assert metrics[lowest] <= metrics[m.access_crops_per_s_key("random")] <= metrics[highest]
        assert m.per_crop("random", m.DECODE_AMPLIFICATION) in metrics
        assert m.per_crop("grouped", m.CHUNKS_TOUCHED_PER_CROP) in metrics
    assert records[1].config["layout_label"] == "call-yx256-zstd" and records[0].track == "layouts"
    assert not (tmp_path / "work").exists(), "converted plates, and the work folder this run made, are removed"


def test_bad_comparisons_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="layout"):
        LayoutComparison(layouts=("nope",))
    with pytest.raises(ConfigError, match="samples"):
        LayoutComparison(samples=0)


def test_cli_writes_rows_csv_and_the_figure(
    tiny_plate: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    code = main(
        [
            "compare-layouts",
            "--plate",
            str(tiny_plate),
            "--layout",
            "tiff",
            "--out",
            str(out),
            "--samples",
            "40",
            "--warmup",
            "5",
            "--repeats",
            "1",
            "--keep",
            "--no-progress",
        ]
    )
    assert code == 0
    assert [r.case for r in read_records(out / "results.jsonl")] == ["memmap", "tiff"]
    assert (out / "results.csv").is_file() and (out / "plots" / "layouts_comparison.png").is_file()
    assert (out / "plates" / "tiff" / "cropbench_layout.json").is_file()
    printed = capsys.readouterr().out
    assert "× memmap" in printed
    verdict = printed[printed.index("\nVerdict") :]
    assert "track layouts (storage layouts): best tiff" in verdict, "it ends in the same verdict block as run"
    assert "the memory-mapped raw plate" in verdict


def test_without_keep_a_run_removes_only_what_it_wrote(tiny_plate: Path, tmp_path: Path) -> None:
    work, out = tmp_path / "work", tmp_path / "out"
    args = ["compare-layouts", "--plate", str(tiny_plate), "--layout", "tiff", "--work", str(work), "--out", str(out)]
    args += ["--samples", "20", "--warmup", "2", "--repeats", "1", "--crop-size", "32", "--no-progress"]
    assert main([*args, "--keep"]) == 0
    users = work / "tiff" / "notes.txt"
    users.write_text("a user's file beside a kept plate")
    kept = {name: sorted(p.name for p in (work / name).iterdir()) for name in ("memmap", "tiff")}
    assert main(args) == 0
    assert users.read_text() == "a user's file beside a kept plate"
    assert {name: sorted(p.name for p in (work / name).iterdir()) for name in ("memmap", "tiff")} == kept
    assert sorted(p.name for p in work.iterdir()) == ["memmap", "tiff"], "the run's own copies are gone"
    lines = (out / "results.jsonl").read_text().splitlines()
    assert [parse_record(line).case for line in lines] == ["memmap", "tiff"] * 2
