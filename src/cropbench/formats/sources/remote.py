"""The object-store byte source: HTTP range GETs under a plate URL (SigV4-signed for S3), with
retries, a deadline per attempt, several requests in flight, and the S3 listing."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote
from xml.etree import ElementTree

from cropbench.config import StoreConfig
from cropbench.errors import StoreError
from cropbench.formats.sources.base import ByteSource, Request
from cropbench.formats.sources.failures import status_error, store_error
from cropbench.formats.sources.http11 import Client
from cropbench.formats.sources.urls import http_url, redact, s3_endpoint, split_url, without_credentials

#: Pages of an S3 listing read at most (1,000 keys a page): a server that never stops listing is an error.
MAX_LISTING_PAGES = 10_000
#: Seconds slept before retry n (n = 0, 1, ...) of a failed request: this times 2**n, at most 2 s.
RETRY_BACKOFF_S = 0.05


#: Statuses retried (the server's trouble, not the request's).
_RETRIED_STATUSES = (500, 502, 503, 504)


class RemoteSource(ByteSource):
    """Objects under a plate URL, read with HTTP range GETs (S3 requests signed with SigV4 from the
    AWS environment variables, unsigned without them); ``in_flight`` requests at once.

    ``timeout_s`` bounds each attempt of a request from connecting to its last body byte, so a
    request with its retries ends within about ``(retries + 1) * timeout_s``.

    The client is :class:`~cropbench.formats.sources.http11.Client` (plain sockets, rebuilt in each
    process): obstore's tokio runtime started in the parent hangs in a forked DataLoader worker, and
    urllib3 cost the reader three times obstore's CPU per request.
    """

    def __init__(self, url: str, config: StoreConfig) -> None:
        super().__init__()
        self._scheme, self._bucket, self._prefix = split_url(without_credentials(url))
        self._url = url  # with its credentials, to mask them in client libraries' messages
        self.location = redact(url)
        self.config = config
        self._http: Client | None = None
        self._credentials: Any = None
        self._pool: ThreadPoolExecutor | None = None
        self._pid = 0

    def _client(self) -> Client:
        if self._http is None or self._pid != os.getpid():
            config = self.config
            self._http = Client(min(config.connect_timeout_s, config.timeout_s), max_idle=max(config.in_flight, 1))
            self._credentials = _credentials(config) if self._scheme == "s3" else None
            self._pool = None
            self._pid = os.getpid()
        return self._http

    def object_url(self, key: str = "", query: str = "") -> str:
        """Where an object (or, with ``query``, the bucket's listing) is requested."""
        path = "/".join(part for part in (self._prefix, key) if part)
        if self._scheme != "s3":
            base = without_credentials(http_url(f"{self._scheme}://{self._bucket}", self.config)).rstrip("/")
            return f"{base}/{quote(path)}" + (f"?{query}" if query else "")
        endpoint = without_credentials(s3_endpoint(self.config)).rstrip("/")
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
            except Exception as error:  # timeouts, refused connections, protocol errors
                if attempt + 1 == attempts:
                    raise store_error(self._url, key, error) from None
            else:
                if status not in _RETRIED_STATUSES or attempt + 1 == attempts:
                    return status, data
            time.sleep(min(RETRY_BACKOFF_S * 2**attempt, 2.0))
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _attempt(self, http: Client, method: str, url: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        """One attempt, ended at ``timeout_s`` wherever it waits."""
        try:
            return http.request(method, url, headers, body, time.monotonic() + self.config.timeout_s)
        except TimeoutError:
            raise TimeoutError(f"timed out: no whole response within timeout_s={self.config.timeout_s:g}") from None

    def _checked(self, key: str, status: int, data: bytes) -> bytes | None:
        if status in (200, 206):
            return data
        if status == 404:
            return None
        raise status_error(self.location, key, status, data)

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
            raise status_error(self.location, key, status, body)

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
                raise status_error(self.location, "", status, body)
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
        one = ByteSource.get_many.__get__(self)
        return [data for part in self._requests_pool().map(lambda request: one([request]), requests) for data in part]

    def get_suffixes(self, requests: Sequence[tuple[str, int]]) -> list[bytes | None]:
        if len(requests) <= 1 or self.config.in_flight <= 1:
            return super().get_suffixes(requests)
        return list(self._requests_pool().map(lambda request: self.get_suffix(*request), requests))

    def _requests_pool(self) -> ThreadPoolExecutor:
        """The threads that keep ``in_flight`` requests open, started once per process."""
        self._client()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.config.in_flight, thread_name_prefix="cropbench-fetch")
        return self._pool

    def close(self) -> None:
        if self._pool is not None and self._pid == os.getpid():
            self._pool.shutdown(wait=False)
        if self._http is not None and self._pid == os.getpid():
            self._http.close()
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
