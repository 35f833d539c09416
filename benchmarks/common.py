"""Shared helpers of the asv suites: plates made once, parameter grids, skips, and the reference.

Benchmark bodies stay one to three lines; what they need is built here. asv imports the suites
under every commit it measures, so cropbench is imported lazily through :func:`require`: a commit
that predates a track or a knob turns into a skip (``NotImplementedError`` in ``setup``), not a
failed import of the whole suite.

Stability on a small, shared machine rests on three choices:
- ``time_*`` benchmarks time a block of crops per sample (not one crop), many samples per round,
  two interleaved rounds, so asv's Mann-Whitney test has data to work with;
- ``track_*`` values of the default grid are normalised or deterministic: the crop path's time
  over the time of cutting the same crops out of fields already in memory, measured block by
  block in the same process (a neighbour's job or a clock change slows both and cancels), read
  amplification, step time over compute-only step time;
- raw wall-clock ``track_*`` values (p95 in ms, ms per sample, first-batch ms) varied 1.3-1.9x
  between processes on the 2-core development machine while the normalised cost varied 1.06-1.16x,
  so they would make ``asv continuous`` flag noise: they live in classes that skip unless
  ``CROPBENCH_ASV_FULL=1`` (:func:`require_full_grid`).
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

#: Opt-in switch for the larger grid (``CROPBENCH_ASV_FULL=1 asv run ...``).
FULL_GRID = os.environ.get("CROPBENCH_ASV_FULL", "") == "1"
#: Crops read per ``time_*`` sample and per block of the relative-cost measurement.
BLOCK = 32
#: Blocks whose ratios make one ``track_relative_cost`` value (40 blocks varied twice as much).
RELATIVE_BLOCKS = 120
#: Fraction of blocks dropped at each end before averaging the ratios.
TRIM = 0.1
#: Where ``setup_cache`` writes plates (relative to asv's per-run cache directory).
PLATE_DIR = "plates"


def grid(default: Sequence[Any], full: Sequence[Any]) -> list[Any]:
    """A parameter's values: small by default, larger with ``CROPBENCH_ASV_FULL=1``."""
    return list(full if FULL_GRID else default)


def require_full_grid(what: str) -> None:
    """Skip raw wall-clock values unless the full grid is asked for (see the module docstring)."""
    if not FULL_GRID:
        raise NotImplementedError(
            f"{what} are raw wall-clock values that vary between processes on a shared machine; "
            "they run with CROPBENCH_ASV_FULL=1"
        )


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
    "cropbench.tracks.track1.run_case": "4cec727",
    **dict.fromkeys(
        (
            "cropbench.tracks.track2.MemoryCrops",
            "cropbench.tracks.track2.Track2Case",
            "cropbench.tracks.track2.run_case",
            "cropbench.tracks.track3.Track3Case",
            "cropbench.tracks.track3.run_case",
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


def layouts() -> list[str]:
    """Named layouts to benchmark: only ``default`` unless the full grid is asked for."""
    if not FULL_GRID:
        return ["default"]
    return sorted(require("cropbench.config", "LAYOUTS"))


def plate_preset() -> str:
    return "full" if FULL_GRID else "smoke"


def make_plates() -> dict[str, str]:
    """``setup_cache`` of every suite: write the plate once per layout, return layout -> path."""
    generate_plate = require("cropbench.plates.generate", "generate_plate")
    spec = require("cropbench.config", "plate_preset")(plate_preset())
    layout_by_name = require("cropbench.config", "layout_by_name")
    plates = {}
    for name in layouts():
        path = Path(PLATE_DIR, f"{name}.zarr").absolute()
        generate_plate(path, spec, layout_by_name(name), overwrite=True, progress=False)
        plates[name] = str(path)
    return plates


def plate_for(plates: dict[str, str], layout: str) -> str:
    if layout not in plates:
        raise NotImplementedError(f"layout {layout!r} was not generated (layouts: {', '.join(plates)})")
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


class CopyCeiling:
    """The same crops cut from fields already in memory, cast like the dataset casts them.

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
