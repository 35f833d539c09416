"""Crops converted once into a training format: what every format shares.

A *crop store* is a folder holding the crops of one plate, cut once by cropbench's own reader
(:func:`cut_crops`: the same objects, windows, channels and uint16 pixels as
:class:`~cropbench.data.dataset.CropDataset` with ``tier="none"``, ``dtype="uint16"``), written by
one library in its own layout, plus ``cropbench_crops.json`` (:class:`CropStoreInfo`): what was
cut, which library and version wrote it, and the size of every file. That manifest is written
last, and the folder is written beside its destination and renamed into place when complete
(:func:`cropbench.plates.destination.staged`), so a folder without it is never taken for a crop
store; opening checks every file against it, so a truncated shard or a missing index is one clear
error before any library reads it.

Each format (:class:`TrainingFormat`) reads its store back through its library's own Dataset,
as a user of that library would, and delivers cropbench's sample dicts (:func:`sample`): item
``i`` of a store equals item ``i`` of the ``CropDataset`` it was cut from.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import importlib
import importlib.metadata
import json
import math
import os
import re
import shutil
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, cast

import numpy as np
import torch
from torch.utils.data import Dataset

from cropbench.config import CropConfig, check_workers
from cropbench.data.dataset import CropDataset
from cropbench.errors import ConfigError, CropbenchError, StoreError
from cropbench.objects import ObjectTable
from cropbench.plates.destination import staged

#: The manifest of a crop store, written last.
MANIFEST_NAME = "cropbench_crops.json"
#: Version of the manifest's layout; a store written with another is refused.
MANIFEST_VERSION = 1
#: Per-crop metadata columns every store keeps, as :meth:`CropDataset.metadata_of` names them.
INTEGER_COLUMNS = ("object_id", "field", "field_index", "crop_y0", "crop_x0", "index")
FLOAT_COLUMNS = ("centroid_y", "centroid_x")
STRING_COLUMNS = ("well",)
#: Crops cut per reader call while converting.
CUT_BATCH = 64


class FormatUnavailableError(CropbenchError):
    """A training format cannot be used here: its library is missing or of a version it was not tested with."""


@dataclass(frozen=True)
class CutBatch:
    """Crops cut from the plate: ``images`` (B, C, H, W) uint16 and one array per metadata column."""

    images: np.ndarray
    columns: Mapping[str, np.ndarray]

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def row(self, position: int) -> dict[str, Any]:
        """Metadata of one crop as plain Python values (JSON-ready)."""
        row: dict[str, Any] = {name: int(self.columns[name][position]) for name in INTEGER_COLUMNS}
        row.update({name: float(self.columns[name][position]) for name in FLOAT_COLUMNS})
        row.update({name: str(self.columns[name][position]) for name in STRING_COLUMNS})
        return row


@dataclass(frozen=True)
class EpochSpec:
    """How an epoch is loaded: the DataLoader's batch size and workers, the library's shuffle and its seed."""

    batch_size: int = 64
    workers: int = 0
    shuffle: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ConfigError(f"batch_size must be a whole number >= 1, got {self.batch_size!r}")
        check_workers(self.workers)


@dataclass(frozen=True)
class S3Access:
    """An S3-compatible endpoint and the credentials a library's client is given for it."""

    endpoint: str
    access_key: str
    secret_key: str
    region: str


