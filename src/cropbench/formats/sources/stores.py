"""zarr-python's and obstore's own remote stores for a plate URL, with the store settings' timeouts,
retries and pool size (the paths the direct reader is compared with)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from cropbench.config import StoreConfig
from cropbench.errors import StoreError
from cropbench.formats.sources.urls import http_url, s3_endpoint, split_url


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
