"""The device pipeline: workers hand over raw uint16 batches, the device makes the tier's tensors.

Under ``pipeline="dataset"`` (the default) each DataLoader worker turns its crops into the tier's
tensors (float32, normalised, augmented) and hands those over. Under ``pipeline="device"``:

1. workers read whole raw uint16 batches (``CropDataset.__getitems__`` with tier ``none``, decode
   threads inside each worker where the crop config asks for them): half the bytes of float32 cross
   the worker → main process boundary;
2. on CUDA the main process copies each batch into one of a few reused pinned host buffers and sends
   it with ``non_blocking=True`` on a side stream (:class:`HostStaging`); the caller's stream waits
   for that stream before it uses the result, and a buffer is refilled only once its copy is done;
3. the device converts to float, normalises and applies the ``light``/``typical`` tier to the batch
   (:meth:`~cropbench.data.transforms.TransformPlan.apply_batch`: the same definitions and the same
   seeded draws as the CPU tier, so the tensors are equal).

On the CPU (``device="cpu"``) steps 1 and 3 run as they are and step 2 is skipped: nothing crosses a bus.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from cropbench.config import CropConfig
from cropbench.data.transforms import TORCH_DTYPES, TransformPlan
from cropbench.errors import ConfigError

#: Where a crop's tier runs: inside the Dataset (in the workers), or on the device after the hand-over.
PIPELINES = ("dataset", "device")
#: Pinned host buffers :class:`HostStaging` cycles through: one being copied while the next is filled.
STAGING_BUFFERS = 2
#: ``transform_device`` of the dataset pipeline: the tier ran in the DataLoader's worker processes,
#: or in the main process when there are none.
IN_WORKERS, IN_MAIN_PROCESS = "worker", "main"


def check_pipeline(pipeline: str) -> None:
    if pipeline not in PIPELINES:
        raise ConfigError(f"pipeline={pipeline!r} is not one of {', '.join(PIPELINES)}")


def raw_crop(crop: CropConfig) -> CropConfig:
    """What the workers read under the device pipeline: the same crops, raw uint16, no tier."""
    return crop.replace(tier="none", dtype="uint16")


def loader_crop(crop: CropConfig, pipeline: str) -> CropConfig:
    """The crop config the DataLoader's dataset is built with under ``pipeline``."""
    check_pipeline(pipeline)
    return raw_crop(crop) if pipeline == "device" else crop


@dataclass(frozen=True)
class Boundaries:
    """Where the tier ran and the bytes per sample crossing each boundary of one loader path."""

    transform_device: str
    worker_to_main: int
    host_to_device: int


def boundaries(crop: CropConfig, channels: int, pipeline: str, workers: int, device: torch.device) -> Boundaries:
    """Where ``crop``'s tier runs and the image bytes per sample handed over on each boundary.

    worker → main: what a worker hands over through shared memory (0 without workers). host → device:
    what is copied to the accelerator (0 on the CPU): the dataset pipeline copies its output tensor
    as it is (Track 3 converts uint16 to float only after the copy), the device pipeline raw uint16.
    """
    check_pipeline(pipeline)
    raw = channels * crop.crop_size * crop.crop_size * TORCH_DTYPES["uint16"].itemsize
    if pipeline == "device":
        delivered = raw
        where = str(device)
    else:
        size = crop.output_size if crop.output_size is not None and crop.tier != "none" else crop.crop_size
        delivered = channels * size * size * TORCH_DTYPES[crop.dtype].itemsize
        where = IN_WORKERS if workers else IN_MAIN_PROCESS
    return Boundaries(
        transform_device=where,
        worker_to_main=delivered if workers else 0,
        host_to_device=delivered if device.type == "cuda" else 0,
    )