@dataclass(frozen=True)
class CropStoreInfo:
    """The manifest of a crop store: what was cut, how it was written, and every file's size."""

    format: str
    library: str
    library_version: str
    plate: str
    plate_name: str
    crop_size: int
    channel_names: tuple[str, ...]
    count: int
    dtype: str
    border: str
    shard_bytes: int
    files: Mapping[str, int]
    manifest_version: int = MANIFEST_VERSION

    @property
    def shape(self) -> tuple[int, int, int]:
        return (len(self.channel_names), self.crop_size, self.crop_size)

    @property
    def stored_bytes(self) -> int:
        return sum(self.files.values())

    def write(self, folder: Path) -> None:
        document = dataclasses.asdict(self)
        (folder / MANIFEST_NAME).write_text(json.dumps(document, indent=1, sort_keys=True))

    @classmethod
    def read(cls, folder: str | Path) -> CropStoreInfo:
        """The manifest of the store at ``folder``, or a StoreError saying why it is not a complete store."""
        path = Path(folder) / MANIFEST_NAME
        if not Path(folder).is_dir():
            raise StoreError(f"crop store {folder} does not exist (convert the plate first)")
        if not path.is_file():
            raise StoreError(
                f"{folder} is not a complete crop store: {MANIFEST_NAME} is missing (it is written last; "
                "convert the plate again)"
            )
        try:
            document = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise StoreError(f"cannot read {path}: {error}") from error
        except RecursionError:
            raise StoreError(f"cannot read {path}: its JSON is nested too deep to be a manifest") from None
        if not isinstance(document, dict) or document.get("manifest_version") != MANIFEST_VERSION:
            found = document.get("manifest_version") if isinstance(document, dict) else document
            raise StoreError(
                f"{path} has manifest_version {found!r}; this cropbench reads {MANIFEST_VERSION} (convert again)"
            )
        files = document.get("files")
        if not isinstance(files, dict) or not all(
            isinstance(name, str) and _inside(name) and isinstance(size, int) and size >= 0
            for name, size in files.items()
        ):
            raise StoreError(f"{path}: 'files' must map relative paths inside the store to sizes in bytes")
        known = {f.name for f in dataclasses.fields(cls)}
        wrong = [name for name, kind in _MANIFEST_TYPES.items() if not _is(document.get(name), kind)]
        if wrong or not all(isinstance(name, str) for name in document.get("channel_names", ())):
            raise StoreError(
                f"{path} is not a crop store manifest: {', '.join(wrong) or 'channel_names'} missing or mistyped"
            )
        if document["crop_size"] < 1 or document["count"] < 0 or document["shard_bytes"] < 1:
            raise StoreError(f"{path} is not a crop store manifest: crop_size, count or shard_bytes out of range")
        document["channel_names"] = tuple(document["channel_names"])
        return cls(**{key: value for key, value in document.items() if key in known})

    def check_files(self, folder: Path) -> None:
        """Every file the writer left is there with the size it had: a truncated shard or a missing
        index fails here, naming the file, before any library reads it."""
        for name, size in sorted(self.files.items()):
            path = folder / name
            if not path.is_file():
                raise StoreError(f"crop store {folder}: {name} is missing (the {self.format} store is incomplete)")
            found = path.stat().st_size
            if found != size:
                raise StoreError(
                    f"crop store {folder}: {name} holds {found} bytes, {size} were written (truncated or "
                    "changed; convert the plate again)"
                )


#: The manifest's fields by the JSON type each must have (``int``: a whole number, not a bool).
_MANIFEST_TYPES: dict[str, type] = {
    "format": str,
    "library": str,
    "library_version": str,
    "plate": str,
    "plate_name": str,
    "crop_size": int,
    "channel_names": list,
    "count": int,
    "dtype": str,
    "border": str,
    "shard_bytes": int,
}


def _is(value: Any, kind: type) -> bool:
    return isinstance(value, kind) and not (kind is int and isinstance(value, bool))


def _inside(name: str) -> bool:
    """Whether a manifest's file name stays inside its store (relative, no ``..``)."""
    parts = Path(name).parts
    return bool(parts) and not Path(name).is_absolute() and ".." not in parts


def sample(image: np.ndarray | torch.Tensor, row: Mapping[str, Any], plate_name: str) -> dict[str, Any]:
    """A crop and its metadata as :meth:`CropDataset.__getitem__` delivers it (tier none, uint16)."""
    tensor = image if isinstance(image, torch.Tensor) else torch.from_numpy(np.array(image, dtype=np.uint16))
    return {
        "image": tensor,
        "object_id": int(row["object_id"]),
        "plate": plate_name,
        "well": str(row["well"]),
        "field": int(row["field"]),
        "field_index": int(row["field_index"]),
        "centroid_y": float(row["centroid_y"]),
        "centroid_x": float(row["centroid_x"]),
        "crop_y0": int(row["crop_y0"]),
        "crop_x0": int(row["crop_x0"]),
        "index": int(row["index"]),
    }


def crop_dataset(
    plate: str | Path, crop_size: int, channels: tuple[str, ...] | None, objects: ObjectTable | str | Path | None
) -> CropDataset:
    """The dataset a store is cut from and compared with: raw uint16 crops, no transform."""
    config = CropConfig(crop_size=crop_size, channels=channels, dtype="uint16", tier="none")
    return CropDataset(plate, config, objects=objects)


