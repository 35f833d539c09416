"""RunContext: what a run's rows say of the plate."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from cropbench.tracks.context import RunContext


def test_location_of_a_plate_in_a_store_masks_its_credentials(tiny_plate: Path) -> None:
    context = RunContext(tiny_plate)
    assert context.location == str(tiny_plate)
    url = "s3://reader:s3cret@bucket/plates/p.zarr"
    context.metadata = dataclasses.replace(context.metadata, remote={"url": url, "store": "s3"})
    assert "s3cret" not in context.location
    assert context.location == "s3://reader:***@bucket/plates/p.zarr"
