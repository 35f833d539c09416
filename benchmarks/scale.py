"""A plate larger than memory in asv: random crops read inside a memory limit a quarter of the plate.

The reader runs in a temporary cgroup whose limit counts its page cache too
(:func:`cropbench.measure.memory_limit.run_limited`), so crops come from the block device:
``track_device_bytes_per_crop`` is a count of work (gated), ``track_crops_per_s`` the disk's speed more
than the code's (not gated). Skipped where no memory cgroup can be written or no reads are counted.
"""

from __future__ import annotations

from typing import Any

from .common import LIMIT_BYTES, UNAVAILABLE, make_out_of_memory_plate, older_commit, skip

OLDER_COMMIT: str | None = None
try:
    from cropbench import metrics as m
    from cropbench.config import CropConfig
    from cropbench.measure.memory_limit import cgroup_parent, process_read_bytes, run_limited
    from cropbench.measure.protocol import configure_threads
    from cropbench.tracks.out_of_memory import random_pass
except ImportError as error:
    OLDER_COMMIT = older_commit(error)

#: Crops timed and counted per value, after a warm-up that opens the shards and fills the chunk cache.
CROPS, WARMUP = 400, 40


def no_limit() -> str | None:
    """Why this machine cannot read inside a memory limit (no memory cgroup, no read counts), or None."""
    parent = cgroup_parent()
    if isinstance(parent, str):
        return f"no memory cgroup to read inside: {parent}"
    return "/proc/self/io counts no reads here: no device bytes to report" if process_read_bytes() is None else None


class OutOfMemory:
    """Random 96 px crops of a plate four times the memory limit of the process reading it."""

    setup_cache = staticmethod(make_out_of_memory_plate)
    timeout = 600
    version = "1"

    def setup(self, cached: dict[str, Any]) -> None:
        skip(OLDER_COMMIT or (cached["plate"] if cached["plate"].startswith(UNAVAILABLE) else None) or no_limit())
        configure_threads(1)
        self.pass_arguments = (cached["plate"], CropConfig(crop_size=96, dtype="uint16"), CROPS, WARMUP, 0, True)

    def track_device_bytes_per_crop(self, cached: dict[str, Any]) -> float:
        limited = run_limited(random_pass, self.pass_arguments, LIMIT_BYTES, require_cgroup=True)
        return float(limited.value[m.DEVICE_BYTES_PER_CROP])

    track_device_bytes_per_crop.unit = "bytes/crop"  # type: ignore[attr-defined]

    def track_crops_per_s(self, cached: dict[str, Any]) -> float:
        limited = run_limited(random_pass, self.pass_arguments, LIMIT_BYTES, require_cgroup=True)
        return float(limited.value[m.CROPS_PER_S])

    track_crops_per_s.unit = "crops/s"  # type: ignore[attr-defined]
