"""Storage layouts behind one reader interface, and the factory that opens the right one.

Which decode paths each storage format offers (``field`` works for all):

============  ==============================  ====================================  ============================
format        ``zarr``                        ``direct``                            ``field``
============  ==============================  ====================================  ============================
ome-zarr      zarr-python slicing             chunk math + store codecs + LRU       whole fields via ``direct``
tiff          zarr-python on tifffile's store  mmap (raw) / only touched strips      ``tifffile.imread`` per file
memmap        does not apply                  one slice of a memory map (reference) whole fields via the map
ome-arrow     does not apply                  zero-copy Arrow chunk buffers + LRU   whole fields via ``direct``
============  ==============================  ====================================  ============================

OME-Arrow also offers ``as-py`` (``.as_py()`` of the field's row and ``ome_arrow.to_numpy``, the
reference script's way), to show what zero-copy access saves.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from cropbench.config import DECODE_PATHS, DEFAULT_CHUNK_CACHE_BYTES, LayoutSpec, PrefetchConfig, ReaderOptions
from cropbench.errors import ConfigError, StoreError
from cropbench.formats import ngff
from cropbench.formats.base import (
    FieldCacheReader,
    FieldInfo,
    PlateGeometry,
    PlateMetadata,
    PlateReader,
    PlateWriter,
    ReadStats,
    Regions,
)
from cropbench.formats.direct import DirectChunkReader
from cropbench.formats.marker import LAYOUT_MARKER, metadata_from_marker, read_marker
from cropbench.formats.memmap import MemmapPlateWriter, MemmapReader
from cropbench.formats.omearrow import (
    OmeArrowPlateWriter,
    OmeArrowPythonReader,
    OmeArrowReader,
    read_colocated_objects,
)
from cropbench.formats.omezarr import OmeZarrPlateWriter, ZarrPythonReader
from cropbench.formats.sources import read_pointer
from cropbench.formats.tiff import TiffPlateWriter, TiffReader, TiffZarrReader
from cropbench.objects import OBJECT_TABLE_NAME, ObjectTable, read_object_table

#: Each format's own reader (decode path ``direct``, and inside the field cache for ``field``).
DIRECT_READERS: dict[str, type[PlateReader]] = {
    "ome-zarr": DirectChunkReader,
    "tiff": TiffReader,
    "memmap": MemmapReader,
    "ome-arrow": OmeArrowReader,
}
#: Each format's library path, where it has one: (decode path, reader).
LIBRARY_READERS: dict[str, tuple[str, type[PlateReader]]] = {
    "ome-zarr": ("zarr", ZarrPythonReader),
    "tiff": ("zarr", TiffZarrReader),
    "ome-arrow": ("as-py", OmeArrowPythonReader),
}
#: Decode paths each storage format supports (see the table above).
DECODES_BY_FORMAT: dict[str, tuple[str, ...]] = {
    fmt: ((LIBRARY_READERS[fmt][0],) if fmt in LIBRARY_READERS else ()) + ("direct", "field") for fmt in DIRECT_READERS
}
WRITERS: dict[str, type[PlateWriter]] = {
    "ome-zarr": OmeZarrPlateWriter,
    "tiff": TiffPlateWriter,
    "memmap": MemmapPlateWriter,
    "ome-arrow": OmeArrowPlateWriter,
}


def read_plate_metadata(path: str | Path) -> PlateMetadata:
    """Metadata of any cropbench-readable plate: a marked layout folder, an NGFF plate or image."""
    root = Path(path)
    document = read_marker(root) if root.is_dir() else None
    if document is not None:
        metadata = metadata_from_marker(root, document)
    else:
        try:
            metadata = ngff.read_plate_metadata(root)
        except StoreError as error:
            if any((root / name).is_file() for name in ("zarr.json", ".zattrs", ".zgroup")):
                raise  # a zarr group: what is wrong in it is the whole answer
            raise StoreError(f"{error}; nor is there a cropbench layout marker ({LAYOUT_MARKER})") from error
    pointer = read_pointer(root) if root.is_dir() else None
    if pointer is not None:  # a mirror of a plate in an object store: pixels are read from its URL
        if metadata.format != "ome-zarr":
            raise StoreError(
                f"{pointer['url']} is a {metadata.format} plate; plates in an object store are read in OME-Zarr "
                "layouts only (convert it locally with --layout, then upload)"
            )
        metadata = dataclasses.replace(metadata, remote=pointer)
    return metadata


def supported_decodes(path_or_metadata: str | Path | PlateMetadata) -> tuple[str, ...]:
    """Decode paths that apply to the plate's storage format."""
    metadata = (
        path_or_metadata if isinstance(path_or_metadata, PlateMetadata) else read_plate_metadata(path_or_metadata)
    )
    return DECODES_BY_FORMAT.get(metadata.format, ("field",))


