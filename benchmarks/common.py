"""Shared helpers of the asv suites: plates made once, parameters, skips, and the references.

Benchmark bodies stay one to three lines; what they need is built here. asv imports the suites
under every commit it measures, so cropbench is imported lazily through :func:`require`: a commit
that predates a track or a knob turns into a skip (``NotImplementedError`` in ``setup``), not a
failed import of the whole suite.

The default grid (the classes without ``Full`` or ``Latency`` in their name) reads the smoke
plate in the default layout. Its Track 1 cases run with the decoded-chunk cache ``bounded``
(1 MiB, a twelfth of the plate's 11.7 MB of decoded pixels, so nearly every sample decodes its
chunks) and at cropbench's ``default`` budget (the plate fits: timed samples hit the cache).

asv 0.6 keeps, for a ``track_*`` benchmark, only the value of the last round (``add_result``
replaces it; there are no samples to pool), so each side of ``asv continuous`` is one call. A
gated ``track_*`` value is therefore a statistic over many blocks inside that call: the crop
path's time over the time of cutting the same crops from fields in memory, measured block by
block, reference and crop path taking turns (:func:`cropbench.measure.protocol.relative_cost`),
so a neighbour's job slows both and cancels; or a count of work (bytes and calls of the decode
step), which does not depend on the clock at all.

The full grid is its own classes (``FullFetch``, ``Latency``, ...), with fixed parameters: they
skip unless ``CROPBENCH_ASV_FULL=1`` is set when they run (:func:`require_full_grid`), so the
benchmark names and parameters never depend on the environment asv was started in. They hold the
larger plate, every layout, and raw wall-clock values (p95 ms, ms per sample, first-batch ms),
which varied 1.3-1.9x between processes on the 2-core development machine.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

#: Opt-in switch of the full-grid classes, read when a benchmark runs (not at import).
FULL_GRID_SWITCH = "CROPBENCH_ASV_FULL"
#: Crops read per ``time_*`` sample and per block of the relative-cost measurement.
BLOCK = 32
#: Blocks whose ratios make one ``track_relative_cost`` value (40 blocks varied twice as much).
RELATIVE_BLOCKS = 120
#: Fraction of blocks dropped at each end before averaging the ratios.
TRIM = 0.1
#: Where ``setup_cache`` writes plates (relative to asv's per-run cache directory).
PLATE_DIR = "plates"
#: The decoded-chunk cache of the ``bounded`` cases: 1 MiB, far below the smoke plate (11.7 MB).
BOUNDED_CACHE_BYTES = 2**20
#: The ``cache`` parameter: ``bounded`` (every timed sample decodes) or cropbench's ``default``.
CACHES = ("bounded", "default")
#: What an installed ome-arrow must offer for cropbench to write its layouts: keyword -> first release.
OME_ARROW_WRITER_KEYWORDS = {"chunk_shape": "0.0.6", "chunk_encoding": "0.0.10", "chunk_compression": "0.0.10"}
#: Prefix of a ``make_full_plates`` value that is a reason, not a path.
UNAVAILABLE = "unavailable: "


def full_grid_enabled() -> bool:
    return os.environ.get(FULL_GRID_SWITCH, "") == "1"


def require_full_grid(what: str) -> None:
    """Skip a full-grid class unless ``CROPBENCH_ASV_FULL=1`` (see the module docstring)."""
    if not full_grid_enabled():
        raise NotImplementedError(f"{what}: full grid, runs with {FULL_GRID_SWITCH}=1")


#: Symbols the suites use that older commits lack: ``module.name`` -> the commit it appeared in.
#: Only these turn into an asv skip on a commit without them; any other missing symbol is a broken
#: benchmark (a rename, a typo) and fails.
ADDED_IN: dict[str, str] = {
    **dict.fromkeys(
        (
            "cropbench.data.dataset.CropDataset",
            "cropbench.data.dataset.PairedViews",
            "cropbench.data.loader.LoaderSpec",
            "cropbench.data.loader.ScheduledSampler",
            "cropbench.data.loader.build_loader",
            "cropbench.data.loader.schedule",
            "cropbench.data.sampling.access_order",
            "cropbench.data.sampling.sampler_for",
            "cropbench.data.transforms.TORCH_DTYPES",
            "cropbench.measure.protocol.configure_threads",
            "cropbench.plates.generate.generate_plate",
        ),
        "c9c71ed",
    ),
    "cropbench.measure.protocol.relative_cost": "a4c3d6b",
    "cropbench.measure.protocol.Stopwatch": "638c776",
    "cropbench.formats.read_plate_metadata": "c9c71ed",
    "cropbench.formats.direct.StageTimedChunkReader": "c9c71ed",  # formats.chunks in older commits
    # Before the tracks were named by track, these lived in cropbench.tracks.track1/track2/track3 and
    # tracks.layouts: commits before that skip them. The commit given is where each first appeared there.
    "cropbench.harness.dataset_case.run_case": "4cec727",
    "cropbench.harness.context.RunContext": "4cec727",
    "cropbench.harness.work.WorkFolder": "fb7103c",  # in tracks.layouts before
    "cropbench.config.StoreConfig": "2f18851",
    "cropbench.formats.sources.mirror_metadata": "2f18851",
    "cropbench.measure.endpoints.nginx_binary": "2f18851",
    "cropbench.measure.endpoints.http_plate": "cf64caa",
    "cropbench.measure.remote.requests_per_crop": "cf64caa",
    "cropbench.metrics.REQUESTS_PER_CROP": "e583338",
    # Named in tracks.out_of_memory from fb7103c until every metric name moved into cropbench.metrics.
    "cropbench.metrics.DEVICE_BYTES_PER_CROP": "fb7103c",
    "cropbench.metrics.BYTES_TRANSFERRED_PER_CROP": "e583338",
    **dict.fromkeys(
        (
            "cropbench.measure.zarr_stages.measure_stages",
            "cropbench.measure.zarr_stages.STORE",
            "cropbench.measure.zarr_stages.CODEC",
            "cropbench.measure.zarr_stages.INDEX_ASSEMBLE",
            "cropbench.measure.zarr_stages.STORE_READS_PER_CROP",
            "cropbench.measure.zarr_stages.STORE_BYTES_PER_CROP",
            "cropbench.measure.zarr_stages.CHUNKS_DECODED_PER_CROP",
        ),
        "ddad099",
    ),
    "cropbench.measure.instructions.measure_instructions": "9e20e58",
    "cropbench.measure.instructions.InstructionWorkload": "9e20e58",
    "cropbench.plates.scale.generate_scale_plate": "a354f74",
    "cropbench.plates.scale.ScaleSpec": "a354f74",
    "cropbench.measure.memory_limit.cgroup_parent": "2e1c751",
    "cropbench.measure.memory_limit.process_read_bytes": "2e1c751",
    "cropbench.measure.memory_limit.run_limited": "2e1c751",
    **dict.fromkeys(
        (
            "cropbench.tracks.out_of_memory.OutOfMemory",
            "cropbench.tracks.out_of_memory.plate_spec_for",
            "cropbench.tracks.out_of_memory.random_pass",
        ),
        "fb7103c",
    ),
    **dict.fromkeys(
        (
            "cropbench.harness.loader_case.MemoryCrops",
            "cropbench.harness.loader_case.Track2Case",
            "cropbench.harness.loader_case.run_case",
            "cropbench.tracks.training.Track3Case",
            "cropbench.tracks.training.run_case",
        ),
        "e715620",
    ),
}


def require(module: str, name: str) -> Any:
    """``module.name`` from the installed cropbench; a skip only if ``ADDED_IN`` says older commits lack it."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        added = ADDED_IN.get(f"{module}.{name}")
        if added is None:
            raise LookupError(
                f"{module}.{name} is missing ({error}) and is not in benchmarks.common.ADDED_IN: "
                "a renamed or removed symbol; update the benchmark, or list the commit it appeared in"
            ) from error
        raise NotImplementedError(f"{module}.{name} is not in this commit of cropbench (added in {added})") from error


