"""Peers that slice zarr arrays crop by crop: zarr-python opening the field's array per crop or keeping
it open, and the zarrs codec pipeline."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from cropbench.tracks.peers.base import CropWindows, PeerDataset


def _open_zarr(path: Path) -> Any:
    import zarr

    return zarr.open_array(str(path), mode="r")


class ZarrOpenPerCrop(PeerDataset):
    """What a first Dataset often does: open the field's zarr array in ``__getitem__``, slice it."""

    name = "zarr-open-per-crop"
    description = "zarr-python, open the field array on every call, slice"
    modules = ("zarr",)

    def read_crop(self, index: int) -> np.ndarray:
        field, y0, x0 = self.windows.window(index)
        array = _open_zarr(self.windows.array_paths[field])
        prefix = self.windows.prefix(array.ndim)
        return self.windows.cut(lambda a, b, c, d: array[(*prefix, slice(a, b), slice(c, d))], y0, x0)


class ZarrKeptOpen(PeerDataset):
    """Naive zarr-python slicing with each field's array opened once per process and kept."""

    name = "zarr-kept-open"
    description = "zarr-python, field arrays kept open, slice"
    modules: ClassVar[tuple[str, ...]] = ("zarr",)

    def __init__(self, windows: CropWindows, work_dir: Path | None = None) -> None:
        super().__init__(windows, work_dir)
        self._arrays: dict[int, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_arrays": {}}

    def read_crop(self, index: int) -> np.ndarray:
        field, y0, x0 = self.windows.window(index)
        array = self._arrays.get(field)
        if array is None:
            array = self._arrays[field] = _open_zarr(self.windows.array_paths[field])
        prefix = self.windows.prefix(array.ndim)
        return self.windows.cut(lambda a, b, c, d: array[(*prefix, slice(a, b), slice(c, d))], y0, x0)


class ZarrsKeptOpen(ZarrKeptOpen):
    """zarr-python slicing with the zarrs codec pipeline (Rust decode; arrays opened under it, kept)."""

    name = "zarr-zarrs"
    description = "zarr-python with the zarrs codec pipeline, field arrays kept open, slice"
    extra = "zarrs"
    install_hint = ".venv/bin/pip install -e '.[zarrs]'"
    modules = ("zarr", "zarrs")

    def read_crop(self, index: int) -> np.ndarray:
        field = int(self.windows.field_index[index])
        if field not in self._arrays:
            import zarr

            with zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"}):
                self._arrays[field] = _open_zarr(self.windows.array_paths[field])
        return super().read_crop(index)
