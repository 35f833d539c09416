"""OME-Zarr HCS plates: the writer (zarr-python, NGFF 0.5) and the zarr-python decode path."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.codecs import BloscCname, BloscCodec, BloscShuffle, ZstdCodec

from cropbench.config import LayoutSpec, StoreConfig
from cropbench.errors import ConfigError, StoreError
from cropbench.formats.base import PlateMetadata, PlateReader, PlateWriter
from cropbench.formats.ngff import NGFF_VERSION, array_chunk_shape, read_array_document
from cropbench.formats.shard_order import reorder_shards
from cropbench.formats.sources import check_regular, redact, scrub_credentials, zarr_store


def compressors_for(layout: LayoutSpec) -> list[Any] | None:
    """zarr v3 bytes-to-bytes codecs for a layout's codec name."""
    if layout.codec == "none":
        return None
    if layout.codec == "zstd":
        return [ZstdCodec(level=layout.clevel)]
    cname = layout.codec.split("-", 1)[1]
    return [BloscCodec(cname=BloscCname(cname), clevel=layout.clevel, shuffle=BloscShuffle.shuffle)]


#: Micrometres per pixel (y, x) of plates that record none (synthetic plates: a 40x objective's 0.65 µm).
DEFAULT_PIXEL_SIZE_UM = (0.65, 0.65)


def row_name(row: int) -> str:
    return chr(ord("A") + row)


def image_attributes(
    name: str,
    channel_names: tuple[str, ...],
    display_ranges: tuple[tuple[float, float], ...],
    pixel_size: tuple[float, float] | None,
) -> dict[str, Any]:
    """NGFF 0.5 ``ome`` attributes of one (c, y, x) image with its array at ``0``: axes, scale and the
    channels' names and display windows. ``pixel_size`` (y, x) in µm; None: unknown (unit-less scale)."""
    unit = {"unit": "micrometer"} if pixel_size else {}
    return {
        "version": NGFF_VERSION,
        "multiscales": [
            {
                "name": name,
                "axes": [
                    {"name": "c", "type": "channel"},
                    {"name": "y", "type": "space", **unit},
                    {"name": "x", "type": "space", **unit},
                ],
                "datasets": [
                    {
                        "path": "0",
                        "coordinateTransformations": [
                            {"type": "scale", "scale": [1.0, *(float(s) for s in pixel_size or (1.0, 1.0))]},
                        ],
                    }
                ],
            }
        ],
        "omero": {
            "channels": [
                {
                    "label": label,
                    "active": True,
                    "color": "FFFFFF",
                    "window": {"start": lo, "end": hi, "min": 0, "max": 65535},
                }
                for label, (lo, hi) in zip(channel_names, display_ranges, strict=True)
            ],
        },
    }


class OmeZarrPlateWriter(PlateWriter):
    """Writes an NGFF 0.5 HCS plate (plate → row/column wells → fields) field by field."""

    def _begin(self) -> None:
        geometry, layout = self.geometry, self.layout
        chunks, shards = layout.chunk_shape(*geometry.field_shape), layout.shard_shape(*geometry.field_shape)
        if shards is not None and any(s % c for s, c in zip(shards, chunks, strict=True)):
            raise ConfigError(
                f"layout {layout.label}: a shard {tuple(shards)} must hold whole chunks {tuple(chunks)} "
                f"(channels_per_chunk={layout.channels_per_chunk} must divide the {geometry.field_shape[0]} channels)"
            )
        self.root = zarr.open_group(str(self.path), mode="w", zarr_format=3)
        rows = sorted({row for row, _ in geometry.wells})
        columns = sorted({column for _, column in geometry.wells}, key=lambda c: (len(c), c))
        self.root.attrs["ome"] = {
            "version": NGFF_VERSION,
            "plate": {
                "name": geometry.name,
                "version": NGFF_VERSION,
                "field_count": max(geometry.field_counts),
                "rows": [{"name": r} for r in rows],
                "columns": [{"name": c} for c in columns],
                "wells": [
                    {"path": f"{r}/{c}", "rowIndex": rows.index(r), "columnIndex": columns.index(c)}
                    for r, c in geometry.wells
                ],
            },
        }
        self.root.attrs["cropbench"] = self.attributes
        for (row, column), count in zip(geometry.wells, geometry.field_counts, strict=True):
            well = self.root.require_group(f"{row}/{column}")
            well.attrs["ome"] = {
                "version": NGFF_VERSION,
                "well": {"images": [{"path": str(site), "acquisition": 0} for site in range(count)]},
            }

    def write_field(self, row: str, column: str, site: int, pixels: np.ndarray) -> None:
        self._check_pixels(row, column, site, pixels)
        image = self.root.require_group(f"{row}/{column}/{site}")
        image.attrs["ome"] = image_attributes(
            f"{row}{column}/{site}",
            self.geometry.channel_names,
            self.geometry.display_ranges,
            self.attributes.get("pixel_size_um", DEFAULT_PIXEL_SIZE_UM),
        )
        channels, height, width = self.geometry.field_shape
        array = image.create_array(
            "0",
            shape=self.geometry.field_shape,
            dtype=pixels.dtype,
            chunks=self.layout.chunk_shape(channels, height, width),
            shards=self.layout.shard_shape(channels, height, width),
            compressors=compressors_for(self.layout),
            dimension_names=("c", "y", "x"),
            fill_value=0,
        )
        array[...] = pixels
        if self.layout.chunk_order == "hilbert":
            reorder_shards(self.path / row / column / str(site) / "0")