def track1_case(**knobs: Any) -> Any:
    """A Track 1 case: ``Track1Case`` lives in ``harness.dataset_case``; in ``tracks.track1`` before the
    tracks were named by track, and in ``config`` in older commits."""
    for module in ("cropbench.harness.dataset_case", "cropbench.tracks.track1"):
        with contextlib.suppress(ImportError, AttributeError):
            return importlib.import_module(module).Track1Case(**knobs)
    return require("cropbench.config", "Track1Case")(**knobs)


def full_layouts() -> list[str]:
    """Every named layout of this commit (the full grid's ``layout`` values)."""
    try:
        return sorted(require("cropbench.config", "LAYOUTS"))
    except (LookupError, NotImplementedError):
        return ["default"]


def cache_knobs(cache: str) -> dict[str, int]:
    """``cache`` parameter -> CropConfig knobs: the ``bounded`` budget, or none (cropbench's default)."""
    if cache not in CACHES:
        raise ValueError(f"cache must be one of {CACHES}, got {cache!r}")
    return {"chunk_cache_bytes": BOUNDED_CACHE_BYTES} if cache == "bounded" else {}


def missing_writer_feature(layout: Any) -> str | None:
    """Why the installed format library cannot write ``layout`` (a feature its release lacks), or None."""
    if getattr(layout, "format", "") != "ome-arrow":
        return None
    import inspect
    from importlib.metadata import version

    try:
        import ome_arrow
    except ImportError:
        return "ome-arrow is not installed"
    keywords = inspect.signature(ome_arrow.from_numpy).parameters
    for keyword, since in OME_ARROW_WRITER_KEYWORDS.items():
        if keyword not in keywords:
            return f"ome-arrow {version('ome-arrow')}: from_numpy has no {keyword}= (added in {since})"
    return None


