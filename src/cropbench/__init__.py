"""cropbench: honest numbers for single-cell crop loading from OME-Zarr plates into PyTorch.

Importing cropbench sets ``OMP_WAIT_POLICY=PASSIVE`` unless the variable is already set: on small
machines, OpenMP threads spinning beside DataLoader workers changed results 3–25×. It must be set
before torch loads its OpenMP runtime, hence here; every record carries the value in force.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from cropbench.config import CropConfig, LayoutSpec, PlateSpec, Track1Case  # noqa: E402
from cropbench.dataset import CropDataset, PairedViews  # noqa: E402
from cropbench.errors import (  # noqa: E402
    ConfigError,
    CropbenchError,
    ImportInputError,
    ObjectTableError,
    OutputError,
    StoreError,
)
from cropbench.formats import PlateReader, open_plate, read_plate_metadata  # noqa: E402
from cropbench.generate import generate_plate  # noqa: E402
from cropbench.objects import ObjectTable, read_object_table  # noqa: E402
from cropbench.records import Record, RecordWriter, read_records, write_csv  # noqa: E402
from cropbench.sampling import GroupedSampler, RandomObjectSampler, sampler_for  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "ConfigError", "CropConfig", "CropDataset", "CropbenchError", "GroupedSampler", "ImportInputError",
    "LayoutSpec", "ObjectTable", "ObjectTableError", "OutputError", "PairedViews", "PlateReader", "PlateSpec",
    "RandomObjectSampler", "Record", "RecordWriter", "StoreError", "Track1Case", "__version__",
    "generate_plate", "open_plate", "read_object_table", "read_plate_metadata", "read_records", "sampler_for",
    "write_csv",
]
