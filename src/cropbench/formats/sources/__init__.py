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

One module per job:

- ``urls``: which strings are plate URLs, their parts, endpoints, credentials masked in messages;
- ``failures``: a failed request (a client library's error, an HTTP status) as one line;
- ``base``: the :class:`ByteSource` interface and its counters;
- ``files``: :class:`FileSource` and the check that a plate file is a regular file;
- ``http11``: the HTTP/1.1 client of range GETs: keep-alive connections, a deadline per whole request;
- ``remote``: :class:`RemoteSource` (range GETs, retries, requests in flight, the S3 listing);
- ``mirror``: metadata mirrors, key indexes, uploads, and the byte source of a plate folder;
- ``stores``: zarr-python's and obstore's own stores for a plate URL.
"""

from __future__ import annotations

from cropbench.formats.sources.base import ByteSource, Request
from cropbench.formats.sources.failures import store_error
from cropbench.formats.sources.files import FileSource, check_regular
from cropbench.formats.sources.mirror import (
    INDEX_NAME,
    REMOTE_POINTER,
    default_cache_dir,
    mirror_metadata,
    open_source,
    read_pointer,
    upload_plate,
    write_index,
)
from cropbench.formats.sources.remote import MAX_LISTING_PAGES, RETRY_BACKOFF_S, RemoteSource
from cropbench.formats.sources.stores import object_store, zarr_store
from cropbench.formats.sources.urls import (
    REMOTE_SCHEMES,
    http_url,
    is_url,
    redact,
    s3_endpoint,
    scrub_credentials,
    split_url,
)

__all__ = [
    "INDEX_NAME",
    "MAX_LISTING_PAGES",
    "REMOTE_POINTER",
    "REMOTE_SCHEMES",
    "RETRY_BACKOFF_S",
    "ByteSource",
    "FileSource",
    "RemoteSource",
    "Request",
    "check_regular",
    "default_cache_dir",
    "http_url",
    "is_url",
    "mirror_metadata",
    "object_store",
    "open_source",
    "read_pointer",
    "redact",
    "s3_endpoint",
    "scrub_credentials",
    "split_url",
    "store_error",
    "upload_plate",
    "write_index",
    "zarr_store",
]
