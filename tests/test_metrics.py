"""Every metric the summary table and the figures read is produced by the smoke preset's rows."""

from __future__ import annotations

from pathlib import Path

import pytest

import cropbench
from cropbench import metrics
from cropbench.report.plots import FIGURE_METRICS
from cropbench.report.summary import SUMMARY_COLUMNS
from cropbench.tracks import TRACKS
from cropbench.tracks.layouts import LayoutComparison, Layouts


@pytest.mark.slow
def test_smoke_rows_hold_every_metric_the_summary_and_figures_read(tiny_plate: Path, tmp_path: Path) -> None:
    layouts = Layouts(LayoutComparison(layouts=("tiles-blosc-lz4",), samples=40, warmup=5, repeats=1), tmp_path)
    records = cropbench.run(tiny_plate, [*TRACKS, layouts], "smoke", samples=40)
    produced: dict[str, set[str]] = {}
    for record in records:
        produced.setdefault(record.track, set()).update(record.metrics)
    for track in [*TRACKS, layouts.name]:
        read = {key for _, key, _ in SUMMARY_COLUMNS.get(track, ())} | set(FIGURE_METRICS.get(track, ()))
        missing = sorted(read - metrics.CONDITIONAL - produced.get(track, set()))
        assert not missing, f"track {track}: the report reads {missing}, which no smoke row holds"
