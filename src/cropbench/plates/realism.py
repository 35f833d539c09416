"""Does synthetic data behave like real Cell Painting? Compare compressibility and intensity stats.

zlib level 1 is the yardstick: it is the ratio Cell Painting storage discussions and the literature quote, and it moves
with the same things that move blosc and zstd (noise floor, background share, texture).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cropbench.config import PlateSpec
from cropbench.errors import ImportInputError
from cropbench.plates.synthetic import render_field


@dataclass(frozen=True)
class RealismStats:
    """Per-image statistics, summarised over a set of images."""

    source: str
    images: int
    zlib1_ratio_mean: float
    zlib1_ratio_min: float
    zlib1_ratio_max: float
    median_intensity: float
    p99_intensity: float
    distinct_values_per_image: float


def zlib1_ratio(pixels: np.ndarray) -> float:
    raw = np.ascontiguousarray(pixels).tobytes()
    return len(raw) / len(zlib.compress(raw, 1))


def summarise(source: str, planes: Iterable[np.ndarray]) -> RealismStats:
    ratios, medians, p99s, distinct = [], [], [], []
    for plane in planes:
        ratios.append(zlib1_ratio(plane))
        medians.append(float(np.median(plane)))
        p99s.append(float(np.percentile(plane, 99)))
        distinct.append(len(np.unique(plane)))
    if not ratios:
        raise ImportInputError(f"no images found for {source}")
    return RealismStats(
        source=source,
        images=len(ratios),
        zlib1_ratio_mean=float(np.mean(ratios)),
        zlib1_ratio_min=float(np.min(ratios)),
        zlib1_ratio_max=float(np.max(ratios)),
        median_intensity=float(np.median(medians)),
        p99_intensity=float(np.median(p99s)),
        distinct_values_per_image=float(np.median(distinct)),
    )


def synthetic_stats(spec: PlateSpec, fields: int = 3) -> RealismStats:
    """Statistics of single-channel planes of the first ``fields`` synthetic fields."""
    planes = (plane for seed in range(fields) for plane in render_field(spec, seed).pixels)
    return summarise(f"synthetic ({spec.field_height}x{spec.field_width}, {spec.cells_per_field} cells)", planes)


def tiff_stats(folder: str | Path) -> RealismStats:
    """Statistics of every TIFF plane in ``folder`` (e.g. the NF1 Cell Painting subset)."""
    import tifffile

    files = sorted(p for p in Path(folder).glob("*.tif*"))
    return summarise(str(folder), (tifffile.imread(p) for p in files))