def _write_plates(preset: str, names: Sequence[str]) -> dict[str, str]:
    generate_plate = require("cropbench.plates.generate", "generate_plate")
    spec = require("cropbench.config", "plate_preset")(preset)
    layout_by_name = require("cropbench.config", "layout_by_name")
    plates = {}
    for name in names:
        try:
            layout = layout_by_name(name)
        except ValueError as error:  # an older commit without this layout
            plates[name] = UNAVAILABLE + str(error)
            continue
        missing = missing_writer_feature(layout)
        if missing is not None:
            plates[name] = UNAVAILABLE + missing
            continue
        path = Path(PLATE_DIR, preset, f"{name}.zarr").absolute()
        generate_plate(path, spec, layout, overwrite=True, progress=False)
        plates[name] = str(path)
    return plates


def make_plates() -> dict[str, str]:
    """``setup_cache`` of the default grid: the smoke plate in the default layout."""
    return _write_plates("smoke", ["default"])


def make_arrow_plates() -> dict[str, str]:
    """``setup_cache`` of the OME-Arrow cases: the smoke plate in the ``ome-arrow`` layout, or why not."""
    return _write_plates("smoke", ["ome-arrow"])


def make_full_plates() -> dict[str, str]:
    """``setup_cache`` of the full grid: the full plate in every layout, or nothing unless asked for."""
    return _write_plates("full", full_layouts()) if full_grid_enabled() else {}


def plate_for(plates: dict[str, str], layout: str) -> str:
    if layout not in plates:
        raise NotImplementedError(f"layout {layout!r} was not generated (layouts: {', '.join(plates) or 'none'})")
    if plates[layout].startswith(UNAVAILABLE):
        raise NotImplementedError(plates[layout])
    return plates[layout]


def one_thread() -> None:
    """One torch intra-op thread, as the CLI runs: 2-core machines otherwise oversubscribe."""
    require("cropbench.measure.protocol", "configure_threads")(1)


def channel_names(channels: str) -> tuple[str, ...] | None:
    """Parameter value -> CropConfig.channels: ``all`` or names joined by ``+``."""
    return None if channels == "all" else tuple(channels.split("+"))


def crop_config(**knobs: Any) -> Any:
    """A CropConfig, or a skip when this commit rejects or lacks one of the knobs."""
    config_class = require("cropbench.config", "CropConfig")
    try:
        return config_class(**knobs)
    except TypeError as error:
        raise NotImplementedError(f"CropConfig of this commit does not take {sorted(knobs)}: {error}") from error


def getter(dataset: Any, access: str) -> Callable[[int], Any]:
    """What a training loop calls per object: one view, or two views for ``paired``."""
    if access == "paired":
        return require("cropbench.data.dataset", "PairedViews")(dataset).__getitem__
    return dataset.__getitem__


def access_order(dataset: Any, access: str, count: int, seed: int = 0) -> list[int]:
    """``count`` indices in the access pattern's order (:func:`cropbench.data.sampling.access_order`)."""
    return [int(i) for i in require("cropbench.data.sampling", "access_order")(dataset, access, count, seed)]


class Suite:
    """asv attributes every suite shares; suites subclass it (it has no benchmarks itself).

    Wall clock (workers and I/O are involved), one call per sample (each call reads a block),
    up to 20 samples in ~2 s per round, two rounds that ``asv continuous`` interleaves across
    the two commits. ``version`` is bumped by a suite when what it measures is redefined.
    """

    timer = staticmethod(time.perf_counter)
    number = 1
    repeat = (10, 20, 2.0)
    warmup_time = 0.2
    rounds = 2
    version = "1"
    setup_cache = staticmethod(make_plates)


class ArrowSuite(Suite):
    """A suite of the OME-Arrow layout: skipped where ome-arrow is missing or cannot write it."""

    setup_cache = staticmethod(make_arrow_plates)


class FullSuite(Suite):
    """A full-grid suite: the full plate in every layout, written only with ``CROPBENCH_ASV_FULL=1``."""

    setup_cache = staticmethod(make_full_plates)


