"""Layouts side by side: one plate rewritten in each layout, each measured the same way.

Per layout (track ``layouts``, one record each): pixel bytes on disk, compression ratio, write
time (encode + write, not reading the source), random and grouped-by-field crops/s through
``CropDataset.__getitem__`` (tier ``none``, uint16, one process, page cache warm: every layout is
measured right after it is written), read amplification per crop from the reader's
``ReadStats``, and each throughput's ratio to the raw memory-mapped layout read through the same
dataset (``ratio_to_memmap``), which is always measured first. That layout is the comparison's
reference, not the fetch ceiling: the dataset's per-crop work rides on it too, and a batched reader
can pass it. The ceiling no reader can pass is track ``targets``' (``tracks.targets.CopyCeiling``).
Throughputs are medians of ``repeats`` timed passes over the same indices after a warm-up pass
(``measure.protocol.interleaved_rates``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cropbench import metrics as m
from cropbench.config import (
    CEILING_LAYOUT,
    DECODE_PATHS,
    DEFAULT_CROP_SIZE,
    LAYOUT_GRID,
    OPTIONAL_LAYOUTS,
    CropConfig,
    layout_by_name,
)
from cropbench.data.sampling import access_order
from cropbench.errors import ConfigError
from cropbench.formats import supported_decodes
from cropbench.harness.context import RunContext
from cropbench.harness.runner import Row
from cropbench.harness.work import WorkFolder
from cropbench.measure.protocol import interleaved_rates, per_item, time_each, time_loop
from cropbench.plates.convert import convert_plate
from cropbench.plates.generate import GeneratedPlate

#: The reference layout every layout's rates are divided by (the name ``report`` imports).
ACCESSES = {"random": "random", "grouped": "grouped-field"}
#: Crops timed through OME-Arrow's ``as-py`` path: a whole field converts to Python objects per crop.
AS_PY_SAMPLES = 40


def default_layouts() -> tuple[str, ...]:
    """The full grid, plus the optional layouts whose extra is installed (OME-Arrow)."""
    from cropbench.formats.omearrow import ome_arrow_available

    return LAYOUT_GRID + (OPTIONAL_LAYOUTS if ome_arrow_available() else ())


@dataclass(frozen=True)
class LayoutComparison:
    """What ``compare-layouts`` measures; part of every record it writes."""

    layouts: tuple[str, ...] = LAYOUT_GRID
    crop_size: int = DEFAULT_CROP_SIZE
    decode: str = "direct"
    samples: int = 2000
    warmup: int = 200
    repeats: int = 3
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.layouts:
            raise ConfigError("layouts must name at least one layout")
        for name in self.layouts:
            layout_by_name(name)
        if self.decode not in DECODE_PATHS:
            raise ConfigError(f"decode={self.decode!r} is not one of {', '.join(DECODE_PATHS)}")
        for knob in ("crop_size", "samples", "repeats"):
            if getattr(self, knob) < 1:
                raise ConfigError(f"{knob} must be >= 1, got {getattr(self, knob)}")
        if self.warmup < 0:
            raise ConfigError(f"warmup must be >= 0, got {self.warmup}")

    def ordered(self) -> list[str]:
        """The memmap reference first (its numbers are the denominators), then the rest in the given order."""
        return [CEILING_LAYOUT, *(name for name in dict.fromkeys(self.layouts) if name != CEILING_LAYOUT)]


def measure_layout(plate: str | Path, comparison: LayoutComparison, context: RunContext) -> dict[str, Any]:
    """Random and grouped crops/s and read amplification of ``plate`` (a rewrite of the run's plate)."""
    metrics: dict[str, Any] = {}
    decode = comparison.decode if comparison.decode in supported_decodes(plate) else "field"
    metrics[m.DECODE] = decode
    config = CropConfig(crop_size=comparison.crop_size, dtype="uint16", decode=decode, seed=comparison.seed)
    for label, access in ACCESSES.items():
        dataset = context.dataset(config, plate)
        indices = access_order(dataset, access, comparison.warmup + comparison.samples, comparison.seed)
        warm, timed = indices[: comparison.warmup], indices[comparison.warmup :]
        time_each(dataset.__getitem__, warm)
        dataset.reader.stats.reset()
        rates = interleaved_rates({label: per_item(dataset.__getitem__)}, [timed], comparison.repeats)[label]
        lowest, highest = m.access_crops_per_s_spread_keys(label)
        metrics[m.access_crops_per_s_key(label)] = rates.median
        metrics[lowest], metrics[highest] = min(rates.per_round), max(rates.per_round)
        metrics.update({m.per_crop(label, k): v for k, v in dataset.reader.stats.per_region().items()})
        dataset.reader.close()
    metrics[m.OBJECTS] = len(dataset)
    if "as-py" in supported_decodes(plate):
        dataset = context.dataset(config.replace(decode="as-py"), plate)
        timed = access_order(dataset, "random", AS_PY_SAMPLES, comparison.seed)
        metrics[m.AS_PY_RANDOM_CROPS_PER_S] = len(timed) / time_loop(dataset.__getitem__, timed)
    return metrics


@dataclass(frozen=True)
class LayoutCase:
    """One layout of a comparison: the plate rewritten in it, then measured."""

    layout_name: str
    comparison: LayoutComparison

    @property
    def label(self) -> str:
        return self.layout_name


class Layouts:
    """Track ``layouts`` for the runner: the run's plate rewritten into each layout under ``work_dir``.

    The memory-mapped reference runs first; every later row records its ratios to it.

    Args:
        comparison: The layouts and how each is read.
        work_dir: Where the rewritten plates are written.
        keep: Keep the rewritten plates; by default each is removed once measured.
    """

    name = "layouts"

    def __init__(self, comparison: LayoutComparison, work_dir: str | Path, keep: bool = False) -> None:
        self.comparison = comparison
        self.work = WorkFolder(work_dir, keep)
        self.ceiling: dict[str, Any] = {}

    def cases(self, preset: str, context: RunContext) -> list[LayoutCase]:
        """One case per layout, the reference first. ``preset`` is ignored: the comparison is the whole measurement."""
        return [LayoutCase(name, self.comparison) for name in self.comparison.ordered()]

    def decode(self, case: LayoutCase) -> None:
        """None: every layout is measured (one without the read path is read with ``field``)."""
        return None  # a layout without the decode path is measured with ``field``

    def measure(self, case: LayoutCase, repeat: int, context: RunContext) -> Iterator[Row]:
        """Rewrite the plate in the case's layout, measure it, remove it unless kept: one row."""
        name, comparison = case.layout_name, case.comparison
        context.progress(f"{name}: writing")
        layout = layout_by_name(name)
        destination = self.work.destination(name)
        try:
            converted = convert_plate(context.plate, destination, layout, overwrite=True)
            context.progress(f"{name}: reading")
            metrics = {**_size_metrics(converted), **measure_layout(converted.path, comparison, context)}
        finally:
            self.work.done(destination)
        if name == CEILING_LAYOUT:
            self.ceiling = metrics
        if self.ceiling:
            for label in ACCESSES:
                metrics[m.ratio_to_memmap(label)] = (
                    metrics[m.access_crops_per_s_key(label)] / self.ceiling[m.access_crops_per_s_key(label)]
                )
            metrics[m.SIZE_RATIO_TO_MEMMAP] = metrics[m.STORED_BYTES] / self.ceiling[m.STORED_BYTES]
        config = {
            "layout_name": name,
            "layout": dataclasses.asdict(layout),
            "layout_label": layout.label,
            "source_plate": context.plate.name,  # by name: rows never hold the machine's paths
            "comparison": dataclasses.asdict(comparison),
        }
        yield Row(case, config, metrics, comparison.seed)


def _size_metrics(converted: GeneratedPlate) -> dict[str, Any]:
    return {
        m.RAW_BYTES: converted.raw_bytes,
        m.STORED_BYTES: converted.stored_bytes,
        m.STORED_MIB: converted.stored_bytes / 2**20,
        m.COMPRESSION_RATIO: converted.compression_ratio,
        m.WRITE_SECONDS: converted.write_seconds,
        m.WRITE_MIB_PER_S: converted.raw_bytes / 2**20 / max(converted.write_seconds, 1e-9),
        m.FIELDS: converted.fields,
    }
