"""Track 1 in asv: ``Dataset.__getitem__`` speed and the decode path's work, one process, no DataLoader.

The default grid reads the smoke plate (``cache`` ``bounded``: nearly every sample decodes) through
:class:`cropbench.harness.crop_path.CropPath`: ``Fetch``, the relative cost (the gate's timing signal);
``Decoding``, the decode step's work (counts); ``Stages``, the relative cost split into fetch, decode and
assembly. The last two read the ``direct`` reader's instruments and skip on ``zarr`` (never a 0).
``FullFetch`` and ``Latency`` are the full grid (``CROPBENCH_ASV_FULL=1``), the latter raw wall clock.
"""

from __future__ import annotations

from typing import Any

from .common import (
    Benchmark,
    full_grid_off,
    full_layouts,
    make_arrow_plates,
    make_full_plates,
    older_commit,
    plate_for,
    skip,
)

OLDER_COMMIT: str | None = None
try:
    from cropbench import metrics as m
    from cropbench.config import CropConfig
    from cropbench.harness.context import RunContext
    from cropbench.harness.crop_path import CropPath, cache_knobs, channel_names, unmeasured
    from cropbench.harness.dataset_case import DatasetCase, run_case
    from cropbench.measure.protocol import configure_threads
except ImportError as error:
    OLDER_COMMIT = older_commit(error)

#: The default grid's cases: 96 px crops of every channel, no transform, the smoke plate.
DEFAULT_GRID = (["random", "grouped-field"], ["direct", "zarr"], ["bounded", "default"])
DEFAULT_NAMES = ("access", "decode", "cache")
#: The full grid's cases: the full plate in every layout (``CROPBENCH_ASV_FULL=1``).
FULL_GRID = (
    ["random", "grouped-field", "chunk-aware", "paired"],
    ["direct", "zarr", "field"],
    [64, 96, 128],
    ["all", "DNA+RNA+Mito"],
    ["none", "light", "typical"],
    full_layouts(),
)
FULL_NAMES = ("access", "decode", "crop_size", "channels", "tier", "layout")
#: Steady-state samples per ``run_case`` call: enough for a reliable p95 (200 needed).
RUN_CASE_SAMPLES = 300


class Fetch(Benchmark):
    """What the crop path costs, as a ratio to an in-memory copy measured beside it."""

    unit = "x in-memory copy"
    params, param_names, version = DEFAULT_GRID, DEFAULT_NAMES, "2"

    def setup(self, plates: dict[str, str], access: str, decode: str, cache: str) -> None:
        skip(OLDER_COMMIT or unmeasured(decode, cache))
        configure_threads(1)
        self.path = CropPath(plate_for(plates, "default"), CropConfig(decode=decode, **cache_knobs(cache)), access)

    def track_relative_cost(self, *params: Any) -> float:
        return self.path.relative_cost()

    def peakmem_epoch(self, *params: Any) -> None:
        self.path.read_epoch()


class Decoding(Benchmark):
    """The decode step's work over one epoch from a fresh dataset, per byte delivered (``direct`` only)."""

    params, param_names, version = DEFAULT_GRID, DEFAULT_NAMES, "2"

    def setup(self, plates: dict[str, str], access: str, decode: str, cache: str) -> None:
        skip(OLDER_COMMIT or unmeasured(decode, cache, instruments=True))
        configure_threads(1)
        crop = CropConfig(decode=decode, **cache_knobs(cache))
        self.path = CropPath(plate_for(plates, "default"), crop, access, stage_timed=True)

    def track_decode_amplification(self, *params: Any) -> float:
        return self.path.decode_amplification()

    track_decode_amplification.unit = "bytes decoded / byte delivered"  # type: ignore[attr-defined]

    def track_decode_calls(self, *params: Any) -> float:
        return self.path.decode_calls_per_mib()

    track_decode_calls.unit = "decode calls / MiB delivered"  # type: ignore[attr-defined]


class Stages(Benchmark):
    """``Fetch.track_relative_cost`` split into the reader's stages (``direct`` only), in the same units."""

    unit = "x in-memory copy"
    params, param_names, version = DEFAULT_GRID, DEFAULT_NAMES, "2"

    def setup(self, plates: dict[str, str], access: str, decode: str, cache: str) -> None:
        skip(OLDER_COMMIT or unmeasured(decode, cache, instruments=True, misses=True))
        configure_threads(1)
        crop = CropConfig(decode=decode, **cache_knobs(cache))
        self.path = CropPath(plate_for(plates, "default"), crop, access, stage_timed=True)

    def track_fetch(self, *params: Any) -> float:
        return self.path.stage_cost("fetch")

    def track_decode(self, *params: Any) -> float:
        return self.path.stage_cost("decode")

    def track_assemble(self, *params: Any) -> float:
        return self.path.stage_cost("assemble")


class ArrowFetch(Benchmark):
    """``Fetch.track_relative_cost`` on the OME-Arrow layout: zero-copy ``direct`` and the reference script's ``as-py``.

    The plate is written by the installed ome-arrow (``asv.ome-arrow.conf.json`` measures its
    releases); where it is missing or lacks a writer feature, the cases skip and say why.
    """

    unit = "x in-memory copy"
    params = (["random"], ["direct", "as-py"])
    param_names = ("access", "decode")
    setup_cache = staticmethod(make_arrow_plates)

    def setup(self, plates: dict[str, str], access: str, decode: str) -> None:
        skip(OLDER_COMMIT)
        configure_threads(1)
        self.path = CropPath(plate_for(plates, "ome-arrow"), CropConfig(decode=decode), access)

    def track_relative_cost(self, *params: Any) -> float:
        return self.path.relative_cost()


class _FullGrid(Benchmark):
    """The full grid's cases: every layout of the full plate (``CROPBENCH_ASV_FULL=1``); no benchmarks."""

    params, param_names = FULL_GRID, FULL_NAMES
    setup_cache = staticmethod(make_full_plates)

    def setup(
        self, plates: dict[str, str], access: str, decode: str, crop_size: int, channels: str, tier: str, layout: str
    ) -> None:
        skip(full_grid_off(type(self).__name__) or OLDER_COMMIT)
        configure_threads(1)
        crop = CropConfig(crop_size=crop_size, channels=channel_names(channels), decode=decode, tier=tier)
        self.path = CropPath(plate_for(plates, layout), crop, access)
        self.case = DatasetCase(crop=crop, access=access, samples=RUN_CASE_SAMPLES, warmup=30, cold_samples=0)


class FullFetch(_FullGrid):
    """``Fetch.track_relative_cost`` over the full grid."""

    unit = "x in-memory copy"

    def track_relative_cost(self, *params: Any) -> float:
        return self.path.relative_cost()


class Latency(_FullGrid):
    """Raw wall-clock time of a block of crops, p95 latency and throughput (full grid only)."""

    def time_fetch(self, *params: Any) -> None:
        self.path.read_block()

    def track_p95_ms(self, *params: Any) -> float:
        return float(run_case(RunContext(self.path.plate), self.case, evict_first=False)[m.P95_MS])

    track_p95_ms.unit = "ms"  # type: ignore[attr-defined]

    def track_ms_per_sample(self, *params: Any) -> float:
        """Throughput, inverted: asv reads every value as lower-is-better (1000 / samples per s)."""
        return 1000.0 / float(run_case(RunContext(self.path.plate), self.case, evict_first=False)[m.SAMPLES_PER_S])

    track_ms_per_sample.unit = "ms/sample"  # type: ignore[attr-defined]
