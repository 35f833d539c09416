"""OME-Arrow plates: each field one row of a Parquet table, pixels in the OME-Arrow image struct.

The format comes from the ``ome-arrow`` package (optional extra: ``.venv/bin/pip install -e ".[arrow]"``);
its own writer builds every image (``ome_arrow.from_numpy`` with typed byte chunks, the
``OME_ARROW_BYTE_STRUCT`` schema). ``images.parquet`` holds one row per field (``plate``,
``well``, ``row``, ``column``, ``field`` and ``image``), one row group per field, with no
Parquet container compression: chunk-level zstd-1 (as the format's authors recommend) or none.
``colocate_objects`` adds an ``objects`` column: each field's cells as a list of structs,
queryable next to the pixels, and the plate then has no separate object table.

Decode paths, named for what they do:
- ``direct``: zero-copy. A field's row group is read once per process; the chunk list is
  flattened to Arrow buffers and a crop decodes only the chunks it touches, sliced straight out
  of the ``pixel_bytes`` buffer (byte-bounded LRU of decoded chunks, like the OME-Zarr path).
  Trap: a list's ``.values`` and any array's raw ``buffers()`` ignore the slice offset of a row
  (and older pyarrow's ``StructArray.field`` did too), so a sliced table silently yields other
  rows' chunks; ``flatten()`` applies the offset, and buffer offsets are applied by hand here.
- ``field``: whole fields assembled from the same buffers, then cut from memory (field cache).
- ``as-py``: the reference script's way: ``table["image"][row].as_py()`` into Python objects,
  then ``ome_arrow.to_numpy`` for the whole field, then the crop. Kept to show the gap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Self

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from cropbench.config import DEFAULT_CHUNK_CACHE_BYTES, ReaderOptions
from cropbench.errors import ConfigError, ObjectTableError, StoreError
from cropbench.formats.base import LruCache, PlateMetadata, PlateReader, PlateWriter, chunk_spans
from cropbench.formats.marker import write_marker
from cropbench.objects import ObjectTable

IMAGES_NAME = "images.parquet"
#: Row groups (fields) of Arrow data a reader keeps per process.
ROW_GROUP_BUDGET_BYTES = 512 * 2**20
_OBJECT_FIELDS = ("object_id", "centroid_y", "centroid_x", "bbox_y0", "bbox_x0", "bbox_y1", "bbox_x1")


def require_ome_arrow() -> Any:
    """The ``ome_arrow`` module, or a ConfigError that says how to install the extra."""
    try:
        import ome_arrow
    except ImportError as error:
        raise ConfigError(
            "the ome-arrow layouts need the optional extra [arrow] (the ome-arrow package): "
            ".venv/bin/pip install -e '.[arrow]' from the repository root"
        ) from error
    return ome_arrow


def ome_arrow_available() -> bool:
    try:
        require_ome_arrow()
    except ConfigError:
        return False
    return True


class OmeArrowPlateWriter(PlateWriter):
    """Writes one Parquet row (and row group) per field with ``ome_arrow.from_numpy``."""

    def _begin(self) -> None:
        self._ome_arrow = require_ome_arrow()
        self.path.mkdir(parents=True)
        self._writer: pq.ParquetWriter | None = None
        self._objects: dict[tuple[str, int], list[dict[str, Any]]] | None = None
        self._dtype: np.dtype | None = None

    @property
    def colocates_objects(self) -> bool:
        return bool(self.layout.colocate_objects)

    def attach_objects(self, table: Any) -> None:
        """Cells to store inline (``colocate_objects``); call before the first field is written."""
        if not self.colocates_objects:
            return
        grouped: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for i in range(len(table)):
            y0, x0, y1, x1 = (int(v) for v in table.bbox[i])
            grouped.setdefault((str(table.well[i]), int(table.field[i])), []).append(
                {
                    "object_id": int(table.object_id[i]),
                    "centroid_y": float(table.centroid_y[i]),
                    "centroid_x": float(table.centroid_x[i]),
                    "bbox_y0": y0,
                    "bbox_x0": x0,
                    "bbox_y1": y1,
                    "bbox_x1": x1,
                }
            )
        self._objects = grouped

    def write_field(self, row: str, column: str, site: int, pixels: np.ndarray) -> None:
        self._check_pixels(row, column, site, pixels)
        self._dtype = pixels.dtype
        chunk = self.layout.chunk_yx or max(self.geometry.field_shape[1:])
        image = self._ome_arrow.from_numpy(
            pixels,
            dim_order="CYX",
            image_id=f"{row}{column}/{site}",
            name=f"{self.geometry.name} {row}{column}/{site}",
            channel_names=list(self.geometry.channel_names),
            clamp_to_uint16=False,
            chunk_shape=(1, chunk, chunk),
            chunk_encoding="bytes",
            chunk_compression=None if self.layout.codec == "none" else "zstd",
            chunk_compression_level=self.layout.clevel if self.layout.codec == "zstd" else None,
        )
        columns: dict[str, pa.Array] = {
            "plate": pa.array([self.geometry.name]),
            "well": pa.array([f"{row}{column}"]),
            "row": pa.array([row]),
            "column": pa.array([column]),
            "field": pa.array([site], pa.int32()),
            "image": pa.repeat(image, 1),
        }
        if self.colocates_objects:
            cells = (self._objects or {}).get((f"{row}{column}", site), [])
            columns["objects"] = pa.array([cells], type=_objects_type())
        table = pa.table(columns)
        if self._writer is None:
            self._writer = pq.ParquetWriter(str(self.path / IMAGES_NAME), table.schema, compression="none")
        self._writer.write_table(table)

    def close(self) -> None:
        if self._writer is None or self._dtype is None:
            raise StoreError(f"no field was written to {self.path}")
        self._writer.close()
        slots = self.geometry.field_slots()
        write_marker(
            self,
            np.dtype(self._dtype).name,
            [str(i) for i in range(len(slots))],
            images=IMAGES_NAME,
            objects_inline=self.colocates_objects,
        )


def _objects_type() -> pa.DataType:
    return pa.list_(
        pa.struct(
            [
                pa.field(name, pa.int64() if name.startswith(("object", "bbox")) else pa.float64())
                for name in _OBJECT_FIELDS
            ]
        )
    )


class _FieldChunks:
    """Where each chunk of one field lives inside the row group's Arrow buffers (no copies);
    ``nbytes`` is what keeping the field holds in memory."""

    def __init__(self, image: pa.StructArray, field_shape: tuple[int, int, int]) -> None:
        self.nbytes = int(image.nbytes)
        parts = dict(zip([f.name for f in image.type], image.flatten(), strict=True))  # flatten: keeps offsets
        grid_row = parts["chunk_grid"][0].as_py()
        self.chunk_y, self.chunk_x = int(grid_row["chunk_y"]), int(grid_row["chunk_x"])
        if int(grid_row.get("chunk_c") or 1) != 1 or int(grid_row.get("chunk_z") or 1) != 1:
            raise StoreError(f"OME-Arrow chunks of {grid_row} are not single-channel 2-D tiles")
        chunks = parts["chunks"].flatten()  # the row's chunk structs (ListArray.flatten keeps offsets too)
        columns = dict(zip([f.name for f in chunks.type], chunks.flatten(), strict=True))
        self.count = len(chunks)
        self.c = columns["c"].to_numpy()
        self.y = columns["y"].to_numpy() // self.chunk_y
        self.x = columns["x"].to_numpy() // self.chunk_x
        self.shape_y = columns["shape_y"].to_numpy()
        self.shape_x = columns["shape_x"].to_numpy()
        compression = columns["compression"].to_pylist()
        self.compression = [c or None for c in compression]
        payload = columns["pixel_bytes"]
        buffers = payload.buffers()
        offsets = np.frombuffer(buffers[1], dtype=np.int64)[payload.offset : payload.offset + len(payload) + 1]
        self.starts, self.ends = offsets[:-1], offsets[1:]
        self.data = buffers[2]
        channels, height, width = field_shape
        self.grid = np.full((channels, -(-height // self.chunk_y), -(-width // self.chunk_x)), -1, dtype=np.int64)
        self.grid[self.c, self.y, self.x] = np.arange(self.count)


class OmeArrowReader(PlateReader):
    """Decode path ``direct``: zero-copy chunk buffers from the Parquet row group of each field."""

    decode = "direct"

    def __init__(self, metadata: PlateMetadata, chunk_cache_bytes: int = DEFAULT_CHUNK_CACHE_BYTES) -> None:
        super().__init__(metadata)
        self.chunk_cache_bytes = chunk_cache_bytes
        self._cache: LruCache[tuple[int, int], np.ndarray] = LruCache(chunk_cache_bytes)
        self._file: pq.ParquetFile | None = None
        self._fields: LruCache[int, _FieldChunks] = LruCache(ROW_GROUP_BUDGET_BYTES, keep_newest=True)
        self._codecs: dict[str, pa.Codec] = {}
        self._dtype = np.dtype(metadata.dtype).newbyteorder("<")

    @classmethod
    def from_options(cls, metadata: PlateMetadata, options: ReaderOptions) -> Self:
        return cls(metadata, chunk_cache_bytes=options.chunk_cache_bytes)

    def _config_state(self) -> dict[str, Any]:
        return {"chunk_cache_bytes": self.chunk_cache_bytes}

    def close(self) -> None:
        self._cache.clear()
        self._fields.clear()
        if self._file is not None:
            self._file.close()
        self._file = None

    def grain(self) -> tuple[int, int]:
        field = self._field(0)
        return field.chunk_y, field.chunk_x

    def files(self) -> list[Path]:
        return [images_path(self.metadata)]

    def _parquet(self) -> pq.ParquetFile:
        if self._file is None:
            path = images_path(self.metadata)
            try:
                self._file = pq.ParquetFile(str(path), memory_map=True)
            except (OSError, pa.ArrowInvalid) as error:
                raise StoreError(f"cannot open OME-Arrow images {path}: {error}") from error
        return self._file

    def _row(self, field_index: int) -> pa.Table:
        try:
            table = self._parquet().read_row_group(field_index, columns=["image"])
        except (OSError, pa.ArrowInvalid, IndexError) as error:
            raise StoreError(f"cannot read field {field_index} of {images_path(self.metadata)}: {error}") from error
        if table.num_rows != 1:
            raise StoreError(f"row group {field_index} of {images_path(self.metadata)} holds {table.num_rows} rows")
        return table

    def _field(self, field_index: int) -> _FieldChunks:
        field = self._fields.get(field_index)
        if field is not None:
            return field
        table = self._row(field_index)
        field = _FieldChunks(table.column("image").combine_chunks(), self.metadata.field_shape)
        self.stats.bytes_fetched += table.nbytes
        self._fields.put(field_index, field)
        return field

    def _chunk(self, field_index: int, field: _FieldChunks, position: int) -> np.ndarray:
        self.stats.chunks_touched += 1
        key = (field_index, position)
        chunk = self._cache.get(key)
        if chunk is not None:
            return chunk
        start, end = int(field.starts[position]), int(field.ends[position])
        payload = field.data.slice(start, end - start)
        shape = (int(field.shape_y[position]), int(field.shape_x[position]))
        size = shape[0] * shape[1] * self._dtype.itemsize
        compression = field.compression[position]
        if compression is not None:
            codec = self._codecs.get(compression)
            if codec is None:
                codec = self._codecs[compression] = pa.Codec(compression)
            payload = codec.decompress(payload, decompressed_size=size)
        values = np.frombuffer(payload, dtype=self._dtype)
        if values.size != shape[0] * shape[1]:
            raise StoreError(f"chunk {position} of field {field_index} holds {values.size} values, expected {shape}")
        chunk = values.reshape(shape)
        self.stats.chunks_decoded += 1
        self.stats.bytes_decoded += chunk.nbytes
        self._cache.put(key, chunk)
        return chunk

    def _fill(
        self, out: np.ndarray, field_index: int, y0: int, y1: int, x0: int, x1: int, channels: np.ndarray | None
    ) -> None:
        field = self._field(field_index)
        wanted = range(self.metadata.field_shape[0]) if channels is None else [int(c) for c in channels]
        step_y, step_x = field.chunk_y, field.chunk_x
        for output, channel in enumerate(wanted):
            for y_index, sy0, sy1 in chunk_spans(y0, y1, step_y):
                cy0 = y_index * step_y
                for x_index, sx0, sx1 in chunk_spans(x0, x1, step_x):
                    cx0 = x_index * step_x
                    position = int(field.grid[channel, y_index, x_index])
                    if position < 0:
                        raise StoreError(
                            f"field {field_index} has no chunk for channel {channel} at ({y_index}, {x_index})"
                        )
                    chunk = self._chunk(field_index, field, position)
                    out[output, sy0 - y0 : sy1 - y0, sx0 - x0 : sx1 - x0] = chunk[
                        sy0 - cy0 : sy1 - cy0, sx0 - cx0 : sx1 - cx0
                    ]


class OmeArrowPythonReader(PlateReader):
    """Decode path ``as-py``: ``.as_py()`` of the field's row, ``ome_arrow.to_numpy``, then the crop."""

    decode = "as-py"

    def __init__(self, metadata: PlateMetadata) -> None:
        super().__init__(metadata)
        self._column: pa.ChunkedArray | None = None
        self._ome_arrow = require_ome_arrow()

    def close(self) -> None:
        self._column = None

    def files(self) -> list[Path]:
        return [images_path(self.metadata)]

    def _fill(
        self, out: np.ndarray, field_index: int, y0: int, y1: int, x0: int, x1: int, channels: np.ndarray | None
    ) -> None:
        if self._column is None:
            try:
                self._column = pq.read_table(
                    str(images_path(self.metadata)), columns=["image"], memory_map=True
                ).column("image")
            except (OSError, pa.ArrowInvalid) as error:
                raise StoreError(f"cannot read {images_path(self.metadata)}: {error}") from error
        record = self._column[field_index].as_py()
        pixels = self._ome_arrow.to_numpy(record, dtype=np.dtype(self.metadata.dtype))
        field = pixels.reshape(self.metadata.field_shape)
        out[...] = field[:, y0:y1, x0:x1] if channels is None else field[channels, y0:y1, x0:x1]
        self.stats.bytes_decoded += field.nbytes


