"""Byte sources: where the direct reader's bytes come from, a local file or an object in a store.

The chunk math of the direct reader is the same whether a shard lies on disk or in a bucket; what
differs is how a byte range is fetched (``os.pread`` vs. an HTTP range GET) and what a fetch
costs (a syscall vs. a round trip). :class:`ByteSource` is that one difference: a local
:class:`FileSource`, and a :class:`RemoteSource` for ``s3://`` and ``http(s)://`` URLs (HTTP range
GETs, SigV4-signed for S3), which keeps up to ``in_flight`` requests open at once and counts
requests and bytes.

Remote plates are opened through a local *mirror*: their small metadata documents (``zarr.json``,
``.zattrs``, the layout marker, the object table) are downloaded once into a cache folder with a
pointer file naming the URL, so every metadata reader works unchanged and only pixels travel
per crop. Endpoint, region and credentials come from the standard AWS environment variables
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``); with no
credentials set, requests are unsigned (public buckets such as the Cell Painting Gallery).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit
from xml.etree import ElementTree

from cropbench.config import StoreConfig
from cropbench.errors import ConfigError, StoreError

#: URL schemes a plate may be given as.
REMOTE_SCHEMES = ("s3", "http", "https")
#: The pointer file of a mirror: the URL, the store settings, and the plate's stored bytes.
REMOTE_POINTER = "cropbench_remote.json"
#: Keys a mirror downloads (metadata and tables); chunk and shard objects stay in the store.
_MIRRORED_SUFFIXES = ("zarr.json", ".zattrs", ".zgroup", ".zarray", ".zmetadata", ".json", ".parquet", ".csv")
#: One byte range to fetch: (key, start, length); ``length`` -1 is the whole object (None if absent).
Request = tuple[str, int, int]


def is_url(plate: str | Path) -> bool:
    """Whether ``plate`` names an object-store location rather than a local path."""
    return isinstance(plate, str) and urlsplit(plate).scheme in REMOTE_SCHEMES


def split_url(url: str) -> tuple[str, str, str]:
    """(scheme, bucket or host, prefix without slashes) of a plate URL."""
    parts = urlsplit(url)
    if parts.scheme not in REMOTE_SCHEMES or not parts.netloc:
        raise ConfigError(f"plate URL {url!r} is not s3://bucket/prefix or http(s)://host/path")
    return parts.scheme, parts.netloc, parts.path.strip("/")


def s3_endpoint(config: StoreConfig) -> str:
    """The S3 endpoint requests go to: the config's, else ``AWS_ENDPOINT_URL``, else AWS ("")."""
    return config.endpoint or os.environ.get("AWS_ENDPOINT_URL", "")


def http_url(url: str, config: StoreConfig) -> str:
    """An HTTP plate URL with the config's endpoint (scheme and host) in place of its own."""
    if not config.endpoint:
        return url
    _, _, prefix = split_url(url)
    return f"{config.endpoint.rstrip('/')}/{prefix}"


def _client_options(url: str, config: StoreConfig) -> dict[str, Any]:
    options: dict[str, Any] = {"timeout": f"{config.timeout_s}s", "connect_timeout": f"{config.connect_timeout_s}s"}
    endpoint = s3_endpoint(config) if url.startswith("s3://") else http_url(url, config)
    if endpoint.startswith("http://"):
        options["allow_http"] = True
    # Requests of one plate share a connection pool as large as the in-flight limit.
    options["pool_max_idle_per_host"] = str(max(config.in_flight, 1))
    return options


def object_store(url: str, config: StoreConfig) -> Any:
    """An obstore store rooted at the plate URL's prefix, with the config's timeouts and retries."""
    from obstore.store import HTTPStore, S3Store

    scheme, netloc, prefix = split_url(url)
    retry: Any = {"max_retries": config.retries, "retry_timeout": _duration(config.timeout_s * (config.retries + 1))}
    client: Any = _client_options(url, config)
    if scheme == "s3":
        signed = bool(os.environ.get("AWS_ACCESS_KEY_ID")) and not config.anonymous
        extra: dict[str, Any] = {} if signed else {"skip_signature": True}
        if "AWS_REGION" not in os.environ and "AWS_DEFAULT_REGION" not in os.environ:
            extra["region"] = "us-east-1"
        if config.endpoint:
            extra["endpoint"] = config.endpoint
        return S3Store(netloc, prefix=prefix or None, client_options=client, retry_config=retry, **extra)
    return HTTPStore.from_url(http_url(url, config), client_options=client, retry_config=retry)