def regular_files_store(root: Path) -> Any:
    """zarr-python's ``LocalStore`` on ``root``, read-only, refusing (as a :class:`StoreError`) any
    object that is not a regular file before zarr opens it: a FIFO would block the read forever, a
    device such as ``/dev/zero`` never ends."""
    from zarr.storage import LocalStore, WrapperStore

    class RegularFilesStore(WrapperStore[Any]):
        async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
            check_regular(root / key)
            return await self._store.get(key, prototype, byte_range)

        async def get_partial_values(self, prototype: Any, key_ranges: Any) -> Any:
            key_ranges = list(key_ranges)
            for key, _ in key_ranges:
                check_regular(root / key)
            return await self._store.get_partial_values(prototype, key_ranges)

    return RegularFilesStore(LocalStore(root, read_only=True))


class ZarrPythonReader(PlateReader):
    """Decode path ``zarr``: plain zarr-python slicing, what users write today.

    A plate in an object store is opened on zarr-python's own remote store (``ObjectStore`` or
    ``FsspecStore``, as the store config's ``zarr_client`` says); every GET it makes is counted in
    ``stats.reads`` and ``stats.bytes_fetched``.
    """

    decode = "zarr"

    def __init__(self, metadata: PlateMetadata) -> None:
        super().__init__(metadata)
        self._arrays: dict[int, Any] = {}
        self._remote = metadata.remote
        self._pid = os.getpid()

    def close(self) -> None:
        self._arrays.clear()

    def files(self) -> list[Path]:
        return [] if self._remote else super().files()

    def _count(self, size: int) -> None:
        self.stats.reads += 1
        self.stats.bytes_fetched += size

    def grain(self) -> tuple[int, int]:
        chunk = array_chunk_shape(read_array_document(self.metadata.path / self.metadata.fields[0].path))
        return chunk[-2], chunk[-1]

    def _array(self, field_index: int) -> Any:
        if self._pid != os.getpid():  # a forked worker opens its own store clients
            self._arrays.clear()
            self._pid = os.getpid()
        array = self._arrays.get(field_index)
        if array is None:
            path: Any = self.metadata.path / self.metadata.fields[field_index].path
            try:
                if self._remote is None:
                    array = zarr.open_array(regular_files_store(path), mode="r")
                else:
                    url, config = self._remote["url"], StoreConfig(**self._remote["store"])
                    path = f"{redact(url).rstrip('/')}/{self.metadata.fields[field_index].path}"
                    store = zarr_store(url, config, count=self._count)
                    array = zarr.open_array(store=store, path=self.metadata.fields[field_index].path, mode="r")
            except Exception as error:  # zarr raises several unrelated types for a bad store
                text = " ".join(str(error).split())
                if self._remote is not None:
                    text = scrub_credentials(text, self._remote["url"])
                raise StoreError(f"cannot open zarr array {path}: {text[:300]}") from error
            self._arrays[field_index] = array
        return array

    def _fill(
        self, out: np.ndarray, field_index: int, y0: int, y1: int, x0: int, x1: int, channels: np.ndarray | None
    ) -> None:
        array = self._array(field_index)
        channel_axis = array.ndim - 3 if self.metadata.channel_axis is None else self.metadata.channel_axis
        selection: list[Any] = [0] * array.ndim
        selection[channel_axis] = slice(None) if channels is None else np.asarray(channels)
        selection[-2:] = [slice(y0, y1), slice(x0, x1)]
        try:
            pixels = array[tuple(selection)] if channels is None else array.get_orthogonal_selection(tuple(selection))
        except Exception as error:  # zarr surfaces codec failures as many exception types
            where = self.metadata.fields[field_index].path
            text = " ".join(str(error).split())
            if self._remote is not None:
                where = f"{redact(self._remote['url']).rstrip('/')}/{where}"
                text = scrub_credentials(text, self._remote["url"])
            raise StoreError(
                f"cannot read y{y0}:{y1} x{x0}:{x1} of {where} (corrupt or missing chunk?): {text[:300]}"
            ) from error
        out[...] = pixels
