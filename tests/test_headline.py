"""The headline table: rendered from track targets' rows (median over runs of each run's median, the
lowest and highest run, impossible ratios to the ceiling marked), written between two markers in one
docs page, and the page's block is the rendering of the committed rows, never typed."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import cropbench
from cropbench import metrics as m
from cropbench.cli import main
from cropbench.errors import OutputError
from cropbench.records import Record, RecordWriter
from cropbench.report.headline import (
    END,
    PAGE,
    ROWS_FOLDER,
    START,
    block,
    current_block,
    describe_tuning,
    headline,
    read_rows,
    regenerate,
    replace_block,
)
from cropbench.tracks.targets import IMPOSSIBLE, ceiling_name, direct_name

ROOT = Path(__file__).resolve().parents[1]
MACHINE = {
    "cpu_model": "Test CPU",
    "cpu_logical": 2,
    "cpu_affinity": 2,
    "ram_bytes": 24 * 2**30,
    "os": "Linux 6.1",
    "machine": "x86_64",
    "cropbench_commit": "0123456789abcdef",
}
CEILING_TUNING = {"threads": 1, "batch": 64, "copy": "C, GIL released"}
TENSORSTORE_TUNING = {
    "context": {
        "cache_pool": {"total_bytes_limit": 44 * 2**20},
        "data_copy_concurrency": {"limit": 2},
        "file_io_concurrency": {"limit": 2},
    },
    "mode": "batch",
    "reads_in_flight": 64,
}


def ratio_row(
    run: str,
    access: str,
    threads: int,
    reference: str,
    median: float,
    repeat: int = 0,
    flags: list[str] | None = None,
    environment: dict[str, Any] | None = None,
) -> Record:
    """A ratio row as track targets writes it (the direct reader at ``threads`` over ``reference``)."""
    ceiling = reference.startswith("ceiling-")
    metrics: dict[str, Any] = {m.RATIO_MEDIAN: median, m.RATIO_MIN: median / 2, m.RATIO_MAX: median * 2}
    if ceiling:
        metrics[m.CEILING_THREADS] = int(reference.removeprefix("ceiling-").removesuffix("t"))
        metrics[m.VALIDITY_FLAGS] = flags or []
    config = {
        "plate": "data/full.zarr",
        "layout": "default",
        "access": access,
        "reader_name": direct_name(threads),
        "reference_name": reference,
        "reader": {"decode_threads": threads, "chunk_cache_bytes": 44 * 2**20, "batch": 64},
        "reference": {**CEILING_TUNING, "threads": threads} if ceiling else TENSORSTORE_TUNING,
    }
    return Record(
        track="targets",
        case=f"{access}/{direct_name(threads)}/over/{reference}",
        config=config,
        metrics=metrics,
        environment=environment or MACHINE,
        repeat=repeat,
        run_id=run,
    )


def summary_row(run: str, access: str, start: float, end: float, repeat: int = 0) -> Record:
    config = {"plate": "data/full.zarr", "layout": "default", "access": access, "objects": 3072, "block": 192}
    config |= {"rounds": 3, "batch": 64, "crop_size": 96}
    metrics = {
        m.LOADAVG_START: [start, 0.0, 0.0],
        m.LOADAVG_END: [end, 0.0, 0.0],
        m.CHUNK_CACHE_FRACTION_OF_PLATE: 0.25,
    }
    return Record("targets", access, config, metrics, MACHINE, repeat=repeat, run_id=run)


def table_line(text: str, reader: str, reference: str) -> str:
    """The table line of the direct reader at ``reader`` over ``reference`` (its name in backticks)."""
    found = [line for line in text.splitlines() if line.startswith(f"| {reader} |") and f"`{reference}`" in line]
    assert len(found) == 1, text
    return found[0]


def test_a_cell_is_the_median_over_runs_of_each_runs_median_with_the_lowest_and_highest_run() -> None:
    rows = [
        *(ratio_row("a", "random", 1, "ceiling-1t", v, repeat=r) for r, v in enumerate((0.2, 0.3, 0.25))),
        *(ratio_row("b", "random", 1, "ceiling-1t", v, repeat=r) for r, v in enumerate((0.1, 0.12))),
        ratio_row("c", "random", 1, "ceiling-1t", 0.4),
        summary_row("a", "random", 0.5, 1.25),
        summary_row("b", "random", 0.75, 0.6),
        summary_row("c", "random", 2.0, 0.9),
    ]
    text = headline(rows)
    line = table_line(text, "1 decode thread", "ceiling-1t")
    # run a: 0.25, run b: 0.11, run c: 0.4 -> median 0.25, lowest 0.11, highest 0.40
    assert "the copy ceiling at 1 thread" in line
    assert line.endswith("| 0.25 (0.11–0.40) |"), line
    assert "3 runs of `cropbench run --track targets` (1–3 repeats each)" in text
    assert "1-minute load average 0.50–2.00" in text
    assert "commit `0123456`" in text and "Test CPU, 2 usable of 2 logical cores, 24 GiB, x86_64, Linux 6.1;" in text
    assert "3,072 crops of 96 px in blocks of 192, 3 rounds, batches of 64" in text and "at 25% of" in text
    assert "`full.zarr` plate (default layout)" in text and "data/" not in text


def test_a_ratio_to_the_ceiling_above_one_is_marked_impossible_whether_or_not_the_row_says_so() -> None:
    rows = [
        ratio_row("a", "random", 2, "ceiling-2t", 1.2, flags=[IMPOSSIBLE]),
        ratio_row("b", "random", 2, "ceiling-2t", 1.1),  # written without the flag: still impossible
        ratio_row("c", "random", 2, "ceiling-2t", 0.9),
        ratio_row("a", "grouped", 2, "ceiling-2t", 0.5),
        ratio_row("a", "random", 2, "tensorstore-batch", 1.8),  # above 1 over a peer: the direct reader is faster
    ]
    text = headline(rows)
    ceiling = table_line(text, "2 decode threads", "ceiling-2t")
    assert f"| 1.10 (0.90–1.20), **{IMPOSSIBLE}** in 2 of 3 rows | 0.50 (0.50–0.50) in 1 of 3 runs |" in ceiling, (
        ceiling
    )
    assert "the copy ceiling at 2 threads" in ceiling and "threads 2" in ceiling
    peer = table_line(text, "2 decode threads", "tensorstore-batch")
    assert IMPOSSIBLE not in peer and "| 1.80 (1.80–1.80) in 1 of 3 runs | – |" in peer, peer
    assert "data_copy_concurrency 2, file_io_concurrency 2" in peer and "cache_pool 44 MiB" in peer


def test_rows_order_ceilings_first_then_each_peer_and_say_what_a_run_lacks() -> None:
    rows = [
        ratio_row("a", "grouped", 1, "tensorstore-futures", 2.0),
        ratio_row("a", "random", 2, "ceiling-2t", 0.3),
        ratio_row("a", "random", 1, "ceiling-1t", 0.2),
        ratio_row("b", "random", 1, "ceiling-1t", 0.2),
        ratio_row("a", "random", 1, "tensorstore-futures", 1.5),
    ]
    lines = [line for line in headline(rows).splitlines() if line.startswith("| ")]
    assert lines[0] == "| `direct`, batched | over | the reference's tuning | random | grouped |"
    assert ["ceiling-1t" in lines[2], "ceiling-2t" in lines[3], "tensorstore-futures" in lines[4]] == [True] * 3
    assert "0.30 (0.30–0.30) in 1 of 2 runs" in lines[3]
    assert lines[4].endswith("| 1.50 (1.50–1.50) in 1 of 2 runs | 2.00 (2.00–2.00) in 1 of 2 runs |")


def test_crops_that_are_not_the_direct_readers_are_named() -> None:
    reader = Record(
        "targets",
        "random/tensorstore-batch",
        {"reader_name": "tensorstore-batch", "case": {"access": "random"}},
        {m.CROPS_PER_S: 100.0, m.IDENTICAL_TO_DIRECT: False},
        MACHINE,
        run_id="a",
    )
    text = headline([reader, ratio_row("a", "random", 1, "tensorstore-batch", 2.0)])
    assert "**not the same crops**" in table_line(text, "1 decode thread", "tensorstore-batch")


def test_rows_of_two_machines_or_without_ratios_are_refused_and_no_rows_quote_nothing() -> None:
    other = {**MACHINE, "cpu_model": "Other CPU"}
    with pytest.raises(OutputError, match="2 machines"):
        headline(
            [
                ratio_row("a", "random", 1, "ceiling-1t", 0.2),
                ratio_row("b", "random", 1, "ceiling-1t", 0.2, environment=other),
            ]
        )
    with pytest.raises(OutputError, match="no ratio"):
        headline([summary_row("a", "random", 0.5, 0.5)])
    kernels = [ratio_row("a", "random", 1, "ceiling-1t", 0.2), ratio_row("b", "random", 1, "ceiling-1t", 0.3)]
    kernels[1] = replace(kernels[1], environment={**MACHINE, "os": "Linux 6.2"})
    assert "x86_64, systems: Linux 6.1; Linux 6.2;" in headline(kernels), "an updated kernel is the same machine"
    assert "each case not recorded" in headline(kernels), "rows without the case's summary say so"
    empty = headline([])
    assert "No rows in `measurements/targets/` yet" in empty and "|" not in empty and not re.search(r"\d\.\d", empty)


def test_the_tuning_is_named_by_each_setting() -> None:
    assert describe_tuning(TENSORSTORE_TUNING) == (
        "cache_pool 44 MiB, data_copy_concurrency 2, file_io_concurrency 2, mode batch, reads_in_flight 64"
    )
    assert describe_tuning({"async.concurrency": 2, "zarr": "3.1.6"}) == "async.concurrency 2, zarr 3.1.6"


def test_the_block_replaces_only_what_lies_between_the_markers() -> None:
    page = f"# Page\n\nbefore\n\n{START}\n| typed | 0.99 |\n{END}\n\nafter\n"
    rows = [ratio_row("a", "random", 1, "ceiling-1t", 0.2)]
    new = replace_block(page, block(rows), "page.md")
    assert new.startswith("# Page\n\nbefore\n\n") and new.endswith("\n\nafter\n")
    assert current_block(new, "page.md") == block(rows) and "0.99" not in new
    for broken in ("no markers", f"{START}\n{END}\n{START}\n{END}", f"{END}\n{START}"):
        with pytest.raises(OutputError, match=r"page\.md"):
            replace_block(broken, block(rows), "page.md")


def write_rows(path: Path, records: list[Record]) -> None:
    with RecordWriter(path) as writer:
        for record in records:
            writer.write(record)


def test_rows_are_read_from_every_jsonl_under_the_folder_keeping_track_targets(tmp_path: Path) -> None:
    write_rows(tmp_path / "run-1" / "results.jsonl", [ratio_row("a", "random", 1, "ceiling-1t", 0.2)])
    write_rows(tmp_path / "run-2.jsonl", [ratio_row("b", "random", 1, "ceiling-1t", 0.3)])
    write_rows(tmp_path / "other.jsonl", [Record("dataset", "random/direct", {}, {m.SAMPLES_PER_S: 1.0}, MACHINE)])
    rows = read_rows(tmp_path)
    assert sorted(r.metrics[m.RATIO_MEDIAN] for r in rows) == [0.2, 0.3]
    assert len({r.run_id for r in rows}) == 2, "each writer is one run"
    assert read_rows(tmp_path / "missing") == []


def test_the_command_rewrites_the_block_in_place_and_checks_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows, page = tmp_path / "rows", tmp_path / "page.md"
    write_rows(rows / "run-1" / "results.jsonl", [ratio_row("a", "random", 1, "ceiling-1t", 0.2)])
    page.write_text(f"text\n{START}\n| typed | 0.50 |\n{END}\n", encoding="utf-8")
    arguments = ["--rows", str(rows), "--page", str(page)]
    assert main(["headline", *arguments, "--check"]) == 1
    assert main(["headline", *arguments]) == 0 and "0.20 (0.20–0.20)" in page.read_text(encoding="utf-8")
    assert main(["headline", *arguments, "--check"]) == 0
    assert not regenerate(rows, page, str(rows)), "a current page is left as it is"
    assert main(["headline", "--rows", str(tmp_path / "nothing"), "--page", str(page)]) == 2
    assert capsys.readouterr().err.strip() == f"cropbench: error: --rows {tmp_path / 'nothing'} does not exist"


def test_the_table_renders_the_rows_the_track_writes(tiny_plate: Path, tmp_path: Path) -> None:
    records = cropbench.run(tiny_plate, ["targets"], "smoke", tmp_path, samples=64)
    text = headline(read_rows(tmp_path))
    for threads in (1, 2):
        line = table_line(text, f"{threads} decode thread{'s' if threads > 1 else ''}", ceiling_name(threads))
        assert re.search(r"\| \d+\.\d\d \(\d+\.\d\d–\d+\.\d\d\)[^|]* \| \d+\.\d\d \(", line), line
    assert "1 run of `cropbench run --track targets` (1 repeat each)" in text
    assert len(records) == len(read_rows(tmp_path))


def markdown_pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_one_page_alone_holds_the_headline_and_the_readme_links_to_it() -> None:
    holding = [page.relative_to(ROOT).as_posix() for page in markdown_pages() if START in page.read_text("utf-8")]
    assert holding == [PAGE], "no figure is typed in two places"
    assert "docs/results/decode-paths.md#the-headline-ratios" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_docs_headline_is_the_rendering_of_the_committed_rows() -> None:
    rows = read_rows(ROOT / ROWS_FOLDER)
    page = (ROOT / PAGE).read_text(encoding="utf-8")
    if not rows:
        assert current_block(page, PAGE) == block([]), f"{PAGE} quotes figures without rows: run cropbench headline"
        pytest.skip(f"no committed rows in {ROWS_FOLDER}/ yet: the page's block says so until they are measured")
    assert current_block(page, PAGE) == block(rows), (
        f"{PAGE}'s headline table is not the rendering of {ROWS_FOLDER}/: run cropbench headline"
    )
