"""Write a synthetic plate to disk: OME-Zarr pixels plus the bundled object table."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
from tqdm import tqdm

from cropbench.config import LayoutSpec, PlateSpec
from cropbench.errors import ConfigError
from cropbench.formats import PlateGeometry, create_plate_writer
from cropbench.formats.omezarr import row_name
from cropbench.objects import OBJECT_TABLE_NAME, ObjectTable
from cropbench.plates.atlas import write_crop_atlas
from cropbench.plates.destination import staged
from cropbench.plates.synthetic import render_field


@dataclass(frozen=True)
class GeneratedPlate:
    """What was written, for the CLI summary and for records."""

    path: Path
    fields: int
    objects: int
    raw_bytes: int
    stored_bytes: int
    write_seconds: float

    @property
    def compression_ratio(self) -> float:
        return self.raw_bytes / max(self.stored_bytes, 1)


#: The largest plate :func:`spec_for_ram_fraction` makes, as a multiple of this machine's RAM.
MAX_RAM_FRACTION = 16.0


def spec_for_ram_fraction(spec: PlateSpec, fraction: float) -> PlateSpec:
    """Grow ``fields_per_well`` so the raw plate is about ``fraction`` × this machine's RAM."""
    if not 0 < fraction <= MAX_RAM_FRACTION:  # nan and inf too
        raise ConfigError(f"ram_fraction must be > 0 and at most {MAX_RAM_FRACTION:g}, got {fraction}")
    target = fraction * psutil.virtual_memory().total
    wells = spec.rows * spec.columns
    fields_per_well = max(1, int(np.ceil(target / (wells * spec.field_bytes))))
    return dataclasses.replace(spec, fields_per_well=fields_per_well)


def display_ranges(pixels: np.ndarray) -> list[tuple[float, float]]:
    """Per-channel (0.5, 99.9) percentile display range of one (c, y, x) field (omero window metadata)."""
    return [(float(np.percentile(channel, 0.5)), float(np.percentile(channel, 99.9))) for channel in pixels]


def stored_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def generate_plate(
    path: str | Path,
    spec: PlateSpec,
    layout: LayoutSpec,
    overwrite: bool = False,
    progress: bool = True,
) -> GeneratedPlate:
    """Render every field of ``spec`` and write plate + object table under ``path``."""
    destination = Path(path)
    with staged(destination, overwrite) as scratch:
        table, started = _write_plate(scratch, spec, layout, progress)
    elapsed = time.perf_counter() - started
    return GeneratedPlate(
        path=destination,
        fields=spec.rows * spec.columns * spec.fields_per_well,
        objects=len(table),
        raw_bytes=spec.total_bytes,
        stored_bytes=stored_size(destination),
        write_seconds=elapsed,
    )


def _write_plate(
    destination: Path,
    spec: PlateSpec,
    layout: LayoutSpec,
    progress: bool,
) -> tuple[ObjectTable, float]:
    """Render and write every field and the object table at ``destination``; returns the table and start time."""
    wells = [(row_name(r), str(c + 1)) for r in range(spec.rows) for c in range(spec.columns)]
    first = render_field(spec, 0)
    started = time.perf_counter()
    geometry = PlateGeometry(
        spec.name,
        tuple(spec.channel_names),
        (spec.channels, spec.field_height, spec.field_width),
        tuple(wells),
        spec.fields_per_well,
        display_ranges=tuple(display_ranges(first.pixels)),
    )
    writer = create_plate_writer(destination, geometry, layout, {"plate_spec": dataclasses.asdict(spec)})
    columns: dict[str, list[np.ndarray]] = {"well": [], "field": [], "centers": [], "boxes": []}
    jobs = [(row, column, site) for row, column in wells for site in range(spec.fields_per_well)]
    for field_seed, (row, column, site) in enumerate(tqdm(jobs, desc="fields", unit="field", disable=not progress)):
        rendered = first if field_seed == 0 else render_field(spec, field_seed)
        writer.write_field(row, column, site, rendered.pixels)
        count = len(rendered.centers)
        columns["well"].append(np.full(count, f"{row}{column}", dtype=object))
        columns["field"].append(np.full(count, site, dtype=np.int64))
        columns["centers"].append(rendered.centers)
        columns["boxes"].append(rendered.boxes)
    writer.close()
    centers = np.concatenate(columns["centers"])
    table = ObjectTable.from_columns(
        well=np.concatenate(columns["well"]),
        field=np.concatenate(columns["field"]),
        centroid_y=centers[:, 0],
        centroid_x=centers[:, 1],
        plate=spec.name,
        bbox=np.concatenate(columns["boxes"]),
    )
    table.write(destination / OBJECT_TABLE_NAME)
    write_crop_atlas(destination, layout)
    return table, started
