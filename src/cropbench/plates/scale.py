"""Plates at experiment scale: N objects in fields of about 300 each, written as a stream.

A production Cell Painting plate holds some 3,500 fields and a million objects. Nothing here holds
the whole plate: each field's pixels go to the layout's writer as soon as they are rendered, and
its objects go to the object table's Parquet file in row groups of ``table_batch_fields`` fields,
so memory holds the rendered templates, one field and one row group, whatever the plate's size.

Rendering a 1080 × 1080 field takes seconds, so rendering every field of a million-object plate
would take hours. ``distinct_fields=K`` renders K fields and writes them in turn (field i gets
field i mod K, with its objects); every field is still written as its own chunks and shards, so
reads, the page cache and the block device see a plate of N fields; only the pixel content (and
so each chunk's compressed size) repeats. ``distinct_fields=0`` renders every field.

The plate is written into a temporary sibling and renamed into place when complete
(:func:`cropbench.plates.destination.staged`): an interrupted run (Ctrl-C) leaves no partial plate.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
import pyarrow.parquet as pq
from tqdm import tqdm

from cropbench.config import CELL_PAINTING_CHANNELS, MAX_FIELD_SIZE, LayoutSpec, PlateSpec
from cropbench.errors import ConfigError
from cropbench.formats import PlateGeometry, create_plate_writer
from cropbench.formats.omezarr import row_name
from cropbench.objects import OBJECT_TABLE_NAME, ObjectTable
from cropbench.plates.destination import staged
from cropbench.plates.generate import GeneratedPlate, display_ranges, stored_size
from cropbench.plates.synthetic import SyntheticField, render_field

#: Wells of a 384-well plate and its rows × columns; sites per well of a production screen.
PLATE_ROWS, PLATE_COLUMNS, PRODUCTION_SITES = 16, 24, 9
#: The most objects a scale plate holds (the issue's scale, with room for the rounding of fields).
MAX_OBJECTS = 2_000_000
#: Fields whose objects are written to the object table's Parquet file as one row group.
TABLE_BATCH_FIELDS = 64
#: Bytes per pixel the renderer holds at its peak besides the field itself (float coordinate grids and maps).
RENDER_BYTES_PER_PIXEL = 64


@dataclass(frozen=True)
class ScaleSpec:
    """A plate of ``objects`` objects, about ``cells_per_field`` per square field of ``field_size`` pixels.

    The fields fill a 384-well plate nine sites per well (more sites per well past 3,456 fields);
    the last well holds what is left. ``distinct_fields`` fields are rendered (0: every field).
    """

    objects: int = 1000
    field_size: int = 1080
    channels: int = 5
    cells_per_field: int = 300
    distinct_fields: int = 8
    seed: int = 0
    name: str = "scale"

    def __post_init__(self) -> None:
        for knob in ("objects", "field_size", "channels", "cells_per_field"):
            value = getattr(self, knob)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{knob} must be a positive integer, got {value!r}")
        if self.objects > MAX_OBJECTS:
            raise ConfigError(f"objects must be at most {MAX_OBJECTS:,}, got {self.objects:,}")
        if self.field_size > MAX_FIELD_SIZE:  # before field_spec() below says it of field_height and field_width
            raise ConfigError(f"field_size must be at most {MAX_FIELD_SIZE:,} pixels, got {self.field_size:,}")
        if not isinstance(self.distinct_fields, int) or self.distinct_fields < 0:
            raise ConfigError(
                f"distinct_fields must be an integer >= 0 (0: render every field), got {self.distinct_fields!r}"
            )
        # The checks of the field a PlateSpec makes (size, channels, name), with their messages.
        self.field_spec()

    def field_spec(self) -> PlateSpec:
        """What :func:`cropbench.plates.synthetic.render_field` reads: field size, channels, cells, seed."""
        return PlateSpec(
            name=self.name,
            rows=1,
            columns=1,
            fields_per_well=1,
            channels=self.channels,
            field_height=self.field_size,
            field_width=self.field_size,
            cells_per_field=self.cells_per_field,
            seed=self.seed,
        )

    @property
    def fewest_per_field(self) -> int:
        """The fewest objects ``render_field`` puts in a field (it draws 0.95 × cells + Poisson(0.1 × cells))."""
        return max(int(self.cells_per_field * 0.95), 1)

    @property
    def fields(self) -> int:
        """Fields enough for ``objects`` whatever the draws; the surplus objects of the last field are left out."""
        return math.ceil(self.objects / self.fewest_per_field)

    @property
    def sites_per_well(self) -> int:
        return max(PRODUCTION_SITES, math.ceil(self.fields / (PLATE_ROWS * PLATE_COLUMNS)))

    def well_sites(self) -> list[tuple[tuple[str, str], int]]:
        """((row, column), sites) of each well in plate order; the last well holds the remainder."""
        sites, fields = self.sites_per_well, self.fields
        wells = math.ceil(fields / sites)
        return [
            (
                (row_name(index // PLATE_COLUMNS), str(index % PLATE_COLUMNS + 1)),
                sites if index < wells - 1 else fields - sites * (wells - 1),
            )
            for index in range(wells)
        ]

    @property
    def field_bytes(self) -> int:
        return self.channels * self.field_size * self.field_size * 2

    @property
    def raw_bytes(self) -> int:
        return self.fields * self.field_bytes

    @property
    def memory_bytes(self) -> int:
        """About the most memory writing the plate holds: one field being rendered and the kept templates."""
        templates = min(self.distinct_fields, self.fields) if self.distinct_fields else 1
        return self.field_size**2 * RENDER_BYTES_PER_PIXEL + templates * self.field_bytes

    def geometry(self, ranges: tuple[tuple[float, float], ...] = ()) -> PlateGeometry:
        wells = self.well_sites()
        return PlateGeometry(
            self.name,
            CELL_PAINTING_CHANNELS[: self.channels],
            (self.channels, self.field_size, self.field_size),
            tuple(well for well, _ in wells),
            tuple(count for _, count in wells),
            display_ranges=ranges,
        )


def check_fits_in_memory(spec: ScaleSpec, available: int | None = None) -> None:
    """Raise ConfigError before anything is written when rendering ``spec``'s fields needs more than the
    memory ``available`` (default: what the machine has free now)."""
    free = psutil.virtual_memory().available if available is None else available
    if spec.memory_bytes > free:
        raise ConfigError(
            f"fields of {spec.field_size:,} px × {spec.channels} channels ({spec.distinct_fields} distinct) need "
            f"about {spec.memory_bytes / 2**30:.1f} GiB of memory to render, more than the "
            f"{free / 2**30:.1f} GiB free; lower the field size, channels or distinct fields"
        )


class FieldSource:
    """The rendered field of each plate position: ``distinct_fields`` templates kept, or each rendered anew."""

    def __init__(self, spec: ScaleSpec) -> None:
        self.spec, self.field_spec = spec, spec.field_spec()
        self.templates: dict[int, SyntheticField] = {}

    def __call__(self, position: int) -> SyntheticField:
        distinct = self.spec.distinct_fields
        seed = position % distinct if distinct else position
        if not distinct:
            return render_field(self.field_spec, seed)
        if seed not in self.templates:
            self.templates[seed] = render_field(self.field_spec, seed)
        return self.templates[seed]


class ObjectTableStream:
    """The object table written as it grows: one Parquet row group per ``batch_fields`` fields."""

    def __init__(self, path: Path, plate: str, batch_fields: int = TABLE_BATCH_FIELDS) -> None:
        if batch_fields < 1:
            raise ConfigError(f"batch_fields must be >= 1, got {batch_fields}")
        self.path, self.plate, self.batch_fields = path, plate, batch_fields
        self.pending: list[tuple[str, int, np.ndarray, np.ndarray]] = []
        self.written = 0
        self.writer: pq.ParquetWriter | None = None

    def add(self, well: str, site: int, centers: np.ndarray, boxes: np.ndarray) -> None:
        """Queue one field's objects (a field without any adds nothing); a full batch is written at once."""
        if len(centers):
            self.pending.append((well, site, centers, boxes))
        if len(self.pending) >= self.batch_fields:
            self.flush()

    @property
    def pending_objects(self) -> int:
        return sum(len(centers) for _, _, centers, _ in self.pending)

    def flush(self) -> None:
        if not self.pending:
            return
        count = self.pending_objects
        centers = np.concatenate([c for _, _, c, _ in self.pending]).reshape(-1, 2)
        table = ObjectTable.from_columns(
            well=np.concatenate([np.full(len(c), well, dtype=object) for well, _, c, _ in self.pending]),
            field=np.concatenate([np.full(len(c), site, dtype=np.int64) for _, site, c, _ in self.pending]),
            centroid_y=centers[:, 0],
            centroid_x=centers[:, 1],
            plate=self.plate,
            bbox=np.concatenate([b for _, _, _, b in self.pending]).reshape(-1, 4),
            object_id=np.arange(self.written, self.written + count, dtype=np.int64),
        ).to_arrow()
        if self.writer is None:
            self.writer = pq.ParquetWriter(str(self.path), table.schema)
        self.writer.write_table(table)
        self.written += count
        self.pending.clear()

    def finish(self) -> None:
        """Write what is queued and close the file."""
        self.flush()
        self.close()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def generate_scale_plate(
    path: str | Path,
    spec: ScaleSpec,
    layout: LayoutSpec,
    overwrite: bool = False,
    progress: bool = True,
    on_field: Callable[[int, int], None] | None = None,
    table_batch_fields: int = TABLE_BATCH_FIELDS,
) -> GeneratedPlate:
    """Write the plate of ``spec`` in ``layout`` at ``path``, field by field, with a progress bar.

    ``on_field(done, total)`` is called after each field is written. The plate appears at ``path``
    only when complete; on any error or interrupt the temporary sibling is removed.
    """
    destination = Path(path)
    check_fits_in_memory(spec)
    started = time.perf_counter()
    with staged(destination, overwrite) as scratch:
        objects = _write_scale_plate(scratch, spec, layout, progress, on_field, table_batch_fields)
    return GeneratedPlate(
        path=destination,
        fields=spec.fields,
        objects=objects,
        raw_bytes=spec.raw_bytes,
        stored_bytes=stored_size(destination),
        write_seconds=time.perf_counter() - started,
    )


