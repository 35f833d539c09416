"""Ratios of two readers timed block by block in turns, so both see the same machine."""

from __future__ import annotations

from typing import Any

import numpy as np

from cropbench import metrics as m


def paired_ratios(reader_seconds: np.ndarray, reference_seconds: np.ndarray) -> dict[str, Any]:
    """The reader's rate over the reference's, block by block (reference seconds over reader seconds on
    the same blocks): the median with quartiles and extremes."""
    ratios = np.asarray(reference_seconds, dtype=np.float64).ravel() / np.maximum(
        np.asarray(reader_seconds, dtype=np.float64).ravel(), 1e-12
    )
    q1, median, q3 = np.percentile(ratios, [25, 50, 75])
    return {
        m.RATIO_MEDIAN: float(median),
        m.RATIO_Q1: float(q1),
        m.RATIO_Q3: float(q3),
        m.RATIO_MIN: float(ratios.min()),
        m.RATIO_MAX: float(ratios.max()),
        m.PAIRED_BLOCKS: int(ratios.size),
    }
