"""Plates in an object store: a real S3 endpoint (moto's server) and a real HTTP server (nginx) on
loopback, both started here and stopped after. Every read path returns the local plate's bytes;
the direct path's requests are coalesced and its shard indexes fetched once; bad input is one
line naming the URL."""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import TEST_LAYOUTS, TINY_SPEC
from torch.utils.data import DataLoader

from cropbench import api
from cropbench import metrics as m
from cropbench.cli import main
from cropbench.config import LAYOUTS, CropConfig, CropOverrides, StoreConfig
from cropbench.data.dataset import CropDataset
from cropbench.data.loader import batch_collate
from cropbench.errors import ConfigError, StoreError
from cropbench.formats import DirectChunkReader, open_plate, read_plate_metadata
from cropbench.formats.sources import mirror_metadata, object_store, upload_plate, write_index
from cropbench.harness.context import RunContext
from cropbench.harness.dataset_case import DatasetCase
from cropbench.harness.runner import plan
from cropbench.measure import endpoints
from cropbench.objects import ObjectTable, read_object_table
from cropbench.plates.generate import generate_plate
from cropbench.records import RESULTS_NAME, parse_record, read_records
from cropbench.tracks.dataset import Dataset

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
    with endpoints.loopback_s3(BUCKET) as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, tiny_plate: Path) -> Path:
    """The folder nginx serves (a private copy, taken when it starts): a probe object and the tiny plate."""
    folder = tmp_path_factory.mktemp("www")
    (folder / "probe.bin").write_bytes(bytes(range(64)))
    shutil.copytree(tiny_plate, folder / "compare.zarr")
    write_index(folder / "compare.zarr")
    return folder


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
) -> Iterator[dict[str, str | Path]]:
    """One tiny plate per layout: on disk, in the S3 bucket, and served over HTTP."""
    if endpoints.nginx_binary() is None:
        pytest.skip("nginx is not installed: apt-get install -y nginx")
    name = f"{request.param}.zarr"
    local = tmp_path_factory.mktemp("remote-plates") / name
    generate_plate(local, TINY_SPEC, REMOTE_LAYOUTS[request.param], progress=False)
    upload_plate(local, f"s3://{BUCKET}/tiny/{name}")
    with endpoints.http_plate(local) as url:
        yield {"local": local, "s3": f"s3://{BUCKET}/tiny/{name}", "http": url}


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
    assert metadata.remote is not None and metadata.remote["url"] == stored_plate["s3"]
    names = {path.name for path in mirror.rglob("*") if path.is_file()}
    assert "zarr.json" in names and "cropbench_objects.parquet" in names
    assert not any("/c/" in path.as_posix() for path in mirror.rglob("*")), "no chunk or shard is downloaded"
    assert open_plate(mirror, "direct").files() == [], "nothing local to evict"


class _TwoCases(Dataset):
    """Track 1 with one small random case per read path, so a run over the store takes seconds."""

    def cases(self, preset: str, context: RunContext) -> list[DatasetCase]:
        crop = CropConfig(chunk_cache_bytes=0)
        return [
            DatasetCase(crop=crop.replace(decode=decode), samples=12, warmup=2, cold_samples=2)
            for decode in ("direct", "zarr")
        ]


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Mirrors under the test's folder, not the user's cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg"


