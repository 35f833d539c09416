"""Track 1 in asv: ``Dataset.__getitem__`` speed and stability, one process, no DataLoader.

``Fetch`` wraps :class:`cropbench.CropDataset` and :func:`cropbench.tracks.track1.run_case`:
``time_fetch`` times a block of crops in the access pattern's order, the ``track_*`` values come
from ``run_case`` (the same harness ``cropbench run`` uses) and from the same-process reference.
"""

from __future__ import annotations

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
)

#: Steady-state samples per ``run_case`` call: enough for a reliable p95 (200 needed).
RUN_CASE_SAMPLES = 300


class Fetch(Suite):
    """One crop configuration read through one access pattern and decode path."""

    params = (
        grid(["random", "grouped-field"], ["random", "grouped-field", "chunk-aware", "paired"]),
        grid(["direct", "field"], ["direct", "zarr", "field"]),
        grid([96], [64, 96, 128]),
        grid(["all"], ["all", "DNA+RNA+Mito"]),
        grid(["none"], ["none", "light", "typical"]),
        layouts(),
    )
    param_names = ("access", "decode", "crop_size", "channels", "tier", "layout")

    def setup(
        self, plates: dict[str, str], access: str, decode: str, crop_size: int, channels: str, tier: str,
        layout: str,
    ) -> None:
        one_thread()
        self.plate = plate_for(plates, layout)
        self.access = access
        self.crop = crop_config(crop_size=crop_size, channels=channel_names(channels), decode=decode, tier=tier)
        self.dataset = require("cropbench.dataset", "CropDataset")(self.plate, self.crop)
        self.get = getter(self.dataset, access)
        self.indices = access_order(self.dataset, access, BLOCK * RELATIVE_BLOCKS)
        self.block = self.indices[:BLOCK]
        for index in self.indices:
            self.get(index)

    def _run_case(self) -> dict[str, Any]:
        case = require("cropbench.config", "Track1Case")(
            crop=self.crop, access=self.access, samples=RUN_CASE_SAMPLES, warmup=30, cold_samples=0,
        )
        return require("cropbench.tracks.track1", "run_case")(self.plate, case, evict_first=False)  # type: ignore[no-any-return]

    def time_fetch(self, *params: Any) -> None:
        for index in self.block:
            self.get(index)

    def track_relative_cost(self, *params: Any) -> float:
        return relative_cost(self.get, CopyCeiling(self.dataset), self.indices)

    track_relative_cost.unit = "x in-memory copy"  # type: ignore[attr-defined]

    def track_p95_ms(self, *params: Any) -> float:
        return float(self._run_case()["p95_ms"])

    track_p95_ms.unit = "ms"  # type: ignore[attr-defined]

    def track_ms_per_sample(self, *params: Any) -> float:
        """Throughput, inverted: asv reads every value as lower-is-better (1000 / samples per s)."""
        return 1000.0 / float(self._run_case()["samples_per_s"])

    track_ms_per_sample.unit = "ms/sample"  # type: ignore[attr-defined]

    def track_decode_amplification(self, *params: Any) -> float:
        return float(self._run_case()["decode_amplification"])

    track_decode_amplification.unit = "bytes decoded / bytes delivered"  # type: ignore[attr-defined]

    def peakmem_epoch(self, *params: Any) -> None:
        for index in range(len(self.dataset)):
            self.get(index)
