"""Seeded synthetic Cell Painting fields: cells on background with optics and camera noise.

Random noise would make every codec and chunk-read result meaningless (it does not compress), so
each field is built the way a microscope sees it: irregular cells with a nucleus and cytoplasm,
channel-specific structures (chromatin, reticulum, nucleoli, membranes, mitochondria), blur,
uneven illumination, a camera offset, Poisson shot noise and Gaussian read noise, in uint16.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cropbench.config import PlateSpec

CAMERA_OFFSET = 100.0
READ_NOISE_SIGMA = 2.0
#: Photo-electrons per grey level: higher gain means less relative shot noise.
GAIN = 2.0


@dataclass(frozen=True)
class Cell:
    """One synthetic cell: centre, outer radius, nucleus radius and shape parameters."""

    center_y: float
    center_x: float
    radius: float
    nucleus_radius: float
    angle: float
    elongation: float
    harmonics: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class SyntheticField:
    """Pixels (C, Y, X) uint16 plus the cells they contain and their bounding boxes."""

    pixels: np.ndarray
    centers: np.ndarray  # (N, 2) float: centroid y, x
    boxes: np.ndarray  # (N, 4) int: y0, x0, y1, x1 (exclusive)


def box_blur(image: np.ndarray, radius: int) -> np.ndarray:
    """Separable box blur with edge clamping; two passes approximate a Gaussian PSF."""
    if radius <= 0:
        return image
    out = image.astype(np.float32, copy=True)
    width = 2 * radius + 1
    for axis in (0, 1):
        padded = np.concatenate(
            [
                np.repeat(np.take(out, [0], axis=axis), radius + 1, axis=axis),
                out,
                np.repeat(np.take(out, [-1], axis=axis), radius, axis=axis),
            ],
            axis=axis,
        )
        cumulative = np.cumsum(padded, axis=axis, dtype=np.float64)
        upper = np.take(cumulative, np.arange(width, cumulative.shape[axis]), axis=axis)
        lower = np.take(cumulative, np.arange(0, cumulative.shape[axis] - width), axis=axis)
        out = ((upper - lower) / width).astype(np.float32)
    return out


def smooth_noise(rng: np.random.Generator, shape: tuple[int, int], scale: int) -> np.ndarray:
    """Zero-mean, unit-variance texture with features about ``scale`` pixels wide."""
    coarse_shape = (shape[0] // scale + 2, shape[1] // scale + 2)
    coarse = rng.standard_normal(coarse_shape).astype(np.float32)
    fine = np.repeat(np.repeat(coarse, scale, axis=0), scale, axis=1)[: shape[0], : shape[1]]
    fine = box_blur(box_blur(fine, max(scale // 2, 1)), max(scale // 2, 1))
    fine -= fine.mean()
    std = float(fine.std())
    return fine / std if std > 0 else fine


def place_cells(rng: np.random.Generator, height: int, width: int, count: int) -> list[Cell]:
    """Scatter ``count`` cells with limited overlap, as in a sub-confluent well."""
    typical_radius = float(np.clip(np.sqrt(height * width / count / np.pi) * 0.75, 8.0, 28.0))
    cells: list[Cell] = []
    centers = np.empty((0, 2))
    attempts = 0
    while len(cells) < count:
        attempts += 1
        radius = float(typical_radius * rng.uniform(0.7, 1.3))
        center = rng.uniform([0, 0], [height, width])
        min_distance = radius * (1.2 if attempts < 40 * count else 0.4)
        if centers.size and np.min(np.hypot(*(centers - center).T)) < min_distance:
            continue
        harmonics = tuple((float(rng.uniform(0, 0.12) / k), float(rng.uniform(0, 2 * np.pi))) for k in (2, 3, 5))
        cells.append(
            Cell(
                center_y=float(center[0]),
                center_x=float(center[1]),
                radius=radius,
                nucleus_radius=radius * float(rng.uniform(0.35, 0.5)),
                angle=float(rng.uniform(0, np.pi)),
                elongation=float(rng.uniform(1.0, 1.6)),
                harmonics=harmonics,
            )
        )
        centers = np.vstack([centers, center])
    return cells


def _cell_masks(
    cell: Cell,
    height: int,
    width: int,
) -> tuple[tuple[slice, slice], np.ndarray, np.ndarray, np.ndarray]:
    """Soft cytoplasm and nucleus masks of one cell inside its clipped bounding box."""
    reach = int(np.ceil(cell.radius * cell.elongation * 1.3)) + 2
    y0, y1 = max(int(cell.center_y) - reach, 0), min(int(cell.center_y) + reach + 1, height)
    x0, x1 = max(int(cell.center_x) - reach, 0), min(int(cell.center_x) + reach + 1, width)
    yy, xx = np.mgrid[y0:y1, x0:x1].astype(np.float32)
    dy, dx = yy - cell.center_y, xx - cell.center_x
    cos, sin = np.cos(cell.angle), np.sin(cell.angle)
    u, v = (dx * cos + dy * sin) / cell.elongation, -dx * sin + dy * cos
    rho, theta = np.hypot(u, v), np.arctan2(v, u)
    boundary = np.ones_like(theta)
    for k, (amplitude, phase) in zip((2, 3, 5), cell.harmonics, strict=True):
        boundary += amplitude * np.cos(k * theta + phase)
    cytoplasm = np.clip((cell.radius * boundary - rho) / 2.0, 0.0, 1.0)
    nucleus_distance = np.hypot(u * cell.elongation * 0.8, v)
    nucleus = np.clip((cell.nucleus_radius * (0.5 + 0.5 * boundary) - nucleus_distance) / 1.5, 0.0, 1.0)
    return (slice(y0, y1), slice(x0, x1)), cytoplasm, nucleus, rho / max(cell.radius, 1.0)


def _structures(rng: np.random.Generator, height: int, width: int, cells: list[Cell]) -> dict[str, np.ndarray]:
    """Channel-independent maps from which every stain is mixed."""
    shape = (height, width)
    names = ("cytoplasm", "nucleus", "membrane", "perinuclear", "brightness")
    maps = {name: np.zeros(shape, np.float32) for name in names}
    for cell in cells:
        region, cytoplasm, nucleus, radial = _cell_masks(cell, height, width)
        maps["cytoplasm"][region] = np.maximum(maps["cytoplasm"][region], cytoplasm)
        maps["nucleus"][region] = np.maximum(maps["nucleus"][region], nucleus)
        ring = cytoplasm * (1.0 - cytoplasm) * 4.0
        maps["membrane"][region] = np.maximum(maps["membrane"][region], ring)
        maps["perinuclear"][region] = np.maximum(maps["perinuclear"][region], cytoplasm * np.exp(-radial * 2.0))
        brightness = float(rng.lognormal(0.0, 0.35))
        maps["brightness"][region] = np.where(cytoplasm > 0, brightness, maps["brightness"][region])
    return maps


def _spots(
    rng: np.random.Generator,
    shape: tuple[int, int],
    mask: np.ndarray,
    density: float,
    radius: int,
) -> np.ndarray:
    """Punctate structures (mitochondria, nucleoli) inside ``mask``."""
    seeds = (rng.random(shape, dtype=np.float32) < density).astype(np.float32) * mask
    return box_blur(box_blur(seeds, radius), radius) * (2 * radius + 1) ** 2 / 2.0


def _stain_generators() -> list[Callable[[np.random.Generator, dict[str, np.ndarray]], np.ndarray]]:
    def dna(rng: np.random.Generator, m: dict[str, np.ndarray]) -> np.ndarray:
        chromatin = 1.0 + 0.25 * smooth_noise(rng, m["nucleus"].shape, 3)
        return 6000.0 * m["nucleus"] * np.clip(chromatin, 0.3, None) * m["brightness"]

    def er(rng: np.random.Generator, m: dict[str, np.ndarray]) -> np.ndarray:
        reticulum = np.clip(1.0 + 0.6 * smooth_noise(rng, m["nucleus"].shape, 2), 0.0, None)
        return 1800.0 * (m["cytoplasm"] * 0.4 + m["perinuclear"] * 1.2) * reticulum * m["brightness"]

    def rna(rng: np.random.Generator, m: dict[str, np.ndarray]) -> np.ndarray:
        nucleoli = _spots(rng, m["nucleus"].shape, m["nucleus"], 0.004, 2)
        return 1200.0 * m["cytoplasm"] * m["brightness"] + 5000.0 * nucleoli

    def agp(rng: np.random.Generator, m: dict[str, np.ndarray]) -> np.ndarray:
        fibres = np.clip(1.0 + 0.8 * smooth_noise(rng, m["nucleus"].shape, 4), 0.0, None)
        return 2500.0 * m["membrane"] * m["brightness"] + 500.0 * m["cytoplasm"] * fibres

    def mito(rng: np.random.Generator, m: dict[str, np.ndarray]) -> np.ndarray:
        cytoplasm_only = m["cytoplasm"] * (1.0 - m["nucleus"])
        spots = _spots(rng, m["nucleus"].shape, cytoplasm_only, 0.02, 1)
        return 3000.0 * spots * m["brightness"] + 300.0 * m["perinuclear"]

    def brightfield(rng: np.random.Generator, m: dict[str, np.ndarray]) -> np.ndarray:
        texture = smooth_noise(rng, m["nucleus"].shape, 16)
        return 8000.0 - 1500.0 * m["membrane"] - 600.0 * m["nucleus"] + 100.0 * texture

    return [dna, er, rna, agp, mito, brightfield, er, mito]


def render_field(spec: PlateSpec, field_seed: int) -> SyntheticField:
    """Render one field of ``spec`` deterministically from ``field_seed``."""
    rng = np.random.default_rng([spec.seed, field_seed])
    height, width = spec.field_height, spec.field_width
    count = int(rng.poisson(spec.cells_per_field * 0.1)) + int(spec.cells_per_field * 0.95)
    cells = place_cells(rng, height, width, count)
    maps = _structures(rng, height, width, cells)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    vignetting = 1.0 - 0.25 * (((yy - height / 2) / height) ** 2 + ((xx - width / 2) / width) ** 2) * 4.0
    pixels = np.empty((spec.channels, height, width), np.uint16)
    generators = _stain_generators()
    for channel in range(spec.channels):
        signal = generators[channel](rng, maps)
        background = 150.0 + 40.0 * channel + 30.0 * smooth_noise(rng, (height, width), 64)
        expected = box_blur(signal, 1) * vignetting + background
        electrons = rng.poisson(np.clip(expected, 0.0, None) * GAIN).astype(np.float32) / GAIN
        counts = electrons + CAMERA_OFFSET + rng.normal(0.0, READ_NOISE_SIGMA, (height, width)).astype(np.float32)
        pixels[channel] = np.clip(np.rint(counts), 0, 65535).astype(np.uint16)
    centers = np.array([[c.center_y, c.center_x] for c in cells], dtype=np.float64)
    reach = np.array([c.radius * c.elongation for c in cells])
    boxes = np.stack(
        [
            np.clip(np.floor(centers[:, 0] - reach), 0, height),
            np.clip(np.floor(centers[:, 1] - reach), 0, width),
            np.clip(np.ceil(centers[:, 0] + reach) + 1, 0, height),
            np.clip(np.ceil(centers[:, 1] + reach) + 1, 0, width),
        ],
        axis=1,
    ).astype(np.int64)
    return SyntheticField(pixels=pixels, centers=centers, boxes=boxes)
