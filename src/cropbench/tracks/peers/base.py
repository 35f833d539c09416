"""The peers' shared protocol: the windows cropbench reads (:class:`CropWindows`) and the Dataset
every peer loader is (:class:`PeerDataset`)."""

from __future__ import annotations

import hashlib
import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch.utils.data import Dataset

from cropbench.data.dataset import CropDataset
from cropbench.errors import ConfigError, OutputError, PeerUnavailableError


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


def peers_folder(plate: str | Path) -> Path:
    """Where peers keep the copies of ``plate`` they read (``PLATE.peers`` beside it), reused by later runs."""
    return Path(f"{Path(plate)}.peers")


class PeerDataset(Dataset[dict[str, Any]], ABC):
    """One peer loader over the windows of a :class:`CropWindows`; item ``i`` is cropbench's item ``i``."""

    name: ClassVar[str]
    description: ClassVar[str]
    #: The pip extra that installs what the peer imports (None: cropbench's own dependencies).
    extra: ClassVar[str | None] = None
    #: A command that installs it, run from the repository root.
    install_hint: ClassVar[str] = "bash scripts/setup.sh"
    modules: ClassVar[tuple[str, ...]] = ()
    #: Layouts (storage formats) the peer reads; None means any.
    formats: ClassVar[tuple[str, ...] | None] = ("ome-zarr",)

    def __init__(self, windows: CropWindows, work_dir: Path | None = None) -> None:
        self.check_available(windows)
        self.windows = windows
        self.work_dir = work_dir

    @classmethod
    def check_available(cls, windows: CropWindows) -> None:
        """Raise :class:`PeerUnavailableError` with the reason when the peer cannot run here."""
        if cls.formats is not None and windows.layout not in cls.formats:
            raise PeerUnavailableError(
                f"{cls.name} reads {', '.join(cls.formats)} plates; {windows.plate} is {windows.layout}"
            )
        for module in cls.modules:
            try:
                importlib.import_module(module)
            except ImportError as error:
                raise PeerUnavailableError(f"{module} cannot be imported ({error}); {cls.install_hint}") from error

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        index = int(index)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} outside a peer of {len(self)} objects")
        return {"image": torch.from_numpy(self.read_crop(index)), "index": index}

    @abstractmethod
    def read_crop(self, index: int) -> np.ndarray:
        """The (C, size, size) crop of object ``index`` as the peer reads it."""

    def info(self) -> dict[str, Any]:
        """Extra metrics of the peer for its row (what it did besides delivering crops)."""
        return {}

    def _work_file(self, name: str) -> Path:
        folder = self.work_dir or peers_folder(self.windows.plate)
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise OutputError(f"cannot create the peers work folder {folder}: {error.strerror or error}") from error
        return folder / name
