"""The object-store byte source: HTTP range GETs under a plate URL (SigV4-signed for S3), with
retries, a deadline per attempt, several requests in flight, and the S3 listing."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast
from urllib.parse import quote
from xml.etree import ElementTree

from cropbench.config import StoreConfig
from cropbench.errors import StoreError
from cropbench.formats.sources.base import ByteSource, Request
from cropbench.formats.sources.failures import status_error, store_error
from cropbench.formats.sources.http11 import Client, Outcome
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
        url, headers = self._prepared(method, key, headers, body, query)
        return self._retried(http, method, key, url, headers, body, self._attempt(http, method, url, headers, body))

    def _prepared(
        self, method: str, key: str, headers: dict[str, str] | None, body: bytes, query: str = ""
    ) -> tuple[str, dict[str, str]]:
        """The URL and headers (signed where there are credentials) of one request."""
        url = self.object_url(key, query)
        headers = dict(headers or {})
        if self._credentials is not None:
            headers = _signed(method, url, headers, body, self._credentials)
        return url, headers

    def _retried(
        self, http: Client, method: str, key: str, url: str, headers: dict[str, str], body: bytes, outcome: Outcome
    ) -> tuple[int, bytes]:
        """The answer to a request whose first attempt came to ``outcome``: that one, or the retries'
        (after a failure or a status of the server's trouble), up to ``retries`` more."""
        attempts = self.config.retries + 1
        for attempt in range(1, attempts + 1):
            if isinstance(outcome, BaseException):  # timeouts, refused connections, protocol errors
                if attempt == attempts:
                    raise store_error(self._url, key, outcome) from None
            elif outcome[0] not in _RETRIED_STATUSES or attempt == attempts:
                return outcome
            time.sleep(min(RETRY_BACKOFF_S * 2 ** (attempt - 1), 2.0))
            outcome = self._attempt(http, method, url, headers, body)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _attempt(self, http: Client, method: str, url: str, headers: dict[str, str], body: bytes) -> Outcome:
        """One attempt, ended at ``timeout_s`` wherever it waits: (status, body) or what ended it."""
        try:
            return http.request(method, url, headers, body, time.monotonic() + self.config.timeout_s)
        except Exception as error:
            return _said(error, self.config.timeout_s)

    def _requested_many(self, specs: Sequence[tuple[str, dict[str, str]]]) -> list[tuple[int, bytes]]:
        """(status, body) of each GET (key, headers), in order: first attempts in flight together on
        this thread (:meth:`Client.request_many`, ``in_flight`` at once), then the retries of those that
        failed on the request threads."""
        http = self._client()
        prepared = [self._prepared("GET", key, headers, b"") for key, headers in specs]
        timeout_s = self.config.timeout_s
        outcomes = [
            _said(outcome, timeout_s) if isinstance(outcome, BaseException) else outcome
            for outcome in http.request_many([("GET", url, headers, b"") for url, headers in prepared], timeout_s)
        ]
        failed = [
            index
            for index, outcome in enumerate(outcomes)
            if isinstance(outcome, BaseException) or outcome[0] in _RETRIED_STATUSES
        ]

        def retried(index: int) -> tuple[int, bytes]:
            url, headers = prepared[index]
            return self._retried(http, "GET", specs[index][0], url, headers, b"", outcomes[index])

        settled = dict(zip(failed, self._requests_pool().map(retried, failed), strict=True)) if failed else {}
        return [cast(tuple[int, bytes], settled.get(index, outcome)) for index, outcome in enumerate(outcomes)]

    def _checked(self, key: str, status: int, data: bytes) -> bytes | None:
        if status in (200, 206):
            return data
        if status == 404:
            return None
        raise status_error(self.location, key, status, data)

    def get(self, key: str) -> bytes | None:
        return self._whole(key, *self.request("GET", key))

    def get_range(self, key: str, start: int, length: int) -> bytes:
        return self._range(key, start, length, *self.request("GET", key, _range_header(start, length)))

    def get_suffix(self, key: str, length: int) -> bytes | None:
        return self._suffix(key, length, *self.request("GET", key, {"Range": f"bytes=-{length}"}))

    def _whole(self, key: str, status: int, data: bytes) -> bytes | None:
        result = self._checked(key, status, data)
        self._count(result)
        return result

    def _range(self, key: str, start: int, length: int, status: int, data: bytes) -> bytes:
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

    def _suffix(self, key: str, length: int, status: int, data: bytes) -> bytes | None:
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
        specs = [(key, {} if length < 0 else _range_header(start, length)) for key, start, length in requests]
        return [
            self._whole(key, *answer) if length < 0 else self._range(key, start, length, *answer)
            for (key, start, length), answer in zip(requests, self._requested_many(specs), strict=True)
        ]

    def get_suffixes(self, requests: Sequence[tuple[str, int]]) -> list[bytes | None]:
        if len(requests) <= 1 or self.config.in_flight <= 1:
            return super().get_suffixes(requests)
        specs = [(key, {"Range": f"bytes=-{length}"}) for key, length in requests]
        return [
            self._suffix(key, length, *answer)
            for (key, length), answer in zip(requests, self._requested_many(specs), strict=True)
        ]

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


def _range_header(start: int, length: int) -> dict[str, str]:
    return {"Range": f"bytes={start}-{start + length - 1}"}


def _said(error: BaseException, timeout_s: float) -> BaseException:
    """A request's failure as its row will say it: a timeout names the setting that bounded it."""
    if isinstance(error, TimeoutError):
        return TimeoutError(f"timed out: no whole response within timeout_s={timeout_s:g}")
    return error


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
