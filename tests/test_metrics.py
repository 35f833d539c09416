"""Every metric the summary table and the figures read is produced by the smoke preset's rows, and
every metric a row holds is named in ``cropbench.metrics``."""

from __future__ import annotations

from pathlib import Path

import pytest

import cropbench
from cropbench import metrics
from cropbench.report.tracks import report_of
from cropbench.tracks import TRACKS
from cropbench.tracks.layouts import LayoutComparison, Layouts


@pytest.mark.slow
def test_smoke_rows_hold_every_metric_the_summary_and_figures_read(tiny_plate: Path, tmp_path: Path) -> None:
    layouts = Layouts(LayoutComparison(layouts=("tiles-blosc-lz4",), samples=40, warmup=5, repeats=1), tmp_path)
    runnable = [info for info in TRACKS.values() if info.runner_class is not None]
    records = cropbench.run(tiny_plate, [*(info.name for info in runnable), layouts], "smoke", samples=40)
    produced: dict[str, set[str]] = {}
    for record in records:
        produced.setdefault(record.track, set()).update(record.metrics)
    for track in [*(info.name for info in runnable), layouts.name]:
        report = report_of(track)
        read = {key for _, key, _ in report.columns} | set(report.figure_metrics)
        missing = sorted(read - metrics.CONDITIONAL - produced.get(track, set()))
        assert not missing, f"track {track}: the report reads {missing}, which no smoke row holds"
        unnamed = sorted(key for key in produced.get(track, set()) if not metrics.catalogued(key))
        assert not unnamed, f"track {track} writes {unnamed}, which cropbench.metrics does not name"


def test_the_catalogue_names_families_and_nothing_else() -> None:
    assert metrics.catalogued(metrics.prefixed(metrics.COMPUTE_ONLY, metrics.prefixed(metrics.WAIT, metrics.P95_MS)))
    assert metrics.catalogued(metrics.per_crop("grouped", metrics.DECODE_AMPLIFICATION))
    assert metrics.catalogued(metrics.access_crops_per_s_spread_keys("random")[1]) and metrics.catalogued(
        metrics.stage_ms("fetch")
    )
    assert not metrics.catalogued("samples_per_second") and not metrics.catalogued("io_samples_per_second")
    with pytest.raises(KeyError):
        metrics.stage_ms("unpack")