def images_path(metadata: PlateMetadata) -> Path:
    return metadata.path / (metadata.pixels_file or IMAGES_NAME)


def read_colocated_objects(plate: Path, metadata: PlateMetadata) -> ObjectTable:
    """The object table kept inline (``objects`` column) of an OME-Arrow plate."""
    if not metadata.objects_inline:
        raise ObjectTableError(f"{plate} keeps no objects inline")
    table = pq.read_table(str(images_path(metadata)), columns=["well", "field", "objects"])
    counts = pc_list_lengths(table.column("objects"))
    cells = table.column("objects").combine_chunks().flatten()
    values = dict(zip([f.name for f in cells.type], cells.flatten(), strict=True))
    return ObjectTable.from_columns(
        well=np.repeat(np.asarray(table.column("well").to_pylist(), dtype=object), counts),
        field=np.repeat(table.column("field").to_numpy(), counts),
        plate=metadata.name,
        centroid_y=values["centroid_y"].to_numpy(),
        centroid_x=values["centroid_x"].to_numpy(),
        bbox=np.stack([values[n].to_numpy() for n in _OBJECT_FIELDS[3:]], axis=1),
        object_id=values["object_id"].to_numpy(),
    )


def pc_list_lengths(column: pa.ChunkedArray) -> np.ndarray:
    import pyarrow.compute as pc

    return np.asarray(pc.list_value_length(column).to_numpy(zero_copy_only=False), dtype=np.int64)
