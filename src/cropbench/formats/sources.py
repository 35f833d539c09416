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
import heapq
import itertools
import json
import os
import re
import shutil
import socket
import stat
import threading
import time
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
#: Pages of an S3 listing read at most (1,000 keys a page): a server that never stops listing is an error.
MAX_LISTING_PAGES = 10_000
#: Seconds slept before retry n (n = 0, 1, ...) of a failed request: this times 2**n, at most 2 s.
RETRY_BACKOFF_S = 0.05

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)([^/?#@]*)@")


def redact(url: str) -> str:
    """``url`` with the credentials of its user part replaced by ``***`` (for every message and log line)."""

    def hide(match: re.Match[str]) -> str:
        user, colon, _ = match[2].partition(":")
        return f"{match[1]}{user}:***@" if colon else f"{match[1]}***@"

    return _USERINFO.sub(hide, url, count=1)


def is_url(plate: str | Path) -> bool:
    """Whether ``plate`` names an object-store location rather than a local path (a malformed URL of
    such a scheme is a :class:`ConfigError`, not a local path)."""
    if not isinstance(plate, str):
        return False
    scheme = _SCHEME.match(plate)
    if scheme is None or scheme[1].lower() not in REMOTE_SCHEMES:
        return False
    split_url(plate)
    return True


def split_url(url: str) -> tuple[str, str, str]:
    """(scheme, bucket or host, prefix without slashes) of a plate URL."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - a port that is not a number raises here, not at the first request
    except ValueError as error:  # "Invalid IPv6 URL", a port out of range or not a number
        raise ConfigError(
            f"plate URL {redact(url)!r} is not s3://bucket/prefix or http(s)://host/path: {error}"
        ) from None
    if parts.scheme not in REMOTE_SCHEMES or not parts.netloc:
        raise ConfigError(f"plate URL {redact(url)!r} is not s3://bucket/prefix or http(s)://host/path")
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
    location = redact(f"{url.rstrip('/')}/{key}" if key else url)
    kind = type(error).__name__
    full = scrub_credentials(str(error), url)
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


def scrub_credentials(text: str, url: str) -> str:
    """``text`` (a client library's message) with the user part of ``url``, if any, masked wherever it appears."""
    userinfo = urlsplit(url).netloc.rpartition("@")[0] if "@" in url else ""
    return text.replace(userinfo, redact(f"x://{userinfo}@")[4:-1]) if userinfo else text


def check_regular(path: str | Path) -> bool:
    """Whether ``path`` exists; a :class:`StoreError` when it is something other than a regular file
    (a FIFO blocks a reader forever, a device such as ``/dev/zero`` never ends), checked without opening it."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return False
    except OSError as error:
        raise StoreError(f"cannot read {path}: {error.strerror or error}") from error
    if not stat.S_ISREG(mode):
        raise not_regular(path, mode)
    return True


def not_regular(path: str | Path, mode: int) -> StoreError:
    """The error for a plate file that is not a regular file, naming what it is."""
    kinds = [(stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a device")]
    kinds += [(stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket")]
    kind = next((name for test, name in kinds if test(mode)), "special")
    return StoreError(f"{path} is not a regular file ({kind}); a plate holds regular files only")


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
    """Objects as files under a local folder: ``os.pread`` on descriptors opened once per process.

    Only regular files are opened: a FIFO would block the reader forever, a device (``/dev/zero``)
    never ends, a directory is not an object; each is a :class:`StoreError` before it is opened.
    """

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.location = str(root)
        self._prefix = f"{root}{os.sep}"
        self._descriptors: dict[str, int] = {}

    def get(self, key: str) -> bytes | None:
        descriptor = self._open(key)
        if descriptor is None:
            return None
        try:
            with open(descriptor, "rb", buffering=0) as handle:
                data = handle.readall()
        except OSError as error:
            raise StoreError(f"cannot read {self._prefix}{key}: {error.strerror or error}") from error
        self._count(data)
        return data

    def path(self, key: str) -> str:
        """The file that holds object ``key`` (for a reader that opens it itself): a :class:`StoreError`
        when something other than a regular file is there."""
        path = self._prefix + key
        check_regular(path)
        return path

    def _open(self, key: str) -> int | None:
        """A descriptor of ``key``'s file, or None when it does not exist; refuses anything but a regular file.

        Checked before opening (opening a device may act on it), and again on the descriptor, opened
        non-blocking (a FIFO swapped in between cannot block the open), so nothing else is ever read.
        """
        self.path(key)
        try:
            descriptor = os.open(self._prefix + key, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as error:
            raise StoreError(f"cannot read {self._prefix}{key}: {error.strerror or error}") from error
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            os.close(descriptor)
            raise not_regular(self._prefix + key, mode)
        os.set_blocking(descriptor, True)
        return descriptor

    def descriptor(self, key: str) -> int | None:
        """A descriptor of object ``key``'s file, opened once per process and kept; None when it does not exist."""
        descriptor = self._descriptors.get(key)
        if descriptor is None:
            with self._lock:  # decode threads may ask for the same new shard at once: open it once
                descriptor = self._descriptors.get(key)
                if descriptor is None:
                    descriptor = self._open(key)
                    if descriptor is None:
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


class _Watch:
    """One request attempt's deadline and the connection it runs on (attached when it sends)."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.expired = False
        self.done = False
        self.connection: Any = None
        self.lock = threading.Lock()

    def attach(self, connection: Any) -> None:
        with self.lock:
            if self.expired:
                raise TimeoutError("the request's deadline passed before it was sent")
            self.connection = connection

    def detach(self) -> None:
        with self.lock:
            self.connection = None

    def finish(self) -> None:
        with self.lock:
            self.done = True
            self.connection = None

    def expire(self) -> None:
        """Past the deadline: shut the connection's socket, so a read blocked on it returns at once."""
        with self.lock:
            if self.done:
                return
            self.expired = True
            sock = getattr(self.connection, "sock", None)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


#: The attempt the calling thread is making (the connection class attaches itself to it).
_CURRENT = threading.local()


class _Watchdog:
    """Ends request attempts that outlive their deadline, from one thread per source and process.

    A socket timeout bounds each read, not a request: a server sending a byte a second never trips it.
    Shutting the socket at the deadline ends the attempt wherever it waits (headers or body).
    """

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._watches: list[tuple[float, int, _Watch]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def watch(self, seconds: float) -> _Watch:
        watch = _Watch(time.monotonic() + seconds)
        with self._condition:
            heapq.heappush(self._watches, (watch.deadline, next(self._order), watch))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="cropbench-deadlines", daemon=True)
                self._thread.start()
            self._condition.notify()
        return watch

    def stop(self) -> None:
        with self._condition:
            self._stopped = True
            self._condition.notify()

    def _run(self) -> None:
        with self._condition:
            while not self._stopped:
                while self._watches and self._watches[0][2].done:
                    heapq.heappop(self._watches)
                if not self._watches:
                    self._condition.wait()
                    continue
                wait = self._watches[0][0] - time.monotonic()
                if wait > 0:
                    self._condition.wait(wait)
                    continue
                heapq.heappop(self._watches)[2].expire()


def _watched_pool_manager(**options: Any) -> Any:
    """A urllib3 pool manager whose connections attach to the calling thread's :class:`_Watch` when
    they send, and detach before they go back to the pool (a late deadline never shuts a socket that
    another request has taken)."""
    import urllib3
    from urllib3.connection import HTTPConnection, HTTPSConnection
    from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

    class Watched:
        def request(self, *args: Any, **kwargs: Any) -> None:
            watch = getattr(_CURRENT, "watch", None)
            if watch is not None:
                watch.attach(self)
                self._cropbench_watch = watch
            super().request(*args, **kwargs)  # type: ignore[misc]

    class WatchedPool:
        def _put_conn(self, conn: Any) -> None:
            watch = getattr(conn, "_cropbench_watch", None)
            if watch is not None:
                watch.detach()
                conn._cropbench_watch = None
            super()._put_conn(conn)  # type: ignore[misc]

    class WatchedHTTPConnection(Watched, HTTPConnection):
        pass

    class WatchedHTTPSConnection(Watched, HTTPSConnection):
        pass

    class WatchedHTTPPool(WatchedPool, HTTPConnectionPool):
        ConnectionCls = WatchedHTTPConnection

    class WatchedHTTPSPool(WatchedPool, HTTPSConnectionPool):
        ConnectionCls = WatchedHTTPSConnection

    manager = urllib3.PoolManager(**options)
    manager.pool_classes_by_scheme = {"http": WatchedHTTPPool, "https": WatchedHTTPSPool}
    return manager


#: Statuses retried (the server's trouble, not the request's).
_RETRIED_STATUSES = (500, 502, 503, 504)


class RemoteSource(ByteSource):
    """Objects under a plate URL, read with HTTP range GETs (S3 requests signed with SigV4 from the
    AWS environment variables, unsigned without them); ``in_flight`` requests at once.

    ``timeout_s`` bounds each attempt of a request from connecting to its last body byte, so a
    request with its retries ends within about ``(retries + 1) * timeout_s``.

    Plain urllib3 connections rather than obstore's: a tokio runtime started in the parent hangs in
    a forked DataLoader worker, and the pool here is rebuilt in each process.
    """

    def __init__(self, url: str, config: StoreConfig) -> None:
        super().__init__()
        self._scheme, self._bucket, self._prefix = split_url(url)
        self._url = url  # with its credentials, to mask them in client libraries' messages
        self.location = redact(url)
        self.config = config
        self._http: Any = None
        self._credentials: Any = None
        self._pool: ThreadPoolExecutor | None = None
        self._watchdog: _Watchdog | None = None
        self._pid = 0

    def _client(self) -> Any:
        if self._http is None or self._pid != os.getpid():
            import urllib3

            config = self.config
            timeout = urllib3.Timeout(connect=min(config.connect_timeout_s, config.timeout_s), read=config.timeout_s)
            self._http = _watched_pool_manager(maxsize=max(config.in_flight, 1), retries=False, timeout=timeout)
            self._credentials = _credentials(config) if self._scheme == "s3" else None
            self._pool = None
            self._watchdog = _Watchdog()
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
        attempts = self.config.retries + 1
        for attempt in range(attempts):
            try:
                status, data = self._attempt(http, method, url, headers, body)
            except Exception as error:  # urllib3: timeouts, refused connections, protocol errors
                if attempt + 1 == attempts:
                    raise store_error(self._url, key, error) from None
            else:
                if status not in _RETRIED_STATUSES or attempt + 1 == attempts:
                    return status, data
            time.sleep(min(RETRY_BACKOFF_S * 2**attempt, 2.0))
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _attempt(self, http: Any, method: str, url: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        """One attempt, ended by the watchdog at ``timeout_s`` wherever it waits."""
        assert self._watchdog is not None  # made with the pool manager by _client
        watch = self._watchdog.watch(self.config.timeout_s)
        _CURRENT.watch = watch
        try:
            response = http.request(method, url, headers=headers, body=body or None, preload_content=True)
        except Exception:
            if watch.expired:
                raise TimeoutError(f"timed out: no whole response within timeout_s={self.config.timeout_s:g}") from None
            raise
        finally:
            _CURRENT.watch = None
            watch.finish()
        if watch.expired:  # a body without a length, cut at the deadline, reads as complete: it is not
            raise TimeoutError(f"timed out: no whole response within timeout_s={self.config.timeout_s:g}")
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
        """(key relative to the plate, size) of every object under an S3 plate URL (ListObjectsV2).

        A page that is not S3's XML, a continuation token given twice, or more than
        :data:`MAX_LISTING_PAGES` pages is a :class:`StoreError` (a server that lists forever).
        """
        token = ""
        seen: set[str] = set()
        prefix = f"{self._prefix}/" if self._prefix else ""
        for page in range(1, MAX_LISTING_PAGES + 1):
            query = f"list-type=2&prefix={quote(prefix, safe='')}"
            if token:
                query += f"&continuation-token={quote(token, safe='')}"
            status, body = self.request("GET", "", query=query)
            if status != 200:
                raise _status_error(self.location, "", status, body)
            entries, token = self._listing_page(body, prefix, page)
            yield from entries
            if not token:
                return
            if token in seen:
                raise StoreError(
                    f"{self.location}: the listing repeated its continuation token {token[:40]!r} "
                    f"on page {page}: the server lists in a loop"
                )
            seen.add(token)
        raise StoreError(
            f"{self.location}: the listing went on for more than {MAX_LISTING_PAGES} pages "
            f"({MAX_LISTING_PAGES * 1000:,} keys or more): not a plate, or a server that lists forever"
        )

    def _listing_page(self, body: bytes, prefix: str, page: int) -> tuple[list[tuple[str, int]], str]:
        """(entries, next continuation token or "") of one ListObjectsV2 page."""
        try:
            root = ElementTree.fromstring(body)
            namespace = root.tag[: root.tag.index("}") + 1] if root.tag.startswith("{") else ""
            entries = [
                (entry.findtext(f"{namespace}Key", "")[len(prefix) :], int(entry.findtext(f"{namespace}Size", "0")))
                for entry in root.iter(f"{namespace}Contents")
            ]
        except (ElementTree.ParseError, ValueError) as error:
            raise StoreError(
                f"{self.location}: the listing (page {page}) is not S3 XML ({type(error).__name__}: {error}; "
                f"it begins {body[:40]!r})"
            ) from None
        truncated = root.findtext(f"{namespace}IsTruncated", "false") == "true"
        return entries, (root.findtext(f"{namespace}NextContinuationToken", "") or "") if truncated else ""

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
        if self._watchdog is not None and self._pid == os.getpid():
            self._watchdog.stop()
        self._pool = None
        self._http = None
        self._watchdog = None


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
    location = redact(f"{url.rstrip('/')}/{key}" if key else url)
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
    pointer = {"url": url, "store": dataclasses.asdict(config), "stored_bytes": sum(size for _, size in entries)}
    (root / REMOTE_POINTER).write_text(json.dumps(pointer, indent=1))
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
    "check_regular",
    "RemoteSource",
    "is_url",
    "mirror_metadata",
    "object_store",
    "open_source",
    "read_pointer",
    "redact",
    "scrub_credentials",
    "split_url",
    "store_error",
    "upload_plate",
    "write_index",
    "zarr_store",
]
