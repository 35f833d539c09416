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

:func:`growth` fits each cost against the object count on log-log axes and names the costs that
grow faster than expected (construction and memory linearly, per-sample costs not at all).
"""

from __future__ import annotations

import dataclasses
import math
import resource
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cropbench import metrics as m
from cropbench.config import CropConfig, check_seed, layout_by_name
from cropbench.data.dataset import CropDataset
from cropbench.data.loader import LoaderSpec
from cropbench.data.sampling import GroupedSampler, RandomObjectSampler
from cropbench.errors import ConfigError
from cropbench.formats import read_plate_metadata
from cropbench.harness import dataset_case, loader_case
from cropbench.harness.work import WorkFolder, deaf_to_stops, uninterrupted, work_folder
from cropbench.measure.memory_limit import run_in_child
from cropbench.measure.protocol import Stopwatch, resident_fraction, rss_bytes
from cropbench.plates.generate import GeneratedPlate, stored_size
from cropbench.plates.scale import MAX_OBJECTS, ScaleSpec, check_crop, generate_scale_plate

TRACK = "scale"
#: The object counts of the issue's growth table.
GROWTH_OBJECTS = (10**3, 10**4, 10**5, 10**6)
#: A cost is named when its fitted exponent exceeds what is expected by more than this.
GROWTH_TOLERANCE = 0.15
#: Sampler orders timed per count (the fastest is kept: an order is pure computation).
SAMPLER_REPEATS = 3
#: The most DataLoader workers of the Track 2 first batch.
MAX_WORKERS = 256

# Metric names of a scale row.
PLATE_STORED_BYTES = "plate_stored_bytes"
PLATE_RAW_BYTES = "plate_raw_bytes"
GENERATE_SECONDS = "generate_seconds"
CONSTRUCTION_SECONDS = "construction_seconds"
CONSTRUCTION_RSS_BYTES = "construction_rss_bytes"
CONSTRUCTION_PEAK_RSS_BYTES = "construction_peak_rss_bytes"
BYTES_PER_OBJECT = "construction_bytes_per_object"
GROUP_KEYS_NS_PER_SAMPLE = "group_keys_ns_per_sample"
RANDOM_ORDER_NS_PER_SAMPLE = "random_order_ns_per_sample"
GROUPED_ORDER_NS_PER_SAMPLE = "grouped_order_ns_per_sample"
RESIDENT_FRACTION = "plate_resident_fraction"
TRACK1_RANDOM_SAMPLES_PER_S = "track1_random_samples_per_s"
TRACK1_GROUPED_SAMPLES_PER_S = "track1_grouped_samples_per_s"
TRACK2_FIRST_BATCH_MS = "track2_first_batch_ms"
TRACK2_PICKLE_BYTES = "track2_dataset_pickle_bytes"


@dataclass(frozen=True)
class Cost:
    """A cost the growth table follows: its metric, how it turns into a cost (rates are inverted),
    and the exponent of the object count it should grow with."""

    metric: str
    title: str
    expected: float
    inverse: bool = False


#: Costs fitted against the object count: total costs grow linearly, per-sample costs stay flat.
COSTS = (
    Cost(CONSTRUCTION_SECONDS, "dataset construction (s)", 1.0),
    Cost(CONSTRUCTION_RSS_BYTES, "dataset memory (bytes)", 1.0),
    Cost(GROUP_KEYS_NS_PER_SAMPLE, "field grouping per sample", 0.0),
    Cost(RANDOM_ORDER_NS_PER_SAMPLE, "random sampler per sample", 0.0),
    Cost(GROUPED_ORDER_NS_PER_SAMPLE, "grouped sampler per sample", 0.0),
    Cost(TRACK1_RANDOM_SAMPLES_PER_S, "Track 1 random, time per sample", 0.0, inverse=True),
    Cost(TRACK1_GROUPED_SAMPLES_PER_S, "Track 1 grouped, time per sample", 0.0, inverse=True),
    Cost(TRACK2_FIRST_BATCH_MS, "Track 2 first batch", 0.0),
)


@dataclass(frozen=True)
class ScaleSweep:
    """What ``cropbench scale sweep`` measures; part of every record it writes."""

    objects: tuple[int, ...] = GROWTH_OBJECTS
    #: The plates' fields (size, channels, density, rendered fields, seed); its ``objects`` is replaced.
    plate: ScaleSpec = dataclasses.field(default_factory=ScaleSpec)
    layout: str = "default"
    crop_size: int = 96
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
        for knob in ("warmup", "workers"):
            if getattr(self, knob) < 0:
                raise ConfigError(f"{knob} must be >= 0, got {getattr(self, knob)}")
        if self.workers > MAX_WORKERS:
            raise ConfigError(f"workers must be at most {MAX_WORKERS}, got {self.workers}")
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
        GROUP_KEYS_NS_PER_SAMPLE: _fastest_ns(lambda: dataset.group_keys("field")) / count,
        RANDOM_ORDER_NS_PER_SAMPLE: _fastest_ns(RandomObjectSampler(count, seed).order) / count,
        GROUPED_ORDER_NS_PER_SAMPLE: _fastest_ns(GroupedSampler(keys, seed).order) / count,
    }


def measure_point(plate: Path, sweep: ScaleSweep) -> dict[str, Any]:
    """Every cost of one plate (run it in a fresh child: :func:`measure_point_in_child`)."""
    crop = sweep.crop()
    rss_before = rss_bytes()
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with Stopwatch() as construction:
        dataset = CropDataset(plate, crop)
    rss_after = rss_bytes()
    peak_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    count = len(dataset)
    metrics: dict[str, Any] = {
        m.OBJECTS: count,
        CONSTRUCTION_SECONDS: construction.seconds,
        CONSTRUCTION_RSS_BYTES: rss_after - rss_before,
        # A forked child starts with its parent's high-water mark: a peak below it is not seen (None).
        CONSTRUCTION_PEAK_RSS_BYTES: peak_after - rss_before if peak_after > peak_before else None,
        BYTES_PER_OBJECT: (rss_after - rss_before) / count,
        **_index_costs(dataset, sweep.seed),
        RESIDENT_FRACTION: resident_fraction(dataset.reader.files()),
    }
    dataset.reader.close()
    for access, name in (("random", TRACK1_RANDOM_SAMPLES_PER_S), ("grouped-field", TRACK1_GROUPED_SAMPLES_PER_S)):
        case = dataset_case.Track1Case(
            crop=crop, access=access, samples=sweep.samples, warmup=sweep.warmup, cold_samples=0, seed=sweep.seed
        )
        metrics[name] = dataset_case.run_case(plate, case)[m.SAMPLES_PER_S]
    loader = LoaderSpec(num_workers=sweep.workers, batch_size=sweep.batch_size)
    batches = max(2 * max(sweep.workers, 1), 2)
    first = loader_case.run_case(
        plate,
        loader_case.Track2Case(crop=crop, loader=loader, samples=batches * sweep.batch_size, epochs=1, seed=sweep.seed),
    )
    metrics[TRACK2_FIRST_BATCH_MS] = first[m.FIRST_BATCH_MS]
    metrics[TRACK2_PICKLE_BYTES] = first.get(m.DATASET_PICKLE_BYTES)
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


def sweep_rows(
    sweep: ScaleSweep,
    work_dir: str | Path,
    keep: bool = False,
    progress: bool = True,
    report: Callable[[str], None] | None = None,
) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(config, metrics) per object count, smallest first; plates removed unless ``keep``."""
    with work_folder(work_dir, keep) as work:
        for objects in sweep.objects:
            spec = sweep.spec(objects)
            if report is not None:
                report(f"{objects:,} objects: {spec.fields:,} fields of {spec.field_size} px")
            plate, generated = scale_plate(work, spec, sweep.layout, progress)
            try:
                if report is not None:
                    report(f"{objects:,} objects: measuring")
                metrics = measure_point_in_child(plate, sweep)
                metrics[m.FIELDS] = spec.fields
                metrics[PLATE_RAW_BYTES] = spec.raw_bytes
                metrics[PLATE_STORED_BYTES] = generated.stored_bytes if generated else stored_size(plate)
                metrics[GENERATE_SECONDS] = generated.write_seconds if generated else None
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
                "kept": keep,
            }
            yield config, metrics


