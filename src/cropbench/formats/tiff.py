"""One TIFF per field and channel: how CellProfiler pipelines keep images today (via tifffile).

Files in ``images/`` are named by the plate's own well, 0-based field and 0-based channel with its
name (``B7_field0_c1_ER.tiff``), deliberately unlike a microscope's export names (Phenix
``r02c07f01p01-ch2sk1fk1fl1.tiff`` numbers sites and channels from 1 in the source's own order), so
a converted plate's files are never mistaken for the source's. Strips are tifffile's defaults: one
contiguous strip uncompressed, ~256 KiB strips with zlib.

Decode paths:
- ``direct``: cropbench's own segment reader. Uncompressed planes are memory-mapped and sliced;
  compressed planes decode only the strips a crop touches (kept in a byte-bounded LRU).
- ``zarr``: zarr-python over tifffile's zarr store (``tifffile.imread(path, aszarr=True)``).
- ``field``: ``tifffile.imread`` of every channel file, whole fields kept in the field cache,
  the way most pipelines read these images.
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import numpy as np
import tifffile

from cropbench.config import DEFAULT_CHUNK_CACHE_BYTES, ReaderOptions
from cropbench.errors import StoreError
from cropbench.formats.base import LruCache, PlateMetadata, PlateReader, PlateWriter, chunk_spans
from cropbench.formats.marker import write_marker
from cropbench.formats.sources import check_regular

IMAGES_DIR = "images"
#: TIFF compression tags the direct path decodes: none, Adobe deflate and old-style deflate (zlib).
_DEFLATE = {8, 32946}


_UNSAFE = re.compile(r"[^A-Za-z0-9.+-]+")


def field_file_names(row: str, column: str, site: int, channel_names: Sequence[str]) -> list[str]:
    """``<well>_field<site>_c<index>_<channel>.tiff``, site and index 0-based as in the plate."""
    stem = _UNSAFE.sub("-", f"{row}{column}")
    return [f"{stem}_field{site}_c{index}_{_UNSAFE.sub('-', name)}.tiff" for index, name in enumerate(channel_names)]


class TiffPlateWriter(PlateWriter):
    """Writes one 2-D TIFF per field and channel with tifffile (``codec`` none or zlib)."""

    def _begin(self) -> None:
        (self.path / IMAGES_DIR).mkdir(parents=True)
        self._dtype: np.dtype | None = None

    def write_field(self, row: str, column: str, site: int, pixels: np.ndarray) -> None:
        self._check_pixels(row, column, site, pixels)
        self._dtype = pixels.dtype
        compression: dict[str, Any] = (
            {"compression": "zlib", "compressionargs": {"level": self.layout.clevel}}
            if self.layout.codec == "zlib"
            else {}
        )
        for name, plane in zip(field_file_names(row, column, site, self.geometry.channel_names), pixels, strict=True):
            tifffile.imwrite(
                self.path / IMAGES_DIR / name, plane, photometric="minisblack", metadata=None, **compression
            )

    def close(self) -> None:
        if self._dtype is None:
            raise StoreError(f"no field was written to {self.path}")
        slots = self.geometry.field_slots()
        files = [
            [f"{IMAGES_DIR}/{name}" for name in field_file_names(row, column, site, self.geometry.channel_names)]
            for row, column, site in slots
        ]
        write_marker(
            self,
            np.dtype(self._dtype).name,
            [f"{row}{column}/{site}" for row, column, site in slots],
            channel_files=files,
        )


def segment_limit(compression: int, decoded_bytes: int) -> int:
    """The most bytes a stored strip or tile of ``decoded_bytes`` may hold: itself uncompressed,
    deflate's worst case (5 bytes a 16 KiB block, and a header), twice it plus a little for other codecs."""
    if compression == 1:
        return decoded_bytes
    if compression in _DEFLATE:
        return decoded_bytes + decoded_bytes // 1000 + 64
    return 2 * decoded_bytes + 1024


