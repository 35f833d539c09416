"""The peers' shared protocol: the Dataset every peer loader is (:class:`PeerDataset`), over the windows
cropbench reads (:class:`~cropbench.harness.windows.CropWindows`)."""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch.utils.data import Dataset

from cropbench.errors import OutputError, PeerUnavailableError
from cropbench.harness.windows import CropWindows


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