def _duration(seconds: float) -> Any:
    import datetime

    return datetime.timedelta(seconds=seconds)


def store_error(url: str, key: str, error: BaseException) -> StoreError:
    """One line naming the object's URL and what went wrong, from any obstore or fsspec error."""
    location = f"{url.rstrip('/')}/{key}" if key else url
    kind = type(error).__name__
    full = str(error)
    text = " ".join(full.split("Debug source")[0].split())  # obstore appends a multi-line debug dump
    hints = {
        "NotFoundError": "no such bucket or key",
        "FileNotFoundError": "no such bucket or key",
        "PermissionDeniedError": "access denied: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY",
        "PermissionError": "access denied: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY",
        "UnauthenticatedError": "not authenticated: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY",
    }
    hint = hints.get(kind)
    lowered, details = text.lower(), " ".join(full.split()).lower()
    if hint is not None:
        pass
    elif "nosuchbucket" in lowered or "not found" in lowered or " 404" in lowered:
        hint = "no such bucket or key"
    elif any(word in lowered for word in ("access denied", "accessdenied", "signature", "forbidden", " 403")):
        hint = "access denied: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"
    elif "invalidaccesskeyid" in lowered or " 401" in lowered:
        hint = "not authenticated: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"
    elif "kind: connect" in details or "connection refused" in details or "dns error" in details:
        hint = "cannot connect: is the endpoint up (AWS_ENDPOINT_URL)?"
    elif "kind: timeout" in details or "timed out" in details or isinstance(error, TimeoutError):
        hint = "timed out (timeout_s, --timeout)"
    elif "connection" in details or "error sending request" in lowered:
        hint = "the connection failed (server gone?)"
    else:
        hint = "store request failed"
    return StoreError(f"{location}: {hint} ({kind}: {text[:160]})")


class ByteSource(ABC):
    """Byte ranges of the objects (files) under one plate root; keys are relative to the root.

    ``requests`` and ``bytes_transferred`` count what crossed the wire (or the syscall boundary).
    """

    location: str = ""

    def __init__(self) -> None:
        self.requests = 0
        self.bytes_transferred = 0
        self._lock = threading.Lock()

    @abstractmethod
    def get(self, key: str) -> bytes | None:
        """The whole object, or None when it does not exist (an absent chunk is its fill value)."""

    @abstractmethod
    def get_range(self, key: str, start: int, length: int) -> bytes:
        """``length`` bytes from ``start``; a short object is a :class:`StoreError`."""

    @abstractmethod
    def get_suffix(self, key: str, length: int) -> bytes | None:
        """The last ``length`` bytes (a shard index at the end), or None when the object does not exist."""

    def get_many(self, requests: Sequence[Request]) -> list[bytes | None]:
        """Every request, in order; a remote source keeps several in flight."""
        return [self.get(key) if length < 0 else self.get_range(key, start, length) for key, start, length in requests]

    def close(self) -> None:  # noqa: B027 - a source with nothing open has nothing to release
        """Release handles and connections."""

    def _count(self, data: bytes | None) -> None:
        self.count(1, 0 if data is None else len(data))

    def count(self, requests: int, nbytes: int) -> None:
        """Add reads made elsewhere (the direct reader's native loads) to ``requests`` and ``bytes_transferred``."""
        with self._lock:
            self.requests += requests
            self.bytes_transferred += nbytes

    def _short(self, key: str, data: bytes, start: int, length: int) -> StoreError:
        return StoreError(
            f"{self.location.rstrip('/')}/{key} is truncated: {len(data)} of {length} bytes at offset {start}"
        )


