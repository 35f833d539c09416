"""A plate larger than memory in asv: random crops read inside a memory limit a quarter of the plate.

The reading process runs in a temporary cgroup whose limit counts its page cache too, so at most
a quarter of the plate can stay cached and random crops are read from the block device
(:func:`cropbench.measure.memory_limit.run_limited`, the plate's files evicted first).

- ``OutOfMemory.track_device_bytes_per_crop``: bytes the kernel read from the block device per
  random 96 px crop of the default layout, over a fixed sequence of crops: a count of work, so it
  moves when the layout or the reader's reads change (and with the machine's read-ahead): gated.
- ``OutOfMemory.track_crops_per_s``: random crops per second inside the limit: the disk's speed
  more than the code's, tracked and not gated.

The case skips (``NotImplementedError`` in ``setup``) where no memory cgroup can be written (not
root, no memory controller) or ``/proc/self/io`` counts no reads, naming the reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .common import PLATE_DIR, UNAVAILABLE, import_track_piece, one_thread, skips_older_commits

#: The memory limit of the reading process (page cache included) and the plate's size over it. The
#: child is forked from asv's benchmark process (torch imported), whose pages it copies as it writes
#: them: 96 MiB ran out of memory there, 160 MiB did not (the same pass in a plain process fits 96).
LIMIT_BYTES = 160 * 2**20
PLATE_MULTIPLE = 4.0
#: Crops timed and counted per value, after a warm-up that opens the shards and fills the chunk cache.
CROPS, WARMUP = 400, 40
#: Fields of 540 px and 5 channels (2.9 MB decoded each), four of them rendered and written in turn.
FIELD_SIZE, CHANNELS, DISTINCT_FIELDS = 540, 5, 4


def make_out_of_memory_plate() -> dict[str, Any]:
    """``setup_cache``: a scale plate in the default layout, ``PLATE_MULTIPLE`` × ``LIMIT_BYTES`` on disk,
    or why it could not be written (a setup_cache may not skip: asv fails it; ``setup`` skips)."""
    try:
        with skips_older_commits():
            from cropbench.config import layout_by_name
            from cropbench.plates.scale import ScaleSpec, generate_scale_plate

            out_of_memory, work_folder = import_track_piece("out of memory"), import_track_piece("work folder")
    except NotImplementedError as missing:
        return {"plate": UNAVAILABLE + str(missing)}
    comparison = out_of_memory.OutOfMemory(
        layouts=("default",),
        limit_bytes=LIMIT_BYTES,
        plate_multiple=PLATE_MULTIPLE,
        plate=ScaleSpec(field_size=FIELD_SIZE, channels=CHANNELS, distinct_fields=DISTINCT_FIELDS),
    )
    root = Path(PLATE_DIR, "scale").absolute()
    spec = out_of_memory.plate_spec_for(comparison, "default", work_folder.WorkFolder(root, keep=True))
    path = root / "out-of-memory-default.zarr"
    written = generate_scale_plate(path, spec, layout_by_name("default"), overwrite=True, progress=False)
    return {"plate": str(path), "stored_bytes": written.stored_bytes}


class OutOfMemory:
    """Random 96 px crops of a plate four times the memory limit of the process reading it."""

    setup_cache = staticmethod(make_out_of_memory_plate)
    timeout = 600
    version = "1"

    @skips_older_commits()
    def setup(self, cached: dict[str, Any]) -> None:
        from cropbench.config import CropConfig
        from cropbench.measure.memory_limit import cgroup_parent, process_read_bytes, run_limited

        if cached["plate"].startswith(UNAVAILABLE):
            raise NotImplementedError(cached["plate"])
        parent = cgroup_parent()
        if isinstance(parent, str):
            raise NotImplementedError(f"no memory cgroup to read inside: {parent}")
        if process_read_bytes() is None:
            raise NotImplementedError("/proc/self/io counts no reads here: no device bytes to report")
        one_thread()
        from cropbench import metrics

        self.out_of_memory, self.run_limited, self.metrics = import_track_piece("out of memory"), run_limited, metrics
        crop = CropConfig(crop_size=96, dtype="uint16")
        self.arguments = (cached["plate"], crop, CROPS, WARMUP, 0, True)

    def _limited_pass(self) -> dict[str, Any]:
        run = self.run_limited(self.out_of_memory.random_pass, self.arguments, LIMIT_BYTES, require_cgroup=True)
        return dict(run.value)

    def track_device_bytes_per_crop(self, cached: dict[str, Any]) -> float:
        return float(self._limited_pass()[self.metrics.DEVICE_BYTES_PER_CROP])

    track_device_bytes_per_crop.unit = "bytes/crop"  # type: ignore[attr-defined]

    def track_crops_per_s(self, cached: dict[str, Any]) -> float:
        return float(self._limited_pass()[self.metrics.CROPS_PER_S])

    track_crops_per_s.unit = "crops/s"  # type: ignore[attr-defined]