def _write_scale_plate(
    destination: Path,
    spec: ScaleSpec,
    layout: LayoutSpec,
    progress: bool,
    on_field: Callable[[int, int], None] | None,
    table_batch_fields: int,
) -> int:
    source = FieldSource(spec)
    geometry = spec.geometry(tuple(display_ranges(source(0).pixels)))
    attributes = {"scale_spec": dataclasses.asdict(spec)}
    writer = create_plate_writer(destination, geometry, layout, attributes)
    table = ObjectTableStream(destination / OBJECT_TABLE_NAME, spec.name, table_batch_fields)
    slots = geometry.field_slots()
    remaining = spec.objects
    bar = tqdm(total=len(slots), desc=f"{spec.name}: fields", unit="field", disable=not progress)
    try:
        for position, (row, column, site) in enumerate(slots):
            field = source(position)
            writer.write_field(row, column, site, field.pixels)
            kept = min(len(field.centers), remaining)
            table.add(f"{row}{column}", site, field.centers[:kept], field.boxes[:kept])
            remaining -= kept
            bar.update(1)
            bar.set_postfix(objects=f"{spec.objects - remaining:,}", refresh=False)
            if on_field is not None:
                on_field(position + 1, len(slots))
        writer.close()
        table.finish()
    finally:
        table.close()
        bar.close()
    return table.written


def check_crop(crop_size: int, plate: ScaleSpec) -> None:
    """A crop must fit in a field of the plate."""
    if crop_size > plate.field_size:
        raise ConfigError(f"crop_size {crop_size} is larger than the field ({plate.field_size} px); lower it")


__all__ = [
    "MAX_OBJECTS",
    "TABLE_BATCH_FIELDS",
    "FieldSource",
    "ObjectTableStream",
    "ScaleSpec",
    "check_crop",
    "check_fits_in_memory",
    "generate_scale_plate",
]
