"""Plates in an object store: a real S3 endpoint (moto's server) and a real HTTP server (nginx) on
loopback, both started here and stopped after. Every read path returns the local plate's bytes;
the direct path's requests are coalesced and its shard indexes fetched once; bad input is one
line naming the URL."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import TEST_LAYOUTS, TINY_SPEC

from cropbench.config import LAYOUTS, StoreConfig
from cropbench.formats import open_plate, read_plate_metadata
from cropbench.formats.sources import mirror_metadata, upload_plate, write_index
from cropbench.measure import endpoints
from cropbench.plates.generate import generate_plate

pytestmark = pytest.mark.skipif(
    not endpoints.moto_available(), reason="moto's server mode is missing: pip install -e '.[remote]'"
)
BUCKET = "plates"
#: Layouts read over the store: the default (sharded 64 px) plus the test layouts (unsharded tiles,
#: per-channel zstd, whole planes, sharded 32 px).
REMOTE_LAYOUTS = {"default": LAYOUTS["default"], **TEST_LAYOUTS}
#: Crops (field, y0, y1, x0, x1) that span chunk borders and the field's edges.
WINDOWS = [(0, 0, 96, 0, 96), (1, 40, 136, 100, 196), (3, 104, 200, 144, 240), (2, 0, 200, 0, 240)]


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server on loopback, with the standard AWS variables pointing at it while the module runs."""
    names = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION")
    saved = {name: os.environ.get(name) for name in names}
    with endpoints.s3_server() as endpoint:
        os.environ.update(
            AWS_ENDPOINT_URL=endpoint,
            AWS_ACCESS_KEY_ID=endpoints.S3_ACCESS_KEY,
            AWS_SECRET_ACCESS_KEY=endpoints.S3_SECRET_KEY,
            AWS_REGION="us-east-1",
        )
        endpoints.create_bucket(endpoint, BUCKET)
        try:
            yield endpoint
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder nginx serves."""
    return tmp_path_factory.mktemp("www")


@pytest.fixture(scope="module")
def http_endpoint(served: Path) -> Iterator[str]:
    if endpoints.nginx_binary() is None:
        pytest.skip("nginx is not installed: apt-get install -y nginx")
    with endpoints.http_server(served) as endpoint:
        yield endpoint


@pytest.fixture(scope="module", params=sorted(REMOTE_LAYOUTS))
def stored_plate(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    s3_endpoint: str,
    http_endpoint: str,
    served: Path,
) -> dict[str, str | Path]:
    """One tiny plate per layout: on disk, in the S3 bucket, and served over HTTP."""
    name = f"{request.param}.zarr"
    local = tmp_path_factory.mktemp("remote-plates") / name
    generate_plate(local, TINY_SPEC, REMOTE_LAYOUTS[request.param], progress=False)
    upload_plate(local, f"s3://{BUCKET}/tiny/{name}")
    shutil.copytree(local, served / name)
    write_index(served / name)
    return {"local": local, "s3": f"s3://{BUCKET}/tiny/{name}", "http": f"{http_endpoint}/{name}"}


def _mirror(url: str, tmp_path: Path, **store: object) -> Path:
    return mirror_metadata(url, StoreConfig(**store), cache_dir=tmp_path / "cache")  # type: ignore[arg-type]


def _crops(plate: Path, decode: str) -> list[np.ndarray]:
    reader = open_plate(plate, decode)
    channels = np.array([3, 0])
    crops = [reader.read_region(*window) for window in WINDOWS]
    crops.append(reader.read_region(*WINDOWS[1], channels=channels))
    reader.close()
    return crops


@pytest.mark.parametrize("scheme", ["s3", "http"])
@pytest.mark.parametrize("path", ["direct", "field", "zarr-obstore", "zarr-fsspec"])
def test_every_read_path_returns_the_local_plates_bytes(
    stored_plate: dict[str, str | Path], scheme: str, path: str, tmp_path: Path
) -> None:
    decode, _, client = path.partition("-")
    mirror = _mirror(str(stored_plate[scheme]), tmp_path, zarr_client=client or "obstore")
    expected = _crops(Path(stored_plate["local"]), decode)
    for got, want in zip(_crops(mirror, decode), expected, strict=True):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_a_mirror_holds_metadata_only_and_points_at_its_url(
    stored_plate: dict[str, str | Path], tmp_path: Path
) -> None:
    mirror = _mirror(str(stored_plate["s3"]), tmp_path)
    metadata = read_plate_metadata(mirror)
    assert metadata.extra["remote"]["url"] == stored_plate["s3"]
    names = {path.name for path in mirror.rglob("*") if path.is_file()}
    assert "zarr.json" in names and "cropbench_objects.parquet" in names
    assert not any("/c/" in path.as_posix() for path in mirror.rglob("*")), "no chunk or shard is downloaded"
    assert open_plate(mirror, "direct").files() == [], "nothing local to evict"
