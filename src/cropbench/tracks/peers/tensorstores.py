"""Peers that read through tensorstore's ``zarr3`` driver: one read per crop, or a batch of reads at once."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from cropbench import metrics as m
from cropbench.config import DEFAULT_CHUNK_CACHE_BYTES
from cropbench.tracks.peers.base import CropWindows, PeerDataset


class TensorStorePerCrop(PeerDataset):
    """tensorstore's ``zarr3`` driver, one read per crop, every field sharing one cache pool of
    ``cache_bytes`` (cropbench's default decoded-chunk budget unless given)."""

    name = "tensorstore-per-crop"
    description = "tensorstore zarr3, cache pool = the decoded-chunk budget, one read per crop"
    extra = "tensorstore"
    install_hint = ".venv/bin/pip install -e '.[tensorstore]'"
    modules = ("tensorstore",)

    def __init__(self, windows: CropWindows, work_dir: Path | None = None, cache_bytes: int | None = None) -> None:
        super().__init__(windows, work_dir)
        self.cache_bytes = DEFAULT_CHUNK_CACHE_BYTES if cache_bytes is None else cache_bytes
        self._arrays: dict[int, Any] = {}
        self._context: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_arrays": {}, "_context": None}

    def _array(self, field: int) -> Any:
        array = self._arrays.get(field)
        if array is None:
            import tensorstore as ts

            if self._context is None:
                self._context = ts.Context({"cache_pool": {"total_bytes_limit": self.cache_bytes}})
            spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(self.windows.array_paths[field])}}
            array = ts.open(spec, context=self._context, read=True).result()
            array = self._arrays[field] = array[self.windows.prefix(array.ndim)]
        return array

    def read_crop(self, index: int) -> np.ndarray:
        field, y0, x0 = self.windows.window(index)
        array = self._array(field)
        return self.windows.cut(lambda a, b, c, d: array[:, a:b, c:d].read().result(), y0, x0)

    def info(self) -> dict[str, Any]:
        return {m.CACHE_POOL_BYTES: self.cache_bytes}


class TensorStoreBatched(TensorStorePerCrop):
    """tensorstore with a whole batch of reads in flight (``ts.Batch``), then gathered into one
    (B, C, H, W) array: its best batched configuration."""

    name = "tensorstore-batched"
    description = "tensorstore zarr3, cache pool = the decoded-chunk budget, a batch of reads in one ts.Batch"
    #: Indices per call when a side-by-side run measures it (``__getitems__``).
    batch_size: ClassVar[int] = 64

    def __getitems__(self, indices: Sequence[int]) -> dict[str, Any]:
        import tensorstore as ts

        channels, height, width = self.windows.field_shape
        size = self.windows.size
        out = np.zeros((len(indices), channels, size, size), dtype=self.windows.dtype)
        pending = []
        with ts.Batch() as batch:
            for slot, index in enumerate(indices):
                field, y0, x0 = self.windows.window(int(index))
                cy0, cx0, cy1, cx1 = max(y0, 0), max(x0, 0), min(y0 + size, height), min(x0 + size, width)
                future = self._array(field)[:, cy0:cy1, cx0:cx1].read(batch=batch)
                pending.append((slot, cy0 - y0, cy1 - y0, cx0 - x0, cx1 - x0, future))
        for slot, top, bottom, left, right, future in pending:
            out[slot, :, top:bottom, left:right] = future.result()
        return {"image": torch.from_numpy(out), "index": torch.as_tensor(np.asarray(indices, dtype=np.int64))}
