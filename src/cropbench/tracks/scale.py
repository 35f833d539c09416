"""How each cost grows with the work: a sweep over scale plates of 10³ to 10⁶ objects.

Per object count (track ``scale``, one record each), on a scale plate of that many objects
(:mod:`cropbench.plates.scale`), in a fresh forked child so no figure carries what an earlier
count left in the allocator:

- dataset construction: seconds and memory (RSS after minus before, and the peak) for
  ``CropDataset`` over the plate's object table, and the bytes per object;
- sampler and index cost per sample: one epoch's order of the random and the grouped-by-field
  samplers, and the field grouping they need;
- Track 1 random and grouped rates (:func:`cropbench.harness.dataset_case.run_case`, no cold pass), with
  the fraction of the plate in the page cache when they ran;
- Track 2 first batch (:func:`cropbench.harness.loader_case.run_case`): worker start-up includes
  handing each worker the dataset, whose pickle grows with the table.

:func:`cropbench.report.growth.growth` fits each cost against the object count on log-log axes and
names the costs that grow faster than expected (construction and memory linearly, per-sample costs
not at all).
"""

from __future__ import annotations

import dataclasses
import resource
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cropbench import metrics as m
from cropbench.config import DEFAULT_CROP_SIZE, CropConfig, check_seed, check_workers, layout_by_name
from cropbench.data.dataset import CropDataset
from cropbench.data.loader import LoaderSpec
from cropbench.data.sampling import GroupedSampler, RandomObjectSampler
from cropbench.errors import ConfigError
from cropbench.formats import read_plate_metadata
from cropbench.harness import dataset_case, loader_case
from cropbench.harness.context import RunContext
from cropbench.harness.runner import Row
from cropbench.harness.work import WorkFolder, WorkSite, deaf_to_stops, uninterrupted
from cropbench.measure.memory_limit import run_in_child
from cropbench.measure.protocol import Stopwatch, resident_fraction, rss_bytes
from cropbench.plates.generate import GeneratedPlate, stored_size
from cropbench.plates.scale import MAX_OBJECTS, ScaleSpec, check_crop, generate_scale_plate

TRACK = "scale"
#: The object counts of the issue's growth table.
GROWTH_OBJECTS = (10**3, 10**4, 10**5, 10**6)
#: Sampler orders timed per count (the fastest is kept: an order is pure computation).
SAMPLER_REPEATS = 3


@dataclass(frozen=True)
class ScaleSweep:
    """What ``cropbench scale sweep`` measures; part of every record it writes."""

    objects: tuple[int, ...] = GROWTH_OBJECTS
    #: The plates' fields (size, channels, density, rendered fields, seed); its ``objects`` is replaced.
    plate: ScaleSpec = dataclasses.field(default_factory=ScaleSpec)
    layout: str = "default"
    crop_size: int = DEFAULT_CROP_SIZE
    samples: int = 1000
    warmup: int = 100
    batch_size: int = 64
    workers: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "objects", tuple(sorted(set(self.objects))))
        if not self.objects or any(not 1 <= count <= MAX_OBJECTS for count in self.objects):
            raise ConfigError(f"objects must be counts from 1 to {MAX_OBJECTS:,}, got {list(self.objects)}")
        layout_by_name(self.layout)
        for knob in ("crop_size", "samples", "batch_size"):
            if getattr(self, knob) < 1:
                raise ConfigError(f"{knob} must be >= 1, got {getattr(self, knob)}")
        if self.warmup < 0:
            raise ConfigError(f"warmup must be >= 0, got {self.warmup}")
        check_workers(self.workers)
        check_crop(self.crop_size, self.plate)
        check_seed(self.seed)

    def spec(self, objects: int) -> ScaleSpec:
        return dataclasses.replace(self.plate, objects=objects)

    def crop(self) -> CropConfig:
        return CropConfig(crop_size=self.crop_size, dtype="uint16", seed=self.seed)


