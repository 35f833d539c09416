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


def ratio_settled(median: float, q1: float, q3: float) -> bool:
    """Whether a paired ratio tells its two options apart: its spread (``q3 - q1``) is below its gap from
    a tie (``|median - 1|``). Otherwise the noise of the rounds is as large as the difference."""
    return bool(q3 - q1 < abs(median - 1.0))


def supply_needed(demand: float, workers: int, threshold: float) -> float:
    """Crops/s a loader must deliver so that a model consuming ``demand`` images/s waits for data less than
    ``threshold`` of its time.

    With workers the loader works beside the model, so the model waits only for what the loader falls
    short of (:func:`predicted_data_wait`); without workers the main process reads between steps and the
    model waits for every batch."""
    return demand * (1.0 - threshold) / (1.0 if workers else threshold)


def predicted_data_wait(supply: float, demand: float, workers: int) -> float:
    """The share of a step spent waiting for data, predicted from the loader's crops/s alone (``supply``)
    and the model's compute-only images/s (``demand``): ``1 - supply / demand`` where workers load beside the
    model and fall short, ``demand / (supply + demand)`` where the main process loads between steps."""
    if workers:
        return max(0.0, 1.0 - supply / demand)
    return demand / (supply + demand)


def predicted_images_per_s(supply: float, demand: float, workers: int) -> float:
    """Images/s of the loop predicted as :func:`predicted_data_wait` predicts its wait: the slower of the
    two beside each other (workers), or one after the other (no workers)."""
    if workers:
        return min(supply, demand)
    return 1.0 / (1.0 / supply + 1.0 / demand)