class FileSource(ByteSource):
    """Objects as files under a local folder: ``os.pread`` on descriptors opened once per process."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.location = str(root)
        self._prefix = f"{root}{os.sep}"
        self._descriptors: dict[str, int] = {}

    def get(self, key: str) -> bytes | None:
        try:
            with open(self._prefix + key, "rb", buffering=0) as handle:
                data = handle.readall()
        except FileNotFoundError:
            return None
        self._count(data)
        return data

    def path(self, key: str) -> str:
        """The file that holds object ``key``."""
        return self._prefix + key

    def descriptor(self, key: str) -> int | None:
        """A descriptor of object ``key``'s file, opened once per process and kept; None when it does not exist."""
        descriptor = self._descriptors.get(key)
        if descriptor is None:
            with self._lock:  # decode threads may ask for the same new shard at once: open it once
                descriptor = self._descriptors.get(key)
                if descriptor is None:
                    try:
                        descriptor = os.open(self._prefix + key, os.O_RDONLY)
                    except FileNotFoundError:
                        return None
                    self._descriptors[key] = descriptor
        return descriptor

    def get_range(self, key: str, start: int, length: int) -> bytes:
        descriptor = self.descriptor(key)
        if descriptor is None:
            raise StoreError(f"{self._prefix}{key} does not exist")
        data = os.pread(descriptor, length, start)
        self._count(data)
        if len(data) != length:
            raise self._short(key, data, start, length)
        return data

    def get_suffix(self, key: str, length: int) -> bytes | None:
        descriptor = self.descriptor(key)
        if descriptor is None:
            return None
        start = os.fstat(descriptor).st_size - length
        if start < 0:
            raise self._short(key, b"", 0, length)
        return self.get_range(key, start, length)

    def close(self) -> None:
        for descriptor in self._descriptors.values():
            os.close(descriptor)
        self._descriptors.clear()


class RemoteSource(ByteSource):
    """Objects under a plate URL, read with HTTP range GETs (S3 requests signed with SigV4 from the
    AWS environment variables, unsigned without them); ``in_flight`` requests at once.

    Plain urllib3 connections rather than obstore's: a tokio runtime started in the parent hangs in
    a forked DataLoader worker, and the pool here is rebuilt in each process.
    """

    def __init__(self, url: str, config: StoreConfig) -> None:
        super().__init__()
        self.location = url
        self.config = config
        self._scheme, self._bucket, self._prefix = split_url(url)
        self._http: Any = None
        self._credentials: Any = None
        self._pool: ThreadPoolExecutor | None = None
        self._pid = 0

    def _client(self) -> Any:
        if self._http is None or self._pid != os.getpid():
            import urllib3

            config = self.config
            retry = urllib3.Retry(
                total=config.retries,
                backoff_factor=0.05,
                status_forcelist=(500, 502, 503, 504),
                allowed_methods=None,
                raise_on_status=False,
            )
            timeout = urllib3.Timeout(connect=config.connect_timeout_s, read=config.timeout_s)
            self._http = urllib3.PoolManager(maxsize=max(config.in_flight, 1), retries=retry, timeout=timeout)
            self._credentials = _credentials(config) if self._scheme == "s3" else None
            self._pool = None
            self._pid = os.getpid()
        return self._http

    def object_url(self, key: str = "", query: str = "") -> str:
        """Where an object (or, with ``query``, the bucket's listing) is requested."""
        path = "/".join(part for part in (self._prefix, key) if part)
        if self._scheme != "s3":
            base = http_url(f"{self._scheme}://{self._bucket}", self.config).rstrip("/")
            return f"{base}/{quote(path)}" + (f"?{query}" if query else "")
        endpoint = s3_endpoint(self.config).rstrip("/")
        if query:  # the bucket's listing: path-style on an S3-compatible server, virtual-hosted on AWS
            return f"{endpoint}/{self._bucket}?{query}" if endpoint else f"{_aws_host(self._bucket)}/?{query}"
        base = f"{endpoint}/{self._bucket}" if endpoint else _aws_host(self._bucket)
        return f"{base}/{quote(path)}"

    def request(
        self, method: str, key: str, headers: dict[str, str] | None = None, body: bytes = b"", query: str = ""
    ) -> tuple[int, bytes]:
        """(status, body) of one request; connection failures and timeouts are one-line StoreErrors."""
        http = self._client()
        url = self.object_url(key, query)
        headers = dict(headers or {})
        if self._credentials is not None:
            headers = _signed(method, url, headers, body, self._credentials)
        try:
            response = http.request(method, url, headers=headers, body=body or None, preload_content=True)
        except Exception as error:  # urllib3: MaxRetryError, timeouts, protocol errors
            raise store_error(self.location, key, error) from error
        return response.status, response.data

    def _checked(self, key: str, status: int, data: bytes) -> bytes | None:
        if status in (200, 206):
            return data
        if status == 404:
            return None
        raise _status_error(self.location, key, status, data)

    def get(self, key: str) -> bytes | None:
        status, data = self.request("GET", key)
        result = self._checked(key, status, data)
        self._count(result)
        return result

    def get_range(self, key: str, start: int, length: int) -> bytes:
        status, data = self.request("GET", key, {"Range": f"bytes={start}-{start + length - 1}"})
        if status == 416:
            data = b""
        else:
            checked = self._checked(key, status, data)
            if checked is None:
                raise StoreError(f"{self.location.rstrip('/')}/{key}: no such bucket or key")
            data = checked[start : start + length] if status == 200 else checked  # 200: the server sent all
        self._count(data)
        if len(data) != length:
            raise self._short(key, data, start, length)
        return data

    def get_suffix(self, key: str, length: int) -> bytes | None:
        status, data = self.request("GET", key, {"Range": f"bytes=-{length}"})
        result = b"" if status == 416 else self._checked(key, status, data)
        if result is not None and status == 200:
            result = result[-length:]
        self._count(result)
        if result is not None and len(result) != length:
            raise self._short(key, result, -1, length)
        return result

    def put(self, key: str, data: bytes) -> None:
        status, body = self.request("PUT", key, {"Content-Length": str(len(data))}, data)
        if status not in (200, 201, 204):
            raise _status_error(self.location, key, status, body)

    def listing(self) -> Iterator[tuple[str, int]]:
        """(key relative to the plate, size) of every object under an S3 plate URL (ListObjectsV2)."""
        token = ""
        prefix = f"{self._prefix}/" if self._prefix else ""
        while True:
            query = f"list-type=2&prefix={quote(prefix, safe='')}"
            if token:
                query += f"&continuation-token={quote(token, safe='')}"
            status, body = self.request("GET", "", query=query)
            if status != 200:
                raise _status_error(self.location, "", status, body)
            root = ElementTree.fromstring(body)
            namespace = root.tag[: root.tag.index("}") + 1] if root.tag.startswith("{") else ""
            for entry in root.iter(f"{namespace}Contents"):
                key = entry.findtext(f"{namespace}Key", "")
                yield key[len(prefix) :], int(entry.findtext(f"{namespace}Size", "0"))
            token = root.findtext(f"{namespace}NextContinuationToken", "") or ""
            if root.findtext(f"{namespace}IsTruncated", "false") != "true" or not token:
                return

    def get_many(self, requests: Sequence[Request]) -> list[bytes | None]:
        if len(requests) <= 1 or self.config.in_flight <= 1:
            return super().get_many(requests)
        self._client()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.config.in_flight, thread_name_prefix="cropbench-fetch")
        one = ByteSource.get_many.__get__(self)
        return [data for part in self._pool.map(lambda request: one([request]), requests) for data in part]

    def close(self) -> None:
        if self._pool is not None and self._pid == os.getpid():
            self._pool.shutdown(wait=False)
        if self._http is not None and self._pid == os.getpid():
            self._http.clear()
        self._pool = None
        self._http = None


