"""Fidelity gate: a hash of what a configuration delivers, so a fast path that changes pixels fails.

The hash covers, for a fixed seeded set of items: pixel bytes, dtype, shape, channel order and the
crop coordinates. Two configurations that differ only in how they read (decode path, layout,
worker count) must produce the same hash.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

import torch

IMAGE_KEYS = ("image", "view1", "view2")
COORDINATE_KEYS = ("object_id", "field_index", "crop_y0", "crop_x0")


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes()


def update_with_sample(digest: Any, sample: Mapping[str, Any]) -> None:
    """Feed one sample (or one collated batch) into ``digest``."""
    for key in IMAGE_KEYS:
        if key in sample:
            tensor = sample[key]
            digest.update(f"{key}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
            digest.update(_tensor_bytes(tensor))
    coordinates = [sample[key] for key in COORDINATE_KEYS if key in sample]
    digest.update(json.dumps([c.tolist() if hasattr(c, "tolist") else c for c in coordinates]).encode())


def fidelity_hash(samples: Iterable[Mapping[str, Any]], channel_names: Iterable[str]) -> str:
    """SHA-256 over the channel order and every sample (or batch) in order."""
    digest = hashlib.sha256(json.dumps(list(channel_names)).encode())
    for sample in samples:
        update_with_sample(digest, sample)
    return digest.hexdigest()