@pytest.mark.slow
def test_upload_then_run_by_url_with_injected_latency(
    s3_endpoint: str, tiny_plate: Path, tmp_path: Path, cache_home: Path
) -> None:
    url = f"s3://{BUCKET}/cli/tiny.zarr"
    assert main(["upload", str(tiny_plate), url]) == 0
    store = StoreConfig(latency_ms=5, in_flight=4)
    records = api.run(url, [_TwoCases()], out_dir=tmp_path / "out", store=store)
    assert [r.config["crop"]["decode"] for r in records] == ["direct", "zarr"]
    for record in records:
        assert record.config["plate"] == url
        assert record.config["store"]["latency_ms"] == 5 and record.config["store"]["in_flight"] == 4
        assert record.metrics[m.INJECTED_LATENCY_MS] == 5 and record.metrics[m.IN_FLIGHT] == 4
        assert record.metrics[m.REQUESTS_PER_CROP] > 0 and record.metrics[m.BYTES_TRANSFERRED_PER_CROP] > 0
        assert record.metrics[m.SERVER_REQUESTS_PER_S] > 0, "a loopback server's own ceiling, once per run"
        assert not record.metrics[m.EVICTION_VERIFIED], "nothing local to evict"
        assert "not-evicted" not in record.metrics[m.VALIDITY_FLAGS]
    local = api.run(tiny_plate, [_TwoCases()])
    assert [r.metrics["fidelity_sha256"] for r in records] == [r.metrics["fidelity_sha256"] for r in local]


def test_the_delay_proxy_adds_its_latency_to_every_request(http_endpoint: str) -> None:
    import http.client

    with endpoints.delay_proxy(http_endpoint, latency_ms=40) as proxy:
        host, port = proxy.removeprefix("http://").split(":")
        connection = http.client.HTTPConnection(host, int(port))
        for _ in range(3):
            began = time.perf_counter()
            connection.request("GET", "/probe.bin", headers={"Range": "bytes=8-17"})
            response = connection.getresponse()
            assert response.status == 206 and response.read() == bytes(range(8, 18)), "nginx serves byte ranges"
            assert time.perf_counter() - began >= 0.04
        connection.close()
    assert endpoints.request_ceiling(f"{http_endpoint}/probe.bin", seconds=0.3, threads=2) > 0


def test_direct_reads_a_crop_in_one_coalesced_request_and_each_shard_index_once(
    s3_endpoint: str, tiny_plate: Path, tmp_path: Path
) -> None:
    url = f"s3://{BUCKET}/requests/tiny.zarr"
    upload_plate(tiny_plate, url)
    windows = [(field, y, y + 96, x, x + 96) for field in range(4) for y, x in ((0, 0), (50, 70), (104, 144))]
    counts = {}
    for gap in (0, StoreConfig().coalesce_gap_bytes):
        reader = DirectChunkReader(read_plate_metadata(_mirror(url, tmp_path, coalesce_gap_bytes=gap)), 0)
        for window in windows:
            reader.read_region(*window)
        counts[gap] = reader.source.requests
        assert reader.stats.reads == reader.source.requests
    shards = 4  # one per field in the default layout: each index fetched once
    assert counts[StoreConfig().coalesce_gap_bytes] == len(windows) + shards
    assert counts[0] > counts[StoreConfig().coalesce_gap_bytes], "without coalescing a crop needs several requests"


# Bad input: one line naming the URL, exit 2, no hang.


def _run_cli(*args: str) -> tuple[int, str]:
    result = subprocess.run(
        [sys.executable, "-m", "cropbench", *args], capture_output=True, text=True, timeout=120, check=False
    )
    return result.returncode, result.stderr


def _one_line_error(code: int, stderr: str, *expected: str) -> None:
    assert code == 2, stderr
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert stderr.startswith("cropbench: error:")
    for text in expected:
        assert text in stderr, stderr


