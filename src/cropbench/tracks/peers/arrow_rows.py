"""Peers that read pixels from Parquet rows as the OME-Arrow reference script does: one row per crop
or per field, nested list columns, ``.as_py()`` and ``np.array``."""

from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from cropbench.formats import open_plate
from cropbench.tracks.peers.base import CropWindows, PeerDataset


def _nested_lists(values: np.ndarray) -> pa.Array:
    """An (n, c, h, w) array as a list<list<list<value>>> column of n rows (no Python objects)."""
    array: pa.Array = pa.array(values.reshape(-1))
    for axis in range(values.ndim - 1, 0, -1):
        step = values.shape[axis]
        count = len(array) // step
        offsets = pa.array(np.arange(count + 1, dtype=np.int64) * step, type=pa.int32())
        array = pa.ListArray.from_arrays(offsets, array)
    return array


class _ArrowRows(PeerDataset):
    """Pixels as nested list columns of a Parquet table, read into memory once, rows via ``.as_py()``."""

    formats = None
    kind: ClassVar[str]
    row_group_size: ClassVar[int]

    def __init__(self, windows: CropWindows, work_dir: Path | None = None) -> None:
        super().__init__(windows, work_dir)
        self.path = self._work_file(f"{self.kind}-{windows.size}px.parquet")
        self.built = self._ensure_table()
        self._pixels: pa.ChunkedArray | None = None
        self.pixels  # noqa: B018 - the reference script reads the table once, before the loop

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pixels": None}

    @property
    def pixels(self) -> pa.ChunkedArray:
        if self._pixels is None:
            self._pixels = pq.read_table(str(self.path), columns=["pixels"], memory_map=True).column("pixels")
        return self._pixels

    def _ensure_table(self) -> bool:
        key = json.dumps({"kind": self.kind, "digest": self.windows.digest()})
        if self.path.is_file():
            try:
                if (pq.read_schema(str(self.path)).metadata or {}).get(b"cropbench_peer") == key.encode():
                    return False
            except (pa.ArrowInvalid, OSError):
                pass
        table = self._build_table().replace_schema_metadata({"cropbench_peer": key})
        partial = self.path.with_suffix(".partial")
        pq.write_table(table, str(partial), row_group_size=self.row_group_size)
        partial.replace(self.path)
        return True

    def _fields(self) -> Iterator[tuple[int, np.ndarray]]:
        """Each field's pixels (c, y, x), read once with cropbench's field path to build the table."""
        reader = open_plate(self.windows.plate, decode="field", field_cache_fields=1)
        try:
            for field in range(len(self.windows.array_paths)):
                yield field, reader.read_field(field)
        finally:
            reader.close()

    @abstractmethod
    def _build_table(self) -> pa.Table: ...


class ArrowCropRows(_ArrowRows):
    """The reference script's crop table: one row per crop, pixels as a (c, y, x) nested list."""

    name = "arrow-crop-rows"
    description = "Parquet, one row per crop, pixels as nested lists, .as_py() + np.array"
    kind = "crops"
    row_group_size = 512

    def _build_table(self) -> pa.Table:
        windows = self.windows
        channels, _, _ = windows.field_shape
        crops = np.zeros((len(windows), channels, windows.size, windows.size), dtype=windows.dtype)
        for field, pixels in self._fields():
            for index in np.flatnonzero(windows.field_index == field).tolist():
                crops[index] = windows.cut_array(pixels, index)
        return pa.table(
            {
                "index": np.arange(len(windows), dtype=np.int64),
                "field_index": windows.field_index,
                "pixels": _nested_lists(crops),
            }
        )

    def read_crop(self, index: int) -> np.ndarray:
        return np.array(self.pixels[index].as_py(), dtype=self.windows.dtype)


class ArrowFieldRows(_ArrowRows):
    """The reference script's field table: one row per field; a crop converts the whole field row."""

    name = "arrow-field-rows"
    description = "Parquet, one row per field, pixels as nested lists, .as_py() + np.array, then crop"
    kind = "fields"
    row_group_size = 1

    def _build_table(self) -> pa.Table:
        fields = np.stack([pixels for _, pixels in self._fields()])
        return pa.table({"field_index": np.arange(len(fields), dtype=np.int64), "pixels": _nested_lists(fields)})

    def read_crop(self, index: int) -> np.ndarray:
        pixels = np.array(self.pixels[int(self.windows.field_index[index])].as_py(), dtype=self.windows.dtype)
        return self.windows.cut_array(pixels, index)