def _fastest_ns(call: Callable[[], Any], repeats: int = SAMPLER_REPEATS) -> int:
    fastest = None
    for _ in range(repeats):
        with Stopwatch() as watch:
            call()
        fastest = watch.ns if fastest is None else min(fastest, watch.ns)
    return int(fastest or 0)


def _index_costs(dataset: CropDataset, seed: int) -> dict[str, float]:
    """Nanoseconds per sample of the field grouping and of one epoch's order of each sampler."""
    count = len(dataset)
    keys = dataset.group_keys("field")
    return {
        m.GROUP_KEYS_NS_PER_SAMPLE: _fastest_ns(lambda: dataset.group_keys("field")) / count,
        m.RANDOM_ORDER_NS_PER_SAMPLE: _fastest_ns(RandomObjectSampler(count, seed).order) / count,
        m.GROUPED_ORDER_NS_PER_SAMPLE: _fastest_ns(GroupedSampler(keys, seed).order) / count,
    }


def measure_point(plate: Path, sweep: ScaleSweep) -> dict[str, Any]:
    """Every cost of one plate (run it in a fresh child: :func:`measure_point_in_child`).

    ``plate`` is a scale plate this sweep wrote, with the object table written beside its pixels, read
    with the sweep's own crop, workers and batch (:class:`ScaleSweep`): no run's context applies (an
    ``--objects`` table or crop overrides name another plate), and building the plate's own context is
    part of the construction cost measured here."""
    crop = sweep.crop()
    rss_before = rss_bytes()
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with Stopwatch() as construction:  # the plate's metadata and object table read, the crops indexed
        context = RunContext(plate=plate)
        dataset = context.dataset(crop)
    rss_after = rss_bytes()
    peak_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    count = len(dataset)
    metrics: dict[str, Any] = {
        m.OBJECTS: count,
        m.CONSTRUCTION_SECONDS: construction.seconds,
        m.CONSTRUCTION_RSS_BYTES: rss_after - rss_before,
        # A forked child starts with its parent's high-water mark: a peak below it is not seen (None).
        m.CONSTRUCTION_PEAK_RSS_BYTES: peak_after - rss_before if peak_after > peak_before else None,
        m.BYTES_PER_OBJECT: (rss_after - rss_before) / count,
        **_index_costs(dataset, sweep.seed),
        m.RESIDENT_FRACTION: resident_fraction(dataset.reader.files()),
    }
    dataset.reader.close()
    for access, name in (("random", m.TRACK1_RANDOM_SAMPLES_PER_S), ("grouped-field", m.TRACK1_GROUPED_SAMPLES_PER_S)):
        case = dataset_case.DatasetCase(
            crop=crop, access=access, samples=sweep.samples, warmup=sweep.warmup, cold_samples=0, seed=sweep.seed
        )
        metrics[name] = dataset_case.run_case(context, case)[m.SAMPLES_PER_S]
    loader = LoaderSpec(num_workers=sweep.workers, batch_size=sweep.batch_size)
    batches = max(2 * max(sweep.workers, 1), 2)
    first = loader_case.run_case(
        context,
        loader_case.LoaderCase(crop=crop, loader=loader, samples=batches * sweep.batch_size, epochs=1, seed=sweep.seed),
    )
    metrics[m.TRACK2_FIRST_BATCH_MS] = first[m.FIRST_BATCH_MS]
    metrics[m.TRACK2_PICKLE_BYTES] = first.get(m.DATASET_PICKLE_BYTES)
    return metrics


def measure_point_in_child(plate: Path, sweep: ScaleSweep) -> dict[str, Any]:
    """:func:`measure_point` in a fresh forked child."""
    value, _ = run_in_child(deaf_to_stops, (measure_point, plate, sweep))
    return dict(value)


