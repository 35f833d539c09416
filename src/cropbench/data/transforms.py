"""Transform tiers, kept apart from I/O so their cost can be measured separately.

- ``none``: only the dtype cast (uint16 stays raw): the I/O cost alone.
- ``light``: per-channel normalisation to [0, 1] by the plate's display windows, then resize.
- ``typical``: light + random flips, random 90° rotations and small per-channel intensity jitter.

Random choices come from a generator seeded by (seed, epoch, index, view), not from the global
torch RNG, so a crop is byte-identical whichever worker makes it, and whether the tier runs on one
crop inside the Dataset (:meth:`TransformPlan.apply`) or on a whole batch on the device
(:meth:`TransformPlan.apply_batch`, :mod:`cropbench.data.device_pipeline`): both draw the same
:class:`Augmentation` per crop and apply it with the same functions.
"""

from __future__ import annotations

import dataclasses
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
#: Range of the ``typical`` tier's per-channel gain and shift.
GAIN_RANGE = (0.9, 1.1)
SHIFT_RANGE = (-0.05, 0.05)


@dataclass(frozen=True)
class Augmentation:
    """The random choices of the ``typical`` tier for one crop: flips, quarter turns, gain and shift per channel."""

    flip_h: bool
    flip_v: bool
    quarter_turns: int
    gain: np.ndarray
    shift: np.ndarray

    @classmethod
    def draw(cls, rng: np.random.Generator, channels: int) -> Augmentation:
        """Draw in a fixed order from ``rng`` (one generator per crop, see :meth:`TransformPlan.augmentation`)."""
        flip_h, flip_v, quarter_turns = rng.random() < 0.5, rng.random() < 0.5, int(rng.integers(4))
        gain = rng.uniform(*GAIN_RANGE, channels).astype(np.float32)
        shift = rng.uniform(*SHIFT_RANGE, channels).astype(np.float32)
        return cls(bool(flip_h), bool(flip_v), quarter_turns, gain, shift)

    @property
    def geometry(self) -> tuple[bool, bool, int]:
        return (self.flip_h, self.flip_v, self.quarter_turns)


def apply_geometry(image: torch.Tensor, flip_h: bool, flip_v: bool, quarter_turns: int) -> torch.Tensor:
    """Flip and turn the last two axes of a crop (C, H, W) or of a stack of crops (N, C, H, W)."""
    if flip_h:
        image = F.horizontal_flip(image)
    if flip_v:
        image = F.vertical_flip(image)
    if quarter_turns:
        image = torch.rot90(image, quarter_turns, dims=(-2, -1))
    return image


def apply_intensity(image: torch.Tensor, gain: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """``image * gain + shift`` with gain and shift per channel, broadcast over the pixels."""
    return image * gain + shift


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

    def with_tier(self, tier: str, dtype: str) -> TransformPlan:
        """The same windows, size and seed under another tier and output dtype."""
        return dataclasses.replace(self, tier=tier, dtype=dtype)

    @property
    def raw(self) -> bool:
        """Whether the tier hands the crop over untouched (uint16, no transform)."""
        return self.tier == "none" and self.dtype == "uint16"

    def apply(self, raw: torch.Tensor, index: int, epoch: int = 0, view: int = 0) -> torch.Tensor:
        """Turn a raw uint16 crop (C, H, W) into the tier's output tensor."""
        dtype = TORCH_DTYPES[self.dtype]
        if self.tier == "none":
            return raw if dtype == torch.uint16 else raw.to(dtype)
        image = self.resize(self.normalise(raw))
        if self.tier == "typical":
            draw = self.augmentation(index, image.shape[-3], epoch, view)
            image = apply_geometry(image, *draw.geometry)
            gain, shift = (torch.from_numpy(v).view(-1, 1, 1) for v in (draw.gain, draw.shift))
            image = apply_intensity(image, gain, shift)
        return image.to(dtype)

    def apply_batch(
        self, raw: torch.Tensor, indices: Sequence[int] | np.ndarray, epoch: int = 0, view: int = 0
    ) -> torch.Tensor:
        """The tier on a whole batch of raw uint16 crops (B, C, H, W) on any device: equal to stacking
        :meth:`apply` of each crop (the same draws and the same operations, batched).

        Crops that share flips and turns are turned together (at most 16 groups), so a batch costs a
        few device calls rather than a few per crop.
        """
        positions = np.asarray(indices, dtype=np.int64).reshape(-1)
        if raw.dim() != 4 or len(positions) != raw.shape[0]:
            raise ValueError(
                f"a batch of shape (B, C, H, W) with B indices, got {tuple(raw.shape)} and {len(positions)}"
            )
        dtype = TORCH_DTYPES[self.dtype]
        if self.tier == "none":
            return raw if dtype == torch.uint16 else raw.to(dtype)
        image = self.resize(self.normalise(raw))
        if self.tier == "typical":
            draws = [self.augmentation(int(i), image.shape[-3], epoch, view) for i in positions.tolist()]
            image = self.augment_batch(image, draws)
        return image.to(dtype)

    def augment_batch(self, image: torch.Tensor, draws: Sequence[Augmentation]) -> torch.Tensor:
        """:func:`apply_geometry` per group of crops drawn alike, then :func:`apply_intensity` at once."""
        if image.shape[-1] != image.shape[-2]:
            raise ValueError(f"quarter turns of a batch need square crops, got {tuple(image.shape[-2:])}")
        groups: dict[tuple[bool, bool, int], list[int]] = {}
        for slot, draw in enumerate(draws):
            groups.setdefault(draw.geometry, []).append(slot)
        # Small host-to-device copies, non-blocking: from pageable memory CUDA stages them at once,
        # without waiting for the work queued before them.
        for geometry, slots in groups.items():
            if geometry == (False, False, 0):
                continue
            chosen = torch.as_tensor(slots, dtype=torch.int64).to(image.device, non_blocking=True)
            image[chosen] = apply_geometry(image[chosen], *geometry)
        jitter = np.stack([np.stack([d.gain for d in draws]), np.stack([d.shift for d in draws])])
        gain, shift = torch.from_numpy(jitter[:, :, :, None, None]).to(image.device, non_blocking=True)
        return apply_intensity(image, gain, shift)

    def augmentation(self, index: int, channels: int, epoch: int = 0, view: int = 0) -> Augmentation:
        """The ``typical`` tier's draws for crop ``index`` of ``epoch`` (``view`` of a paired sample)."""
        return Augmentation.draw(np.random.default_rng((self.seed, epoch, index, view)), channels)

    def normalise(self, raw: torch.Tensor) -> torch.Tensor:
        """uint16 to float32, each channel shifted and scaled by its display window (crop or batch)."""
        image = raw.to(torch.float32)
        return F.normalize(image, mean=list(self.offsets), std=list(self.scales))

    def resize(self, image: torch.Tensor) -> torch.Tensor:
        if self.output_size is None or self.output_size == image.shape[-1]:
            return image
        return F.resize(image, [self.output_size, self.output_size], antialias=True)

    @staticmethod
    def augment(image: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
        """The ``typical`` tier's augmentation of one crop with draws from ``rng``."""
        draw = Augmentation.draw(rng, image.shape[0])
        gain, shift = (torch.from_numpy(v).view(-1, 1, 1) for v in (draw.gain, draw.shift))
        return apply_intensity(apply_geometry(image, *draw.geometry), gain, shift)
