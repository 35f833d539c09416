"""The layout marker: a small JSON file that makes a folder of non-zarr pixels a cropbench plate.

OME-Zarr plates describe themselves (NGFF metadata). TIFF folders and raw memory-mapped arrays do
not, so their writers leave ``cropbench_layout.json`` beside the pixels: format, channel names,
field shape, dtype, display windows, and each field's (well, site) and files. ``open_plate``
finds the layout of a path from it. The marker is written last, so an interrupted write is
never mistaken for a finished plate.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from cropbench.errors import StoreError
from cropbench.formats.base import LAYOUT_MARKER, FieldInfo, PlateMetadata, PlateWriter

MARKER_VERSION = 1


def write_marker(writer: PlateWriter, dtype: str, field_paths: list[str], **extra: Any) -> Path:
    """Describe what ``writer`` wrote; ``field_paths[i]`` locates field i relative to the plate."""
    geometry = writer.geometry
    slots = geometry.field_slots()
    document = {
        "cropbench_layout": MARKER_VERSION,
        "format": writer.layout.format,
        "layout": dataclasses.asdict(writer.layout),
        "name": geometry.name,
        "channel_names": list(geometry.channel_names),
        "field_shape": list(geometry.field_shape),
        "dtype": dtype,
        "windows": [{"start": lo, "end": hi} for lo, hi in geometry.display_ranges],
        "fields": [
            {"well": f"{row}{column}", "row": row, "column": column, "field": site, "path": path}
            for (row, column, site), path in zip(slots, field_paths, strict=True)
        ],
        "cropbench": writer.attributes,
        **extra,
    }
    path = writer.path / LAYOUT_MARKER
    path.write_text(json.dumps(document, indent=1))
    return path


def read_marker(root: Path) -> dict[str, Any] | None:
    """The marker document of ``root``, or None when ``root`` has no marker."""
    path = root / LAYOUT_MARKER
    if not path.is_file():
        return None
    try:
        document = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise StoreError(f"cannot read layout marker {path}: {error}") from error
    if not isinstance(document, dict):
        raise StoreError(f"layout marker {path} holds a JSON {type(document).__name__}, not an object")
    if document.get("cropbench_layout") != MARKER_VERSION:
        raise StoreError(
            f"{path} has marker version {document.get('cropbench_layout')!r}; this cropbench reads {MARKER_VERSION}"
        )
    return document


def metadata_from_marker(root: Path, document: dict[str, Any]) -> PlateMetadata:
    """PlateMetadata of a marked plate, with its format's own entries (pixel files, objects inline)."""
    try:
        fields = tuple(
            FieldInfo(
                index=i,
                plate=document["name"],
                well=f["well"],
                row=f["row"],
                column=f["column"],
                field=int(f["field"]),
                path=f["path"],
            )
            for i, f in enumerate(document["fields"])
        )
        shape = tuple(int(s) for s in document["field_shape"])
        windows = document.get("windows") or []
        return PlateMetadata(
            path=root,
            name=document["name"],
            fields=fields,
            channel_names=tuple(document["channel_names"]),
            field_shape=(shape[0], shape[1], shape[2]),
            dtype=document["dtype"],
            format=document["format"],
            display_ranges=tuple((float(w.get("start", 0.0)), float(w.get("end", 65535.0))) for w in windows),
            attributes=dict(document.get("cropbench") or {}),
            pixels_file=str(document.get("pixels") or document.get("images") or ""),
            channel_files=tuple(tuple(str(name) for name in names) for names in document.get("channel_files", [])),
            objects_inline=bool(document.get("objects_inline")),
        )
    except (KeyError, TypeError, ValueError, IndexError) as error:
        raise StoreError(f"layout marker of {root} is incomplete or malformed: {error!r}") from error
