"""Shared fixtures: small real plates on disk, written once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cropbench.config import LAYOUTS, LayoutSpec, PlateSpec
from cropbench.plates.generate import generate_plate

#: Small enough to write in well under a second, large enough for several chunks per field.
TINY_SPEC = PlateSpec(
    name="tiny",
    rows=1,
    columns=2,
    fields_per_well=2,
    channels=5,
    field_height=200,
    field_width=240,
    cells_per_field=25,
    seed=7,
)
#: Layouts every decode path must agree on (chunks smaller than the field so crops span chunks).
TEST_LAYOUTS: dict[str, LayoutSpec] = {
    "tiles": LayoutSpec(chunk_yx=64, channels_per_chunk=0, codec="blosc-lz4"),
    "channel-tiles-zstd": LayoutSpec(chunk_yx=48, channels_per_chunk=1, codec="zstd"),
    "planes-raw": LayoutSpec(chunk_yx=0, channels_per_chunk=1, codec="none"),
    "sharded": LayoutSpec(chunk_yx=32, channels_per_chunk=0, codec="blosc-zstd", shard_yx=-1),
}


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_plate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny plate in the default layout."""
    path = tmp_path_factory.mktemp("plates") / "tiny.zarr"
    generate_plate(path, TINY_SPEC, LAYOUTS["default"], progress=False)
    return path


@pytest.fixture(scope="session", params=sorted(TEST_LAYOUTS))
def layout_plate(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny plate in each of several layouts."""
    path = tmp_path_factory.mktemp("layouts") / f"{request.param}.zarr"
    generate_plate(path, TINY_SPEC, TEST_LAYOUTS[request.param], progress=False)
    return path
