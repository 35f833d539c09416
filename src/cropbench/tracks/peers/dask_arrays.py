"""The dask peer: ``dask.array.from_zarr`` per field, sliced and computed per crop as spatialdata does it,
and the scheduler dask may use in this process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import get_worker_info

from cropbench import metrics as m
from cropbench.tracks.peers.base import CropWindows, PeerDataset


def dask_scheduler(default: str | None = None) -> str | None:
    """dask's scheduler for this process: synchronous inside DataLoader workers, else ``default``.

    A forked worker inherits dask's thread pool without its threads; a threaded ``compute`` there
    waits forever (the deadlock spatialdata users meet with ``num_workers > 0``).
    """
    return "synchronous" if get_worker_info() is not None else default


class DaskPerCrop(PeerDataset):
    """``dask.array.from_zarr`` per field (once), then slice and ``compute`` per crop, as spatialdata does."""

    name = "dask-per-crop"
    description = "dask.array.from_zarr per field, slice + compute per crop"
    extra = "dask"
    install_hint = ".venv/bin/pip install -e '.[dask]'"
    modules = ("dask", "dask.array", "zarr")

    def __init__(self, windows: CropWindows, work_dir: Path | None = None, scheduler: str | None = None) -> None:
        super().__init__(windows, work_dir)
        self.scheduler = scheduler
        self._arrays: dict[int, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_arrays": {}}

    def _array(self, field: int) -> Any:
        array = self._arrays.get(field)
        if array is None:
            import dask.array as da

            array = da.from_zarr(str(self.windows.array_paths[field]))
            array = self._arrays[field] = array[self.windows.prefix(array.ndim)]
        return array

    def read_crop(self, index: int) -> np.ndarray:
        field, y0, x0 = self.windows.window(index)
        array = self._array(field)
        scheduler = dask_scheduler(self.scheduler)
        return self.windows.cut(lambda a, b, c, d: array[:, a:b, c:d].compute(scheduler=scheduler), y0, x0)

    def info(self) -> dict[str, Any]:
        return {
            m.DASK_SCHEDULER: self.scheduler or "dask default (threads)",
            m.DASK_SCHEDULER_IN_WORKERS: "synchronous",
        }
