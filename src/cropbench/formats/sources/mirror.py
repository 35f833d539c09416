"""Remote plates as local mirrors: a plate's metadata documents and tables downloaded once into a
cache folder with a pointer file naming its URL; the key index that lets HTTP (which cannot list)
find them; uploading a plate; and the byte source a plate folder reads its pixels from."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from cropbench.config import StoreConfig
from cropbench.errors import ConfigError, StoreError
from cropbench.formats.sources.base import ByteSource
from cropbench.formats.sources.files import FileSource
from cropbench.formats.sources.remote import RemoteSource
from cropbench.formats.sources.urls import redact, s3_endpoint, split_url

#: The pointer file of a mirror (mode 0600): the URL and the store settings, credentials masked, and the
#: plate's stored bytes.
REMOTE_POINTER = "cropbench_remote.json"
#: Keys a mirror downloads (metadata and tables); chunk and shard objects stay in the store.
_MIRRORED_SUFFIXES = ("zarr.json", ".zattrs", ".zgroup", ".zarray", ".zmetadata", ".json", ".parquet", ".csv")


def open_source(root: Path, remote: dict[str, Any] | None) -> ByteSource:
    """The byte source of a plate: its files, or (for a mirror) the objects under its URL."""
    if remote is None:
        return FileSource(root)
    return RemoteSource(remote["url"], StoreConfig(**remote["store"]))


def _mirrored(key: str) -> bool:
    parts = key.split("/")
    if "c" in parts[:-1]:  # zarr v3 chunk keys: .../c/0/1/2
        return False
    return parts[-1].endswith(_MIRRORED_SUFFIXES)


def mirror_metadata(url: str, config: StoreConfig | None = None, cache_dir: Path | None = None) -> Path:
    """Download a plate's metadata documents and tables into a cache folder; returns that folder.

    The folder holds a pointer file (:data:`REMOTE_POINTER`) naming the URL and the store settings;
    readers opened on it fetch pixels from the store. HTTP servers cannot list, so an HTTP plate
    needs an index (``cropbench_index.json``, written by :func:`upload_plate` and by
    :func:`write_index`) listing its keys.
    """
    config = config or StoreConfig()
    if url.startswith("s3://") and not config.endpoint:
        # The endpoint this process resolves goes into the pointer file, so readers in worker processes
        # ask the same server even where their environment differs (forkserver workers inherit the
        # environment the server process started with, not this process's current one).
        config = dataclasses.replace(config, endpoint=s3_endpoint(config))
    split_url(url)
    shown = redact(url).rstrip("/")
    root = (cache_dir or default_cache_dir()) / hashlib.sha256(url.encode()).hexdigest()[:16]
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    source = RemoteSource(url, dataclasses.replace(config, retries=min(config.retries, 1)))
    try:
        if url.startswith("s3://"):
            entries = list(source.listing())
        else:
            index = source.get(INDEX_NAME)
            if index is None:
                raise StoreError(
                    f"{shown}/{INDEX_NAME} not found: an HTTP plate needs the key index that "
                    "`cropbench upload` writes (HTTP servers cannot list a folder)"
                )
            entries = _index_entries(index, f"{shown}/{INDEX_NAME}")
        if not entries:
            raise StoreError(f"{shown}: no objects under this prefix (no such plate)")
        targets = {key: _confined(root, key, shown) for key, _ in entries}
        wanted = [key for key, _ in entries if _mirrored(key)]
        for key, data in zip(wanted, source.get_many([(key, 0, -1) for key in wanted]), strict=True):
            if data is None:
                raise StoreError(f"{shown}/{key}: listed but not found")
            target = targets[key]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    finally:
        source.close()
    # Credentials masked: requests never send a URL's user part, and the pointer's URL and endpoint reach rows.
    store = dataclasses.asdict(dataclasses.replace(config, endpoint=redact(config.endpoint)))
    pointer = {"url": redact(url), "store": store, "stored_bytes": sum(size for _, size in entries)}
    with os.fdopen(os.open(root / REMOTE_POINTER, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as file:
        file.write(json.dumps(pointer, indent=1))
    return root


def _index_entries(index: bytes, where: str) -> list[tuple[str, int]]:
    """(key, size) of every object a plate's key index lists; a malformed index is a :class:`StoreError`."""
    try:
        objects = json.loads(index)["objects"]
        entries = [(key, int(size)) for key, size in objects]
        if not all(isinstance(key, str) for key, _ in entries):
            raise TypeError("a key is not a string")
    except (ValueError, KeyError, TypeError) as error:  # JSON, shape, sizes: all the index's fault
        raise StoreError(
            f'{where} is not a key index ({{"objects": [[key, size], ...]}}): {type(error).__name__}: {error}'
        ) from None
    return entries


