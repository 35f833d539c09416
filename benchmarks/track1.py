"""Track 1 in asv: ``Dataset.__getitem__`` speed and the decode path's work, one process, no DataLoader.

Default grid (the smoke plate; ``cache`` ``bounded`` makes nearly every sample decode):

- ``Fetch.track_relative_cost``: the sampler's next index and its crop, over the time of cutting
  the same crop from fields in memory, block by block in one call (the gate's timing signal);
- ``Decoding``: the decode step's work per byte delivered over one epoch (bytes out of the
  codecs, decode calls) — counts, so identical code gives identical values;
- ``Stages``: ``track_relative_cost`` split into the reader's fetch, decode and assembly.

``Decoding`` and ``Stages`` need the ``direct`` reader's instruments; the ``zarr`` path has none
and skips (never a 0). ``FullFetch`` and ``Latency`` are the full grid (``CROPBENCH_ASV_FULL=1``):
every layout of the full plate, and raw wall-clock values (``time_fetch``, p95, throughput).
"""

from __future__ import annotations

from typing import Any

from .common import (
    BLOCK,
    CACHES,
    RELATIVE_BLOCKS,
    ArrowSuite,
    FullSuite,
    Suite,
    access_order,
    cache_knobs,
    channel_names,
    crop_config,
    crop_dataset,
    decode_work,
    full_layouts,
    getter,
    import_track_piece,
    memory_reference,
    one_thread,
    plate_for,
    relative_cost,
    require_full_grid,
    sampled,
    skips_older_commits,
    stage_costs,
    stage_timed_dataset,
)

#: Steady-state samples per ``run_case`` call: enough for a reliable p95 (200 needed).
RUN_CASE_SAMPLES = 300


class _Crops:
    """Reads one crop configuration through one access pattern (no benchmarks; mixed into suites)."""

    def prepare(self, plate: str, access: str, crop: Any, stage_timed: bool = False) -> None:
        from cropbench.harness.memory_reference import MemoryReference  # noqa: F401 - the bodies' reference, checked here
        from cropbench.measure.protocol import relative_cost  # noqa: F401 - the bodies' measure, checked here

        one_thread()
        self.plate, self.access, self.crop = plate, access, crop
        self.dataset = stage_timed_dataset(plate, crop) if stage_timed else crop_dataset(plate, crop)
        self.get = getter(self.dataset, access)
        self.indices = access_order(self.dataset, access, BLOCK * RELATIVE_BLOCKS)
        self.block = self.indices[:BLOCK]
        for index in self.indices[: len(self.dataset)]:
            self.get(index)

    def relative_cost(self) -> float:
        """The sampler's next index and its crop, over cutting the same crop from fields in memory."""
        return relative_cost(sampled(self.get, self.dataset, self.access), memory_reference(self.dataset), self.indices)


class _DefaultCrops(_Crops, Suite):
    """The default grid's cases: 96 px crops of every channel, no transform, the smoke plate."""

    params = (["random", "grouped-field"], ["direct", "zarr"], list(CACHES))
    param_names = ("access", "decode", "cache")
    version = "2"
    #: Whether the reader needs the ``direct`` path's instruments (stage clocks, decode counts).
    instrumented = False

    @skips_older_commits()
    def setup(self, plates: dict[str, str], access: str, decode: str, cache: str) -> None:
        if decode != "direct" and self.instrumented:
            raise NotImplementedError(f"the {decode} path has no stage clocks or decode counters (only 'direct')")
        if decode != "direct" and cache != "bounded":
            raise NotImplementedError(f"the {decode} path has no decoded-chunk cache: only the 'bounded' case runs")
        crop = crop_config(decode=decode, **cache_knobs(cache))
        self.prepare(plate_for(plates, "default"), access, crop, stage_timed=self.instrumented)


class Fetch(_DefaultCrops):
    """What the crop path costs, as a ratio to an in-memory copy measured beside it."""

    def track_relative_cost(self, *params: Any) -> float:
        return self.relative_cost()

    track_relative_cost.unit = "x in-memory copy"  # type: ignore[attr-defined]

    def peakmem_epoch(self, *params: Any) -> None:
        for index in range(len(self.dataset)):
            self.get(index)


