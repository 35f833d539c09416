"""Track 2 in asv: DataLoader epochs and what the training loop waits for.

``Loader`` wraps :func:`cropbench.data.loader.build_loader`: ``track_relative_epoch`` is the time of an
epoch read from the plate over the time of the same loader serving crops already in memory
(:class:`cropbench.tracks.track2.MemoryCrops`, the ceiling), epochs alternating in one process.
``LoaderLatency`` holds the raw wall-clock numbers — ``time_epoch`` and what
:func:`cropbench.tracks.track2.run_case` (the harness ``cropbench run`` uses) reports: first-batch
latency, steady throughput, batch-wait p95 — and runs with ``CROPBENCH_ASV_FULL=1`` only (see
benchmarks/common.py for why). asv's ``peakmem_*`` sees only
the main process, so worker memory is left to ``cropbench run`` (it records every worker's RSS).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from .common import Suite, crop_config, grid, layouts, one_thread, plate_for, require, require_full_grid

#: Samples per epoch: a few dozen batches, so an epoch is short but not one batch.
EPOCH_SAMPLES = 512
#: Plate/memory epoch pairs behind one ``track_relative_epoch`` value (their median).
EPOCH_PAIRS = 3


def epoch_seconds(loader: Any) -> float:
    """Wall-clock seconds of one epoch, worker start-up and shutdown included."""
    start = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - start


class _Loading(Suite):
    """One crop configuration served by one DataLoader configuration (random access; no benchmarks)."""

    params = (
        grid([0, 2], [0, 1, 2, 4]),
        grid([64], [16, 64, 256]),
        grid(["direct"], ["direct", "zarr", "field"]),
        grid(["none"], ["none", "typical"]),
        layouts(),
    )
    param_names = ("num_workers", "batch_size", "decode", "tier", "layout")
    #: An epoch forks workers; fewer, longer samples than Track 1's.
    repeat = (5, 10, 4.0)

    def setup(
        self, plates: dict[str, str], num_workers: int, batch_size: int, decode: str, tier: str, layout: str
    ) -> None:
        one_thread()
        self.plate = plate_for(plates, layout)
        loader_spec = require("cropbench.data.loader", "LoaderSpec")(num_workers=num_workers, batch_size=batch_size)
        crop = crop_config(crop_size=96, decode=decode, tier=tier)
        self.case = require("cropbench.tracks.track2", "Track2Case")(
            crop=crop,
            loader=loader_spec,
            samples=EPOCH_SAMPLES,
            epochs=2,
        )
        dataset = require("cropbench.data.dataset", "CropDataset")(self.plate, crop)
        sampler = require("cropbench.data.sampling", "sampler_for")(dataset, "random", 0)
        orders = require("cropbench.data.loader", "schedule")(sampler, EPOCH_SAMPLES, 1)
        self.dataset, self.loader_spec, self.orders = dataset, loader_spec, orders
        self.loader = self._build(dataset)

    def _build(self, dataset: Any) -> Any:
        scheduled = require("cropbench.data.loader", "ScheduledSampler")(self.orders)
        return require("cropbench.data.loader", "build_loader")(dataset, self.loader_spec, scheduled, 0)


class Loader(_Loading):
    """Whole epochs through the DataLoader, from the plate and from memory."""

    def track_relative_epoch(self, *params: Any) -> float:
        memory_loader = self._build(require("cropbench.tracks.track2", "MemoryCrops")(self.dataset))
        ratios = []
        for pair in range(EPOCH_PAIRS):
            if pair % 2:
                memory_seconds = epoch_seconds(memory_loader)
                plate_seconds = epoch_seconds(self.loader)
            else:
                plate_seconds = epoch_seconds(self.loader)
                memory_seconds = epoch_seconds(memory_loader)
            ratios.append(plate_seconds / memory_seconds)
        return float(np.median(ratios))

    track_relative_epoch.unit = "x in-memory epoch"  # type: ignore[attr-defined]

    def peakmem_epoch(self, *params: Any) -> None:
        for _ in self.loader:
            pass


class LoaderLatency(_Loading):
    """Raw milliseconds from ``run_case`` (full grid only)."""

    def setup(self, *args: Any) -> None:
        require_full_grid("Track 2 first-batch latency, throughput and batch-wait p95 in ms")
        super().setup(*args)

    def _run_case(self) -> dict[str, Any]:
        return require("cropbench.tracks.track2", "run_case")(self.plate, self.case)

    def time_epoch(self, *params: Any) -> None:
        for _ in self.loader:
            pass

    def track_first_batch_ms(self, *params: Any) -> float:
        return float(self._run_case()["first_batch_ms"])

    track_first_batch_ms.unit = "ms"  # type: ignore[attr-defined]

    def track_ms_per_sample(self, *params: Any) -> float:
        """Steady throughput, inverted: asv reads every value as lower-is-better (1000 / samples per s)."""
        return 1000.0 / float(self._run_case()["samples_per_s"])

    track_ms_per_sample.unit = "ms/sample"  # type: ignore[attr-defined]

    def track_batch_p95_ms(self, *params: Any) -> float:
        return float(self._run_case()["batch_p95_ms"])

    track_batch_p95_ms.unit = "ms"  # type: ignore[attr-defined]
