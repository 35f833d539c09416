"""WebDataset: POSIX tar shards of at most ``shard_bytes``, one ``.npy`` and one ``.json`` member per crop.

Written with ``webdataset.ShardWriter`` (``crops-000000.tar``, ...; the key is the crop's index) and
read as its users read it: ``webdataset.WebDataset`` over the shard list, shards shuffled and split
across DataLoader workers by the library, samples shuffled in a buffer, ``.decode()``, then torch's
DataLoader. WebDataset reads shards front to back and has no random access by index
(``random_access`` is False): Track 1's random reads do not apply to it. From an object store it
reads each shard by URL, ``http(s)://`` through curl (a bucket readable without signing).
"""

from __future__ import annotations

import functools
import json
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader, Dataset

from cropbench.data.dataset import CropDataset
from cropbench.data.training.base import (
    MANIFEST_NAME,
    CropStoreInfo,
    CutBatch,
    EpochSpec,
    S3Access,
    TrainingFormat,
    sample,
)
from cropbench.errors import ConfigError, StoreError

SHARD_PATTERN = "crops-%06d.tar"
#: Samples held in WebDataset's shuffle buffer (per worker).
SHUFFLE_BUFFER = 1000


def _to_sample(item: tuple[Any, dict[str, Any]], plate_name: str) -> dict[str, Any]:
    image, row = item
    return sample(image, row, plate_name)


class WebDatasetFormat(TrainingFormat):
    """WebDataset tar shards, read through ``webdataset.WebDataset``."""

    name = "webdataset"
    library = "webdataset"
    module = "webdataset"
    versions = ("0.2.90", "2")
    random_access = False
    remote = None

    def _write(self, folder: Path, batches: Iterator[CutBatch], dataset: CropDataset, shard_bytes: int) -> None:
        import webdataset

        with webdataset.ShardWriter(
            str(folder / SHARD_PATTERN), maxcount=10**9, maxsize=shard_bytes, verbose=0
        ) as sink:
            for batch in batches:
                for position in range(len(batch)):
                    row = batch.row(position)
                    sink.write({"__key__": f"{row['index']:09d}", "npy": batch.images[position], "json": row})

    def _map_dataset(self, path: Path, info: CropStoreInfo) -> Dataset[dict[str, Any]]:
        raise ConfigError("webdataset reads tar shards in order and has no random access by index")

    def _epoch_loader(self, path: Path, info: CropStoreInfo, spec: EpochSpec) -> Iterable[dict[str, Any]]:
        shards = [str(path.resolve() / name) for name in sorted(info.files) if name.endswith(".tar")]
        return self._loader(shards, info.plate_name, spec)

    def remote_epoch_loader(
        self, url: str, cache: Path, s3: S3Access, plate_name: str, spec: EpochSpec
    ) -> Iterable[dict[str, Any]]:
        """The shards of a bucket readable without signing, by HTTP through curl (WebDataset's own
        ``http://`` handler), downloaded into WebDataset's shard cache; the shard list from the manifest."""
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        base = f"{s3.endpoint.rstrip('/')}/{bucket}/{prefix}"
        try:
            with urllib.request.urlopen(f"{base}/{MANIFEST_NAME}", timeout=60) as response:
                files = json.loads(response.read())["files"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise StoreError(f"cannot read the manifest of {url}: {error}") from error
        urls = [f"{base}/{name}" for name in sorted(files) if name.endswith(".tar")]
        cache.mkdir(parents=True, exist_ok=True)  # WebDataset's shard cache must exist
        return self._loader(urls, plate_name, spec, cache)

    def _loader(
        self, urls: list[str], plate_name: str, spec: EpochSpec, cache: Path | None = None
    ) -> Iterable[dict[str, Any]]:
        import webdataset

        pipeline = webdataset.WebDataset(
            urls,
            shardshuffle=len(urls) if spec.shuffle else False,
            seed=spec.seed,
            empty_check=False,  # more workers than shards leaves some workers without any
            workersplitter=webdataset.split_by_worker,
            **({"cache_dir": str(cache)} if cache is not None else {}),
        )
        if spec.shuffle:
            pipeline = pipeline.shuffle(SHUFFLE_BUFFER)
        # A tuple in, so the library's map does not copy ``__key__`` into cropbench's sample dict.
        dataset = pipeline.decode().to_tuple("npy", "json").map(functools.partial(_to_sample, plate_name=plate_name))
        return DataLoader(dataset, batch_size=spec.batch_size, num_workers=spec.workers)
