"""A plate in a store in asv: the smoke plate served by nginx on loopback and read by its URL.

Requests and bytes transferred per random 96 px crop are counts the reader keeps (decoded-chunk cache
off; shard indexes fetched in a warm-up), the same on every run of the same code;
``track_relative_cost`` times the store against the local plate, block by block in one call. nginx
serves a copy of the plate from ``setup`` to ``teardown``; without it or the path's HTTP client, skipped.
"""

from __future__ import annotations

import contextlib
import importlib.util
import tempfile
from pathlib import Path
from typing import Any

from .common import Benchmark, older_commit, plate_for, skip

OLDER_COMMIT: str | None = None
try:
    from cropbench import metrics as m
    from cropbench.config import CropConfig, StoreConfig
    from cropbench.formats.sources import mirror_metadata
    from cropbench.harness.crop_path import store_over_local
    from cropbench.measure.endpoints import http_plate, nginx_binary
    from cropbench.measure.protocol import configure_threads
    from cropbench.measure.remote import requests_per_crop
except ImportError as error:
    OLDER_COMMIT = older_commit(error)

#: Random crops counted per ``track_requests_per_crop`` / ``track_bytes_per_crop`` value.
COUNTED_CROPS = 64
#: Blocks of 32 crops in one ``track_relative_cost`` value (fewer than Track 1's: a request each).
REMOTE_BLOCKS = 12
#: The Python packages each read path's HTTP client needs.
CLIENT_PACKAGES = {"direct": ("urllib3",), "zarr": ("fsspec", "aiohttp")}


def missing_client(decode: str) -> str | None:
    """Why the ``decode`` path cannot read over HTTP here (a client package or nginx is missing), or None."""
    missing = [name for name in CLIENT_PACKAGES[decode] if importlib.util.find_spec(name) is None]
    if missing:
        return f"the {decode} path over HTTP needs {', '.join(missing)} (not installed)"
    if nginx_binary() is None:
        return "nginx is not installed (apt-get install -y nginx): no HTTP server to read from"
    return None


class Store(Benchmark):
    """The smoke plate by URL from a loopback nginx: requests, bytes and time per crop (``direct`` and ``zarr``)."""

    params = (["direct", "zarr"],)
    param_names = ("decode",)
    #: 2: the counted crops are drawn by the library's random sampler (they were a permutation of its own).
    version = "2"

    def setup(self, plates: dict[str, str], decode: str) -> None:
        skip(OLDER_COMMIT or missing_client(decode))
        configure_threads(1)
        self.decode, self.local = decode, Path(plate_for(plates, "default"))
        self.crop = CropConfig(decode=decode, chunk_cache_bytes=0)
        with contextlib.ExitStack() as stack:  # the server and the mirror's folder stay up until teardown
            url = stack.enter_context(http_plate(self.local))
            cache = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cropbench-mirrors-")))
            self.mirror = mirror_metadata(url, StoreConfig(), cache)
            self.served = stack.pop_all()

    def teardown(self, plates: dict[str, str], decode: str) -> None:
        # asv calls teardown after a setup that skipped (NotImplementedError) before the server started.
        if hasattr(self, "served"):
            self.served.close()

    def track_requests_per_crop(self, *params: Any) -> float:
        return float(requests_per_crop(self.mirror, self.decode, COUNTED_CROPS, cache_bytes=0)[m.REQUESTS_PER_CROP])

    track_requests_per_crop.unit = "requests/crop"  # type: ignore[attr-defined]

    def track_bytes_per_crop(self, *params: Any) -> float:
        counted = requests_per_crop(self.mirror, self.decode, COUNTED_CROPS, cache_bytes=0)
        return float(counted[m.BYTES_TRANSFERRED_PER_CROP])

    track_bytes_per_crop.unit = "bytes/crop"  # type: ignore[attr-defined]

    def track_relative_cost(self, *params: Any) -> float:
        return store_over_local(self.mirror, self.local, self.crop, REMOTE_BLOCKS)

    track_relative_cost.unit = "x local read"  # type: ignore[attr-defined]