@dataclass(frozen=True)
class Growth:
    """A cost's fitted exponent of the object count, against the one expected."""

    cost: Cost
    exponent: float

    @property
    def faster_than_expected(self) -> bool:
        return self.exponent > self.cost.expected + GROWTH_TOLERANCE

    def describe(self) -> str:
        return f"{self.cost.title} grows as N^{self.exponent:.2f} (expected N^{self.cost.expected:g})"


def growth(rows: Sequence[dict[str, Any]]) -> list[Growth]:
    """Each cost's least-squares exponent on log-log axes over the rows that have it (two counts at least)."""
    fitted = []
    for cost in COSTS:
        points = [
            (float(row[m.OBJECTS]), float(row[cost.metric]))
            for row in rows
            if isinstance(row.get(cost.metric), (int, float)) and row[cost.metric] > 0 and row.get(m.OBJECTS)
        ]
        if len({n for n, _ in points}) < 2:
            continue
        counts = np.log([n for n, _ in points])
        values = np.log([1.0 / v if cost.inverse else v for _, v in points])
        slope = float(np.polyfit(counts, values, 1)[0])
        fitted.append(Growth(cost, slope))
    return fitted


def faster_than_linear(rows: Sequence[dict[str, Any]]) -> list[Growth]:
    """The costs whose growth exceeds what is expected (the total work then grows faster than linearly)."""
    return [item for item in growth(rows) if item.faster_than_expected]


