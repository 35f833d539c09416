"""The synthetic generator is deterministic and looks like microscopy, not noise."""

from __future__ import annotations

import zlib

import numpy as np

from cropbench.config import PlateSpec
from cropbench.plates.synthetic import box_blur, render_field

SPEC = PlateSpec(channels=5, field_height=256, field_width=256, cells_per_field=40, seed=3)


def zlib_ratio(pixels: np.ndarray) -> float:
    raw = pixels.tobytes()
    return len(raw) / len(zlib.compress(raw, 1))


def test_same_seed_same_pixels_other_seed_other_pixels() -> None:
    first, again = render_field(SPEC, 0), render_field(SPEC, 0)
    assert np.array_equal(first.pixels, again.pixels)
    assert np.array_equal(first.centers, again.centers)
    assert not np.array_equal(first.pixels, render_field(SPEC, 1).pixels)


def test_uint16_with_camera_offset_and_12_to_16_bit_range() -> None:
    field = render_field(SPEC, 0)
    assert field.pixels.dtype == np.uint16 and field.pixels.shape == (5, 256, 256)
    assert field.pixels.min() >= 50, "background should sit on a camera offset"
    assert field.pixels.max() > 4095, "bright structures should use more than 12 bits"


def test_cells_are_brighter_than_background_in_the_dna_channel() -> None:
    field = render_field(SPEC, 0)
    dna = field.pixels[0].astype(float)
    at_nuclei = [dna[int(y), int(x)] for y, x in field.centers]
    assert np.median(at_nuclei) > 3 * np.median(dna)


def test_compression_ratio_is_in_the_range_of_real_cell_painting() -> None:
    ratio = zlib_ratio(render_field(SPEC, 0).pixels)
    noise = np.random.default_rng(0).integers(0, 65535, (5, 256, 256), dtype=np.uint16)
    assert 1.1 <= ratio <= 4.0
    assert zlib_ratio(noise) < 1.01 < ratio


def test_bounding_boxes_contain_centroids_and_stay_in_the_field() -> None:
    field = render_field(SPEC, 0)
    y0, x0, y1, x1 = field.boxes.T
    cy, cx = field.centers.T
    assert ((y0 <= cy) & (cy < y1) & (x0 <= cx) & (cx < x1)).all()
    assert (y0 >= 0).all() and (y1 <= 256).all() and (x1 <= 256).all()
    assert len(field.centers) >= 0.9 * SPEC.cells_per_field


def test_box_blur_preserves_a_constant_image() -> None:
    image = np.full((20, 30), 7.0, dtype=np.float32)
    assert np.allclose(box_blur(image, 3), 7.0)


def test_realism_report_puts_synthetic_and_real_nf1_in_the_cell_painting_range() -> None:
    from pathlib import Path

    import pytest

    from cropbench.plates.realism import synthetic_stats, tiff_stats

    nf1 = Path(__file__).resolve().parents[2] / "shared" / "data" / "nf1_cellpainting_subset" / "Plate_2_images"
    synthetic = synthetic_stats(SPEC, fields=1)
    assert synthetic.images == 5 and 1.1 <= synthetic.zlib1_ratio_mean <= 4.0
    if not nf1.is_dir():
        pytest.skip(
            f"NF1 subset not found at {nf1.parent}: copy tests/data/cytotable/NF1_cellpainting_data_shrunken "
            "of github.com/cytomining/CytoDataFrame (NF1 Cell Painting, Plate 2) there"
        )
    real = tiff_stats(nf1)
    assert real.images == 15 and 1.1 <= real.zlib1_ratio_mean <= 4.0
