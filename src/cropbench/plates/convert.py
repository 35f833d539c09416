"""One plate, many layouts: rewrite any readable plate in any layout, pixels unchanged.

``convert_plate`` reads each field of the source (any format) and writes it with the target
layout's writer; the object table travels along. ``materialize_layout`` does the same once per
(source, layout) and reuses the result, so tracks and asv suites take ``layout`` as a parameter.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from cropbench.config import LayoutSpec, layout_by_name
from cropbench.errors import StoreError
from cropbench.formats import (
    PlateGeometry,
    PlateMetadata,
    PlateReader,
    create_plate_writer,
    open_plate,
    read_plate_metadata,
)
from cropbench.formats.marker import LAYOUT_MARKER
from cropbench.formats.omearrow import require_ome_arrow
from cropbench.objects import LABEL_CLASSES_NAME, OBJECT_TABLE_NAME, ObjectTable, read_object_table
from cropbench.plates.atlas import write_crop_atlas
from cropbench.plates.destination import Origin, staged
from cropbench.plates.generate import GeneratedPlate


def pixel_bytes(path: Path) -> int:
    """Bytes on disk of a plate's pixels and metadata, without the bundled object table."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and p.name != OBJECT_TABLE_NAME)


def convert_plate(
    source: str | Path,
    destination: str | Path,
    layout: LayoutSpec,
    overwrite: bool = False,
    progress: bool = False,
    source_decode: str = "field",
) -> GeneratedPlate:
    """Rewrite every field of ``source`` in ``layout`` at ``destination``.

    ``write_seconds`` counts only the target writer (encoding and writing), not reading the source;
    ``stored_bytes`` counts pixels and metadata, not the object table.
    """
    source_path, destination_path = Path(source), Path(destination)
    if source_path.resolve() == destination_path.resolve():
        raise StoreError(f"cannot convert {source_path} onto itself")
    metadata = read_plate_metadata(source_path)
    reader = open_plate(source_path, source_decode, field_cache_fields=1, metadata=metadata)
    attributes = {
        **metadata.attributes,
        "converted_from": {"path": str(source_path.resolve()), "fingerprint": _fingerprint(source_path)},
    }
    if layout.format == "ome-arrow":
        require_ome_arrow()  # a heavy first import: keep it off the write clock
    with staged(destination_path, overwrite, Origin(source_path, layout.label)) as scratch:
        writing, objects = _write_copy(scratch, metadata, reader, layout, attributes, progress)
    reader.close()
    raw = len(metadata.fields) * int(np.prod(metadata.field_shape)) * np.dtype(metadata.dtype).itemsize
    return GeneratedPlate(
        path=destination_path,
        fields=len(metadata.fields),
        objects=len(objects or ()),
        raw_bytes=raw,
        stored_bytes=pixel_bytes(destination_path),
        write_seconds=writing,
    )


def _write_copy(
    destination_path: Path,
    metadata: PlateMetadata,
    reader: PlateReader,
    layout: LayoutSpec,
    attributes: dict[str, Any],
    progress: bool,
) -> tuple[float, ObjectTable | None]:
    """Write every field of ``reader`` and the object table; returns seconds spent writing and the table."""
    source_path = metadata.path
    wells: dict[tuple[str, str], int] = {}
    for info in metadata.fields:
        wells[(info.row, info.column)] = wells.get((info.row, info.column), 0) + 1
    started = time.perf_counter()
    geometry = PlateGeometry(
        metadata.name,
        metadata.channel_names,
        metadata.field_shape,
        tuple(wells),
        tuple(wells.values()),
        display_ranges=metadata.display_ranges,
    )
    writer = create_plate_writer(destination_path, geometry, layout, attributes)
    writing = time.perf_counter() - started
    table = source_path / OBJECT_TABLE_NAME
    objects = read_object_table(source_path) if table.is_file() else None
    colocated = bool(getattr(writer, "colocates_objects", False))
    if colocated and objects is not None:
        writer.attach_objects(objects)  # type: ignore[attr-defined]
    for info in tqdm(metadata.fields, desc=f"convert to {layout.label}", unit="field", disable=not progress):
        pixels = reader.read_field(info.index)
        started = time.perf_counter()
        writer.write_field(info.row, info.column, info.field, pixels)
        writing += time.perf_counter() - started
    started = time.perf_counter()
    writer.close()
    writing += time.perf_counter() - started
    if table.is_file() and not colocated:
        shutil.copyfile(table, destination_path / OBJECT_TABLE_NAME)
    if (source_path / LABEL_CLASSES_NAME).is_file():  # label class ids stay those of the source
        shutil.copyfile(source_path / LABEL_CLASSES_NAME, destination_path / LABEL_CLASSES_NAME)
    started = time.perf_counter()
    write_crop_atlas(destination_path, layout)
    writing += time.perf_counter() - started
    return writing, objects


def _fingerprint(path: Path) -> list[int]:
    """Changes when the source plate is rewritten: mtimes of its metadata and object table."""
    names = ("zarr.json", ".zattrs", LAYOUT_MARKER, OBJECT_TABLE_NAME)
    return [(path / name).stat().st_mtime_ns for name in names if (path / name).is_file()]


def layouts_root(source: str | Path) -> Path:
    """Where converted copies of a plate live by default: ``<plate>.layouts/`` beside it."""
    source_path = Path(source)
    return source_path.parent / f"{source_path.name}.layouts"


def materialize_layout(source: str | Path, layout: str, root: str | Path | None = None, progress: bool = False) -> Path:
    """The plate at ``source`` in the named layout: converted once, reused while the source is unchanged."""
    spec = layout_by_name(layout)
    destination = Path(root) if root is not None else layouts_root(source)
    destination = destination / layout
    if destination.exists():
        try:
            existing = read_plate_metadata(destination).attributes
        except StoreError:
            existing = {}
        origin = existing.get("converted_from", {})
        if (
            existing.get("layout_label") == spec.label
            and origin.get("path") == str(Path(source).resolve())
            and origin.get("fingerprint") == _fingerprint(Path(source))
            and (
                spec.colocate_objects
                or (destination / OBJECT_TABLE_NAME).is_file() == (Path(source) / OBJECT_TABLE_NAME).is_file()
            )
        ):
            return destination
    convert_plate(source, destination, spec, overwrite=True, progress=progress)
    return destination
