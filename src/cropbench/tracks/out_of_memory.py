"""Layouts side by side on plates larger than the memory the benchmark may use.

A layout that wins in the page cache can lose on the disk: a shard per field reads a few kB per
crop, a whole-plane chunk reads megabytes. Per layout (track ``out-of-memory``, one record each) a
scale plate is written whose stored bytes are ``plate_multiple`` × the memory limit, then random
crops are read through ``CropDataset.__getitem__`` (tier ``none``, uint16, one process):

- inside the limit (:func:`cropbench.measure.memory_limit.run_limited`): the plate's files are
  evicted first, the cgroup's limit bounds the page cache the pass can hold, and the bytes read
  from the block device (``/proc/self/io``) over the timed pass give device bytes per crop;
- right after, the same indices of the same plate with the plate loaded into the page cache and
  no limit (unless it does not fit in the free memory), so both rates come from one run, back
  to back, each with the load average it ran under.

``device_over_reader`` is the device bytes over the bytes the reader asked for: read-ahead and
file-system blocks at the device, beside the chunk and shard reads the reader counts itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from cropbench import metrics as m
from cropbench.config import DEFAULT_CROP_SIZE, CropConfig, check_seed, layout_by_name
from cropbench.data.sampling import access_order
from cropbench.errors import ConfigError
from cropbench.harness.context import RunContext
from cropbench.harness.runner import Row
from cropbench.harness.work import WorkFolder, WorkSite, deaf_to_stops, uninterrupted
from cropbench.measure.memory_limit import (
    MIN_LIMIT_BYTES,
    process_read_bytes,
    run_in_child,
    run_limited,
)
from cropbench.measure.protocol import evict, load_into_page_cache, resident_fraction, time_loop
from cropbench.plates.scale import MAX_OBJECTS, ScaleSpec, check_crop, generate_scale_plate

TRACK = "out-of-memory"
#: The default layout and two others that read very different amounts per crop.
DEFAULT_LAYOUTS = ("default", "tiles", "planes")
#: The cached pass runs only when the plate takes at most this fraction of the free memory.
CACHED_FRACTION_OF_AVAILABLE = 0.7


@dataclass(frozen=True)
class OutOfMemoryComparison:
    """What ``cropbench scale out-of-memory`` measures; part of every record it writes."""

    layouts: tuple[str, ...] = DEFAULT_LAYOUTS
    limit_bytes: int = 2**30
    plate_multiple: float = 4.0
    #: The plates' fields (size, channels, density, rendered fields, seed); the objects follow from the size.
    plate: ScaleSpec = dataclasses.field(default_factory=ScaleSpec)
    crop_size: int = DEFAULT_CROP_SIZE
    samples: int = 2000
    warmup: int = 100
    seed: int = 0
    #: Also read the same plate in the page cache (when it fits in the free memory).
    cached: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "layouts", tuple(dict.fromkeys(self.layouts)))
        if not self.layouts:
            raise ConfigError("layouts must name at least one layout")
        for name in self.layouts:
            layout_by_name(name)
        if not isinstance(self.limit_bytes, int) or self.limit_bytes < MIN_LIMIT_BYTES:
            raise ConfigError(f"limit_bytes must be at least {MIN_LIMIT_BYTES // 2**20} MiB, got {self.limit_bytes!r}")
        if not 2 <= self.plate_multiple <= 8:
            raise ConfigError(
                f"plate_multiple must be within 2..8 (the plate over the limit), got {self.plate_multiple}"
            )
        for knob in ("crop_size", "samples"):
            if getattr(self, knob) < 1:
                raise ConfigError(f"{knob} must be >= 1, got {getattr(self, knob)}")
        if self.warmup < 0:
            raise ConfigError(f"warmup must be >= 0, got {self.warmup}")
        check_crop(self.crop_size, self.plate)
        check_seed(self.seed)

    def crop(self) -> CropConfig:
        return CropConfig(crop_size=self.crop_size, dtype="uint16", seed=self.seed)

    @property
    def target_bytes(self) -> int:
        return math.ceil(self.limit_bytes * self.plate_multiple)


def random_pass(plate: str, crop: CropConfig, samples: int, warmup: int, seed: int, cold: bool) -> dict[str, Any]:
    """Random crops of ``plate``: evicted first (``cold``) or loaded into the page cache; the device
    bytes and reader counters of the timed pass only (the warm-up opens files and fills the chunk cache).

    ``plate`` is a scale plate this track wrote, with the object table written beside its pixels, and
    ``crop`` is the comparison's own (:meth:`OutOfMemoryComparison.crop`): no run's context applies (an
    ``--objects`` table or crop overrides name another plate), so the plate gets a context of its own."""
    dataset = RunContext(plate=Path(plate)).dataset(crop)
    files = dataset.reader.files()
    metrics: dict[str, Any] = {}
    if cold:
        metrics.update(evict(files).as_metrics())
    else:
        load_into_page_cache(files)
    indices = access_order(dataset, "random", warmup + samples, seed)
    time_loop(dataset.__getitem__, indices[:warmup])
    metrics[m.RESIDENT_BEFORE_PASS] = resident_fraction(files)
    dataset.reader.stats.reset()
    metrics[m.LOADAVG_BEFORE] = os.getloadavg()[0]
    start = process_read_bytes()
    seconds = time_loop(dataset.__getitem__, indices[warmup:])
    end = process_read_bytes()
    metrics[m.LOADAVG_AFTER] = os.getloadavg()[0]
    stats = dataset.reader.stats
    metrics[m.CROPS_PER_S] = samples / seconds if seconds > 0 else float("inf")
    metrics.update(stats.per_region())
    if start is not None and end is not None:
        device = end - start
        metrics[m.DEVICE_READ_BYTES] = device
        metrics[m.DEVICE_BYTES_PER_CROP] = device / samples
        metrics[m.DEVICE_OVER_READER] = device / stats.bytes_fetched if stats.bytes_fetched else None
        metrics[m.DEVICE_OVER_DELIVERED] = device / stats.bytes_delivered if stats.bytes_delivered else None
    return metrics


def plate_spec_for(comparison: OutOfMemoryComparison, layout_name: str, work: WorkFolder) -> ScaleSpec:
    """The scale plate whose stored bytes in ``layout_name`` reach the comparison's target: a probe of
    the rendered fields gives the stored bytes per field (compression differs per layout). The probe
    is written in a temporary folder under the work folder and always removed."""
    base = comparison.plate
    probe_fields = max(min(base.distinct_fields or 4, 8), 1)
    probe_spec = dataclasses.replace(base, objects=probe_fields * base.fewest_per_field)
    created = not work.root.exists()
    work.root.mkdir(parents=True, exist_ok=True)
    try:
        with tempfile.TemporaryDirectory(prefix=".probe-", dir=work.root) as scratch:
            written = generate_scale_plate(
                Path(scratch) / f"{layout_name}.zarr", probe_spec, layout_by_name(layout_name), progress=False
            )
    finally:
        if created and not work.keep:
            with contextlib.suppress(OSError):
                work.root.rmdir()
    per_field = written.stored_bytes / written.fields
    fields = max(1, math.ceil(comparison.target_bytes * 1.02 / per_field))
    if fields * base.fewest_per_field > MAX_OBJECTS:
        raise ConfigError(
            f"a plate of {comparison.target_bytes / 2**30:.1f} GiB in {layout_name} needs {fields:,} fields of "
            f"{base.field_size} px, more than a scale plate of {MAX_OBJECTS:,} objects holds; "
            "lower --limit-mib or --plate-multiple"
        )
    return dataclasses.replace(base, objects=fields * base.fewest_per_field)


def measure_layout(
    comparison: OutOfMemoryComparison,
    name: str,
    work: WorkFolder,
    progress: bool = True,
    report: Callable[[str], None] | None = None,
    require_cgroup: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config, metrics) of one layout: its plate under ``work``, always removed after measuring."""
    say = report or (lambda _: None)
    spec = plate_spec_for(comparison, name, work)
    say(f"{name}: writing {spec.fields:,} fields (about {comparison.target_bytes / 2**30:.1f} GiB stored)")
    destination = work.destination(f"out-of-memory-{name}.zarr")
    try:
        written = generate_scale_plate(destination, spec, layout_by_name(name), overwrite=True, progress=progress)
        say(f"{name}: random crops inside {comparison.limit_bytes / 2**20:.0f} MiB")
        args = (str(destination), comparison.crop(), comparison.samples, comparison.warmup, comparison.seed)
        limited = run_limited(
            deaf_to_stops, (random_pass, *args, True), comparison.limit_bytes, require_cgroup=require_cgroup
        )
        metrics: dict[str, Any] = {
            m.OBJECTS: written.objects,
            m.FIELDS: written.fields,
            m.PLATE_STORED_BYTES: written.stored_bytes,
            m.PLATE_OVER_LIMIT: written.stored_bytes / comparison.limit_bytes,
            m.PLATE_BELOW_MULTIPLE: written.stored_bytes < comparison.target_bytes,
            **limited.as_metrics(),
            **limited.value,  # the timed pass's device bytes replace the child's whole run's
        }
        metrics.update(_cached(comparison, destination, args, written.stored_bytes, say))
        if m.prefixed(m.CACHED_, m.CROPS_PER_S) in metrics and metrics[m.CROPS_PER_S]:
            metrics[m.LIMITED_OVER_CACHED] = metrics[m.CROPS_PER_S] / metrics[m.prefixed(m.CACHED_, m.CROPS_PER_S)]
    finally:
        with uninterrupted():
            work.done(destination)
    config = {
        "comparison": dataclasses.asdict(comparison),
        "scale_spec": dataclasses.asdict(spec),
        "layout_name": name,
        "layout_label": layout_by_name(name).label,
        "plate": str(destination),
    }
    return config, metrics