def _aws_host(bucket: str) -> str:
    return f"https://{bucket}.s3.{_region()}.amazonaws.com"


def _region() -> str:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"


def _credentials(config: StoreConfig) -> Any:
    """SigV4 credentials from the AWS environment variables, or None (unsigned: public buckets)."""
    access = os.environ.get("AWS_ACCESS_KEY_ID")
    if config.anonymous or not access:
        return None
    from botocore.credentials import Credentials

    return Credentials(access, os.environ.get("AWS_SECRET_ACCESS_KEY", ""), os.environ.get("AWS_SESSION_TOKEN"))


def _signed(method: str, url: str, headers: dict[str, str], body: bytes, credentials: Any) -> dict[str, str]:
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest

    request = AWSRequest(method=method, url=url, headers=headers, data=body)
    S3SigV4Auth(credentials, "s3", _region()).add_auth(request)
    return dict(request.headers.items())


def _status_error(url: str, key: str, status: int, body: bytes) -> StoreError:
    """A non-success HTTP status as one line: the URL, what it means, and the server's error code."""
    location = f"{url.rstrip('/')}/{key}" if key else url
    code = ""
    with contextlib.suppress(ElementTree.ParseError, ValueError):
        code = ElementTree.fromstring(body).findtext("Code") or "" if body.startswith(b"<") else ""
    meaning = {
        403: "access denied: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY",
        401: "not authenticated: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY",
        404: "no such bucket or key",
    }.get(status, "store request failed")
    if code == "NoSuchBucket":
        meaning = "no such bucket"
    elif code in ("InvalidAccessKeyId", "SignatureDoesNotMatch"):
        meaning = "access denied: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"
    return StoreError(f"{location}: {meaning} (HTTP {status}{' ' + code if code else ''})")


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
    split_url(url)
    root = (cache_dir or default_cache_dir()) / hashlib.sha256(url.encode()).hexdigest()[:16]
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    source = RemoteSource(url, dataclasses.replace(config, retries=min(config.retries, 1)))
    if url.startswith("s3://"):
        entries = list(source.listing())
    else:
        index = source.get(INDEX_NAME)
        if index is None:
            raise StoreError(
                f"{url.rstrip('/')}/{INDEX_NAME} not found: an HTTP plate needs the key index that "
                "`cropbench upload` writes (HTTP servers cannot list a folder)"
            )
        entries = [(str(key), int(size)) for key, size in json.loads(index)["objects"]]
    if not entries:
        raise StoreError(f"{url}: no objects under this prefix (no such plate)")
    wanted = [key for key, _ in entries if _mirrored(key)]
    for key, data in zip(wanted, source.get_many([(key, 0, -1) for key in wanted]), strict=True):
        if data is None:
            raise StoreError(f"{url.rstrip('/')}/{key}: listed but not found")
        target = root / key
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    source.close()
    pointer = {"url": url, "store": dataclasses.asdict(config), "stored_bytes": sum(size for _, size in entries)}
    (root / REMOTE_POINTER).write_text(json.dumps(pointer, indent=1))
    return root


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