def scale_plate(
    work: WorkFolder,
    spec: ScaleSpec,
    layout_name: str,
    progress: bool,
) -> tuple[Path, GeneratedPlate | None]:
    """The plate of ``spec`` under ``work``: one kept there earlier with the same spec and layout is
    reused (None for what was generated), anything else is written fresh."""
    name = f"scale-{spec.objects}-{layout_name}.zarr"
    kept = work.root / name
    if work.keep and kept.is_dir():
        try:
            attributes = read_plate_metadata(kept).attributes
        except Exception:  # noqa: BLE001 - not a readable plate: written fresh beside it
            attributes = {}
        same_layout = attributes.get("layout_label") == layout_by_name(layout_name).label
        if same_layout and attributes.get("scale_spec") == dataclasses.asdict(spec):
            return kept, None
    destination = work.destination(name)
    try:
        return destination, generate_scale_plate(
            destination, spec, layout_by_name(layout_name), overwrite=True, progress=progress
        )
    except BaseException:  # an interrupt too: the hidden folder ``destination`` may be in goes with it
        with uninterrupted():
            work.done(destination)
        raise


def measure_count(
    sweep: ScaleSweep,
    objects: int,
    work: WorkFolder,
    progress: bool = True,
    report: Callable[[str], None] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config, metrics) of one object count: its plate under ``work`` (removed after measuring unless
    kept), every cost measured in a fresh child."""
    say = report or (lambda _: None)
    spec = sweep.spec(objects)
    say(f"{objects:,} objects: {spec.fields:,} fields of {spec.field_size} px")
    plate, generated = scale_plate(work, spec, sweep.layout, progress)
    try:
        say(f"{objects:,} objects: measuring")
        metrics = measure_point_in_child(plate, sweep)
        metrics[m.FIELDS] = spec.fields
        metrics[m.PLATE_RAW_BYTES] = spec.raw_bytes
        metrics[m.PLATE_STORED_BYTES] = generated.stored_bytes if generated else stored_size(plate)
        metrics[m.GENERATE_SECONDS] = generated.write_seconds if generated else None
    finally:
        if generated is not None:
            with uninterrupted():
                work.done(plate)
    config = {
        "sweep": dataclasses.asdict(sweep),
        "scale_spec": dataclasses.asdict(spec),
        "layout": sweep.layout,
        "layout_label": layout_by_name(sweep.layout).label,
        "plate": str(plate),
        "kept": work.keep,
    }
    return config, metrics


@dataclass(frozen=True)
class ScaleCase:
    """One object count of a sweep."""

    sweep: ScaleSweep
    objects: int

    @property
    def label(self) -> str:
        return f"{self.objects} objects"


class Scale:
    """Track ``scale`` for the runner: one case per object count of ``sweep``, smallest first, each on
    its own scale plate under the site's work folder (:func:`measure_count`).

    Args:
        sweep: The object counts, the plates' layout and how each is read.
        progress: Show the plates' write progress.
    """

    name = TRACK

    def __init__(self, sweep: ScaleSweep, progress: bool = True) -> None:
        self.sweep, self.progress = sweep, progress

    def cases(self, preset: str, context: WorkSite) -> list[ScaleCase]:
        """One case per object count, smallest first. ``preset`` is ignored: the comparison is the whole measurement."""
        # Each case carries the sweep narrowed to its own count, so its identity (what --resume matches)
        # does not change when a later run asks for more counts.
        return [
            ScaleCase(dataclasses.replace(self.sweep, objects=(objects,)), objects) for objects in self.sweep.objects
        ]

    def decode(self, case: ScaleCase) -> None:
        """None: each case writes the plate it reads."""
        return None

    def measure(self, case: ScaleCase, repeat: int, context: WorkSite) -> Iterator[Row]:
        """Write (or reuse) the plate of the case's object count and measure its costs: one row."""
        config, metrics = measure_count(case.sweep, case.objects, context.work, self.progress, context.progress)
        yield Row(case, config, metrics, case.sweep.seed)


__all__ = [
    "GROWTH_OBJECTS",
    "ScaleSweep",
    "measure_point",
    "measure_point_in_child",
    "ScaleCase",
    "Scale",
    "measure_count",
]
