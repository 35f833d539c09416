"""The import plan, everything resolved from the table and the image folder and checked before a pixel is
written, and the import that writes the plate from it."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from tqdm import tqdm

from cropbench.config import LayoutSpec
from cropbench.errors import ImportInputError
from cropbench.formats import PlateGeometry, create_plate_writer
from cropbench.objects import OBJECT_TABLE_NAME, ObjectTable, label_classes, write_label_classes
from cropbench.plates.destination import check_replaceable, staged
from cropbench.plates.generate import GeneratedPlate, display_ranges, stored_size
from cropbench.plates.importing.columns import (
    IDENTITY_COLUMNS,
    PLATE_COLUMNS,
    SITE_COLUMNS,
    column_strings,
    find_column,
    find_file_columns,
    looked_for,
    read_table,
    row_number,
    table_centroids,
    table_identity,
    table_labels,
    table_pixel_size,
    table_wells,
)
from cropbench.plates.importing.files import (
    IMAGE_SUFFIXES,
    FieldSource,
    check_files_exist,
    check_files_inside,
    check_shapes,
    field_numbers,
    files_from_columns,
    phenix_files,
    phenix_name,
    read_field,
)


@dataclass(frozen=True)
class ImportOptions:
    """What to take from the table: channels (source → plate name), compartment, plate, name."""

    channels: tuple[tuple[str, str], ...] | None = None
    compartment: str | None = None
    plate: str | None = None
    name: str | None = None
    plane: int = 1
    labels: tuple[str, ...] = ()
    pixel_size_um: float | None = None

    def __post_init__(self) -> None:
        if self.pixel_size_um is not None and not self.pixel_size_um > 0:
            raise ImportInputError(f"pixel size must be > 0 micrometres, got {self.pixel_size_um}")
        clashing = sorted(set(self.labels) & {*IDENTITY_COLUMNS, "object_id", "plate", "well", "field"})
        if clashing:
            raise ImportInputError(f"--label {clashing[0]} names a column the object table makes itself")

    @staticmethod
    def parse_channels(specs: Sequence[str] | None) -> tuple[tuple[str, str], ...] | None:
        """``["DAPI=DNA", "GFP"]`` → ``(("DAPI", "DNA"), ("GFP", "GFP"))``; None keeps all channels."""
        if not specs:
            return None
        pairs = []
        for spec in specs:
            source, _, target = spec.partition("=")
            if not source.strip() or (_ and not target.strip()):
                raise ImportInputError(f"channel {spec!r} is not SOURCE or SOURCE=NAME")
            pairs.append((source.strip(), (target or source).strip()))
        targets = [target for _, target in pairs]
        if len(set(targets)) != len(targets):
            raise ImportInputError(f"channel names {targets} repeat a name")
        return tuple(pairs)


@dataclass(frozen=True)
class ImportPlan:
    """Everything resolved from the table and folder, checked, before any pixel is written."""

    name: str
    channel_names: tuple[str, ...]
    fields: tuple[FieldSource, ...]
    field_shape: tuple[int, int, int]
    dtype: str
    objects: ObjectTable
    columns: dict[str, Any]
    label_classes: dict[str, tuple[str, ...]]
    pixel_size_um: tuple[float, float] | None

    def wells(self) -> list[tuple[str, str]]:
        return list(dict.fromkeys((f.row, f.column) for f in self.fields))


def plan_import(table_path: str | Path, images: str | Path, options: ImportOptions | None = None) -> ImportPlan:
    """Resolve and check everything an import needs; raises :class:`ImportInputError` on bad input."""
    options = options or ImportOptions()
    table = read_table(table_path, options.labels)
    images_dir = Path(images)
    if not images_dir.is_dir():
        raise ImportInputError(f"image folder {images_dir} does not exist")
    names = table.column_names
    row_numbers = np.arange(table.num_rows, dtype=np.int64)
    used: dict[str, Any] = {}
    plate_column = find_column(names, PLATE_COLUMNS)
    if plate_column is not None:
        plates = column_strings(table, plate_column)
        distinct = sorted(set(plates))
        if options.plate is not None:
            keep = np.array([p == options.plate for p in plates])
            if not keep.any():
                raise ImportInputError(
                    f"plate {options.plate!r} is not in {plate_column}; it has {', '.join(distinct)}"
                )
            table, row_numbers = table.filter(pa.array(keep)), row_numbers[keep]
        elif len(distinct) > 1:
            raise ImportInputError(
                f"the table holds {len(distinct)} plates ({', '.join(distinct[:5])}); choose one with --plate"
            )
        used["plate"] = plate_column
    elif options.plate is not None:
        raise ImportInputError(f"--plate {options.plate!r} given, but the table has no {looked_for(PLATE_COLUMNS)}")
    if table.num_rows == 0:
        raise ImportInputError(f"the single-cell table {table_path} has no rows")
    plate_name = (
        options.name
        or options.plate
        or (column_strings(table, plate_column)[0] if plate_column else Path(table_path).stem)
    )
    wells, well_columns = table_wells(table)
    used.update(well_columns)
    site_column = find_column(names, SITE_COLUMNS)
    sites = column_strings(table, site_column) if site_column else None
    used["site"] = site_column
    centroid_y, centroid_x, bbox, compartment = table_centroids(table, options.compartment)
    used.update(compartment)

    file_columns = find_file_columns(names)
    skipped: dict[str, str] = {}
    if file_columns:
        available = []
        for channel, kinds in file_columns.items():
            first = column_strings(table, kinds["FileName"])[0]
            if first.lower().endswith(IMAGE_SUFFIXES):
                available.append(channel)
            else:
                skipped[channel] = f"{kinds['FileName']} holds {first!r}, not a TIFF"
        chosen = _choose_channels(available, options, skipped)
        row_files = files_from_columns(table, images_dir, file_columns, chosen)
        used["files"] = {source: file_columns[source] for source, _ in chosen}
    else:
        phenix = phenix_files(images_dir)
        if not phenix:
            raise ImportInputError(
                "the table has no file name columns (looked for Image_FileName_<Channel>, "
                f"Image_FileName_Orig<Channel>, FileName_<Channel>) and {images_dir} holds no Phenix-style files "
                "like r01c01f01p01-ch1sk1fk1fl1.tiff"
            )
        if sites is None:
            raise ImportInputError(f"Phenix-style files need a site per row: looked for {looked_for(SITE_COLUMNS)}")
        available = [f"ch{c}" for c in sorted({key[4] for key in phenix})]
        chosen = _choose_channels(available, options, skipped)
        row_files = []
        for (row, column), site in zip(wells, sites, strict=True):
            if not site.isdigit():
                raise ImportInputError(f"site {site!r} in {site_column} is not a Phenix field number")
            key = (row_number(row), int(column), int(site), options.plane)
            row_files.append(
                tuple(
                    phenix.get((*key, int(source[2:])), images_dir / phenix_name(*key, int(source[2:])))
                    for source, _ in chosen
                )
            )
        used["files"] = "phenix"

    fields, field_of_row = _group_fields(wells, sites, row_files)
    check_files_exist(fields, [source for source, _ in chosen], source_names=available)
    check_files_inside(images_dir, row_files, [source for source, _ in chosen], row_numbers.tolist())
    channel_names = tuple(target for _, target in chosen)
    field_shape, dtype = check_shapes(fields, channel_names)
    _check_inside(centroid_y, centroid_x, field_shape, fields, field_of_row, row_numbers)
    ordered = _sites_in_order(fields)
    site_index = {id(field): number for number, field in field_numbers(ordered)}
    identity, identity_columns = table_identity(
        table, [fields[f].site for f in field_of_row], row_numbers, compartment["compartment"]
    )
    labels, label_columns = table_labels(table, options.labels)
    used.update(identity_columns)
    pixel_size, pixel_size_column = table_pixel_size(table, options.pixel_size_um)
    used["pixel_size"] = pixel_size_column
    objects = ObjectTable.from_columns(
        well=np.array([fields[f].well for f in field_of_row], dtype=object),
        field=np.array([site_index[id(fields[f])] for f in field_of_row], dtype=np.int64),
        centroid_y=centroid_y,
        centroid_x=centroid_x,
        plate=plate_name,
        bbox=bbox,
        object_id=row_numbers,
        extra={**identity, **labels},
    )
    classes = {name: label_classes(values) for name, values in labels.items() if values.dtype == object}
    return ImportPlan(
        name=plate_name,
        channel_names=channel_names,
        fields=tuple(ordered),
        field_shape=field_shape,
        dtype=dtype,
        objects=objects,
        columns={**used, "channels": dict(chosen), "labels": label_columns},
        label_classes=classes,
        pixel_size_um=pixel_size,
    )


def _choose_channels(
    available: Sequence[str], options: ImportOptions, skipped: dict[str, str]
) -> list[tuple[str, str]]:
    if options.channels is None:
        if not available:
            raise ImportInputError(f"no image channel to import ({'; '.join(f'{k}: {v}' for k, v in skipped.items())})")
        return [(channel, channel) for channel in available]
    for source, _ in options.channels:
        if source not in available:
            why = f" ({skipped[source]})" if source in skipped else ""
            raise ImportInputError(f"channel {source!r}{why} is not in the input; channels: {', '.join(available)}")
    return list(options.channels)


def _site_key(site: str) -> tuple[int, int | str]:
    return (0, int(site)) if site.isdigit() else (1, site)


def _group_fields(
    wells: list[tuple[str, str]],
    sites: list[str] | None,
    row_files: list[tuple[Path, ...]],
) -> tuple[list[FieldSource], list[int]]:
    """One field per (well, site); without a site column, one per distinct file set in a well."""
    keys: dict[tuple[str, str, str], int] = {}
    fields: list[FieldSource] = []
    field_of_row = []
    derived: dict[tuple[str, str, tuple[Path, ...]], str] = {}
    for number, ((row, column), files) in enumerate(zip(wells, row_files, strict=True)):
        if sites is not None:
            site = sites[number]
        else:
            site = derived.setdefault((row, column, files), str(sum(k[:2] == (row, column) for k in derived) + 1))
        key = (row, column, site)
        index = keys.get(key)
        if index is None:
            index = keys[key] = len(fields)
            fields.append(FieldSource(row=row, column=column, site=site, files=files))
        elif fields[index].files != files:
            raise ImportInputError(
                f"well {row}{column} site {site} names different files in different rows "
                f"({fields[index].files[0].name} and {files[0].name}): the site column does not identify fields"
            )
        field_of_row.append(index)
    return fields, field_of_row


def _sites_in_order(fields: list[FieldSource]) -> list[FieldSource]:
    return sorted(fields, key=lambda f: (row_number(f.row), int(f.column), _site_key(f.site)))


def _check_inside(
    y: np.ndarray,
    x: np.ndarray,
    shape: tuple[int, int, int],
    fields: list[FieldSource],
    field_of_row: list[int],
    row_numbers: np.ndarray,
) -> None:
    _, height, width = shape
    outside = (y < 0) | (y >= height) | (x < 0) | (x >= width)
    if outside.any():
        shown = [
            f"row {int(row_numbers[i])} (well {fields[field_of_row[i]].well} site {fields[field_of_row[i]].site}: "
            f"x={x[i]:.1f}, y={y[i]:.1f})"
            for i in np.flatnonzero(outside)[:5]
        ]
        raise ImportInputError(
            f"{int(outside.sum())} centroids lie outside the {height}x{width} field: {'; '.join(shown)}"
        )


def import_plate(
    table: str | Path,
    images: str | Path,
    out: str | Path,
    layout: LayoutSpec,
    options: ImportOptions | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> GeneratedPlate:
    """Write the plate (pixels in ``layout``) and its object table; returns what was written."""
    options = options or ImportOptions()
    destination = Path(out)
    check_replaceable(destination, overwrite)  # before reading any input
    plan = plan_import(table, images, options)
    wells = plan.wells()
    counts = [sum((f.row, f.column) == well for f in plan.fields) for well in wells]
    first = read_field(plan.fields[0], plan.channel_names, plan.field_shape)
    provenance = {
        "table": str(Path(table).resolve()),
        "images": str(Path(images).resolve()),
        "columns": plan.columns,
        "sites": {f"{f.well}/{i}": f.site for i, f in field_numbers(plan.fields)},
    }
    pixel_size = {"pixel_size_um": list(plan.pixel_size_um) if plan.pixel_size_um else None}
    started = time.perf_counter()
    with staged(destination, overwrite) as scratch:  # a failed import leaves no partial plate
        geometry = PlateGeometry(
            plan.name,
            tuple(plan.channel_names),
            plan.field_shape,
            tuple(wells),
            tuple(counts),
            display_ranges=tuple(display_ranges(first)),
        )
        writer = create_plate_writer(scratch, geometry, layout, {"import": provenance, **pixel_size})
        for number, field in tqdm(field_numbers(plan.fields), desc="fields", unit="field", disable=not progress):
            pixels = first if field is plan.fields[0] else read_field(field, plan.channel_names, plan.field_shape)
            writer.write_field(field.row, field.column, number, pixels)
        writer.close()
        plan.objects.write(scratch / OBJECT_TABLE_NAME)
        if plan.label_classes:
            write_label_classes(scratch, plan.label_classes)
    elapsed = time.perf_counter() - started
    raw = len(plan.fields) * int(np.prod(plan.field_shape)) * np.dtype(plan.dtype).itemsize
    return GeneratedPlate(
        path=destination,
        fields=len(plan.fields),
        objects=len(plan.objects),
        raw_bytes=raw,
        stored_bytes=stored_size(destination),
        write_seconds=elapsed,
    )