def cut_crops(dataset: CropDataset, batch: int = CUT_BATCH) -> Iterator[CutBatch]:
    """Every crop of ``dataset`` in index order, ``batch`` at a time, through the dataset's reader."""
    for start in range(0, len(dataset), batch):
        indices = np.arange(start, min(start + batch, len(dataset)), dtype=np.int64)
        images = dataset.read_raw_batch(indices)
        columns = {
            name: values.numpy() if isinstance(values, torch.Tensor) else np.asarray(values, dtype=object)
            for name, values in dataset.metadata_columns(indices).items()
            if name != "labels"
        }
        yield CutBatch(images, columns)


def file_sizes(folder: Path) -> dict[str, int]:
    """Bytes of every file under ``folder`` by relative path (the manifest excepted)."""
    return {
        path.relative_to(folder).as_posix(): path.stat().st_size
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != MANIFEST_NAME
    }


def not_a_store(path: Path) -> str | None:
    """Why ``path`` may not be replaced by a new crop store (None when it may): only a complete store
    cropbench wrote, whose manifest names exactly the files there with their sizes, is replaced, so a
    user's folder holding a stray or hand-made ``cropbench_crops.json`` is never deleted."""
    if path.is_symlink() or not path.is_dir() or not (path / MANIFEST_NAME).is_file():
        return "it is not a crop store cropbench wrote"
    try:
        info = CropStoreInfo.read(path)
        info.check_files(path)
    except StoreError as error:
        return f"it is not a complete crop store cropbench wrote ({error})"
    extra = sorted(set(file_sizes(path)) - set(info.files))
    if extra:
        return f"it holds files its crop store manifest does not name ({', '.join(extra[:3])})"
    return None


#: The largest shard or chunk a format is asked for: MDS and litdata index a shard's samples with 32-bit offsets.
MAX_SHARD_BYTES = 2**32 - 1


def check_shard_bytes(shard_bytes: int) -> None:
    """A shard or chunk size every format can write: a whole number of bytes from 1 to :data:`MAX_SHARD_BYTES`."""
    if isinstance(shard_bytes, bool) or not isinstance(shard_bytes, int) or not 1 <= shard_bytes <= MAX_SHARD_BYTES:
        raise ConfigError(
            f"shard_bytes must be a whole number from 1 to {MAX_SHARD_BYTES} (4 GiB), got {shard_bytes!r}"
        )


def needed_bytes(count: int, shape: tuple[int, ...]) -> int:
    """Bytes a store of ``count`` uint16 crops of ``shape`` holds at least (every format stores them raw)."""
    return count * math.prod(shape) * np.dtype(np.uint16).itemsize


def check_free_space(folder: Path, needed: int, what: str) -> None:
    """Refuse a write the disk under ``folder`` cannot hold, before the library starts it: a library
    that meets a full disk mid-write may not recover (h5py can crash the process on close)."""
    existing = next(path for path in (folder, *folder.parents) if path.exists())
    free = shutil.disk_usage(existing).free
    if needed > free:
        raise StoreError(
            f"{what}: [Errno {errno.ENOSPC}] No space left on device: about {needed / 2**20:.1f} MiB needed, "
            f"{free / 2**20:.1f} MiB free under {folder}"
        )


def write_failure(what: str, error: BaseException) -> StoreError:
    """A library's error while writing as one line; a full disk says so however the library words it."""
    text = str(error).strip()
    first = text.splitlines()[0][:300] if text else type(error).__name__
    if getattr(error, "errno", None) == errno.ENOSPC or os.strerror(errno.ENOSPC) in text:
        full = f"[Errno {errno.ENOSPC}] {os.strerror(errno.ENOSPC)}"
        return StoreError(f"{what}: {first if first.startswith(full[:10]) else f'{full} ({first})'}")
    return StoreError(f"{what}: {first}")


