"""Crops converted once into the training formats labs convert to, read back through each library.

``training_format(name)`` gives one :class:`TrainingFormat`: ``hdf5`` (h5py), ``webdataset``,
``litdata`` and ``mds`` (MosaicML streaming). Each library is an optional extra, imported only
when its format is used; without it (or with a version outside the tested range) the format
raises :class:`FormatUnavailableError` naming the install command.
"""

from __future__ import annotations

from cropbench.data.training.base import (
    MANIFEST_NAME,
    MAX_SHARD_BYTES,
    CropStoreInfo,
    CutBatch,
    EpochSpec,
    FormatUnavailableError,
    S3Access,
    TrainingFormat,
    check_free_space,
    check_shard_bytes,
    crop_dataset,
    cut_crops,
    needed_bytes,
    not_a_store,
    sample,
)
from cropbench.data.training.hdf5_crops import Hdf5Format
from cropbench.data.training.litdata_chunks import LitdataFormat
from cropbench.data.training.mds_shards import MdsFormat
from cropbench.data.training.webdataset_shards import WebDatasetFormat
from cropbench.errors import ConfigError

#: Every training format by name, in the order comparisons measure them.
TRAINING_FORMATS: dict[str, type[TrainingFormat]] = {
    cls.name: cls for cls in (Hdf5Format, WebDatasetFormat, LitdataFormat, MdsFormat)
}


def training_format(name: str) -> TrainingFormat:
    """The format called ``name`` (its library is imported only when it is used)."""
    try:
        return TRAINING_FORMATS[name]()
    except KeyError:
        raise ConfigError(f"format {name!r} is not one of {', '.join(TRAINING_FORMATS)}") from None


__all__ = [
    "MANIFEST_NAME",
    "MAX_SHARD_BYTES",
    "TRAINING_FORMATS",
    "CropStoreInfo",
    "CutBatch",
    "EpochSpec",
    "FormatUnavailableError",
    "S3Access",
    "TrainingFormat",
    "check_free_space",
    "check_shard_bytes",
    "crop_dataset",
    "cut_crops",
    "needed_bytes",
    "sample",
    "not_a_store",
    "training_format",
]
