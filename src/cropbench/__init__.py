"""cropbench: honest numbers for single-cell crop loading from OME-Zarr plates into PyTorch.

Importing cropbench sets ``OMP_WAIT_POLICY=PASSIVE`` unless the variable is already set: on small
machines, OpenMP threads spinning beside DataLoader workers change results several-fold (docs/tracks.md
has the measurement). It must be set
before torch loads its OpenMP runtime, hence here; every record carries the value in force.

The public names below load on first use, so ``import cropbench`` (and the CLI's ``--help``) does not
pay for importing torch and zarr.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"

#: Public name → module that defines it.
_PUBLIC: dict[str, str] = {
    "ConfigError": "cropbench.errors",
    "CropbenchError": "cropbench.errors",
    "ImportInputError": "cropbench.errors",
    "ObjectTableError": "cropbench.errors",
    "OutputError": "cropbench.errors",
    "StoreError": "cropbench.errors",
    "CropConfig": "cropbench.config",
    "LayoutSpec": "cropbench.config",
    "PlateSpec": "cropbench.config",
    "DatasetCase": "cropbench.harness.dataset_case",
    "ObjectTable": "cropbench.objects",
    "read_object_table": "cropbench.objects",
    "Record": "cropbench.records",
    "RecordWriter": "cropbench.records",
    "read_records": "cropbench.records",
    "write_csv": "cropbench.records",
    "PlateReader": "cropbench.formats",
    "open_plate": "cropbench.formats",
    "plate_objects": "cropbench.formats",
    "read_plate_metadata": "cropbench.formats",
    "generate_plate": "cropbench.plates.generate",
    "CropDataset": "cropbench.data.dataset",
    "PairedViews": "cropbench.data.dataset",
    "GroupedSampler": "cropbench.data.sampling",
    "RandomObjectSampler": "cropbench.data.sampling",
    "sampler_for": "cropbench.data.sampling",
    "run": "cropbench.api",
    "advise": "cropbench.api",
    "AdviseRun": "cropbench.api",
}

__all__ = ["__version__", *sorted(_PUBLIC)]


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'cropbench' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