def _confined(root: Path, key: str, url: str) -> Path:
    """Where object ``key`` goes in a mirror: inside ``root``, or a :class:`StoreError` for a key that
    climbs out (``..``), is absolute, or resolves (through anything) outside the root."""
    parts = key.split("/")
    target = root.joinpath(*parts)
    inside = root.resolve()
    if (
        not key
        or key.startswith("/")
        or "\\" in key
        or "\0" in key
        or any(part in ("", ".", "..") for part in parts)
        or not target.resolve().is_relative_to(inside)
    ):
        raise StoreError(
            f"{url}: the listing names key {key[:120]!r}, outside the plate (absolute, empty or with '..' parts); "
            "a mirror writes only inside its own folder"
        )
    return target


def read_pointer(root: Path) -> dict[str, Any] | None:
    """The pointer document of a mirror folder, or None for a plain local plate."""
    path = root / REMOTE_POINTER
    if not path.is_file():
        return None
    document = json.loads(path.read_text())
    return document if isinstance(document, dict) else None


def default_cache_dir() -> Path:
    """Where mirrors of remote plates live: ``$XDG_CACHE_HOME/cropbench/remote`` (``~/.cache`` by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cropbench" / "remote"


#: The key index an upload leaves at the plate's root, so HTTP (which cannot list) finds the documents.
INDEX_NAME = "cropbench_index.json"


def upload_plate(plate: Path, url: str, config: StoreConfig | None = None) -> int:
    """Put every file of a local plate folder under ``url`` (any layout); returns the bytes uploaded.

    Writes :data:`INDEX_NAME` last, so a reader never sees a half-uploaded plate as complete.
    """
    config = config or StoreConfig()
    scheme, _, _ = split_url(url)
    if scheme != "s3":
        raise ConfigError(f"upload writes to s3:// URLs only (HTTP servers are read-only here), got {url!r}")
    if not plate.is_dir():
        raise StoreError(f"plate {plate} is not a folder")
    target = RemoteSource(url, config)
    files = sorted(p for p in plate.rglob("*") if p.is_file() and p.name not in (REMOTE_POINTER, INDEX_NAME))
    objects: list[tuple[str, int]] = []

    def put(path: Path) -> None:
        key = path.relative_to(plate).as_posix()
        data = path.read_bytes()
        target.put(key, data)
        objects.append((key, len(data)))

    with ThreadPoolExecutor(config.in_flight) as pool:
        list(pool.map(put, files))
    target.put(INDEX_NAME, json.dumps({"objects": sorted(objects)}).encode())
    target.close()
    return sum(size for _, size in objects)


def write_index(plate: Path) -> Path:
    """Write :data:`INDEX_NAME` into a local plate folder (for serving it over HTTP as it is)."""
    files = sorted(p for p in plate.rglob("*") if p.is_file() and p.name not in (INDEX_NAME, REMOTE_POINTER))
    objects = [(p.relative_to(plate).as_posix(), p.stat().st_size) for p in files]
    path = plate / INDEX_NAME
    path.write_text(json.dumps({"objects": objects}))
    return path