def read_failure(store: Path, files: Iterable[str], error: BaseException, reading: str) -> StoreError:
    """A library's error while reading a crop store as one StoreError naming the store and, where the
    library's message names one (or only one file can be at fault), the damaged file."""
    text = " ".join(str(part) for part in (error, *getattr(error, "args", ()), error.__cause__, error.__context__))
    names = sorted(files, key=len, reverse=True)
    named = next((name for name in names if Path(name).name in text), names[0] if len(names) == 1 else None)
    first = next((line for line in str(error).strip().splitlines() if line.strip()), "")
    where = f"{store / named}" if named else f"crop store {store} (the library does not say which file)"
    return StoreError(f"cannot read {reading} of {where}: {type(error).__name__}: {first[:300]}")


class CheckedDataset(Dataset[dict[str, Any]]):
    """A library's map-style Dataset whose read errors become one StoreError naming the file."""

    def __init__(self, dataset: Any, store: Path, files: Iterable[str]) -> None:
        self.dataset, self.store, self.files = dataset, store, tuple(files)
        self.length = len(dataset)  # some libraries read their index only here: an error while opening

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Any]:
        index = int(index)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} outside a crop store of {len(self)} crops")
        try:
            return cast(dict[str, Any], self.dataset[index])
        except CropbenchError:
            raise
        except Exception as error:  # whatever the library raises on a damaged file
            raise read_failure(self.store, self.files, error, f"crop {index}") from error


class CheckedLoader:
    """A library's loader whose read errors, in this process or a worker, become one StoreError."""

    def __init__(self, loader: Iterable[dict[str, Any]], store: Path, files: Iterable[str]) -> None:
        self.loader, self.store, self.files = loader, store, tuple(files)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        try:
            yield from self.loader
        except CropbenchError:
            raise
        except Exception as error:
            raise read_failure(self.store, self.files, error, "an epoch") from error