#: The process that started obstore's runtime (a tokio runtime does not survive fork).
_OBSTORE_PID: list[int] = []


def zarr_store(url: str, config: StoreConfig, count: Callable[[int], None] | None = None) -> Any:
    """zarr-python's own remote store for a plate URL: ``ObjectStore`` (obstore) or ``FsspecStore`` (s3fs,
    aiohttp), as ``config.zarr_client`` says; ``count`` is called with the bytes of every GET."""
    from zarr.storage import FsspecStore, ObjectStore

    if config.zarr_client == "obstore":
        if _OBSTORE_PID and _OBSTORE_PID[0] != os.getpid():
            raise StoreError(
                f"{url}: zarr-python's ObjectStore (obstore) hangs in a forked DataLoader worker once the parent "
                "used it; use --zarr-client fsspec, or workers started with forkserver or spawn"
            )
        _OBSTORE_PID[:] = [os.getpid()]
        store: Any = ObjectStore(object_store(url, config), read_only=True)
    else:
        scheme, netloc, prefix = split_url(url)
        if scheme == "s3":
            options: dict[str, Any] = {
                "anon": not os.environ.get("AWS_ACCESS_KEY_ID") or config.anonymous,
                "asynchronous": True,
                "config_kwargs": {
                    "connect_timeout": config.connect_timeout_s,
                    "read_timeout": config.timeout_s,
                    "retries": {"max_attempts": config.retries + 1},
                    "max_pool_connections": max(config.in_flight, 10),
                },
            }
            if s3_endpoint(config):
                options["endpoint_url"] = s3_endpoint(config)
        else:
            options = {"asynchronous": True, "client_kwargs": {"timeout": _aiohttp_timeout(config)}}
            url = http_url(url, config)
        store = FsspecStore.from_url(url, storage_options=options, read_only=True)
    return store if count is None else _counting(store, count)


def _aiohttp_timeout(config: StoreConfig) -> Any:
    import aiohttp

    return aiohttp.ClientTimeout(total=config.timeout_s, connect=config.connect_timeout_s)


def _counting(store: Any, count: Callable[[int], None]) -> Any:
    """``store`` wrapped so that every ``get`` (one request) reports the bytes it returned."""
    from zarr.storage import WrapperStore

    class CountingStore(WrapperStore[Any]):
        async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
            result = await self._store.get(key, prototype, byte_range)
            count(0 if result is None else len(result))
            return result

    return CountingStore(store)


__all__ = [
    "INDEX_NAME",
    "REMOTE_POINTER",
    "REMOTE_SCHEMES",
    "ByteSource",
    "FileSource",
    "RemoteSource",
    "is_url",
    "mirror_metadata",
    "object_store",
    "open_source",
    "read_pointer",
    "split_url",
    "store_error",
    "upload_plate",
    "write_index",
    "zarr_store",
]
