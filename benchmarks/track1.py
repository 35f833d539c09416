"""Track 1 in asv: ``Dataset.__getitem__`` speed and stability, one process, no DataLoader.

``Fetch`` (default grid, safe to gate on): ``track_relative_cost`` divides the crop path's time
by the same-process in-memory copy of the same crops; ``track_decode_amplification`` counts
bytes. ``Latency`` holds the raw wall-clock numbers — ``time_fetch`` (a block of crops in the
access pattern's order) and the p95 and throughput of :func:`cropbench.tracks.track1.run_case`
(the harness ``cropbench run`` uses) — and runs with ``CROPBENCH_ASV_FULL=1`` only: in 5
identical-code ``asv continuous`` comparisons ``time_fetch`` alone was flagged once, at 1.42x.
"""

from __future__ import annotations

import math
from typing import Any

from .common import (
    BLOCK,
    RELATIVE_BLOCKS,
    CopyCeiling,
    Suite,
    access_order,
    channel_names,
    crop_config,
    getter,
    grid,
    layouts,
    one_thread,
    plate_for,
    relative_cost,
    require,
    require_full_grid,
)

#: Steady-state samples per ``run_case`` call: enough for a reliable p95 (200 needed).
RUN_CASE_SAMPLES = 300


class _Crops(Suite):
    """One crop configuration read through one access pattern and decode path (no benchmarks)."""

    params = (
        grid(["random", "grouped-field"], ["random", "grouped-field", "chunk-aware", "paired"]),
        grid(["direct"], ["direct", "zarr", "field"]),
        grid([96], [64, 96, 128]),
        grid(["all"], ["all", "DNA+RNA+Mito"]),
        grid(["none"], ["none", "light", "typical"]),
        layouts(),
    )
    param_names = ("access", "decode", "crop_size", "channels", "tier", "layout")

    def setup(
        self,
        plates: dict[str, str],
        access: str,
        decode: str,
        crop_size: int,
        channels: str,
        tier: str,
        layout: str,
    ) -> None:
        one_thread()
        self.plate = plate_for(plates, layout)
        self.access = access
        self.crop = crop_config(crop_size=crop_size, channels=channel_names(channels), decode=decode, tier=tier)
        self.dataset = require("cropbench.data.dataset", "CropDataset")(self.plate, self.crop)
        self.get = getter(self.dataset, access)
        self.indices = access_order(self.dataset, access, BLOCK * RELATIVE_BLOCKS)
        self.block = self.indices[:BLOCK]
        for index in self.indices[: len(self.dataset)]:
            self.get(index)


class Fetch(_Crops):
    """What the crop path costs, in forms that stay put on a busy machine."""

    def track_relative_cost(self, *params: Any) -> float:
        return relative_cost(self.get, CopyCeiling(self.dataset), self.indices)

    track_relative_cost.unit = "x in-memory copy"  # type: ignore[attr-defined]

    def track_decode_amplification(self, *params: Any) -> float:
        """Bytes decoded per byte delivered over one epoch from a fresh dataset (n/a for ``zarr``)."""
        dataset = require("cropbench.data.dataset", "CropDataset")(self.plate, self.crop)
        get = getter(dataset, self.access)
        for index in self.indices[: len(dataset)]:
            get(index)
        stats = dataset.reader.stats
        return float(stats.per_region()["decode_amplification"]) if stats.regions else math.nan

    track_decode_amplification.unit = "bytes decoded / bytes delivered"  # type: ignore[attr-defined]

    def peakmem_epoch(self, *params: Any) -> None:
        for index in range(len(self.dataset)):
            self.get(index)


class Latency(_Crops):
    """Raw wall-clock time of a block of crops, p95 latency and throughput (full grid only)."""

    def setup(self, *args: Any) -> None:
        require_full_grid("Track 1 fetch time, latency and throughput")
        super().setup(*args)

    def time_fetch(self, *params: Any) -> None:
        for index in self.block:
            self.get(index)

    def _run_case(self) -> dict[str, Any]:
        case = require("cropbench.config", "Track1Case")(
            crop=self.crop,
            access=self.access,
            samples=RUN_CASE_SAMPLES,
            warmup=30,
            cold_samples=0,
        )
        return require("cropbench.tracks.track1", "run_case")(self.plate, case, evict_first=False)

    def track_p95_ms(self, *params: Any) -> float:
        return float(self._run_case()["p95_ms"])

    track_p95_ms.unit = "ms"  # type: ignore[attr-defined]

    def track_ms_per_sample(self, *params: Any) -> float:
        """Throughput, inverted: asv reads every value as lower-is-better (1000 / samples per s)."""
        return 1000.0 / float(self._run_case()["samples_per_s"])

    track_ms_per_sample.unit = "ms/sample"  # type: ignore[attr-defined]
