"""Storage layouts behind one reader interface, and the factory that opens the right one."""

from __future__ import annotations

from pathlib import Path

from cropbench.config import DECODE_PATHS
from cropbench.errors import ConfigError
from cropbench.formats.base import FieldCacheReader, FieldInfo, PlateMetadata, PlateReader, ReadStats
from cropbench.formats.chunks import DirectChunkReader
from cropbench.formats.ngff import read_plate_metadata
from cropbench.formats.omezarr import OmeZarrPlateWriter, ZarrPythonReader


def open_plate(
    path: str | Path, decode: str = "direct", chunk_cache_bytes: int = 64 * 2**20,
    field_cache_fields: int = 2, metadata: PlateMetadata | None = None,
) -> PlateReader:
    """Open a plate with one decode path: ``zarr``, ``direct`` or ``field``."""
    if decode not in DECODE_PATHS:
        raise ConfigError(f"decode={decode!r} is not one of {', '.join(DECODE_PATHS)}")
    metadata = metadata or read_plate_metadata(path)
    if decode == "zarr":
        return ZarrPythonReader(metadata)
    if decode == "direct":
        return DirectChunkReader(metadata, chunk_cache_bytes=chunk_cache_bytes)
    return FieldCacheReader(metadata, DirectChunkReader(metadata, chunk_cache_bytes=0), field_cache_fields)


__all__ = [
    "DirectChunkReader", "FieldCacheReader", "FieldInfo", "OmeZarrPlateWriter", "PlateMetadata",
    "PlateReader", "ReadStats", "ZarrPythonReader", "open_plate", "read_plate_metadata",
]
