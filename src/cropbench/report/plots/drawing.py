"""What every figure draws the same way: flagged rows, bars on axes from zero, log axes, the saved file.

Every figure treats flagged rows (validity flags, see :mod:`cropbench.harness.flags`) the same way:
grey and hatched, with a legend entry saying they are not measurements to quote. Bars lie on linear
axes from zero, so their lengths compare; log axes are kept for lines across decades (latency CDFs,
warm-up curves).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.container import BarContainer
from matplotlib.patches import Patch
from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

from cropbench.records import Record

#: Draws one figure from the rows into a folder; returns the file, or None when the rows hold nothing for it.
FigureMaker = Callable[[Sequence[Record], Path], Path | None]
#: The ten colours of matplotlib's default cycle.
TAB10 = [plt.get_cmap("tab10")(number) for number in range(10)]

#: How every figure draws a flagged row: grey, hatched, with this legend entry.
FLAGGED_COLOR = "lightgray"
FLAGGED_EDGE = "gray"
FLAGGED_HATCH = "///"
FLAGGED_NOTE = "grey, hatched: flagged (see the summary), not a measurement to quote"
#: Hatches drawn in a series' colour need a wider line than matplotlib's default to be seen.
plt.rcParams["hatch.linewidth"] = 1.2
#: Labels come from rows (case names, config values): a ``$`` in one is drawn, never typeset as mathtext.
plt.rcParams["text.parse_math"] = False


def flagged_handle() -> Patch:
    """The legend entry of flagged rows, the same in every figure."""
    return Patch(facecolor=FLAGGED_COLOR, edgecolor=FLAGGED_EDGE, hatch=FLAGGED_HATCH, label=FLAGGED_NOTE)


def horizontal_bars(
    axis: plt.Axes, positions: Any, values: Sequence[float], color: str, marked: Sequence[bool], **kwargs: Any
) -> BarContainer:
    """Horizontal bars in ``color``; the ``marked`` (flagged) ones grey, hatched in ``color`` (so two
    series stay told apart)."""
    bars = axis.barh(positions, values, color=[FLAGGED_COLOR if mark else color for mark in marked], **kwargs)
    for bar, mark in zip(bars.patches, marked, strict=True):
        if mark:
            bar.set_hatch(FLAGGED_HATCH)
            bar.set_edgecolor(color)
            bar.set_linewidth(0.5)
    return bars


def axis_from_zero(axis: plt.Axes, values: Sequence[float], room: float = 1.08) -> None:
    """A linear x axis from zero to a little past the largest finite value, in plain numbers."""
    axis.set_xscale("linear")
    finite = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    axis.set_xlim(0.0, max(max(finite, default=1.0), 1e-9) * room)
    formatter = ScalarFormatter(useOffset=False)
    formatter.set_scientific(False)
    axis.xaxis.set_major_formatter(formatter)


def log_x_axis(axis: plt.Axes) -> None:
    """A log x axis ticked at 1, 2 and 5 per decade in plain numbers (0.5, 1, 2, 5, 10, ...)."""
    axis.set_xscale("log")
    axis.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.xaxis.set_major_formatter(ScalarFormatter())
    axis.xaxis.set_minor_formatter(NullFormatter())


def save_figure(figure: plt.Figure, path: Path) -> Path:
    """Lay the figure out, write it to ``path`` and free it."""
    figure.tight_layout()
    figure.savefig(path, dpi=110, bbox_inches="tight")  # legends placed beside or under the axes included
    plt.close(figure)
    return path
