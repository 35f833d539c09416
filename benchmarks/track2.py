"""Track 2 in asv: DataLoader epochs from the plate over the same loader serving crops from memory.

:class:`cropbench.harness.loader_case.LoaderEpochs` times the two in turns, epoch by epoch, in one call.
Not in the recommended gate: worker start-up dominates a 512-sample epoch. ``FullLoader`` and
``LoaderLatency`` (raw milliseconds of :func:`cropbench.harness.loader_case.run_case`) are the full grid
(``CROPBENCH_ASV_FULL=1``). ``peakmem_*`` sees only the main process, not the workers.
"""

from __future__ import annotations

from typing import Any

from .common import Benchmark, full_grid_off, full_layouts, make_full_plates, older_commit, plate_for, skip

OLDER_COMMIT: str | None = None
try:
    from cropbench import metrics as m
    from cropbench.config import CropConfig
    from cropbench.data.loader import LoaderSpec
    from cropbench.harness.context import RunContext
    from cropbench.harness.loader_case import LoaderCase, LoaderEpochs, run_case
    from cropbench.measure.protocol import configure_threads
except ImportError as error:
    OLDER_COMMIT = older_commit(error)

#: Samples per epoch: a few dozen batches, so an epoch is short but not one batch.
EPOCH_SAMPLES = 512
#: The full grid: more workers, batch sizes, decode paths and tiers, every layout of the full plate.
FULL_GRID = ([0, 1, 2, 4], [16, 64, 256], ["direct", "zarr", "field"], ["none", "typical"], full_layouts())
FULL_NAMES = ("num_workers", "batch_size", "decode", "tier", "layout")


class Loader(Benchmark):
    """Whole epochs through the DataLoader, from the plate and from memory (0 and 2 workers, the smoke plate)."""

    unit = "x in-memory epoch"
    params = ([0, 2], [64], ["direct"], ["none"])
    param_names = ("num_workers", "batch_size", "decode", "tier")
    version = "2"
    repeat = (5, 10, 4.0)  # an epoch forks workers: fewer, longer samples than Track 1's

    def setup(self, plates: dict[str, str], num_workers: int, batch_size: int, decode: str, tier: str) -> None:
        skip(OLDER_COMMIT)
        configure_threads(1)
        crop = CropConfig(crop_size=96, decode=decode, tier=tier)
        loader = LoaderSpec(num_workers=num_workers, batch_size=batch_size)
        self.epochs = LoaderEpochs(plate_for(plates, "default"), crop, loader, EPOCH_SAMPLES)

    def track_relative_epoch(self, *params: Any) -> float:
        return self.epochs.relative_epoch()

    def peakmem_epoch(self, *params: Any) -> None:
        self.epochs.epoch()


class _FullGrid(Benchmark):
    """The full grid's cases: every layout of the full plate (``CROPBENCH_ASV_FULL=1``); no benchmarks."""

    params, param_names = FULL_GRID, FULL_NAMES
    repeat = (5, 10, 4.0)
    setup_cache = staticmethod(make_full_plates)

    def setup(
        self, plates: dict[str, str], num_workers: int, batch_size: int, decode: str, tier: str, layout: str
    ) -> None:
        skip(full_grid_off(type(self).__name__) or OLDER_COMMIT)
        configure_threads(1)
        crop = CropConfig(crop_size=96, decode=decode, tier=tier)
        loader = LoaderSpec(num_workers=num_workers, batch_size=batch_size)
        self.epochs = LoaderEpochs(plate_for(plates, layout), crop, loader, EPOCH_SAMPLES)
        self.case = LoaderCase(crop=crop, loader=loader, samples=EPOCH_SAMPLES, epochs=2)


class FullLoader(_FullGrid):
    """``Loader.track_relative_epoch`` over the full grid."""

    unit = "x in-memory epoch"

    def track_relative_epoch(self, *params: Any) -> float:
        return self.epochs.relative_epoch()


class LoaderLatency(_FullGrid):
    """Raw milliseconds from ``run_case`` (full grid only)."""

    def time_epoch(self, *params: Any) -> None:
        self.epochs.epoch()

    def track_first_batch_ms(self, *params: Any) -> float:
        return float(run_case(RunContext(self.epochs.plate), self.case)[m.FIRST_BATCH_MS])

    track_first_batch_ms.unit = "ms"  # type: ignore[attr-defined]

    def track_ms_per_sample(self, *params: Any) -> float:
        """Steady throughput, inverted: asv reads every value as lower-is-better (1000 / samples per s)."""
        return 1000.0 / float(run_case(RunContext(self.epochs.plate), self.case)[m.SAMPLES_PER_S])

    track_ms_per_sample.unit = "ms/sample"  # type: ignore[attr-defined]

    def track_batch_p95_ms(self, *params: Any) -> float:
        return float(run_case(RunContext(self.epochs.plate), self.case)[m.BATCH_P95_MS])

    track_batch_p95_ms.unit = "ms"  # type: ignore[attr-defined]