@dataclass(frozen=True)
class TiffPlane:
    """Where one 2-D TIFF keeps its pixels: strip offsets and sizes, and how they are encoded.

    :meth:`parse` reads the header only (after checking the path is a regular file);
    :meth:`check` holds it to a plate (shape, a pixel type read without loss, every strip within
    its plane's size and the file); :meth:`direct_problem` says why the direct path cannot read it.
    """

    path: Path
    shape: tuple[int, ...]
    dtype: np.dtype
    rows_per_strip: int
    offsets: tuple[int, ...]
    byte_counts: tuple[int, ...]
    deflated: bool
    contiguous_offset: int | None
    compression: int = 1
    predictor: int = 1
    tiled: bool = False
    samples: int = 1
    segment_bytes: int = 0
    file_bytes: int = 0

    @classmethod
    def parse(cls, path: Path) -> TiffPlane:
        if not check_regular(path):
            raise StoreError(f"cannot read TIFF {path}: no such file")
        try:
            file_bytes = os.stat(path).st_size
            with tifffile.TiffFile(path) as tiff:
                page = tiff.pages.first
                byteorder = tiff.byteorder
                shape = tuple(int(s) for s in page.shape)
                dtype = np.dtype(page.dtype)
                compression = int(page.compression)
                contiguous = compression == 1 and bool(page.is_contiguous)
                return cls(
                    path=path,
                    shape=shape,
                    dtype=dtype.newbyteorder(byteorder),
                    rows_per_strip=int(page.rowsperstrip) or shape[0],
                    offsets=tuple(int(o) for o in page.dataoffsets),
                    byte_counts=tuple(int(b) for b in page.databytecounts),
                    deflated=compression in _DEFLATE,
                    contiguous_offset=int(page.dataoffsets[0]) if contiguous else None,
                    compression=compression,
                    predictor=int(page.predictor),
                    tiled=bool(page.is_tiled),
                    samples=int(page.samplesperpixel),
                    segment_bytes=int(np.prod(page.chunks)) * dtype.itemsize,
                    file_bytes=file_bytes,
                )
        except StoreError:
            raise
        except Exception as error:  # tifffile raises many unrelated types (IndexError, struct.error, ...) on bad bytes
            raise StoreError(f"cannot read TIFF {path}: {type(error).__name__}: {error}") from error

    def check(self, shape: tuple[int, int], dtype: str) -> TiffPlane:
        """This plane, if a plate of fields ``shape`` and pixel type ``dtype`` can read it exactly."""
        if self.shape != shape:
            raise StoreError(f"{self.path} has shape {self.shape}, the plate's fields are {shape}")
        stored = self.dtype.newbyteorder("=")
        if not np.can_cast(stored, np.dtype(dtype), "safe"):
            raise StoreError(
                f"{self.path} holds {stored.name} pixels, the plate's are {dtype}: they would wrap or lose "
                f"their sign; store the channel as {dtype} (or a narrower unsigned type)"
            )
        strips = self.expected_strips()
        if len(self.offsets) != strips or len(self.byte_counts) != strips:
            raise StoreError(
                f"{self.path}: {len(self.offsets)} strip offsets and {len(self.byte_counts)} byte counts for a "
                f"plane of {strips} strips ({self.shape[0]} rows, {self.rows_per_strip} per strip): the file is corrupt"
            )
        limit = segment_limit(self.compression, self.segment_bytes)
        for index, (offset, count) in enumerate(zip(self.offsets, self.byte_counts, strict=True)):
            if count > limit or offset + count > self.file_bytes:
                raise StoreError(
                    f"{self.path}: strip {index} has byte count {count:,} at offset {offset:,}; a strip of this "
                    f"plane holds at most {limit:,} bytes and the file has {self.file_bytes:,}: the file is corrupt"
                )
        return self

    def expected_strips(self) -> int:
        """How many segments the plane's header must list: one per strip (tiled planes: as many as it lists)."""
        if self.tiled or len(self.shape) != 2:
            return len(self.offsets)
        return -(-self.shape[0] // max(self.rows_per_strip, 1))

    def direct_problem(self) -> str | None:
        """Why the direct path cannot read this plane (None: it can)."""
        if len(self.shape) != 2 or self.tiled or self.samples != 1:
            return (
                f"{self.path}: the direct path reads single-sample 2-D stripped TIFFs, found shape {self.shape}, "
                f"tiled={self.tiled}; use decode='field'"
            )
        if self.compression not in (1, *_DEFLATE) or self.predictor != 1:
            return (
                f"{self.path}: compression {self.compression!r} with predictor {self.predictor!r} is not read by "
                "the direct path (it reads uncompressed and zlib without predictor); use decode='field'"
            )
        return None


def channel_files(metadata: PlateMetadata, field_index: int) -> list[Path]:
    try:
        names = metadata.channel_files[field_index]
    except IndexError as error:
        raise StoreError(f"layout marker of {metadata.path} lists no files for field {field_index}") from error
    return [metadata.path / name for name in names]


class TiffReader(PlateReader):
    """Decode path ``direct`` on the TIFF layout (and, through ``read_field``, path ``field``)."""

    decode = "direct"

    def __init__(self, metadata: PlateMetadata, chunk_cache_bytes: int = DEFAULT_CHUNK_CACHE_BYTES) -> None:
        super().__init__(metadata)
        self.chunk_cache_bytes = chunk_cache_bytes
        self._cache: LruCache[tuple[int, int, int], np.ndarray] = LruCache(chunk_cache_bytes)
        self._planes: dict[int, list[TiffPlane]] = {}
        self._checked: dict[int, list[TiffPlane]] = {}
        self._maps: dict[tuple[int, int], np.memmap] = {}
        self._descriptors: dict[Path, int] = {}

    @classmethod
    def from_options(cls, metadata: PlateMetadata, options: ReaderOptions) -> Self:
        return cls(metadata, chunk_cache_bytes=options.chunk_cache_bytes)

    def _config_state(self) -> dict[str, Any]:
        return {"chunk_cache_bytes": self.chunk_cache_bytes}

    def close(self) -> None:
        self._cache.clear()
        self._maps.clear()
        for descriptor in self._descriptors.values():
            os.close(descriptor)
        self._descriptors.clear()

    def grain(self) -> tuple[int, int]:
        plane = self._field_planes(0)[0]
        if plane.deflated:
            return plane.rows_per_strip, plane.shape[1]
        return super().grain()

    def _checked_planes(self, field_index: int) -> list[TiffPlane]:
        """The field's planes, each checked against the plate (every decode path reads through this)."""
        planes = self._checked.get(field_index)
        if planes is None:
            planes = checked_planes(self.metadata, field_index)
            self._checked[field_index] = planes
        return planes

    def _field_planes(self, field_index: int) -> list[TiffPlane]:
        planes = self._planes.get(field_index)
        if planes is None:
            planes = self._checked_planes(field_index)
            for plane in planes:
                problem = plane.direct_problem()
                if problem is not None:
                    raise StoreError(problem)
            self._planes[field_index] = planes
        return planes

    def _fill(
        self, out: np.ndarray, field_index: int, y0: int, y1: int, x0: int, x1: int, channels: np.ndarray | None
    ) -> None:
        planes = self._field_planes(field_index)
        wanted = range(len(planes)) if channels is None else [int(c) for c in channels]
        for position, channel in enumerate(wanted):
            plane = planes[channel]
            if plane.contiguous_offset is not None:
                out[position] = self._map(field_index, channel, plane)[y0:y1, x0:x1]
                self.stats.bytes_fetched += (y1 - y0) * (x1 - x0) * plane.dtype.itemsize
                continue
            rows = plane.rows_per_strip
            for strip_index, ry0, ry1 in chunk_spans(y0, y1, rows):
                strip = self._strip(field_index, channel, plane, strip_index)
                sy0 = strip_index * rows
                out[position, ry0 - y0 : ry1 - y0] = strip[ry0 - sy0 : ry1 - sy0, x0:x1]

    def _map(self, field_index: int, channel: int, plane: TiffPlane) -> np.memmap:
        mapped = self._maps.get((field_index, channel))
        if mapped is None:
            try:
                mapped = np.memmap(
                    plane.path, dtype=plane.dtype, mode="r", offset=plane.contiguous_offset or 0, shape=plane.shape
                )
            except (OSError, ValueError) as error:  # a file cut short: shorter than its header says
                raise StoreError(f"TIFF {plane.path} is truncated or unreadable: {error}") from error
            self._maps[(field_index, channel)] = mapped
        return mapped

    def _strip(self, field_index: int, channel: int, plane: TiffPlane, strip_index: int) -> np.ndarray:
        self.stats.chunks_touched += 1
        key = (field_index, channel, strip_index)
        strip = self._cache.get(key)
        if strip is not None:
            return strip
        descriptor = self._descriptors.get(plane.path)
        if descriptor is None:
            descriptor = os.open(plane.path, os.O_RDONLY)
            self._descriptors[plane.path] = descriptor
        encoded = os.pread(descriptor, plane.byte_counts[strip_index], plane.offsets[strip_index])
        self.stats.bytes_fetched += len(encoded)
        height, width = plane.shape
        strip_rows = min(plane.rows_per_strip, height - strip_index * plane.rows_per_strip)
        try:  # never more than the strip's own size is inflated, whatever the stream claims
            data = (
                zlib.decompressobj().decompress(encoded, strip_rows * width * plane.dtype.itemsize)
                if plane.deflated
                else encoded
            )
        except zlib.error as error:
            raise StoreError(
                f"strip {strip_index} of {plane.path} cannot be decoded (corrupt zlib data): {error}"
            ) from None
        expected = strip_rows * width * plane.dtype.itemsize
        if len(data) < expected:  # also a stream that ends inside a pixel
            raise StoreError(
                f"strip {strip_index} of {plane.path} decoded to {len(data)} bytes, "
                f"expected {expected}: the file is corrupt"
            )
        strip = np.frombuffer(data, dtype=plane.dtype, count=strip_rows * width).reshape(strip_rows, width)
        self.stats.bytes_decoded += strip.nbytes
        self.stats.chunks_decoded += 1
        self._cache.put(key, strip)
        return strip

    def read_field(self, field_index: int, channels: np.ndarray | None = None) -> np.ndarray:
        """Whole field through ``tifffile.imread``, as pipelines read these images."""
        paths = [plane.path for plane in self._checked_planes(field_index)]
        wanted = range(len(paths)) if channels is None else [int(c) for c in channels]
        result = np.empty((len(wanted), *self.metadata.field_shape[1:]), dtype=self.metadata.dtype)
        for position, channel in enumerate(wanted):
            try:
                result[position] = tifffile.imread(paths[channel])
            except Exception as error:  # tifffile and imagecodecs raise many unrelated types on corrupt data
                raise StoreError(f"cannot read TIFF {paths[channel]}: {type(error).__name__}: {error}") from error
            self.stats.bytes_fetched += paths[channel].stat().st_size
            self.stats.chunks_decoded += 1
        self.stats.bytes_decoded += result.nbytes
        self.stats.regions += 1
        self.stats.bytes_delivered += result.nbytes
        return result

    def files(self) -> list[Path]:
        return all_files(self.metadata)


class TiffZarrReader(PlateReader):
    """Decode path ``zarr`` on the TIFF layout: zarr-python slicing of tifffile's zarr store."""

    decode = "zarr"

    def __init__(self, metadata: PlateMetadata) -> None:
        super().__init__(metadata)
        self._arrays: dict[int, list[Any]] = {}
        self._stores: list[Any] = []

    def close(self) -> None:
        for store in self._stores:
            store.close()
        self._stores.clear()
        self._arrays.clear()

    def _field_arrays(self, field_index: int) -> list[Any]:
        import zarr

        arrays = self._arrays.get(field_index)
        if arrays is None:
            arrays = []
            for plane in checked_planes(self.metadata, field_index):
                path = plane.path
                try:
                    store = tifffile.imread(path, aszarr=True)
                except Exception as error:  # as parse: any type on bad bytes
                    raise StoreError(f"cannot open TIFF {path} as a zarr store: {error}") from error
                self._stores.append(store)
                arrays.append(zarr.open_array(store, mode="r"))
            self._arrays[field_index] = arrays
        return arrays

    def _fill(
        self, out: np.ndarray, field_index: int, y0: int, y1: int, x0: int, x1: int, channels: np.ndarray | None
    ) -> None:
        arrays = self._field_arrays(field_index)
        wanted = range(len(arrays)) if channels is None else [int(c) for c in channels]
        for position, channel in enumerate(wanted):
            try:
                out[position] = arrays[channel][y0:y1, x0:x1]
            except Exception as error:  # a corrupt or truncated strip: tifffile and imagecodecs raise many types
                path = channel_files(self.metadata, field_index)[channel]
                raise StoreError(f"TIFF {path} cannot be read: {type(error).__name__}: {error}") from error

    def files(self) -> list[Path]:
        return all_files(self.metadata)


def checked_planes(metadata: PlateMetadata, field_index: int) -> list[TiffPlane]:
    """Every channel file of a field parsed (headers only) and checked against the plate."""
    shape = (metadata.field_shape[1], metadata.field_shape[2])
    return [TiffPlane.parse(path).check(shape, metadata.dtype) for path in channel_files(metadata, field_index)]


def all_files(metadata: PlateMetadata) -> list[Path]:
    """Every channel file of every field."""
    return [path for index in range(len(metadata.fields)) for path in channel_files(metadata, index)]
