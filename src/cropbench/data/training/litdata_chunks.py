"""litdata's optimized format: binary chunks of ``shard_bytes`` and an ``index.json``.

Written with litdata's ``BinaryWriter`` (what ``litdata.optimize`` runs in each of its workers),
one item per crop: the uint16 image and its metadata columns. Read with ``litdata.StreamingDataset``
(random access by index, its own shuffle of chunks and items per epoch) and, for epochs, its
``StreamingDataLoader``; the dataset's ``transform`` turns each item into cropbench's sample dict.

From S3, litdata reads ``index.json`` through boto3 (``storage_options`` give it the endpoint and
keys) and each chunk through obstore. Its obstore store is built with litdata's own fixed client
options (litdata 0.2.76), which replace those obstore would take from the environment, so
``AWS_ALLOW_HTTP=true`` (set here, as a user would) does not reach it and a plain-http endpoint such
as a loopback store is refused: :meth:`LitdataFormat.remote_failure` says so in one line.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from cropbench.data.dataset import CropDataset
from cropbench.data.training.base import CropStoreInfo, CutBatch, EpochSpec, S3Access, TrainingFormat, sample

INDEX_NAME = "index.json"


def _to_sample(item: dict[str, Any], plate_name: str) -> dict[str, Any]:
    return sample(item["image"], item, plate_name)


class LitdataFormat(TrainingFormat):
    """litdata's optimized chunks, read through ``litdata.StreamingDataset``."""

    name = "litdata"
    library = "litdata"
    module = "litdata"
    versions = ("0.2.50", "0.3")

    def _write(self, folder: Path, batches: Iterator[CutBatch], dataset: CropDataset, shard_bytes: int) -> None:
        from litdata.streaming.writer import BinaryWriter

        writer = BinaryWriter(str(folder), chunk_bytes=shard_bytes)
        for batch in batches:
            for position in range(len(batch)):
                row = batch.row(position)
                writer.add_item(row["index"], {"image": batch.images[position], **row})
        writer.done()
        writer.merge()

    def index_files(self, info: CropStoreInfo) -> list[str]:
        return [INDEX_NAME]

    def _dataset(self, path: Path, info: CropStoreInfo, *, shuffle: bool = False, seed: int = 0) -> Any:
        import litdata

        return litdata.StreamingDataset(
            str(path.resolve()),
            shuffle=shuffle,
            seed=seed,
            transform=functools.partial(_to_sample, plate_name=info.plate_name),
        )

    remote = None

    def _map_dataset(self, path: Path, info: CropStoreInfo) -> Dataset[dict[str, Any]]:
        return self._dataset(path, info)

    def _epoch_loader(self, path: Path, info: CropStoreInfo, spec: EpochSpec) -> Iterable[dict[str, Any]]:
        import litdata

        dataset = self._dataset(path, info, shuffle=spec.shuffle, seed=spec.seed)
        return litdata.StreamingDataLoader(dataset, batch_size=spec.batch_size, num_workers=spec.workers)

    def remote_epoch_loader(
        self, url: str, cache: Path, s3: S3Access, plate_name: str, spec: EpochSpec
    ) -> Iterable[dict[str, Any]]:
        """litdata's chunks streamed from ``url`` into ``cache_dir``, the endpoint in ``storage_options``."""
        import litdata

        dataset = litdata.StreamingDataset(
            url,
            cache_dir=str(cache),
            shuffle=spec.shuffle,
            seed=spec.seed,
            transform=functools.partial(_to_sample, plate_name=plate_name),
            storage_options={
                "endpoint_url": s3.endpoint,
                "aws_access_key_id": s3.access_key,
                "aws_secret_access_key": s3.secret_key,
                "region_name": s3.region,
            },
        )
        return litdata.StreamingDataLoader(dataset, batch_size=spec.batch_size, num_workers=spec.workers)

    def remote_environment(self, s3: S3Access) -> dict[str, str]:
        # object_store's setting for a plain-http endpoint; litdata's own client options override it
        # (see the module docstring), so it counts only where litdata leaves obstore its environment.
        return {"AWS_ALLOW_HTTP": "true"} if s3.endpoint.startswith("http://") else {}

    def remote_failure(self, error: BaseException) -> str:
        text = str(error)
        if "BadScheme" in text or "builder error" in text:  # reqwest refusing http:// without allow_http
            return PLAIN_HTTP_REFUSED.format(version=self.library_version())
        return super().remote_failure(error)


#: The remote row's reason where litdata's obstore client refuses a plain-http endpoint.
PLAIN_HTTP_REFUSED = (
    "litdata {version} fetches chunks through obstore with its own client options, which refuse a "
    "plain-http endpoint such as the loopback store's (AWS_ALLOW_HTTP=true does not reach them)"
)
