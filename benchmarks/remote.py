"""A plate in a store in asv: the smoke plate served over HTTP on loopback and read by its URL.

On a store a crop is paid for in requests, so the gate here is what the reader counts, which is
the same on every run of the same code: requests and bytes transferred per random 96 px crop
(decoded-chunk cache off, so every crop fetches what it needs; shard indexes fetched once in a
warm-up). Beside them, ``track_relative_cost`` times the crop path over the store against the
same crops read from the local plate, block by block in one call, so a slower machine moves both.

nginx serves a copy of the plate on 127.0.0.1 from ``setup`` to ``teardown`` (a range-capable
server that needs no Python package). Where nginx or the read path's HTTP client is missing, the
cases skip and name it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import tempfile
from pathlib import Path
from typing import Any

from .common import (
    BLOCK,
    Suite,
    access_order,
    crop_config,
    crop_dataset,
    one_thread,
    plate_for,
    relative_cost,
    skips_older_commits,
)

#: Random crops counted per ``track_requests_per_crop`` / ``track_bytes_per_crop`` value.
COUNTED_CROPS = 64
#: Blocks of ``BLOCK`` crops in one ``track_relative_cost`` value (fewer than Track 1's: a request each).
REMOTE_BLOCKS = 12
#: The Python packages each read path's HTTP client needs.
CLIENT_PACKAGES = {"direct": ("urllib3",), "zarr": ("fsspec", "aiohttp")}


class Store(Suite):
    """The smoke plate by URL from a loopback nginx: requests, bytes and time per crop (``direct`` and ``zarr``)."""

    params = (["direct", "zarr"],)
    param_names = ("decode",)
    #: 2: the counted crops are drawn by the library's random sampler (they were a permutation of its own).
    version = "2"

    @skips_older_commits()
    def setup(self, plates: dict[str, str], decode: str) -> None:
        from cropbench import metrics
        from cropbench.config import StoreConfig
        from cropbench.formats.sources import mirror_metadata
        from cropbench.measure.endpoints import http_plate, nginx_binary
        from cropbench.measure.remote import requests_per_crop

        missing = [name for name in CLIENT_PACKAGES[decode] if importlib.util.find_spec(name) is None]
        if missing:
            raise NotImplementedError(f"the {decode} path over HTTP needs {', '.join(missing)} (not installed)")
        if nginx_binary() is None:
            raise NotImplementedError("nginx is not installed (apt-get install -y nginx): no HTTP server to read from")
        one_thread()
        self.decode = decode
        self.local = Path(plate_for(plates, "default"))
        self.requests_per_crop, self.metrics = requests_per_crop, metrics
        self._stack = contextlib.ExitStack()
        try:
            url = self._stack.enter_context(http_plate(self.local))
            cache = Path(self._stack.enter_context(tempfile.TemporaryDirectory(prefix="cropbench-mirrors-")))
            self.mirror = mirror_metadata(url, StoreConfig(), cache)
        except BaseException:
            self._stack.close()
            raise

    def teardown(self, plates: dict[str, str], decode: str) -> None:
        # asv calls teardown after a setup that skipped (NotImplementedError) before the stack existed.
        stack = getattr(self, "_stack", None)
        if stack is not None:
            stack.close()

    def _counts(self) -> dict[str, float]:
        counted: dict[str, float] = self.requests_per_crop(self.mirror, self.decode, COUNTED_CROPS, cache_bytes=0)
        return counted

    def track_requests_per_crop(self, *params: Any) -> float:
        return float(self._counts()[self.metrics.REQUESTS_PER_CROP])

    track_requests_per_crop.unit = "requests/crop"  # type: ignore[attr-defined]

    def track_bytes_per_crop(self, *params: Any) -> float:
        return float(self._counts()[self.metrics.BYTES_TRANSFERRED_PER_CROP])

    track_bytes_per_crop.unit = "bytes/crop"  # type: ignore[attr-defined]

    def track_relative_cost(self, *params: Any) -> float:
        crop = crop_config(decode=self.decode, chunk_cache_bytes=0)
        remote, local = crop_dataset(self.mirror, crop), crop_dataset(self.local, crop)
        indices = access_order(local, "random", BLOCK * REMOTE_BLOCKS)
        return relative_cost(remote.__getitem__, local.__getitem__, indices)

    track_relative_cost.unit = "x local read"  # type: ignore[attr-defined]