class TrainingFormat(ABC):
    """One training format: its library, a writer of cut crops, and readers through the library's Datasets."""

    name: ClassVar[str]
    #: The distribution that provides the library, and the module imported.
    library: ClassVar[str]
    module: ClassVar[str]
    #: Versions of the library this format was written and tested with: [lowest, below).
    versions: ClassVar[tuple[str, str]]
    #: Whether the library's Dataset reads one crop by index (random access), not only in its own order.
    random_access: ClassVar[bool] = True
    #: Why the format is not read from an object store here (None: :meth:`remote_epoch_loader` does).
    remote: ClassVar[str | None] = "not read from an object store here"

    @classmethod
    def install_hint(cls) -> str:
        lowest, below = cls.versions
        return f"scripts/setup_formats.sh installs it (or: .venv/bin/pip install '{cls.library}>={lowest},<{below}')"

    @classmethod
    def library_version(cls) -> str:
        """The installed library's version; FormatUnavailableError when it is missing or outside ``versions``."""
        try:
            importlib.import_module(cls.module)
            version = importlib.metadata.version(cls.library)
        except ImportError as error:
            raise FormatUnavailableError(
                f"format {cls.name!r} needs {cls.library}, which cannot be imported ({error}); {cls.install_hint()}"
            ) from error
        lowest, below = cls.versions
        if not _version_key(lowest) <= _version_key(version) < _version_key(below):
            raise FormatUnavailableError(
                f"format {cls.name!r} needs {cls.library}>={lowest},<{below}; {version} is installed; "
                f"{cls.install_hint()}"
            )
        return version

    @classmethod
    def available(cls) -> str | None:
        """None when the format can run here, else why not (with the install command)."""
        try:
            cls.library_version()
        except FormatUnavailableError as error:
            return str(error)
        return None

    def write(
        self, dataset: CropDataset, destination: str | Path, *, shard_bytes: int, overwrite: bool = False
    ) -> CropStoreInfo:
        """Cut every crop of ``dataset`` once and write them at ``destination``; returns the manifest."""
        version = self.library_version()
        check_shard_bytes(shard_bytes)
        destination = Path(destination)
        # Written beside the destination, renamed into place when complete; only a crop store is replaced.
        with staged(destination, overwrite, refuse=not_a_store) as folder:
            what = f"{self.name}: cannot write crops to {destination}"
            shape = (len(dataset.channel_indices), dataset.config.crop_size, dataset.config.crop_size)
            check_free_space(destination.parent, needed_bytes(len(dataset), shape), what)
            try:
                folder.mkdir()
                self._write(folder, cut_crops(dataset), dataset, shard_bytes)
            except CropbenchError:
                raise
            except Exception as error:  # the library's own error types, a full disk among them
                raise write_failure(what, error) from error
            info = CropStoreInfo(
                format=self.name,
                library=self.library,
                library_version=version,
                plate=str(Path(dataset.reader.metadata.path).resolve()),
                plate_name=dataset.plate_name,
                crop_size=dataset.config.crop_size,
                channel_names=dataset.channel_names,
                count=len(dataset),
                dtype="uint16",
                border=dataset.config.border,
                shard_bytes=shard_bytes,
                files=file_sizes(folder),
            )
            info.write(folder)
        return info

    def open(self, path: str | Path) -> CropStoreInfo:
        """The manifest of a store of this format, every file checked; the library's version checked."""
        self.library_version()
        folder = Path(path)
        info = CropStoreInfo.read(folder)
        if info.format != self.name:
            raise StoreError(f"crop store {folder} holds format {info.format!r}, not {self.name!r}")
        info.check_files(folder)
        declared = needed_bytes(info.count, info.shape)
        if declared > info.stored_bytes:  # crops are stored raw: a store cannot hold more than its files
            raise StoreError(
                f"crop store {folder} declares {info.count} crops of {info.shape} ({declared} bytes) but its files "
                f"hold {info.stored_bytes} bytes (a damaged manifest; convert the plate again)"
            )
        return info

    def map_dataset(self, path: str | Path) -> Dataset[dict[str, Any]]:
        """Item ``i`` by index through the library's Dataset (where ``random_access``; else a ConfigError);
        whatever the library raises on a damaged file is a StoreError naming it."""
        if not self.random_access:
            raise ConfigError(f"{self.name} reads its shards in order and has no random access by index")
        info = self.open(path)
        with self._reading(Path(path), info, "the index"):
            return CheckedDataset(self._map_dataset(Path(path), info), Path(path), info.files)

    def epoch_loader(self, path: str | Path, spec: EpochSpec) -> Iterable[dict[str, Any]]:
        """Batches of one epoch as the library's users load them: its Dataset, its shuffling, its loader;
        whatever the library raises on a damaged file is a StoreError naming it."""
        info = self.open(path)
        with self._reading(Path(path), info, "the index"):
            return CheckedLoader(self._epoch_loader(Path(path), info, spec), Path(path), info.files)

    @contextlib.contextmanager
    def _reading(self, store: Path, info: CropStoreInfo, reading: str) -> Iterator[None]:
        try:
            yield
        except CropbenchError:
            raise
        except Exception as error:
            raise read_failure(store, self.index_files(info), error, reading) from error

    def index_files(self, info: CropStoreInfo) -> list[str]:
        """The files a library reads when it opens a store (those at fault when opening fails)."""
        return sorted(info.files)

    @abstractmethod
    def _write(self, folder: Path, batches: Iterator[CutBatch], dataset: CropDataset, shard_bytes: int) -> None:
        """Write the crops into ``folder`` (which exists and is empty)."""

    @abstractmethod
    def _map_dataset(self, path: Path, info: CropStoreInfo) -> Dataset[dict[str, Any]]:
        """The library's Dataset by index over the checked store at ``path``."""

    @abstractmethod
    def _epoch_loader(self, path: Path, info: CropStoreInfo, spec: EpochSpec) -> Iterable[dict[str, Any]]:
        """The library's loader of one epoch over the checked store at ``path``."""

    def remote_environment(self, s3: S3Access) -> dict[str, str]:
        """Environment variables the library's S3 client reads (set around the remote epochs, workers included)."""
        return {}

    def remote_epoch_loader(
        self, url: str, cache: Path, s3: S3Access, plate_name: str, spec: EpochSpec
    ) -> Iterable[dict[str, Any]]:
        """Batches of one epoch of the store uploaded at ``url`` (``s3://bucket/prefix``), the library
        downloading into ``cache`` as its users let it; only where ``remote`` is None."""
        raise FormatUnavailableError(f"format {self.name!r}: {self.remote}")

    def remote_failure(self, error: BaseException) -> str:
        """Why the remote epochs failed, in one line: the library's error as it first words it."""
        lines = str(error).strip().splitlines()
        return f"{self.library} over the loopback store: {lines[0] if lines else repr(error)}"


def _version_key(version: str) -> tuple[int, ...]:
    """A release version as numbers (``0.2.76`` → (0, 2, 76)); a pre-release or local part ends it."""
    match = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()
