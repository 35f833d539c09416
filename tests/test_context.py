"""RunContext: what a run's rows say of the plate."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from cropbench.harness.context import RunContext


def test_location_of_a_plate_in_a_store_masks_its_credentials(tiny_plate: Path) -> None:
    context = RunContext(tiny_plate)
    assert context.location == str(tiny_plate)
    url = "s3://reader:s3cret@bucket/plates/p.zarr"
    context.metadata = dataclasses.replace(context.metadata, remote={"url": url, "store": "s3"})
    assert "s3cret" not in context.location
    assert context.location == "s3://reader:***@bucket/plates/p.zarr"


def test_object_count_is_what_a_dataset_over_the_plate_serves(tiny_plate: Path) -> None:
    from cropbench.config import CropConfig
    from cropbench.data.dataset import CropDataset

    assert RunContext(tiny_plate).object_count == len(CropDataset(tiny_plate, CropConfig())) > 0
