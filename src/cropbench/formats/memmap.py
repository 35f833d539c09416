"""Raw memory-mapped plate: the uncompressed reference layout the layouts track compares others with.

Not the ceiling: the ceiling is the C copy of the same crops from an in-memory copy at the reader's
thread count (``cropbench run --track targets``), which this layout's per-item work stays below.

All fields live in one C-ordered raw file of shape (fields, c, y, x): no header, no compression,
no chunk index. A crop is one numpy slice of a memory map, so a read costs the page faults and one
copy, nothing else. Decode paths: ``direct`` (slice the map) and ``field`` (copy whole fields into
the field cache first); ``zarr`` does not apply (there is no zarr store).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cropbench.errors import StoreError
from cropbench.formats.base import PlateMetadata, PlateReader, PlateWriter
from cropbench.formats.marker import write_marker

PIXELS_NAME = "pixels.raw"


class MemmapPlateWriter(PlateWriter):
    """Writes every field into one raw file; the dtype is that of the first field written."""

    def _begin(self) -> None:
        self.path.mkdir(parents=True)
        self._slots = {slot: i for i, slot in enumerate(self.geometry.field_slots())}
        self._map: np.memmap | None = None
        self._dtype: np.dtype | None = None

    def write_field(self, row: str, column: str, site: int, pixels: np.ndarray) -> None:
        self._check_pixels(row, column, site, pixels)
        if self._map is None:
            self._dtype = pixels.dtype
            shape = (len(self._slots), *self.geometry.field_shape)
            self._map = np.memmap(
                self.path / PIXELS_NAME,
                dtype=pixels.dtype.newbyteorder("<"),
                mode="w+",
                shape=shape,
            )
        if pixels.dtype != self._dtype:
            raise StoreError(f"field {row}{column}/{site} is {pixels.dtype}, earlier fields are {self._dtype}")
        try:
            index = self._slots[(row, column, site)]
        except KeyError as error:
            raise StoreError(f"field {row}{column}/{site} is not one of the plate's wells and sites") from error
        self._map[index] = pixels

    def close(self) -> None:
        if self._map is None:
            raise StoreError(f"no field was written to {self.path}")
        self._map.flush()
        self._map = None
        write_marker(self, np.dtype(self._dtype).name, [str(i) for i in range(len(self._slots))], pixels=PIXELS_NAME)


class MemmapReader(PlateReader):
    """Decode path ``direct`` on the raw layout: one slice of a memory map per crop.

    ``bytes_fetched`` counts the bytes copied; the kernel faults whole 4 KiB pages, so the true
    fetch is larger for narrow crops (not counted: counting pages would cost as much as the read).
    """

    decode = "direct"

    def __init__(self, metadata: PlateMetadata) -> None:
        super().__init__(metadata)
        self._map: np.memmap | None = None

    def pixels(self) -> np.memmap:
        """The whole plate as one (fields, C, H, W) memory map, mapped once."""
        if self._map is None:
            path = self.metadata.path / (self.metadata.pixels_file or PIXELS_NAME)
            shape = (len(self.metadata.fields), *self.metadata.field_shape)
            expected = int(np.prod(shape)) * np.dtype(self.metadata.dtype).itemsize
            if not path.is_file() or path.stat().st_size != expected:
                found = (
                    path.stat().st_size
                    if path.is_file()
                    else "something that is not a regular file (a FIFO, device or folder)"
                    if path.exists()
                    else "no file"
                )
                raise StoreError(f"raw pixels {path} should hold {expected} bytes for {shape}, found {found}")
            self._map = np.memmap(path, dtype=np.dtype(self.metadata.dtype).newbyteorder("<"), mode="r", shape=shape)
        return self._map

    def close(self) -> None:
        self._map = None

    def _fill(
        self, out: np.ndarray, field_index: int, y0: int, y1: int, x0: int, x1: int, channels: np.ndarray | None
    ) -> None:
        pixels = self.pixels()
        if channels is None:
            out[...] = pixels[field_index, :, y0:y1, x0:x1]
        else:
            out[...] = pixels[field_index, channels, y0:y1, x0:x1]
        self.stats.bytes_fetched += out.nbytes

    def files(self) -> list[Path]:
        return [self.metadata.path / (self.metadata.pixels_file or PIXELS_NAME)]