def growth_table(rows: Sequence[dict[str, Any]]) -> str:
    """The growth table as Markdown, then the costs that grow faster than expected, named."""
    header = (
        "| objects | fields | construction s | MB RAM | bytes/object (marginal) | random order ns/sample | "
        "Track 1 random samples/s | Track 1 grouped samples/s | Track 2 first batch ms | plate cached |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    previous: dict[str, Any] | None = None
    for row in sorted(rows, key=lambda r: r[m.OBJECTS]):
        lines.append(
            "| "
            + " | ".join(
                [
                    f"{row[m.OBJECTS]:,}",
                    f"{row.get(m.FIELDS, 0):,}",
                    _number(row.get(CONSTRUCTION_SECONDS), 3),
                    _number(_mb(row.get(CONSTRUCTION_RSS_BYTES)), 1),
                    _number(_marginal_bytes(previous, row), 0),
                    _number(row.get(RANDOM_ORDER_NS_PER_SAMPLE), 1),
                    _number(row.get(TRACK1_RANDOM_SAMPLES_PER_S), 0),
                    _number(row.get(TRACK1_GROUPED_SAMPLES_PER_S), 0),
                    _number(row.get(TRACK2_FIRST_BATCH_MS), 0),
                    _number(row.get(RESIDENT_FRACTION), 2),
                ]
            )
            + " |"
        )
        previous = row
    named = faster_than_linear(rows)
    lines.append("")
    if not named:
        lines.append("No cost grows faster than expected over these counts.")
    for item in named:
        lines.append(f"Grows faster than expected: {item.describe()}.")
    return "\n".join(lines)


def _marginal_bytes(previous: dict[str, Any] | None, row: dict[str, Any]) -> float | None:
    """Memory per object added since the previous count: what an object costs, without the fixed costs
    (imports, plate metadata) that dominate a small plate's bytes per object."""
    if previous is None or previous.get(CONSTRUCTION_RSS_BYTES) is None or row.get(CONSTRUCTION_RSS_BYTES) is None:
        return None
    added = row[m.OBJECTS] - previous[m.OBJECTS]
    return (row[CONSTRUCTION_RSS_BYTES] - previous[CONSTRUCTION_RSS_BYTES]) / added if added else None


def _mb(value: Any) -> float | None:
    return None if value is None else value / 1e6


def _number(value: Any, digits: int) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:,.{digits}f}"


__all__ = [
    "COSTS",
    "GROWTH_OBJECTS",
    "Cost",
    "Growth",
    "ScaleSweep",
    "faster_than_linear",
    "growth",
    "growth_table",
    "measure_point",
    "measure_point_in_child",
    "sweep_rows",
]