def open_plate(
    path: str | Path,
    decode: str = "direct",
    chunk_cache_bytes: int = DEFAULT_CHUNK_CACHE_BYTES,
    field_cache_fields: int = 2,
    metadata: PlateMetadata | None = None,
    decode_threads: int = 1,
    prefetch: PrefetchConfig | None = None,
) -> PlateReader:
    """Open a plate, whatever its layout (detected from the path), with one decode path.

    ``decode_threads`` applies to the OME-Zarr chunk reader (``direct``, and inside ``field``); the
    other formats' readers have nothing to decode in parallel and ignore it; so is ``prefetch``
    (reading ahead of the batch asked for: the ``direct`` path's).
    """
    if decode not in DECODE_PATHS:
        raise ConfigError(f"decode={decode!r} is not one of {', '.join(DECODE_PATHS)}")
    metadata = metadata or read_plate_metadata(path)
    if decode not in supported_decodes(metadata):
        raise ConfigError(
            f"decode={decode!r} does not apply to the {metadata.format} layout of {metadata.path}; "
            f"it supports {', '.join(supported_decodes(metadata))}"
        )
    own_reader = DIRECT_READERS[metadata.format].from_options
    if decode == "field":  # the field cache holds whole fields: its reader needs no chunk cache of its own
        return FieldCacheReader(metadata, own_reader(metadata, ReaderOptions(0, decode_threads)), field_cache_fields)
    if decode == "direct":
        return own_reader(metadata, ReaderOptions(chunk_cache_bytes, decode_threads, prefetch or PrefetchConfig()))
    return LIBRARY_READERS[metadata.format][1](metadata)


def plate_objects(plate: str | Path, location: tuple[str, int] | None = None) -> ObjectTable:
    """The object table of a plate: its bundled table, or the objects an OME-Arrow plate keeps inline."""
    source = Path(plate)
    if source.is_dir() and not (source / OBJECT_TABLE_NAME).is_file():
        document = read_marker(source)
        if document is not None and document.get("objects_inline"):
            return read_colocated_objects(source, metadata_from_marker(source, document))
    return read_object_table(source, location)


def create_plate_writer(
    path: str | Path,
    geometry: PlateGeometry,
    layout: LayoutSpec,
    attributes: dict[str, Any] | None = None,
    overwrite: bool = False,
) -> PlateWriter:
    """The writer of ``layout.format``; call ``write_field`` per field, then ``close``.

    ``overwrite`` replaces an existing plate only if cropbench wrote it; anything else is refused.
    """
    return WRITERS[layout.format](path, geometry, layout, attributes, overwrite)


__all__ = [
    "DECODES_BY_FORMAT",
    "DirectChunkReader",
    "FieldCacheReader",
    "FieldInfo",
    "MemmapPlateWriter",
    "MemmapReader",
    "OmeArrowPlateWriter",
    "OmeArrowPythonReader",
    "OmeArrowReader",
    "OmeZarrPlateWriter",
    "PlateGeometry",
    "PlateMetadata",
    "PlateReader",
    "PlateWriter",
    "ReadStats",
    "Regions",
    "TiffPlateWriter",
    "TiffReader",
    "TiffZarrReader",
    "ZarrPythonReader",
    "create_plate_writer",
    "open_plate",
    "plate_objects",
    "read_plate_metadata",
    "supported_decodes",
]