@dataclass(frozen=True)
class OutOfMemoryCase:
    """One layout of a comparison out of memory."""

    comparison: OutOfMemoryComparison
    layout_name: str

    @property
    def label(self) -> str:
        return self.layout_name


class OutOfMemory:
    """Track ``out-of-memory`` for the runner: one case per layout of ``comparison``, each on its own
    plate under the site's work folder (:func:`measure_layout`).

    Args:
        comparison: The layouts, the plate size and the memory limit.
        progress: Show the plates' write progress.
        require_cgroup: Fail rather than measure without a cgroup to enforce the limit.
    """

    name = TRACK

    def __init__(self, comparison: OutOfMemoryComparison, progress: bool = True, require_cgroup: bool = False) -> None:
        self.comparison, self.progress, self.require_cgroup = comparison, progress, require_cgroup

    def cases(self, preset: str, context: WorkSite) -> list[OutOfMemoryCase]:
        """One case per layout. ``preset`` is ignored: the comparison is the whole measurement."""
        # Each case carries the comparison narrowed to its own layout, so its identity (what --resume
        # matches) does not change when a later run asks for more layouts.
        return [
            OutOfMemoryCase(dataclasses.replace(self.comparison, layouts=(name,)), name)
            for name in self.comparison.layouts
        ]

    def decode(self, case: OutOfMemoryCase) -> None:
        """None: each case writes the plate it reads."""
        return None

    def measure(self, case: OutOfMemoryCase, repeat: int, context: WorkSite) -> Iterator[Row]:
        """Write the layout's plate, read it inside the limit and from the page cache: one row."""
        config, metrics = measure_layout(
            case.comparison, case.layout_name, context.work, self.progress, context.progress, self.require_cgroup
        )
        yield Row(case, config, metrics, case.comparison.seed)


def _cached(
    comparison: OutOfMemoryComparison, plate: Path, args: tuple[Any, ...], stored: int, say: Callable[[str], None]
) -> dict[str, Any]:
    """The same random pass with the plate in the page cache, or why it was not run."""
    if not comparison.cached:
        return {m.CACHED_SKIPPED: "not asked for"}
    available = psutil.virtual_memory().available
    if stored > CACHED_FRACTION_OF_AVAILABLE * available:
        return {m.CACHED_SKIPPED: f"the plate ({stored / 2**30:.1f} GiB) does not fit in the free memory"}
    say(f"{plate.name}: the same crops in the page cache")
    value, _ = run_in_child(deaf_to_stops, (random_pass, *args, False))
    return {m.prefixed(m.CACHED_, key): item for key, item in value.items()}


__all__ = [
    "DEFAULT_LAYOUTS",
    "OutOfMemoryComparison",
    "OutOfMemoryCase",
    "OutOfMemory",
    "measure_layout",
    "plate_spec_for",
    "random_pass",
]