class HostStaging:
    """Reused pinned host buffers and a side stream: raw batches onto a CUDA device without blocking.

    Each batch is copied into the next of ``buffers`` pinned buffers (allocated once per batch shape;
    a shorter last batch uses the front of one) and sent with ``non_blocking=True`` on the side
    stream. An event per buffer records when its copy is done; the buffer is refilled only after that.
    """

    def __init__(self, device: torch.device, buffers: int = STAGING_BUFFERS) -> None:
        if device.type != "cuda":
            raise ConfigError(f"pinned staging needs a CUDA device, got {device}")
        if buffers < 1:
            raise ConfigError(f"buffers must be >= 1, got {buffers}")
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self._buffers: list[torch.Tensor | None] = [None] * buffers
        self._copied: list[torch.cuda.Event | None] = [None] * buffers
        self._next = 0
        self.allocations = 0

    def _buffer(self, slot: int, batch: torch.Tensor) -> torch.Tensor:
        buffer = self._buffers[slot]
        fits = (
            buffer is not None
            and buffer.dtype == batch.dtype
            and buffer.shape[1:] == batch.shape[1:]
            and buffer.shape[0] >= batch.shape[0]
        )
        if not fits:
            buffer = torch.empty(batch.shape, dtype=batch.dtype, pin_memory=True)
            self._buffers[slot] = buffer
            self.allocations += 1
        assert buffer is not None
        return buffer[: batch.shape[0]]

    def send(self, batch: torch.Tensor) -> torch.Tensor:
        """``batch`` on the device, copied on the side stream; use it on the side stream or after
        :meth:`hand_over`."""
        slot = self._next
        self._next = (slot + 1) % len(self._buffers)
        event = self._copied[slot]
        if event is not None:
            event.synchronize()  # the copy out of this buffer has finished: it may be refilled
        staged = self._buffer(slot, batch)
        staged.copy_(batch)
        with torch.cuda.stream(self.stream):
            moved = staged.to(self.device, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        self._copied[slot] = done
        return moved

    def hand_over(self, tensor: torch.Tensor) -> torch.Tensor:
        """Make the caller's stream wait for the side stream's work on ``tensor``, and tell the
        allocator that stream uses its memory."""
        current = torch.cuda.current_stream(self.device)
        current.wait_stream(self.stream)
        tensor.record_stream(current)
        return tensor


class DeviceTier:
    """Raw uint16 batches (B, C, H, W) from the workers → the tier's tensors on ``device``.

    ``plan`` is the tier to make (the dataset's plan under :func:`loader_crop`'s raw config, with the
    case's tier and dtype: :meth:`for_dataset`). On CUDA the batch goes through :class:`HostStaging`
    and the tier runs on the side stream; on the CPU it runs on the batch as it came.
    """

    def __init__(self, plan: TransformPlan, device: torch.device, buffers: int = STAGING_BUFFERS) -> None:
        self.plan = plan
        self.device = device
        self.staging = HostStaging(device, buffers) if device.type == "cuda" else None

    @classmethod
    def for_dataset(cls, raw_plan: TransformPlan, crop: CropConfig, device: torch.device) -> DeviceTier:
        """The device tier of ``crop`` for a dataset built with :func:`raw_crop` (whose plan is ``raw_plan``)."""
        if not raw_plan.raw:
            raise ConfigError(f"the device tier needs a dataset of raw uint16 crops, got tier={raw_plan.tier!r}")
        return cls(raw_plan.with_tier(crop.tier, crop.dtype), device)

    def __call__(
        self, raw: torch.Tensor, indices: Sequence[int] | np.ndarray | torch.Tensor, epoch: int = 0, view: int = 0
    ) -> torch.Tensor:
        if raw.dtype != torch.uint16:
            raise ConfigError(f"the device tier takes raw uint16 batches, got {raw.dtype}")
        positions = indices.numpy() if isinstance(indices, torch.Tensor) else np.asarray(indices)
        if self.staging is None:
            return self.plan.apply_batch(raw, positions, epoch, view)
        moved = self.staging.send(raw)
        with torch.cuda.stream(self.staging.stream):
            image = self.plan.apply_batch(moved, positions, epoch, view)
        return self.staging.hand_over(image)


__all__ = [
    "IN_MAIN_PROCESS",
    "IN_WORKERS",
    "PIPELINES",
    "STAGING_BUFFERS",
    "Boundaries",
    "DeviceTier",
    "HostStaging",
    "boundaries",
    "check_pipeline",
    "loader_crop",
    "raw_crop",
]
