"""Records → figures. One function per figure; :func:`plot_results` draws all that the records allow.

One module per job: what every figure draws the same way (``drawing``: flagged rows, bars on axes
from zero, log axes, saving), which rows are drawn and how they are named (``rows``), and the figures
of Track 1, Track 2, Track 3 and the comparisons (layouts, peers). Which track draws which figures is
said in the table of tracks' reports (:data:`cropbench.report.tracks.REPORTS`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before a figure module imports pyplot: figures are written to files, never shown

from cropbench.errors import OutputError  # noqa: E402
from cropbench.harness.flags import flagged  # noqa: E402
from cropbench.records import Record  # noqa: E402
from cropbench.report.plots.comparisons import layouts_comparison, peers_comparison  # noqa: E402
from cropbench.report.plots.drawing import (  # noqa: E402
    FLAGGED_COLOR,
    FLAGGED_EDGE,
    FLAGGED_HATCH,
    FLAGGED_NOTE,
    TAB10,
    FigureMaker,
    axis_from_zero,
    flagged_handle,
    horizontal_bars,
    log_x_axis,
    save_figure,
)
from cropbench.report.plots.rows import (  # noqa: E402
    describe_loading,
    drawable,
    label_runs,
    latest_runs,
    row_label,
    rows_of,
    runs_in,
)
from cropbench.report.plots.track1 import rolling_median, steady_from, track1_bars, track1_cdf, track1_warmup  # noqa: E402
from cropbench.report.plots.track2 import sweep_key, track2_first_batch, track2_scaling  # noqa: E402
from cropbench.report.plots.track3 import flagged_workers, track3_bars, track3_workers  # noqa: E402
from cropbench.report.tracks import REPORTS  # noqa: E402

#: Every figure maker, by its name: what a track's ``figures`` in :data:`cropbench.report.tracks.REPORTS`
#: name, in the order that table gives.
FIGURE_MAKERS: dict[str, FigureMaker] = {
    maker.__name__: maker
    for maker in (
        track1_bars,
        track1_cdf,
        track1_warmup,
        track2_scaling,
        track2_first_batch,
        track3_bars,
        track3_workers,
        layouts_comparison,
        peers_comparison,
    )
}


def plot_results(records: Sequence[Record], out_dir: str | Path, all_runs: bool = False) -> list[Path]:
    """Draw every figure the records allow into ``out_dir``; returns the files written.

    By default each track's figures show its latest run only; ``all_runs`` overlays every run,
    each row labelled with its run id (never averaged across runs).
    """
    destination = Path(out_dir)
    try:
        destination.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OutputError(f"cannot create plot directory {destination}: {error.strerror or error}") from error
    if not records:
        raise OutputError("no records to plot")
    chosen = drawable(label_runs(records) if all_runs else latest_runs(records))
    if not chosen:
        raise OutputError(f"none of the {len(records)} records holds the metrics a figure draws")
    makers = [FIGURE_MAKERS[name] for report in REPORTS.values() for name in report.figures]
    return [path for maker in makers if (path := maker(chosen, destination)) is not None]


__all__ = [
    "FIGURE_MAKERS",
    "FLAGGED_COLOR",
    "FLAGGED_EDGE",
    "FLAGGED_HATCH",
    "FLAGGED_NOTE",
    "TAB10",
    "FigureMaker",
    "axis_from_zero",
    "describe_loading",
    "drawable",
    "flagged",
    "flagged_handle",
    "flagged_workers",
    "horizontal_bars",
    "label_runs",
    "latest_runs",
    "layouts_comparison",
    "log_x_axis",
    "peers_comparison",
    "plot_results",
    "rolling_median",
    "row_label",
    "rows_of",
    "runs_in",
    "save_figure",
    "steady_from",
    "sweep_key",
    "track1_bars",
    "track1_cdf",
    "track1_warmup",
    "track2_first_batch",
    "track2_scaling",
    "track3_bars",
    "track3_workers",
]
