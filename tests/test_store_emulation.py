"""The emulated object store: nginx with Lua delays in a network namespace behind a shaped veth."""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from cropbench.errors import ConfigError
from cropbench.measure.store_emulation import (
    SERVER_BOUND_SHARE,
    EmulatedStore,
    StoreModel,
    emulated_store,
    machine_seconds,
    namespaces,
    sweep_stale,
    unavailable,
)

needs_emulation = pytest.mark.skipif(unavailable() is not None, reason=f"{unavailable()}")


def _get(store: EmulatedStore, key: str, requests: int, byte_range: str = "bytes=0-9") -> list[bytes]:
    parts = urlsplit(store.endpoint)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port or 80, timeout=30)
    bodies = []
    for _ in range(requests):
        connection.request("GET", f"/{key}", headers={"Range": byte_range})
        response = connection.getresponse()
        assert response.status == 206
        bodies.append(response.read())
    connection.close()
    return bodies


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("www")
    (folder / "object").write_bytes(bytes(range(256)) * 16)
    return folder


def test_the_model_predicts_from_littles_law_and_its_limits() -> None:
    model = StoreModel(
        median_latency_ms=20, p99_latency_ms=20, request_rate=None, connection_mb_s=None, link_gbit_s=None
    )
    assert model.latency_sigma == 0 and model.predicted_requests_per_s(16, 40_000) == pytest.approx(800)
    tailed = StoreModel(median_latency_ms=20, p99_latency_ms=100)
    assert tailed.mean_latency_ms > 20, "a log-normal tail raises the mean above the median"
    assert tailed.predicted_requests_per_s(10_000, 1000) == 5500, "the prefix's request rate caps many in flight"
    linked = StoreModel(link_gbit_s=1, request_rate=None)
    assert linked.predicted_requests_per_s(10_000, 1_000_000) == pytest.approx(125), "1 Gbit/s moves 125 MB/s"


def test_a_model_out_of_range_is_refused_naming_the_argument() -> None:
    with pytest.raises(ConfigError, match="p99_latency_ms must be >= median_latency_ms"):
        StoreModel(median_latency_ms=50, p99_latency_ms=10)
    with pytest.raises(ConfigError, match="link_gbit_s must be > 0"):
        StoreModel(link_gbit_s=0)
    with pytest.raises(ConfigError, match="root='/no/such' is not a folder"), emulated_store(Path("/no/such")):
        pass


@needs_emulation
def test_the_store_serves_ranges_after_the_injected_latency_and_traces_each_request(served: Path) -> None:
    model = StoreModel(median_latency_ms=15, p99_latency_ms=15)
    with emulated_store(served, model) as store:
        assert store.namespace in namespaces()
        with store.window() as window:
            bodies = _get(store, "object", 3, "bytes=8-17")
    assert bodies == [bytes(range(8, 18))] * 3
    assert [(trace.key, trace.byte_range, trace.status, trace.body_bytes) for trace in window.requests] == [
        ("/object", "bytes=8-17", 206, 10)
    ] * 3
    # nginx's own clock (millisecond resolution) around each request holds the injected sleep.
    assert all(trace.end_s - trace.start_s >= 0.014 for trace in window.requests)
    assert store.namespace not in namespaces()


@needs_emulation
def test_a_window_whose_server_burns_cpu_is_flagged_server_bound(served: Path) -> None:
    burning = StoreModel(median_latency_ms=0, p99_latency_ms=0, cpu_per_request_ms=25)
    with emulated_store(served, burning) as store, store.window() as busy, ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda _: _get(store, "object", 15), range(2)))
    assert busy.server_cpu_s >= 30 * 0.025 * 0.9, "the Lua loop burns CPU time, whatever the load"
    assert busy.server_busy_share >= SERVER_BOUND_SHARE and busy.server_bound
    assert busy.machine_busy_s >= busy.server_cpu_s - 0.05 and 0 < busy.machine_busy_share <= 1
    with emulated_store(served, StoreModel(median_latency_ms=20, p99_latency_ms=40)) as store, store.window() as idle:
        _get(store, "object", 20)
    assert len(idle.requests) == 20 and not idle.server_bound, "sleeping in the event loop costs no CPU"


def test_the_machines_busy_seconds_count_what_this_process_burned() -> None:
    """Whatever else runs, the cores were busy at least while this process computed, and the seconds
    counted in all are the wall time on every core."""
    busy, total = machine_seconds()
    cpu, wall = time.process_time(), time.perf_counter()
    while time.process_time() - cpu < 0.3:
        pass
    burned, elapsed = time.process_time() - cpu, time.perf_counter() - wall
    busy_after, total_after = machine_seconds()
    assert busy_after - busy >= burned - 0.05, "clock ticks are 10 ms: a few may fall either side"
    cores = os.cpu_count() or 1
    assert (total_after - total) == pytest.approx(elapsed * cores, rel=0.25, abs=0.05 * cores)


