"""Track 2 in asv: DataLoader epochs and what the training loop waits for.

``Loader`` wraps :func:`cropbench.loader.build_loader` (``time_epoch``: one epoch, worker start-up
included, wall clock, with asv's own statistics). ``LoaderLatency`` reports what
:func:`cropbench.tracks.track2.run_case` (the harness ``cropbench run`` uses) measures in raw
milliseconds — first-batch latency, steady throughput, batch-wait p95 — and runs with
``CROPBENCH_ASV_FULL=1`` only (see benchmarks/common.py for why). asv's ``peakmem_*`` sees only
the main process, so worker memory is left to ``cropbench run`` (it records every worker's RSS).
"""

from __future__ import annotations

from typing import Any

from .common import Suite, crop_config, grid, layouts, one_thread, plate_for, require, require_full_grid

#: Samples per epoch: a few dozen batches, so an epoch is short but not one batch.
EPOCH_SAMPLES = 512


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

    def setup(self, plates: dict[str, str], num_workers: int, batch_size: int, decode: str, tier: str,
              layout: str) -> None:
        one_thread()
        self.plate = plate_for(plates, layout)
        loader_spec = require("cropbench.loader", "LoaderSpec")(num_workers=num_workers, batch_size=batch_size)
        crop = crop_config(crop_size=96, decode=decode, tier=tier)
        self.case = require("cropbench.tracks.track2", "Track2Case")(
            crop=crop, loader=loader_spec, samples=EPOCH_SAMPLES, epochs=2,
        )
        dataset = require("cropbench.dataset", "CropDataset")(self.plate, crop)
        sampler = require("cropbench.sampling", "sampler_for")(dataset, "random", 0)
        orders = require("cropbench.loader", "schedule")(sampler, EPOCH_SAMPLES, 1)
        scheduled = require("cropbench.loader", "ScheduledSampler")(orders)
        self.loader = require("cropbench.loader", "build_loader")(dataset, loader_spec, scheduled, 0)



class Loader(_Loading):
    """Whole epochs through the DataLoader."""

    def time_epoch(self, *params: Any) -> None:
        for _ in self.loader:
            pass

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