class Decoding(_DefaultCrops):
    """The decode step's work over one epoch from a fresh dataset, per byte delivered (``direct`` only)."""

    instrumented = True

    def track_decode_amplification(self, *params: Any) -> float:
        reader = decode_work(self.plate, self.crop, self.access, self.indices)
        return reader.decoded_bytes / reader.stats.bytes_delivered

    track_decode_amplification.unit = "bytes decoded / byte delivered"  # type: ignore[attr-defined]

    def track_decode_calls(self, *params: Any) -> float:
        reader = decode_work(self.plate, self.crop, self.access, self.indices)
        return reader.decode_calls / (reader.stats.bytes_delivered / 2**20)

    track_decode_calls.unit = "decode calls / MiB delivered"  # type: ignore[attr-defined]


class Stages(_DefaultCrops):
    """``Fetch.track_relative_cost`` split into the reader's stages (``direct`` only), in the same units."""

    instrumented = True

    @skips_older_commits()
    def setup(self, plates: dict[str, str], access: str, decode: str, cache: str) -> None:
        from cropbench.measure.protocol import Stopwatch  # noqa: F401 - used by common.stage_costs, checked here

        if cache != "bounded":
            raise NotImplementedError("the whole plate is in the cache: nothing is fetched or decoded (see 'bounded')")
        super().setup(plates, access, decode, cache)

    def _stage(self, stage: str) -> float:
        get = sampled(self.get, self.dataset, self.access)
        return stage_costs(self.dataset, get, memory_reference(self.dataset), self.indices)[stage]

    def track_fetch(self, *params: Any) -> float:
        return self._stage("fetch")

    def track_decode(self, *params: Any) -> float:
        return self._stage("decode")

    def track_assemble(self, *params: Any) -> float:
        return self._stage("assemble")

    track_fetch.unit = track_decode.unit = track_assemble.unit = "x in-memory copy"  # type: ignore[attr-defined]


class ArrowFetch(_Crops, ArrowSuite):
    """``Fetch.track_relative_cost`` on the OME-Arrow layout: zero-copy ``direct`` and the reference script's ``as-py``.

    The plate is written by the installed ome-arrow (``asv.ome-arrow.conf.json`` measures its
    releases); where it is missing or lacks a writer feature, the cases skip and say why.
    """

    params = (["random"], ["direct", "as-py"])
    param_names = ("access", "decode")

    @skips_older_commits()
    def setup(self, plates: dict[str, str], access: str, decode: str) -> None:
        self.prepare(plate_for(plates, "ome-arrow"), access, crop_config(decode=decode))

    def track_relative_cost(self, *params: Any) -> float:
        return self.relative_cost()

    track_relative_cost.unit = "x in-memory copy"  # type: ignore[attr-defined]


class _FullCrops(_Crops, FullSuite):
    """The full grid's cases: the full plate in every layout (``CROPBENCH_ASV_FULL=1``)."""

    params = (
        ["random", "grouped-field", "chunk-aware", "paired"],
        ["direct", "zarr", "field"],
        [64, 96, 128],
        ["all", "DNA+RNA+Mito"],
        ["none", "light", "typical"],
        full_layouts(),
    )
    param_names = ("access", "decode", "crop_size", "channels", "tier", "layout")

    @skips_older_commits()
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
        require_full_grid(type(self).__name__)
        crop = crop_config(crop_size=crop_size, channels=channel_names(channels), decode=decode, tier=tier)
        self.prepare(plate_for(plates, layout), access, crop)
        self.dataset_case, self.run_context = import_track_piece("dataset case"), import_track_piece("run context")


class FullFetch(_FullCrops):
    """``Fetch.track_relative_cost`` over the full grid."""

    def track_relative_cost(self, *params: Any) -> float:
        return self.relative_cost()

    track_relative_cost.unit = "x in-memory copy"  # type: ignore[attr-defined]


class Latency(_FullCrops):
    """Raw wall-clock time of a block of crops, p95 latency and throughput (full grid only)."""

    def time_fetch(self, *params: Any) -> None:
        for index in self.block:
            self.get(index)

    def _run_case(self) -> dict[str, Any]:
        case = self.dataset_case.Track1Case(
            crop=self.crop, access=self.access, samples=RUN_CASE_SAMPLES, warmup=30, cold_samples=0
        )
        return self.dataset_case.run_case(self.run_context.RunContext(plate=self.plate), case, evict_first=False)

    def track_p95_ms(self, *params: Any) -> float:
        return float(self._run_case()["p95_ms"])

    track_p95_ms.unit = "ms"  # type: ignore[attr-defined]

    def track_ms_per_sample(self, *params: Any) -> float:
        """Throughput, inverted: asv reads every value as lower-is-better (1000 / samples per s)."""
        return 1000.0 / float(self._run_case()["samples_per_s"])

    track_ms_per_sample.unit = "ms/sample"  # type: ignore[attr-defined]