# The child takes Ctrl-C as an interactive run does: a shell starts background jobs (a CI script run
# with `&`, say) with SIGINT ignored, and Python then installs no KeyboardInterrupt handler.
_CHILD = """
import signal, sys, time
from pathlib import Path
from cropbench.measure.store_emulation import emulated_store
signal.signal(signal.SIGINT, signal.default_int_handler)
with emulated_store(Path(sys.argv[1])) as store:
    print(store.namespace, store.nginx_pid, *store.worker_pids, flush=True)
    time.sleep(120)
"""


def _running(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    try:
        return "Z" not in stat.read_text().split(")")[1][:3]
    except OSError:
        return False


def _start_store_child(served: Path) -> subprocess.Popen[str]:
    """A process running an emulated store over ``served`` that prints its namespace and pids."""
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_CHILD), str(served)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
    )


@needs_emulation
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_run_removes_its_namespace_qdisc_and_nginx(served: Path, signum: int) -> None:
    child = _start_store_child(served)
    try:
        assert child.stdout is not None
        namespace, *pids = child.stdout.readline().split()
        assert namespace in namespaces()
        qdisc = subprocess.run(
            ["ip", "netns", "exec", namespace, "tc", "qdisc", "show"], capture_output=True, text=True
        )
        assert "tbf" in qdisc.stdout, "the link is shaped while the store runs"
        child.send_signal(signum)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert namespace not in namespaces()
    assert subprocess.run(["ip", "link", "show", f"{namespace}h"], capture_output=True).returncode != 0
    for pid in map(int, pids):
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]


@needs_emulation
def test_what_a_killed_run_left_is_swept_and_nothing_else(served: Path) -> None:
    child = _start_store_child(served)
    live = f"cbs{os.getpid()}x999"  # this module's pattern, but its process runs: not stale
    foreign = "cbsweep-foreign"  # another program's namespace: never touched
    try:
        assert child.stdout is not None
        namespace, *servers = child.stdout.readline().split()
        child.kill()  # SIGKILL: no teardown runs, so the namespace, its veth and scratch folders outlive it
        child.wait()
        # nginx dies with its parent at once (the kernel ends its process namespace), sweep or not.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_running(int(pid)) for pid in servers):
            time.sleep(0.05)
        assert not any(_running(int(pid)) for pid in servers), "nginx outlived the process that started it"
        assert namespace in namespaces()
        left = sorted(Path(tempfile.gettempdir()).glob(f"cropbench-*-{child.pid}-*"))
        assert left, "a killed run leaves its scratch folders (the served copy, nginx's folder)"
        for name in (live, foreign):
            subprocess.run(["ip", "netns", "add", name], check=True)
        removed = sweep_stale()
        assert namespace in removed and f"{namespace}h" not in namespaces()
        assert namespace not in namespaces()
        assert subprocess.run(["ip", "link", "show", f"{namespace}h"], capture_output=True).returncode != 0
        assert not any(folder.exists() for folder in left), "the next run sweeps the killed run's folders"
        assert "10251:" not in subprocess.run(["ip", "rule"], capture_output=True, text=True).stdout
        assert live in namespaces() and foreign in namespaces()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        for name in (live, foreign):
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)


@pytest.fixture
def hostile_folder(tmp_path: Path) -> Path:
    """A folder to serve whose links point at a private file beside it and at /etc."""
    folder = tmp_path / "plate"
    folder.mkdir()
    (folder / "object").write_bytes(b"served bytes")
    secret = tmp_path / "secret.txt"
    secret.write_text("private")
    secret.chmod(0o600)
    (folder / "notes.txt").symlink_to(secret)
    (folder / "etcdir").symlink_to("/etc", target_is_directory=True)
    return folder


def _status(store: EmulatedStore, key: str) -> tuple[int, bytes]:
    parts = urlsplit(store.endpoint)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port or 80, timeout=30)
    try:
        connection.request("GET", f"/{key}")
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _uid(pid: int) -> int:
    line = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Uid:"))
    return int(line.split()[1])


@needs_emulation
def test_links_in_a_served_folder_are_not_followed_and_the_workers_are_not_root(hostile_folder: Path) -> None:
    with emulated_store(hostile_folder, StoreModel(median_latency_ms=0, p99_latency_ms=0)) as store:
        assert _status(store, "object") == (200, b"served bytes")
        for key in ("notes.txt", "etcdir/shadow", "etcdir/hostname"):
            status, body = _status(store, key)
            assert status in (403, 404) and b"private" not in body and b"root:" not in body, key
        assert store.worker_pids and all(_uid(pid) != 0 for pid in store.worker_pids)
    assert (hostile_folder / "notes.txt").is_symlink(), "the served folder itself is left as it was"


_OTHER_USER = """
import encodings.idna, os, socket, sys
os.setgid(65534); os.setuid(65534)
probe = socket.socket()
probe.settimeout(5)
try:
    probe.connect((sys.argv[1], int(sys.argv[2])))
    print("connected")
except OSError as error:
    print("refused", error.errno)
"""


