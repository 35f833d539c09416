"""HDF5 through h5py: one chunked dataset of crops (one chunk per crop) and the object table beside it.

``crops.h5`` holds ``/crops`` (N, C, H, W) uint16, chunked one crop per chunk and uncompressed, so
item ``i`` is one chunk read, and ``/objects/<column>`` one dataset per metadata column. h5py has
no loader of its own: users wrap the file in a torch Dataset opened once per process (an h5py file
handle does not survive a fork) and shuffle with the DataLoader's sampler, which is what
:class:`Hdf5CropDataset` and :meth:`Hdf5Format.epoch_loader` do.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from cropbench.data.dataset import CropDataset
from cropbench.data.training.base import (
    FLOAT_COLUMNS,
    INTEGER_COLUMNS,
    STRING_COLUMNS,
    CropStoreInfo,
    CutBatch,
    EpochSpec,
    TrainingFormat,
    sample,
)
from cropbench.errors import StoreError

FILE_NAME = "crops.h5"
CROPS = "crops"
OBJECTS = "objects"


class Hdf5Format(TrainingFormat):
    """HDF5 (h5py): one file; ``shard_bytes`` does not apply (one chunk per crop)."""

    name = "hdf5"
    library = "h5py"
    module = "h5py"
    versions = ("3.8", "4")
    remote = "h5py reads local files (its ros3 driver for S3 is not measured here)"

    def _write(self, folder: Path, batches: Iterator[CutBatch], dataset: CropDataset, shard_bytes: int) -> None:
        import h5py

        shape = (len(dataset.channel_indices), dataset.config.crop_size, dataset.config.crop_size)
        columns: dict[str, list[np.ndarray]] = {name: [] for name in (*INTEGER_COLUMNS, *FLOAT_COLUMNS)}
        wells: list[str] = []
        # No chunk cache: every write is whole chunks, and a dirty cached chunk that cannot be flushed
        # (a full disk) crashes h5py when the file closes.
        with h5py.File(folder / FILE_NAME, "w", rdcc_nbytes=0) as handle:
            crops = handle.create_dataset(CROPS, shape=(len(dataset), *shape), dtype="<u2", chunks=(1, *shape))
            for batch in batches:
                start = int(batch.columns["index"][0])
                crops[start : start + len(batch)] = batch.images
                for name in columns:
                    columns[name].append(np.asarray(batch.columns[name]))
                wells.extend(str(well) for well in batch.columns["well"])
            group = handle.create_group(OBJECTS)
            for name, parts in columns.items():
                group.create_dataset(name, data=np.concatenate(parts))
            group.create_dataset("well", data=np.array(wells, dtype=object), dtype=h5py.string_dtype())
            handle.attrs["plate_name"] = dataset.plate_name

    def index_files(self, info: CropStoreInfo) -> list[str]:
        return [FILE_NAME]

    def _map_dataset(self, path: Path, info: CropStoreInfo) -> Hdf5CropDataset:
        return Hdf5CropDataset(path / FILE_NAME, info)

    def _epoch_loader(self, path: Path, info: CropStoreInfo, spec: EpochSpec) -> Iterable[dict[str, Any]]:
        return DataLoader(
            self._map_dataset(path, info),
            batch_size=spec.batch_size,
            shuffle=spec.shuffle,
            num_workers=spec.workers,
            generator=torch.Generator().manual_seed(spec.seed),
        )


class Hdf5CropDataset(Dataset[dict[str, Any]]):
    """Crops of an HDF5 crop store by index; the file is opened once per process, on first read."""

    def __init__(self, path: Path, info: CropStoreInfo) -> None:
        import h5py

        self.path, self.plate_name = path, info.plate_name
        count = info.count
        try:
            with h5py.File(path, "r") as handle:
                crops = handle[CROPS]
                # Shapes are checked against the manifest before anything is allocated: a file declaring
                # more than it holds is refused, not read into memory.
                if crops.shape != (count, *info.shape) or crops.dtype != np.uint16:
                    raise StoreError(
                        f"{path}: /{CROPS} is {crops.dtype} {crops.shape}, expected uint16 {(count, *info.shape)}"
                    )
                group = handle[OBJECTS]
                for name in (*INTEGER_COLUMNS, *FLOAT_COLUMNS, *STRING_COLUMNS):
                    if group[name].shape != (count,):
                        raise StoreError(
                            f"{path}: /{OBJECTS}/{name} has shape {group[name].shape}, expected ({count},)"
                        )
                self.columns = {name: group[name][()] for name in (*INTEGER_COLUMNS, *FLOAT_COLUMNS)}
                self.columns["well"] = group["well"].asstr()[()]
        except (OSError, KeyError, TypeError, ValueError, AttributeError) as error:
            raise StoreError(f"cannot read HDF5 crop store {path}: {error}") from error
        self._handle: Any = None
        self._pid = -1

    def __len__(self) -> int:
        return len(self.columns["index"])

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_handle": None, "_pid": -1}

    def _crops(self) -> Any:
        if self._handle is None or self._pid != os.getpid():
            import h5py

            self._handle, self._pid = h5py.File(self.path, "r"), os.getpid()
        return self._handle[CROPS]

    def __getitem__(self, index: int) -> dict[str, Any]:
        index = int(index)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} outside a crop store of {len(self)} crops")
        try:
            image = self._crops()[index]
        except OSError as error:
            raise StoreError(f"cannot read crop {index} of {self.path}: {error}") from error
        row = {name: self.columns[name][index] for name in (*INTEGER_COLUMNS, *FLOAT_COLUMNS, *STRING_COLUMNS)}
        return sample(image, row, self.plate_name)
