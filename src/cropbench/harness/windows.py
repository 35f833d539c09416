"""The crops cropbench delivers as plain arrays, so a peer loader or a ceiling reads exactly the same windows."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cropbench.data.dataset import CropDataset
from cropbench.errors import ConfigError


@dataclass(frozen=True, eq=False)
class CropWindows:
    """The crops cropbench delivers, as plain arrays: which field, and the window's top-left corner.

    Built from a :class:`CropDataset` so every peer reads exactly the windows cropbench reads.
    """

    plate: Path
    array_paths: tuple[Path, ...]
    field_shape: tuple[int, int, int]
    dtype: str
    layout: str
    channel_names: tuple[str, ...]
    channel_axis: int | None
    size: int
    field_index: np.ndarray
    window_y0: np.ndarray
    window_x0: np.ndarray

    @classmethod
    def from_dataset(cls, dataset: CropDataset) -> CropWindows:
        metadata = dataset.reader.metadata
        if dataset.channel_indices != tuple(range(len(metadata.channel_names))):
            raise ConfigError(f"peers read all channels; the dataset selects {dataset.channel_names}")
        if dataset.config.border != "pad":
            raise ConfigError(f"peers cut border='pad' windows; the dataset uses border={dataset.config.border!r}")
        channel_axis = metadata.channel_axis
        return cls(
            plate=Path(metadata.path),
            array_paths=tuple(Path(metadata.path) / info.path for info in metadata.fields),
            field_shape=metadata.field_shape,
            dtype=metadata.dtype,
            layout=metadata.format,
            channel_names=metadata.channel_names,
            channel_axis=None if channel_axis is None else int(channel_axis),
            size=dataset.config.crop_size,
            field_index=dataset.field_index.copy(),
            window_y0=dataset.window_y0.copy(),
            window_x0=dataset.window_x0.copy(),
        )

    def __len__(self) -> int:
        return len(self.field_index)

    def window(self, index: int) -> tuple[int, int, int]:
        """(field, y0, x0) of object ``index``."""
        return int(self.field_index[index]), int(self.window_y0[index]), int(self.window_x0[index])

    def prefix(self, ndim: int) -> tuple[Any, ...]:
        """Selection of the (c, y, x) volume of a field array with ``ndim`` axes (leading t/z at 0)."""
        channel_axis = ndim - 3 if self.channel_axis is None else self.channel_axis
        selection: list[Any] = [0] * (ndim - 2)
        selection[channel_axis] = slice(None)
        return tuple(selection)

    def cut(self, read: Callable[[int, int, int, int], Any], y0: int, x0: int) -> np.ndarray:
        """The window at (y0, x0) through ``read(y0, y1, x0, x1)``; pixels outside the field are zero."""
        channels, height, width = self.field_shape
        size = self.size
        if y0 >= 0 and x0 >= 0 and y0 + size <= height and x0 + size <= width:
            return np.asarray(read(y0, y0 + size, x0, x0 + size))
        out = np.zeros((channels, size, size), dtype=self.dtype)
        cy0, cx0, cy1, cx1 = max(y0, 0), max(x0, 0), min(y0 + size, height), min(x0 + size, width)
        out[:, cy0 - y0 : cy1 - y0, cx0 - x0 : cx1 - x0] = read(cy0, cy1, cx0, cx1)
        return out

    def cut_array(self, field_pixels: np.ndarray, index: int) -> np.ndarray:
        """The window of object ``index`` cut from its field's (c, y, x) pixels already in memory."""
        _, y0, x0 = self.window(index)
        return self.cut(lambda a, b, c, d: field_pixels[:, a:b, c:d], y0, x0)

    def digest(self) -> str:
        """Identity of the plate and windows, so a table written for them can be reused safely."""
        hasher = hashlib.sha256(f"{self.plate.resolve()}|{self.size}|{self.field_shape}|{self.dtype}".encode())
        for array in (self.field_index, self.window_y0, self.window_x0):
            hasher.update(np.ascontiguousarray(array, dtype=np.int64).tobytes())
        return hasher.hexdigest()[:16]