@needs_emulation
def test_only_the_measuring_user_reaches_the_store(served: Path) -> None:
    with emulated_store(served, StoreModel(median_latency_ms=0, p99_latency_ms=0)) as store:
        assert _status(store, "object")[0] == 200
        parts = urlsplit(store.endpoint)
        other = subprocess.run(
            [sys.executable, "-c", _OTHER_USER, parts.hostname or "", str(parts.port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert other.stdout.split()[:1] == ["refused"], other.stdout + other.stderr


@needs_emulation
def test_two_stores_started_together_get_different_subnets_and_serve_their_own_files(tmp_path: Path) -> None:
    folders = []
    for name in ("a", "b"):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "object").write_bytes(name.encode() * 8)
        folders.append(folder)
    barrier = threading.Barrier(2)
    seen: dict[str, tuple[str, bytes]] = {}

    def serve(folder: Path) -> None:
        barrier.wait(timeout=60)
        with emulated_store(folder, StoreModel(median_latency_ms=0, p99_latency_ms=0)) as store:
            barrier.wait(timeout=60)  # both run at once
            seen[folder.name] = (store.endpoint, _status(store, "object")[1])
            barrier.wait(timeout=60)

    threads = [threading.Thread(target=serve, args=(folder,)) for folder in folders]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert seen["a"][0] != seen["b"][0]
    assert seen["a"][1] == b"a" * 8 and seen["b"][1] == b"b" * 8


@needs_emulation
def test_the_request_rate_limit_holds(served: Path) -> None:
    """At 200 requests/s, 60 requests from 4 connections take at least 59 / 200 s on nginx's own clock,
    however fast the machine; without the limit they take a few milliseconds."""
    limited = StoreModel(
        median_latency_ms=0, p99_latency_ms=0, request_rate=200, connection_mb_s=None, link_gbit_s=None
    )
    with emulated_store(served, limited) as store, store.window() as window, ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: _get(store, "object", 15), range(4)))
    assert len(window.requests) == 60
    span = max(trace.end_s for trace in window.requests) - min(trace.start_s for trace in window.requests)
    assert span >= 59 / 200 * 0.9, f"60 requests in {span:.3f} s: {60 / span:.0f} requests/s against a limit of 200"


def test_root_without_the_capabilities_gets_one_line_naming_them(monkeypatch: pytest.MonkeyPatch) -> None:
    import cropbench.measure.store_emulation as emulation

    monkeypatch.setattr(emulation.os, "geteuid", lambda: 0)
    monkeypatch.setattr(emulation, "_effective_capabilities", lambda: 0)
    monkeypatch.setattr(emulation, "nginx_binary", lambda: "/usr/sbin/nginx")
    monkeypatch.setattr(emulation.shutil, "which", lambda name: f"/usr/sbin/{name}")
    monkeypatch.setattr(emulation, "NGINX_MODULES", Path(__file__).parent)
    monkeypatch.setattr(emulation, "LUA_MODULES", (Path(__file__).name,))
    reason = emulation.unavailable()
    assert reason is not None and "CAP_NET_ADMIN" in reason and "CAP_SYS_ADMIN" in reason and "\n" not in reason
    with pytest.raises(ConfigError, match="cannot run: root here lacks CAP_NET_ADMIN"), emulated_store(Path(".")):
        pass


def test_compare_formats_that_asks_for_the_store_and_cannot_have_it_exits_non_zero(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import cropbench.measure.store_emulation as emulation
    from cropbench.cli import main

    monkeypatch.setattr(emulation, "unavailable", lambda: "network namespaces need root")
    code = main(["compare-formats", "--plate", str(tmp_path), "--latency-ms", "20", "--out", str(tmp_path / "out")])
    said = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and said == [
        "cropbench: error: --latency-ms 20 reads over the emulated store, which cannot run here: "
        "network namespaces need root"
    ]


@needs_emulation
@pytest.mark.parametrize("decode", ["direct", "field", "zarr"])
def test_every_read_path_counts_the_requests_the_server_answered(tiny_plate: Path, tmp_path: Path, decode: str) -> None:
    """The reader's own request and byte counts (what a row over a store records) are the server's log."""
    from cropbench.config import StoreConfig
    from cropbench.formats import open_plate
    from cropbench.formats.sources import mirror_metadata
    from cropbench.measure.store_emulation import emulated_plate

    model = StoreModel(median_latency_ms=0, p99_latency_ms=0)
    with emulated_plate(tiny_plate, model) as (store, url):
        mirror = mirror_metadata(url, StoreConfig(), cache_dir=tmp_path / "mirror")
        reader = open_plate(mirror, decode, 0)
        with store.window() as window:
            for field_index, y, x in ((0, 10, 20), (1, 40, 8), (0, 70, 90)):
                reader.read_region(field_index, y, y + 24, x, x + 24)
        reader.close()
    # zarr-python asks for absent chunks too (404: the fill value), and reads array metadata lazily.
    assert window.requests and all(trace.status in (200, 206, 404) for trace in window.requests)
    answered = [(trace.method, trace.key, trace.byte_range, trace.status) for trace in window.requests]
    assert reader.stats.reads == len(window.requests), f"every request the server answered is counted: {answered}"
    assert reader.stats.bytes_fetched == sum(trace.body_bytes for trace in window.requests if trace.status < 300)