@pytest.mark.slow
def test_unreachable_and_silent_endpoints_fail_in_one_line_within_the_timeout(
    s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"s3://{BUCKET}/tiny.zarr"
    knobs = ["--retries", "0", "--timeout", "1", "--connect-timeout", "1", "--no-progress", "--out", str(tmp_path)]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{endpoints.free_port()}")
    _one_line_error(*_run_cli("run", "--plate", url, *knobs), url, "cannot connect")
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{silent.getsockname()[1]}")
        _one_line_error(*_run_cli("run", "--plate", url, *knobs), url, "timed out")


@pytest.mark.slow
def test_missing_bucket_key_and_plate_fail_in_one_line(
    s3_endpoint: str, http_endpoint: str, tiny_plate: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    out = ["--no-progress", "--out", str(tmp_path)]
    _one_line_error(*_run_cli("run", "--plate", "s3://no-such-bucket/p.zarr", *out), "no-such-bucket", "no such")
    _one_line_error(*_run_cli("run", "--plate", f"s3://{BUCKET}/absent.zarr", *out), "absent.zarr", "no objects")
    _one_line_error(*_run_cli("run", "--plate", f"{http_endpoint}/absent.zarr", *out), "absent.zarr", "not found")
    _one_line_error(*_run_cli("upload", str(tiny_plate), "s3://no-such-bucket/p.zarr"), "no-such-bucket", "no such")


@pytest.mark.slow
def test_wrong_credentials_fail_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A server that checks signatures: after its first unauthenticated action (creating the bucket),
    # every request needs a known key.
    with endpoints.s3_server(environment={"INITIAL_NO_AUTH_ACTION_COUNT": "1"}) as endpoint:
        endpoints.create_bucket(endpoint, BUCKET)
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGWRONGWRONG1")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
        url = f"s3://{BUCKET}/tiny.zarr"
        code, stderr = _run_cli("run", "--plate", url, "--retries", "0", "--no-progress", "--out", str(tmp_path))
        _one_line_error(code, stderr, url)
        assert "AWS_ACCESS_KEY_ID" in stderr


@pytest.mark.parametrize("decode", ["direct", "zarr"])
def test_a_truncated_shard_is_an_error_naming_its_url(
    s3_endpoint: str, tiny_plate: Path, tmp_path: Path, decode: str
) -> None:
    import obstore

    url = f"s3://{BUCKET}/truncated-{decode}/tiny.zarr"
    upload_plate(tiny_plate, url)
    metadata = read_plate_metadata(_mirror(url, tmp_path, retries=0))
    shard = f"{metadata.fields[0].path}/c/0/0/0"
    store = object_store(url, StoreConfig())
    whole = bytes(obstore.get(store, shard).bytes())
    obstore.put(store, shard, whole[: len(whole) // 3])  # the index at the end is gone
    with pytest.raises(StoreError) as error:
        open_plate(_mirror(url, tmp_path, retries=0), decode).read_region(0, 0, 96, 0, 96)
    assert f"{url}/{metadata.fields[0].path}" in str(error.value) and "\n" not in str(error.value)


@pytest.mark.slow
def test_a_server_that_stops_mid_run_keeps_the_finished_rows(
    tiny_plate: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    with endpoints.loopback_s3(BUCKET) as endpoint, endpoints.delay_proxy(endpoint, 0) as proxy:
        url = f"s3://{BUCKET}/stops/tiny.zarr"
        upload_plate(tiny_plate, url)
        stopped = []

        def stop_after_first_row(message: str, record: object) -> None:
            if record is not None and not stopped:
                stopped.append(record)
                endpoints.stop_server(endpoint)

        store = StoreConfig(retries=0, timeout_s=2, connect_timeout_s=1, endpoint=proxy)
        with pytest.raises(StoreError) as error:
            api.run(url, [_TwoCases()], out_dir=tmp_path / "out", store=store, progress=stop_after_first_row)
    assert url in str(error.value) and "\n" not in str(error.value)
    kept = read_records(tmp_path / "out" / RESULTS_NAME)
    assert len(kept) == 1 and kept[0].config["crop"]["decode"] == "direct"


@pytest.mark.slow
@pytest.mark.parametrize("path", ["direct", "zarr-fsspec", "zarr-obstore"])
def test_forked_dataloader_workers_read_a_plate_in_a_store(
    s3_endpoint: str, tiny_plate: Path, tmp_path: Path, path: str
) -> None:
    decode, _, client = path.partition("-")
    url = f"s3://{BUCKET}/workers-{path}/tiny.zarr"
    upload_plate(tiny_plate, url)
    mirror = _mirror(url, tmp_path, zarr_client=client or "fsspec", retries=0, timeout_s=5)
    config = CropConfig(decode=decode, dtype="uint16")
    remote, local = CropDataset(mirror, config), CropDataset(tiny_plate, config)
    remote[0]  # the parent reads first, as Track 1 does before Track 2 forks its workers
    order = list(range(0, len(local), 3))

    def batches(dataset: CropDataset) -> list[torch.Tensor]:
        loader = DataLoader(
            dataset,
            batch_size=8,
            sampler=order,
            num_workers=2,
            collate_fn=batch_collate,
            multiprocessing_context="fork",
            timeout=60,
        )
        return [batch["image"] for batch in loader]

    if client == "obstore":  # its runtime does not survive fork: an error that says so, not a hang
        with pytest.raises(Exception, match="forked DataLoader worker"):
            batches(remote)
        return
    for got, want in zip(batches(remote), batches(local), strict=True):
        assert torch.equal(got, want)


# The asv suite over a loopback HTTP server (benchmarks/remote.py).


def _store_suite() -> type:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks import remote as remote_suite

    return remote_suite.Store


def test_the_asv_store_suite_counts_the_same_requests_each_call_and_stops_its_server(tiny_plate: Path) -> None:
    if endpoints.nginx_binary() is None:
        pytest.skip("nginx is not installed: apt-get install -y nginx")
    suite = _store_suite()()
    plates = {"default": str(tiny_plate)}
    suite.setup(plates, "direct")
    try:
        url = read_plate_metadata(suite.mirror).remote["url"]  # type: ignore[index]
        requests = suite.track_requests_per_crop(plates, "direct")
        assert requests == suite.track_requests_per_crop(plates, "direct"), "a count, not a time"
        assert 0 < requests <= 1.5, "coalesced ranges and a cached shard index: about one request per crop"
        assert suite.track_bytes_per_crop(plates, "direct") == suite.track_bytes_per_crop(plates, "direct") > 0
        assert suite.track_relative_cost(plates, "direct") > 0
    finally:
        suite.teardown(plates, "direct")
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{url}/zarr.json", timeout=2)


def test_the_asv_store_suite_skips_naming_what_is_missing(tiny_plate: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    suite = _store_suite()
    monkeypatch.setattr(sys.modules["benchmarks.remote"], "nginx_binary", lambda: None)
    with pytest.raises(NotImplementedError, match="nginx is not installed"):
        suite().setup({"default": str(tiny_plate)}, "direct")
    monkeypatch.setitem(sys.modules["benchmarks.remote"].CLIENT_PACKAGES, "direct", ("no_such_http_client",))
    with pytest.raises(NotImplementedError, match="needs no_such_http_client"):
        suite().setup({"default": str(tiny_plate)}, "direct")


# compare-layouts --plate URL: each layout served on loopback, requests/crop and crops/s.


@pytest.mark.slow
def test_compare_layouts_by_url_reports_requests_and_crops_per_s_per_layout(
    s3_endpoint: str,
    http_endpoint: str,
    tiny_plate: Path,
    tmp_path: Path,
    cache_home: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from cropbench.measure.store_emulation import unavailable

    emulation_reason = unavailable()
    s3_url = f"s3://{BUCKET}/compare/tiny.zarr"
    upload_plate(tiny_plate, s3_url)
    for url, layouts in ((f"{http_endpoint}/compare.zarr", ["default", "tiles"]), (s3_url, ["tiles"])):
        out = tmp_path / url.split(":")[0]
        args = ["compare-layouts", "--plate", url, "--samples", "40", "--latency-ms", "1", "--out", str(out)]
        assert main([*args, *(f"--layout={name}" for name in layouts), "--no-progress"]) == 0
        lines = (out / "results.jsonl").read_text().splitlines()
        records = [parse_record(line) for line in lines]
        assert [r.case for r in records] == layouts and {r.track for r in records} == {"store-layouts"}
        for record in records:
            row = record.metrics
            assert record.config["plate"] == url and row[m.INJECTED_LATENCY_MS] == 1 and row[m.LAYOUT] == record.case
            assert all(m.catalogued(key) for key in row)
            for prefix in (m.DIRECT_, m.ZARR_):
                assert row[prefix + m.REQUESTS_PER_CROP] > 0 and row[prefix + m.BYTES_TRANSFERRED_PER_CROP] > 0
                assert row[prefix + m.SAMPLES_PER_S] > 0 and row[prefix + m.LOCAL_SAMPLES_PER_S] > 0
            # the local reads went through the cache the store's reader grew to read ahead
            holds = row[m.DIRECT_ + m.CACHE_FRACTION_OF_PLATE] >= 1
            assert row[m.DIRECT_ + m.READER_CACHE_BYTES] > 0 and m.ZARR_ + m.READER_CACHE_BYTES not in row
            assert ("cache>=plate" in row.get(m.VALIDITY_FLAGS, [])) == holds
            if emulation_reason is None:  # the emulated store served it: its model and the server's shares
                assert row[m.STORE_MODEL]["median_latency_ms"] == 1 and m.STORE_EMULATION_SKIP_REASON not in row
                assert all(
                    row[prefix + m.SERVER_BUSY_SHARE] >= 0 and prefix + m.SERVER_BOUND in row
                    for prefix in (m.DIRECT_, m.ZARR_)
                )
            else:  # the row says why the delay proxy stood in
                assert row[m.STORE_EMULATION_SKIP_REASON] == emulation_reason and m.STORE_MODEL not in row
        assert not (out / "plates").exists(), "converted layouts are removed unless --keep"
        printed = capsys.readouterr().out
        assert "req/crop" in printed and ("delay proxy" in printed) == (emulation_reason is not None)


@pytest.mark.slow
def test_compare_layouts_with_a_bad_url_fails_in_one_line(
    s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    out = ["--no-progress", "--out", str(tmp_path), "--retries", "0", "--connect-timeout", "1"]
    for url, why in (
        ("s3://no-such-bucket/p.zarr", "no such"),
        (f"s3://{BUCKET}/absent.zarr", "no objects"),
        (f"http://127.0.0.1:{endpoints.free_port()}/p.zarr", "cannot connect"),
    ):
        _one_line_error(*_run_cli("compare-layouts", "--plate", url, *out), url.split("/")[2], why)


@pytest.mark.slow
def test_compare_layouts_by_url_refuses_options_it_would_ignore(tmp_path: Path) -> None:
    for flag, value in (("--decode", "zarr"), ("--repeats", "5"), ("--objects", "objects.csv")):
        args = ("compare-layouts", "--plate", "s3://bucket/p.zarr", flag, value, "--out", str(tmp_path))
        _one_line_error(*_run_cli(*args), "s3://bucket/p.zarr", flag, "local plate only")
    assert not any(tmp_path.iterdir()), "nothing is written before the error"


def test_compare_layouts_by_url_keeps_plates_it_did_not_write(
    s3_endpoint: str, tiny_plate: Path, tmp_path: Path, cache_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cropbench.report import tables
    from cropbench.tracks import store_layouts

    url = f"s3://{BUCKET}/keep/tiny.zarr"
    upload_plate(tiny_plate, url)
    work = tmp_path / "work"
    kept = work / "tiles" / "mine.txt"
    kept.parent.mkdir(parents=True)
    kept.write_text("a user's file")
    measured: list[Path] = []

    def count_only(context: object, plate: Path, *_: object) -> dict[str, object]:
        measured.append(plate)
        return {m.STORED_MIB: 1.0}

    monkeypatch.setattr(store_layouts, "layout_over_store", count_only)
    monkeypatch.setattr(tables, "layouts_table", lambda records: "")
    args = ["compare-layouts", "--plate", url, "--work", str(work), "--out", str(tmp_path / "out"), "--no-progress"]
    assert main([*args, "--layout=default", "--layout=tiles"]) == 0
    assert kept.read_text() == "a user's file", "a folder that was there before is left alone"
    assert sorted(p.name for p in work.iterdir()) == ["tiles"], "what the run wrote is removed without --keep"
    assert [p.name for p in measured] == ["default", "tiles"] and measured[1].parent != work
    lines = (tmp_path / "out" / "results.jsonl").read_text().splitlines()
    assert [parse_record(line).case for line in lines] == ["default", "tiles"]


@pytest.mark.slow
def test_the_remote_track_counts_requests_and_times_the_loader_beside_the_local_plate(
    s3_endpoint: str, tiny_plate: Path, tmp_path: Path, cache_home: Path
) -> None:
    url = f"s3://{BUCKET}/track/tiny.zarr"
    upload_plate(tiny_plate, url)
    records = api.run(url, ["remote"], out_dir=tmp_path, samples=64, local_plate=tiny_plate)
    assert [r.case for r in records] == ["direct/w0/b32", "direct/w2/b32", "zarr/w0/b32", "zarr/w2/b32"]
    for record in records:
        assert record.metrics[m.REQUESTS_PER_CROP] > 0 and record.metrics[m.SAMPLES_PER_S] > 0
        assert record.metrics[m.RATIO_TO_LOCAL] > 0
        # The local reference read through the cache the store's reader held (configured up front).
        assert record.config["cache_bytes"] == record.metrics.get(m.READER_CACHE_BYTES)
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    assert [parse_record(line).case for line in lines] == [r.case for r in records]


@pytest.mark.slow
def test_a_run_by_url_beside_its_local_plate_carries_the_ratio_to_local(
    s3_endpoint: str, tiny_plate: Path, cache_home: Path
) -> None:
    url = f"s3://{BUCKET}/ratio/tiny.zarr"
    upload_plate(tiny_plate, url)
    records = api.run(url, [_TwoCases()], local_plate=tiny_plate)
    assert [r.config["crop"]["decode"] for r in records] == ["direct", "zarr"]
    for record in records:
        local = record.metrics[m.LOCAL_SAMPLES_PER_S]
        assert local > 0
        assert record.metrics[m.RATIO_TO_LOCAL] == pytest.approx(record.metrics[m.SAMPLES_PER_S] / local)
    alone = api.run(url, [_TwoCases()])[0].metrics
    assert m.RATIO_TO_LOCAL not in alone, "no local plate, no ratio"
    assert m.SERVER_REQUESTS_PER_S not in alone, "no injected latency: the endpoint may be a real store"
    with pytest.raises(ConfigError, match="already local"):
        api.run(tiny_plate, [_TwoCases()], local_plate=tiny_plate)


def test_a_mirror_keeps_the_endpoint_it_was_made_with(
    s3_endpoint: str, tiny_plate: Path, cache_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Forkserver workers inherit the environment their server process started with, which may lack
    # AWS_ENDPOINT_URL: a reader opened on the mirror must still ask the server the mirror came from.
    url = f"s3://{BUCKET}/endpoint/tiny.zarr"
    upload_plate(tiny_plate, url)
    mirror = mirror_metadata(url)
    expected = open_plate(tiny_plate, "direct").read_region(0, 0, 16, 0, 16)
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    np.testing.assert_array_equal(open_plate(mirror, "direct").read_region(0, 0, 16, 0, 16), expected)


def test_the_remote_track_over_a_local_plate_writes_no_request_counts(tiny_plate: Path, tmp_path: Path) -> None:
    """A plate on local disk makes no requests: its rows carry no count rather than a count of zero."""
    from cropbench.tracks.remote import Remote

    records = api.run(tiny_plate, [Remote(workers=(0,))], out_dir=tmp_path, samples=32)
    assert {r.config["decode"] for r in records} == {"direct", "zarr"}
    for record in records:
        assert m.REQUESTS_PER_CROP not in record.metrics and m.BYTES_TRANSFERRED_PER_CROP not in record.metrics
        assert record.metrics[m.SAMPLES_PER_S] > 0


def test_the_remote_tracks_chunk_cache_is_sized_for_the_crop_size_the_run_reads(
    tiny_plate: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--crop-size reaches the cache the store's reader is given, not only the crops: the cache is sized
    for the crops read ahead, so one sized for the built-in crop would hold too little or too much."""
    import cropbench.tracks.remote as remote_track

    def sized(context: RunContext, decode: str, batch_size: int, crop_size: int) -> int:
        return batch_size * crop_size

    monkeypatch.setattr(remote_track, "read_ahead_cache_bytes", sized)
    track = remote_track.Remote(workers=(0,), batch_size=4)
    context = RunContext(tiny_plate, overrides=CropOverrides(crop_size=48))
    planned = plan([track], "smoke", context)
    assert planned and all(p.case.crop_size == 48 and p.case.cache_bytes == 4 * 48 for p in planned)
    built_in = plan([track], "smoke", RunContext(tiny_plate))
    assert all(p.case.cache_bytes == 4 * track.crop_size for p in built_in)


def test_compare_layouts_over_a_store_reads_with_the_store_settings_given(
    tiny_plate: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--timeout, --retries, --zarr-client and --anonymous reach the measured reads, not a fresh default."""
    import cropbench.formats.sources as sources
    from cropbench.tracks.store_layouts import StoreLayoutComparison, layout_over_store

    given = StoreConfig(timeout_s=7.5, retries=5, zarr_client="obstore", anonymous=True, in_flight=3)
    settings = StoreLayoutComparison(latency_ms=4, in_flight=9, store=given)
    used: list[StoreConfig] = []

    class Seen(Exception):
        pass

    def mirror(url: str, store: StoreConfig, cache: Path) -> Path:
        used.append(store)
        raise Seen

    @contextlib.contextmanager
    def serve(plate: Path) -> Iterator[str]:
        yield "http://127.0.0.1:9/tiny.zarr"

    monkeypatch.setattr(sources, "mirror_metadata", mirror)
    with pytest.raises(Seen):
        layout_over_store(RunContext(tiny_plate), tiny_plate, serve, settings, tmp_path)
    assert used == [dataclasses.replace(given, in_flight=9, latency_ms=0.0)]
    assert settings.reads(4.0) == dataclasses.replace(given, in_flight=9, latency_ms=4.0)


def test_the_remote_tracks_reads_use_the_runs_object_table(
    s3_endpoint: str, tiny_plate: Path, tmp_path: Path, cache_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--objects reaches both of the remote track's reads: the request count and the loader's crops/s."""
    import cropbench.harness.loader_case as loader_case
    import cropbench.tracks.remote as remote_track

    url = f"s3://{BUCKET}/objects/tiny.zarr"
    upload_plate(tiny_plate, url)
    table = read_object_table(tiny_plate)
    every_other = ObjectTable.from_columns(
        well=table.well[::2], field=table.field[::2], centroid_y=table.centroid_y[::2], centroid_x=table.centroid_x[::2]
    )
    every_other.write(tmp_path / "cells.parquet")
    counted: list[int] = []
    loaded: list[int] = []
    count, run_case = remote_track.count_requests, loader_case.run_case

    def counting(dataset: CropDataset, *args: Any, **kwargs: Any) -> dict[str, float]:
        counted.append(len(dataset))
        return count(dataset, *args, **kwargs)

    def loading(context: RunContext, case: loader_case.LoaderCase, **kwargs: Any) -> dict[str, Any]:
        loaded.append(len(context.dataset(case.crop)))
        return run_case(context, case, **kwargs)

    monkeypatch.setattr(remote_track, "count_requests", counting)
    monkeypatch.setattr(loader_case, "run_case", loading)
    records = api.run(
        url, [remote_track.Remote(workers=(0,))], samples=48, objects=tmp_path / "cells.parquet", local_plate=tiny_plate
    )
    assert len(records) == 2 and all(r.metrics[m.REQUESTS_PER_CROP] > 0 for r in records)
    objects = len(CropDataset(tiny_plate, CropConfig(), objects=tmp_path / "cells.parquet"))
    assert objects < len(CropDataset(tiny_plate, CropConfig()))
    assert counted == [objects, objects]
    assert loaded and set(loaded) == {objects}, "the store's and the local plate's reads alike"
