"""MosaicML streaming's MDS: shards of at most ``shard_bytes`` and an ``index.json``.

Written with ``streaming.MDSWriter`` (the image as a fixed-shape ``ndarray:uint16`` column, the
metadata as a ``json`` column, no compression) and read with ``streaming.StreamingDataset``
(``local=`` the store, no remote): random access by index, and for epochs its own partitioned
shuffle (``py1e``) inside torch's DataLoader, with the DataLoader's batch size given to the dataset
as MosaicML asks. The dataset subclass (:mod:`cropbench.data.training.mds_dataset`) turns each
item into cropbench's sample dict.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, cast

from torch.utils.data import DataLoader, Dataset

from cropbench.data.dataset import CropDataset
from cropbench.data.training.base import CropStoreInfo, CutBatch, EpochSpec, S3Access, TrainingFormat

INDEX_NAME = "index.json"
#: What mosaicml-streaming imports, installed beside it (it is installed without its dependencies).
MDS_IMPORTS = ("transformers<5", "xxhash", "zstd", "catalogue", "brotli", "python-snappy")


class MdsFormat(TrainingFormat):
    """MosaicML streaming (MDS) shards, read through ``streaming.StreamingDataset``."""

    name = "mds"
    library = "mosaicml-streaming"
    module = "streaming"
    versions = ("0.11", "0.14")

    @classmethod
    def install_hint(cls) -> str:
        # The package pins numpy<2.2 and xxhash<4; installed without its dependencies it keeps the tested numpy.
        lowest, below = cls.versions
        return (
            f"scripts/setup_formats.sh installs it (or: .venv/bin/pip install --no-deps '{cls.library}>={lowest},"
            f"<{below}' && .venv/bin/pip install {' '.join(repr(name) for name in MDS_IMPORTS)})"
        )

    def _write(self, folder: Path, batches: Iterator[CutBatch], dataset: CropDataset, shard_bytes: int) -> None:
        from streaming import MDSWriter

        shape = ",".join(str(n) for n in (len(dataset.channel_indices), *(dataset.config.crop_size,) * 2))
        columns = {"image": f"ndarray:uint16:{shape}", "meta": "json"}
        with MDSWriter(out=str(folder), columns=columns, compression=None, size_limit=shard_bytes) as writer:
            for batch in batches:
                for position in range(len(batch)):
                    writer.write({"image": batch.images[position], "meta": batch.row(position)})

    def index_files(self, info: CropStoreInfo) -> list[str]:
        return [INDEX_NAME]

    def _dataset(
        self, path: Path, info: CropStoreInfo, *, shuffle: bool = False, seed: int = 0, batch_size: int = 1
    ) -> Any:
        from streaming.base.util import clean_stale_shared_memory

        from cropbench.data.training.mds_dataset import MdsCrops

        clean_stale_shared_memory()  # shared memory left by a dataset of an earlier process
        return MdsCrops(
            local=str(path.resolve()),
            plate_name=info.plate_name,
            shuffle=shuffle,
            shuffle_seed=seed,
            batch_size=batch_size,
        )

    remote = None

    def _map_dataset(self, path: Path, info: CropStoreInfo) -> Dataset[dict[str, Any]]:
        return cast(Dataset[dict[str, Any]], self._dataset(path, info))

    def _epoch_loader(self, path: Path, info: CropStoreInfo, spec: EpochSpec) -> Iterable[dict[str, Any]]:
        dataset = self._dataset(path, info, shuffle=spec.shuffle, seed=spec.seed, batch_size=spec.batch_size)
        return DataLoader(dataset, batch_size=spec.batch_size, num_workers=spec.workers)

    def remote_environment(self, s3: S3Access) -> dict[str, str]:
        # MosaicML's S3 client takes a custom endpoint from S3_ENDPOINT_URL, credentials from the AWS variables.
        return {
            "S3_ENDPOINT_URL": s3.endpoint,
            "AWS_ACCESS_KEY_ID": s3.access_key,
            "AWS_SECRET_ACCESS_KEY": s3.secret_key,
            "AWS_REGION": s3.region,
        }

    def remote_epoch_loader(
        self, url: str, cache: Path, s3: S3Access, plate_name: str, spec: EpochSpec
    ) -> Iterable[dict[str, Any]]:
        """MDS shards streamed from ``url`` into ``cache`` (``remote=``, ``local=``)."""
        from streaming.base.util import clean_stale_shared_memory

        from cropbench.data.training.mds_dataset import MdsCrops

        clean_stale_shared_memory()
        dataset = MdsCrops(
            remote=url,
            local=str(cache),
            plate_name=plate_name,
            shuffle=spec.shuffle,
            shuffle_seed=spec.seed,
            batch_size=spec.batch_size,
        )
        # Workers start by spawn: the S3 client that fetched index.json here keeps its connection open,
        # and forked workers would share that one socket, each reading answers meant for another (shards
        # with another shard's bytes); a pickled dataset leaves its client behind. Not forkserver: its
        # server keeps the environment it started with, before the store's credentials were set.
        context = "spawn" if spec.workers else None
        return DataLoader(
            dataset, batch_size=spec.batch_size, num_workers=spec.workers, multiprocessing_context=context
        )
