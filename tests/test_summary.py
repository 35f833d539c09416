"""Summary tables: every row names its run and shows its validity flags, explained under the table."""

from __future__ import annotations

from cropbench import metrics as m
from cropbench.harness.flags import decide
from cropbench.records import Record
from cropbench.report.summary import summary_table


def row(case: str, run_id: str, flags: list[str] | None) -> Record:
    metrics = {m.SAMPLES_PER_S: 1000.0, m.P50_MS: 0.5, m.COUNT: 200, m.OBJECTS: 320}
    if flags is not None:
        metrics[m.VALIDITY_FLAGS] = flags
    return Record(track="dataset", case=case, config={}, metrics=metrics, environment={}, run_id=run_id)


def test_rows_show_their_run_and_flags_with_a_legend() -> None:
    table = summary_table([row("random/direct", "run-a", []), row("random/zarr", "run-b", ["cache>=plate"])])
    lines = table.splitlines()
    assert "run" in lines[0] and "flags" in lines[0]
    assert "run-a" in lines[2] and lines[2].rstrip().endswith("ok")
    assert "run-b" in lines[3] and "cache>=plate" in lines[3]
    assert any(line.strip().startswith("cache>=plate: ") and "cache hits" in line for line in lines[4:])


def test_no_legend_without_flags_and_rows_without_flags_print_a_dash() -> None:
    table = summary_table([row("random/direct", "run-a", [])])
    assert "flags (" not in table
    assert summary_table([row("old", "run-a", None)]).splitlines()[2].rstrip().endswith("-")


def test_a_track3_row_with_a_negative_stall_is_written_impossible_and_the_table_reads_it() -> None:
    metrics = {m.STALL_CROSSCHECK: -0.29, m.DATA_WAIT_FRACTION: 0.01, m.VALIDITY_FLAGS: []}
    measured = Record(
        track="training", case="resnet18/train", config={}, metrics=metrics, environment={}, run_id="run-a"
    )
    assert summary_table([measured]).splitlines()[2].rstrip().endswith("ok"), "the table decides no flag"
    lines = summary_table([decide(measured)]).splitlines()  # as the runner writes it
    assert lines[2].rstrip().endswith("impossible") and any(line.strip().startswith("impossible: ") for line in lines)


def test_the_new_tracks_show_their_own_columns() -> None:
    def one(track: str, **metrics: object) -> Record:
        return Record(track=track, case="case", config={}, metrics=metrics, environment={}, run_id="run-a")

    ratio = {m.RATIO_MEDIAN: 0.21, m.RATIO_Q1: 0.2, m.RATIO_Q3: 0.23, m.PAIRED_BLOCKS: 48, m.CEILING_THREADS: 2}
    targets = summary_table([one("targets", **ratio, **{m.VALIDITY_FLAGS: []})]).splitlines()
    assert all(title in targets[0] for title in ("ratio", "q1", "q3", "blocks", "ceiling threads", "same bytes"))
    assert targets[2].split()[2:] == ["-", "0.210", "0.200", "0.230", "48", "2", "-", "ok"]
    remote = {m.SAMPLES_PER_S: 321.5, m.RATIO_TO_LOCAL: 0.25, m.REQUESTS_PER_CROP: 1.5}
    assert summary_table([one("remote", **remote)]).splitlines()[2].split()[2:5] == ["321.5", "0.250", "1.50"]
    layouts = {
        m.STORED_MIB: 12.0,
        "direct_requests_per_crop": 1.0,
        "direct_samples_per_s": 50.0,
        "zarr_samples_per_s": 5.0,
    }
    row = summary_table([one("store-layouts", **layouts)]).splitlines()[2].split()[2:]
    assert row[:3] == ["12.0", "1.00", "50.0"] and row[5] == "5.0"


def test_a_skipped_peers_reason_sits_under_the_table_not_in_a_column() -> None:
    reason = "spatialdata cannot be imported (No module named 'spatialdata'); " + "its pins conflict " * 10
    rows = [
        Record(
            track="peers",
            case="cropbench-direct/96px/all",
            config={},
            metrics={m.SAMPLES_PER_S: 900.0, m.COUNT: 300, m.VALIDITY_FLAGS: []},
            environment={},
        ),
        Record(
            track="peers",
            case="spatialdata-tiles/96px/all",
            config={},
            metrics={m.SKIPPED: True, m.SKIP_REASON: reason},
            environment={},
        ),
    ]
    table = summary_table(rows)
    widths = [len(line) for line in table.splitlines() if "/96px/all" in line and ":" not in line]
    assert len(widths) == 2 and max(widths) < 140, "a reason in a column padded every row to its length"
    assert f"  spatialdata-tiles/96px/all: {reason}" in table.splitlines()
    assert "flags" in table.splitlines()[0], "peer rows show their flags like every track"
