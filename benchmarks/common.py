"""Shared pieces of the asv suites: plates made once, parameters, skips, and calls into cropbench.

Benchmark bodies stay one to three lines; what they need is built here, by calls into cropbench.

**Older commits.** asv imports the suites under every commit it measures, so no suite imports
cropbench at module level: each ``setup`` imports what its benchmarks use, inside
:func:`skips_older_commits`, which turns a cropbench module or name the measured commit lacks into
asv's skip (``NotImplementedError``, naming it). Nothing maps names to commits; on the current
checkout every benchmark must run (tests/test_benchmarks.py runs each once), which is what catches a
rename. The modules of the tracks the suites call are named in :data:`TRACK_MODULES` only.

The default grid (the classes without ``Full`` or ``Latency`` in their name) reads the smoke
plate in the default layout. Its Track 1 cases run with the decoded-chunk cache ``bounded``
(1 MiB, far below the smoke plate's decoded pixels, so nearly every sample decodes its chunks) and
at cropbench's ``default`` budget (the plate fits: timed samples hit the cache).

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
which move between processes far more than the in-call ratios (docs/asv.md).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

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
#: Prefix of a ``setup_cache`` plate value that is a reason, not a path.
UNAVAILABLE = "unavailable: "
#: The cropbench module of each track-level piece the suites call (the one place that names them).
TRACK_MODULES = {
    "dataset case": "cropbench.harness.dataset_case",
    "loader case": "cropbench.harness.loader_case",
    "training case": "cropbench.tracks.training",
    "out of memory": "cropbench.tracks.out_of_memory",
    "work folder": "cropbench.harness.work",
    "run context": "cropbench.harness.context",
}


@contextlib.contextmanager
def skips_older_commits() -> Iterator[None]:
    """asv's skip where the measured commit's cropbench lacks a module or name imported inside
    (a decorator of ``setup`` and ``setup_cache``, or a ``with`` block); other errors pass through."""
    try:
        yield
    except ImportError as error:
        if not (error.name or "").startswith("cropbench"):
            raise
        raise NotImplementedError(f"this commit of cropbench lacks what the benchmark uses: {error}") from error


def import_track_piece(piece: str) -> ModuleType:
    """The cropbench module of a track-level piece (:data:`TRACK_MODULES`), for use in :func:`skips_older_commits`."""
    return importlib.import_module(TRACK_MODULES[piece])


def full_grid_enabled() -> bool:
    return os.environ.get(FULL_GRID_SWITCH, "") == "1"


def require_full_grid(what: str) -> None:
    """Skip a full-grid class unless ``CROPBENCH_ASV_FULL=1`` (see the module docstring)."""
    if not full_grid_enabled():
        raise NotImplementedError(f"{what}: full grid, runs with {FULL_GRID_SWITCH}=1")


def full_layouts() -> list[str]:
    """Every named layout of this commit (the full grid's ``layout`` values)."""
    try:
        with skips_older_commits():
            from cropbench.config import LAYOUTS

            return sorted(LAYOUTS)
    except NotImplementedError:
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
    """Each named layout's plate path, or why it could not be written (a setup_cache may not skip: asv fails it)."""
    try:
        with skips_older_commits():
            from cropbench.config import layout_by_name, plate_preset
            from cropbench.plates.generate import generate_plate
    except NotImplementedError as older:
        return dict.fromkeys(names, UNAVAILABLE + str(older))
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
        generate_plate(path, plate_preset(preset), layout, overwrite=True, progress=False)
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
    from cropbench.measure.protocol import configure_threads

    configure_threads(1)


def channel_names(channels: str) -> tuple[str, ...] | None:
    """Parameter value -> CropConfig.channels: ``all`` or names joined by ``+``."""
    return None if channels == "all" else tuple(channels.split("+"))


def crop_config(**knobs: Any) -> Any:
    from cropbench.config import CropConfig

    return CropConfig(**knobs)


def crop_dataset(plate: str | Path, crop: Any, **options: Any) -> Any:
    from cropbench.data.dataset import CropDataset

    return CropDataset(plate, crop, **options)


def getter(dataset: Any, access: str) -> Callable[[int], Any]:
    """What a training loop calls per object: one view, or two views for ``paired``."""
    from cropbench.data.dataset import PairedViews

    return PairedViews(dataset).__getitem__ if access == "paired" else dataset.__getitem__


def access_order(dataset: Any, access: str, count: int, seed: int = 0) -> list[int]:
    """``count`` indices in the access pattern's order (:func:`cropbench.data.sampling.access_order`)."""
    from cropbench.data.sampling import access_order as order

    return [int(i) for i in order(dataset, access, count, seed)]


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


def memory_reference(dataset: Any) -> Any:
    """The dataset's crops cut from its fields in memory and cast like the dataset casts them: the reference
    of :func:`relative_cost` (:class:`cropbench.harness.memory_reference.MemoryReference`; a suite's ``setup``
    imports it, so a commit without it skips)."""
    from cropbench.harness.memory_reference import MemoryReference

    return MemoryReference.of_dataset(dataset)


def relative_cost(get: Callable[[int], Any], reference: Callable[[int], Any], indices: Sequence[int]) -> float:
    """:func:`cropbench.measure.protocol.relative_cost` over blocks of ``BLOCK`` crops, ``TRIM`` dropped at each end."""
    from cropbench.measure.protocol import relative_cost as cost

    return float(cost(get, reference, indices, BLOCK, TRIM))


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
    from cropbench.data.sampling import sampler_for

    stream = SamplerStream(sampler_for(dataset, access, 0))
    return lambda expected: get(stream(expected))


def stage_timed_dataset(plate: str, crop: Any) -> Any:
    """A ``direct`` dataset whose reader clocks fetch, decode and assembly and counts the decode step's work."""
    from cropbench.formats import read_plate_metadata
    from cropbench.formats.direct import StageTimedChunkReader

    reader = StageTimedChunkReader(read_plate_metadata(plate), crop.chunk_cache_bytes)
    return crop_dataset(plate, crop, reader=reader)


def stage_costs(
    dataset: Any, get: Callable[[int], Any], reference: Callable[[int], Any], indices: Sequence[int]
) -> dict[str, float]:
    """Each stage's part of :func:`relative_cost`: the relative cost times the stage's share of the crop path's time.

    The reader's stage clocks run inside the same calls that :func:`relative_cost` times, so a
    stage's share and the cost come from one measurement; ``assemble`` is the reader's time outside
    fetch and decode (planning, cache lookups, copying pieces into the crop).
    """
    from cropbench.measure.protocol import Stopwatch

    stage_ns = dataset.reader.stage_ns
    stage_ns.update(fetch=0, decode=0, region=0)
    total = Stopwatch()
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
