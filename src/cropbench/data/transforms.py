"""Transform tiers, kept apart from I/O so their cost can be measured separately.

- ``none``: only the dtype cast (uint16 stays raw): the I/O ceiling.
- ``light``: per-channel normalisation to [0, 1] by the plate's display windows, then resize.
- ``typical``: light + random flips, random 90° rotations and small per-channel intensity jitter.

Random choices come from a generator seeded by (seed, epoch, index, view), not from the global
torch RNG, so a crop is byte-identical whichever worker makes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torchvision.transforms.v2.functional as F

TORCH_DTYPES: dict[str, torch.dtype] = {
    "uint16": torch.uint16,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


@dataclass(frozen=True)
class TransformPlan:
    """Everything a tier needs, fixed at dataset construction (picklable, no tensors held)."""

    tier: str
    dtype: str
    offsets: tuple[float, ...]
    scales: tuple[float, ...]
    output_size: int | None
    seed: int

    @classmethod
    def for_windows(
        cls,
        tier: str,
        dtype: str,
        windows: Sequence[tuple[float, float]],
        output_size: int | None,
        seed: int,
    ) -> TransformPlan:
        offsets = tuple(float(lo) for lo, _ in windows)
        scales = tuple(float(max(hi - lo, 1.0)) for lo, hi in windows)
        return cls(tier=tier, dtype=dtype, offsets=offsets, scales=scales, output_size=output_size, seed=seed)

    def apply(self, raw: torch.Tensor, index: int, epoch: int = 0, view: int = 0) -> torch.Tensor:
        """Turn a raw uint16 crop (C, H, W) into the tier's output tensor."""
        dtype = TORCH_DTYPES[self.dtype]
        if self.tier == "none":
            return raw if dtype == torch.uint16 else raw.to(dtype)
        image = self.normalise(raw)
        if self.output_size is not None and self.output_size != image.shape[-1]:
            image = F.resize(image, [self.output_size, self.output_size], antialias=True)
        if self.tier == "typical":
            image = self.augment(image, np.random.default_rng((self.seed, epoch, index, view)))
        return image.to(dtype)

    def normalise(self, raw: torch.Tensor) -> torch.Tensor:
        image = raw.to(torch.float32)
        return F.normalize(image, mean=list(self.offsets), std=list(self.scales))

    @staticmethod
    def augment(image: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
        flip_h, flip_v, quarter_turns = rng.random() < 0.5, rng.random() < 0.5, int(rng.integers(4))
        if flip_h:
            image = F.horizontal_flip(image)
        if flip_v:
            image = F.vertical_flip(image)
        if quarter_turns:
            image = torch.rot90(image, quarter_turns, dims=(-2, -1))
        channels = image.shape[0]
        gain = torch.from_numpy(rng.uniform(0.9, 1.1, channels).astype(np.float32)).view(-1, 1, 1)
        shift = torch.from_numpy(rng.uniform(-0.05, 0.05, channels).astype(np.float32)).view(-1, 1, 1)
        return image * gain + shift