class MemoryReference:
    """The same crops cut from fields already in memory, cast like the dataset casts them: the
    reference of :func:`relative_cost` (not a ceiling: it casts like the dataset, per crop, in Python;
    the fetch ceiling is :class:`cropbench.tracks.targets.CopyCeiling`).

    It does no decoding, no chunk lookup and no cache bookkeeping, and it does not go through the
    code under test, so a slowdown anywhere in cropbench's crop path raises the ratio to it; a
    slowdown of the whole machine raises both and cancels.
    """

    def __init__(self, dataset: Any) -> None:
        import torch

        reader = dataset.reader
        channels = list(dataset.channel_indices)
        self.fields = [reader.read_field(i)[channels] for i in range(len(reader.metadata.fields))]
        _, height, width = reader.metadata.field_shape
        size = dataset.config.crop_size
        self.size = size
        self.field_index = np.asarray(dataset.field_index)
        self.y0 = np.clip(np.asarray(dataset.window_y0), 0, height - size)
        self.x0 = np.clip(np.asarray(dataset.window_x0), 0, width - size)
        self.dtype = require("cropbench.data.transforms", "TORCH_DTYPES")[dataset.config.dtype]
        self._from_numpy = torch.from_numpy

    def __call__(self, index: int) -> Any:
        y0, x0, size = int(self.y0[index]), int(self.x0[index]), self.size
        window = self.fields[int(self.field_index[index])][:, y0 : y0 + size, x0 : x0 + size]
        return self._from_numpy(np.ascontiguousarray(window)).to(self.dtype)


def relative_cost(get: Callable[[int], Any], reference: Callable[[int], Any], indices: Sequence[int]) -> float:
    """:func:`cropbench.measure.protocol.relative_cost` over blocks of ``BLOCK`` crops, ``TRIM`` dropped at each end."""
    return float(require("cropbench.measure.protocol", "relative_cost")(get, reference, indices, BLOCK, TRIM))


class SamplerStream:
    """What a training loop does before each crop: take the sampler's next index, epoch after epoch.

    Called with the index the access order expects (and ignoring it), so :func:`relative_cost` can
    time the sampler and the crop together against a reference that reads the same crop.
    """

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler
        self.epoch = 0
        self._indices: Iterator[int] = iter(())

    def __call__(self, expected: int) -> int:
        index = next(self._indices, None)
        if index is None:
            self.sampler.set_epoch(self.epoch)
            self.epoch += 1
            self._indices = iter(self.sampler)
            index = next(self._indices)
        return index


def sampled(get: Callable[[int], Any], dataset: Any, access: str) -> Callable[[int], Any]:
    """``get`` of the index the access pattern's sampler yields next (the same order as :func:`access_order`)."""
    stream = SamplerStream(require("cropbench.data.sampling", "sampler_for")(dataset, access, 0))
    return lambda expected: get(stream(expected))


def stage_timed_reader_class() -> Any:
    """``StageTimedChunkReader``: in ``cropbench.formats.direct``, in ``cropbench.formats.chunks`` in older commits."""
    try:
        return require("cropbench.formats.direct", "StageTimedChunkReader")
    except NotImplementedError as missing:
        try:
            return importlib.import_module("cropbench.formats.chunks").StageTimedChunkReader
        except (ImportError, AttributeError):
            raise missing from None


def stage_timed_dataset(plate: str, crop: Any) -> Any:
    """A ``direct`` dataset whose reader clocks fetch, decode and assembly and counts the decode step's work."""
    metadata = require("cropbench.formats", "read_plate_metadata")(plate)
    reader = stage_timed_reader_class()(metadata, crop.chunk_cache_bytes)
    if not hasattr(reader, "decode_calls"):
        raise NotImplementedError("this commit's stage-timed reader does not count decode calls (added in b4465d5)")
    return require("cropbench.data.dataset", "CropDataset")(plate, crop, reader=reader)


def stage_costs(
    dataset: Any, get: Callable[[int], Any], reference: Callable[[int], Any], indices: Sequence[int]
) -> dict[str, float]:
    """Each stage's part of :func:`relative_cost`: the relative cost times the stage's share of the crop path's time.

    The reader's stage clocks run inside the same calls that :func:`relative_cost` times, so a
    stage's share and the cost come from one measurement; ``assemble`` is the reader's time outside
    fetch and decode (planning, cache lookups, copying pieces into the crop).
    """
    stage_ns = dataset.reader.stage_ns
    stage_ns.update(fetch=0, decode=0, region=0)
    total = require("cropbench.measure.protocol", "Stopwatch")()
    cost = relative_cost(total.wrap(get), reference, indices) / max(total.ns, 1)
    assemble = stage_ns["region"] - stage_ns["fetch"] - stage_ns["decode"]
    return {"fetch": cost * stage_ns["fetch"], "decode": cost * stage_ns["decode"], "assemble": cost * assemble}


def decode_work(plate: str, crop: Any, access: str, indices: Sequence[int]) -> Any:
    """The stage-timed reader after one epoch through the access pattern's sampler, from a fresh dataset."""
    dataset = stage_timed_dataset(plate, crop)
    get = sampled(getter(dataset, access), dataset, access)
    for index in indices[: len(dataset)]:
        get(index)
    return dataset.reader
