"""Byte sources against hostile input: a loopback HTTP server (started and stopped here, bounded in
time) that drips, lists forever, answers garbage or names keys outside the plate, and local files
that are not regular files. Every case ends in a one-line typed error within its deadline."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from cropbench import api
from cropbench.cli import main
from cropbench.config import CropConfig, StoreConfig
from cropbench.errors import ConfigError, CropbenchError, StoreError
from cropbench.formats import sources
from cropbench.formats.sources import (
    REMOTE_POINTER,
    FileSource,
    RemoteSource,
    is_url,
    mirror_metadata,
    split_url,
    write_index,
)
from cropbench.harness.dataset_case import DatasetCase
from cropbench.tracks.dataset import Dataset

#: Seconds a hostile-server case may take at most (its deadline is well under this).
CASE_LIMIT_S = 6.0


class Hostile:
    """What the loopback server answers: ``respond(handler)`` writes one whole response."""

    def __init__(self) -> None:
        self.respond: Callable[[BaseHTTPRequestHandler], None] = send(200, b"")
        self.requests: list[str] = []
        self.stop = threading.Event()
        #: Keep a connection open after a response (HTTP/1.1) instead of closing it (HTTP/1.0). A response
        #: that says HTTP/1.1 and is then closed races the client's reuse of the connection.
        self.keep_alive = False


def send(status: int, body: bytes, content_type: str = "application/octet-stream") -> Callable[[Any], None]:
    def respond(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    return respond


@contextlib.contextmanager
def serve(state: Hostile, tls: ssl.SSLContext | None = None) -> Iterator[str]:
    """A loopback HTTP server answering as ``state.respond`` says (over TLS with ``tls``); its URL.
    Stopped (any drip ended) on exit."""

    class Handler(BaseHTTPRequestHandler):
        def setup(self) -> None:
            self.protocol_version = "HTTP/1.1" if state.keep_alive else "HTTP/1.0"
            super().setup()

        def do_GET(self) -> None:
            state.requests.append(self.path)
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                state.respond(self)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        state.stop.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def hostile() -> Iterator[tuple[Hostile, str]]:
    """A loopback HTTP server whose answers the test sets; stopped after the test."""
    state = Hostile()
    with serve(state) as endpoint:
        yield state, endpoint


def drip(state: Hostile, headers_too: bool = False, interval_s: float = 1.0) -> Callable[[Any], None]:
    """A 100-byte body (or its headers too) sent one byte every ``interval_s``."""

    def respond(handler: BaseHTTPRequestHandler) -> None:
        head = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"
        if not headers_too:
            handler.wfile.write(head)
            head = b""
        for byte in head + b"x" * 100:
            if state.stop.wait(interval_s):
                return
            handler.wfile.write(bytes([byte]))
            handler.wfile.flush()

    return respond


def bounded(
    call: Callable[[], object], limit_s: float = CASE_LIMIT_S, release: Path | None = None
) -> tuple[BaseException | None, float]:
    """Run ``call`` on a thread; (what it raised or None, seconds taken); fails the test past ``limit_s``.

    ``release`` is a FIFO: a reader still blocked opening it then is let go (a writer opened without
    blocking), so a hang fails the test instead of leaving a thread stuck for the rest of the run.
    """
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as error:
            outcome.append(error)

    started = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit_s)
    elapsed = time.monotonic() - started
    if not outcome and release is not None:
        with contextlib.suppress(OSError):
            os.close(os.open(release, os.O_WRONLY | os.O_NONBLOCK))
    assert outcome, f"still running after {limit_s} s"
    return outcome[0], elapsed


def make_special(path: Path, kind: str) -> Path:
    """Put a FIFO, a link to ``/dev/zero`` or a folder at ``path`` (replacing a file there)."""
    if path.is_file() or path.is_symlink():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()
    return path


def _s3(endpoint: str, **store: Any) -> RemoteSource:
    return RemoteSource("s3://bucket/plate", StoreConfig(endpoint=endpoint, anonymous=True, **store))


def listing(keys: list[str], token: str = "") -> bytes:
    entries = "".join(f"<Contents><Key>plate/{key}</Key><Size>2</Size></Contents>" for key in keys)
    more = f"<IsTruncated>true</IsTruncated><NextContinuationToken>{token}</NextContinuationToken>" if token else ""
    return f'<?xml version="1.0"?><ListBucketResult>{entries}{more}</ListBucketResult>'.encode()


def fetch(source: RemoteSource, how: str) -> bytes | None:
    """The plate's ``zarr.json`` read alone (``one``: a blocking request) or beside a second read of it
    (``many``: both in flight together on non-blocking sockets); the two reads must agree."""
    if how == "one":
        return source.get("zarr.json")
    first, second = source.get_many([("zarr.json", 0, -1), ("zarr.json", 0, -1)])
    assert first == second
    return first


#: A request alone, or several in flight together (each path of the client).
HOW = pytest.mark.parametrize("how", ["one", "many"])


# --- URLs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["http://[::1/p.zarr", "s3://[bucket/p.zarr", "https://host:port/p.zarr"])
def test_a_malformed_url_is_a_config_error_naming_it(url: str) -> None:
    with pytest.raises(ConfigError, match=r"plate URL .* is not"):
        is_url(url)
    with pytest.raises(ConfigError, match=r"plate URL .* is not"):
        split_url(url)


def test_the_cli_refuses_a_malformed_url_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "--plate", "http://[::1/p.zarr", "--out", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("cropbench: error:") and "[::1" in err[0], err


# --- deadlines ----------------------------------------------------------------------------------


@HOW
@pytest.mark.parametrize("headers_too", [False, True], ids=["body", "headers"])
@pytest.mark.parametrize("retries", [0, 1])
def test_a_server_sending_a_byte_a_second_ends_within_the_deadline(
    hostile: tuple[Hostile, str], headers_too: bool, retries: int, how: str
) -> None:
    state, endpoint = hostile
    state.respond = drip(state, headers_too, interval_s=0.5)
    source = RemoteSource(f"{endpoint}/p.zarr", StoreConfig(timeout_s=1.0, retries=retries))
    error, elapsed = bounded(lambda: fetch(source, how))
    source.close()
    assert isinstance(error, StoreError) and "timed out" in str(error), error
    assert "\n" not in str(error) and "/p.zarr/zarr.json" in str(error)
    # Without a whole-request deadline the drip takes 50 s or more (a byte every 0.5 s never trips a
    # per-read timeout); the margin over the deadline leaves room for a busy machine's scheduling.
    assert elapsed < (retries + 1) * 1.0 + 10, f"took {elapsed:.1f} s with timeout_s=1 and {retries} retries"


@HOW
def test_a_slow_but_whole_answer_within_the_deadline_is_read(hostile: tuple[Hostile, str], how: str) -> None:
    state, endpoint = hostile

    def respond(handler: BaseHTTPRequestHandler) -> None:
        handler.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nab")
        handler.wfile.flush()
        time.sleep(0.3)
        handler.wfile.write(b"cd")

    state.respond = respond
    state.keep_alive = True  # so the connection is really reused, whenever the server's thread runs
    source = RemoteSource(f"{endpoint}/p.zarr", StoreConfig(timeout_s=3.0, retries=0))
    assert fetch(source, how) == b"abcd"
    assert [fetch(source, how) for _ in range(3)] == [b"abcd"] * 3, "the connection is reused safely"
    source.close()


# --- the HTTP/1.1 client ------------------------------------------------------------------------


def raw(answer: bytes) -> Callable[[Any], None]:
    """Write ``answer`` as the whole response, bytes as given."""

    def respond(handler: BaseHTTPRequestHandler) -> None:
        handler.wfile.write(answer)
        handler.wfile.flush()

    return respond


@pytest.mark.parametrize(
    ("answer", "body"),
    [
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=1\r\nabc\r\n2\r\nde\r\n0\r\nT: 1\r\n\r\n",
            b"abcde",
        ),
        (b"HTTP/1.0 200 OK\r\n\r\nuntil the connection closes", b"until the connection closes"),
        (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: 1\r\nx-a: 2\r\n\r\nok", b"ok"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", b""),
    ],
    ids=["chunked", "until-close", "100-continue", "empty"],
)
@HOW
def test_each_way_of_ending_a_body_is_read(hostile: tuple[Hostile, str], answer: bytes, body: bytes, how: str) -> None:
    state, endpoint = hostile
    state.respond = raw(answer)
    source = RemoteSource(f"{endpoint}/p.zarr", StoreConfig(timeout_s=3.0, retries=0))
    assert fetch(source, how) == body
    source.close()


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", "closed after 3 of 10 body bytes"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\nabc", "Content-Length is not a number"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "Content-Length is negative"),
        (b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP/1 status line"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "not a header line"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "not a chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n", "longer than its size"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"x" * (80 * 2**10), "head is over"),
        (b"", "closed before the response head ended"),
        (b"HTTP/1.1 200 OK\r\nContent-Le", "closed before the response head ended"),
    ],
    ids=[
        "short",
        "length-text",
        "length-negative",
        "not-http",
        "header",
        "chunk-size",
        "chunk-long",
        "huge-head",
        "nothing",
        "cut-head",
    ],
)
@HOW
def test_a_malformed_or_cut_answer_is_one_line_naming_the_object(
    hostile: tuple[Hostile, str], answer: bytes, why: str, how: str
) -> None:
    state, endpoint = hostile
    state.respond = raw(answer)
    source = RemoteSource(f"{endpoint}/p.zarr", StoreConfig(timeout_s=3.0, retries=0))
    error, _ = bounded(lambda: fetch(source, how))
    source.close()
    assert isinstance(error, StoreError) and why in str(error), error
    assert "\n" not in str(error) and "/p.zarr/zarr.json" in str(error)


@HOW
def test_a_kept_connection_the_server_closed_while_idle_is_replaced_once(
    hostile: tuple[Hostile, str], how: str
) -> None:
    """The server says HTTP/1.1 (the client keeps the connection) and then closes it: the next request,
    sent on it, finds it closed before any answer and goes once more on a fresh connection."""
    state, endpoint = hostile
    state.respond = raw(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")  # HTTP/1.0 server: closes after
    source = RemoteSource(f"{endpoint}/p.zarr", StoreConfig(timeout_s=3.0, retries=0))
    assert [fetch(source, how) for _ in range(4)] == [b"ok"] * 4
    assert len(state.requests) == (4 if how == "one" else 8), "the sends on closed connections reached no server"
    source.close()


def ranges(data: bytes, ports: set[int]) -> Callable[[Any], None]:
    """Answer each range GET with its bytes of ``data`` (206), noting the client's port."""

    def respond(handler: BaseHTTPRequestHandler) -> None:
        ports.add(handler.client_address[1])
        first, _, last = handler.headers["Range"].removeprefix("bytes=").partition("-")
        body = data[int(first) : int(last) + 1]
        handler.send_response(206)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    return respond


def test_many_ranges_in_flight_come_back_in_order_on_at_most_in_flight_connections(
    hostile: tuple[Hostile, str],
) -> None:
    state, endpoint = hostile
    data, ports = bytes(range(256)) * 64, set[int]()
    state.respond, state.keep_alive = ranges(data, ports), True
    source = RemoteSource(f"{endpoint}/p.zarr", StoreConfig(timeout_s=5.0, retries=0, in_flight=3))
    wanted = [("c/0", start, length) for start, length in [(0, 1), (5, 300), (16000, 384), (7, 9)] * 5]
    got = source.get_many(wanted)
    assert got == [data[start : start + length] for _, start, length in wanted]
    assert source.requests == len(wanted) and source.bytes_transferred == sum(length for *_, length in wanted)
    assert 1 <= len(ports) <= 3, f"{len(ports)} connections for in_flight=3"
    source.close()


@pytest.mark.parametrize("retries", [0, 1])
def test_a_server_in_trouble_is_asked_again_among_many(hostile: tuple[Hostile, str], retries: int) -> None:
    """The first two answers are 503 (the server's trouble): with a retry both requests are asked
    again and read; without, the answer is a one-line error naming the object and the status."""
    state, endpoint = hostile
    answered = []

    def respond(handler: BaseHTTPRequestHandler) -> None:
        answered.append(handler.path)
        send(503 if len(answered) <= 2 else 200, b"busy" if len(answered) <= 2 else b"ok")(handler)

    state.respond = respond
    source = RemoteSource(f"{endpoint}/p.zarr", StoreConfig(timeout_s=3.0, retries=retries))
    error, _ = bounded(lambda: fetch(source, "many"))
    if retries:
        assert error is None and len(answered) == 4
    else:
        assert isinstance(error, StoreError) and "503" in str(error) and "/p.zarr/zarr.json" in str(error), error
        assert "\n" not in str(error)
    source.close()


def test_many_requests_to_nothing_listening_end_in_one_line() -> None:
    with contextlib.closing(socket.socket()) as probe:  # a port bound and closed: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    source = RemoteSource(f"http://127.0.0.1:{port}/p.zarr", StoreConfig(timeout_s=2.0, retries=1))
    error, _ = bounded(lambda: fetch(source, "many"))
    assert isinstance(error, StoreError) and "/p.zarr/zarr.json" in str(error) and "\n" not in str(error), error
    source.close()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl makes the test's certificate")
@HOW
def test_an_https_plate_is_read_over_tls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """TLS on the blocking path and on the non-blocking one (handshake, records holding more than a
    read): a certificate this test makes and trusts for 127.0.0.1."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            key,
            "-out",
            cert,
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    state = Hostile()
    body = bytes(range(256)) * 1024  # over one TLS record (16 KiB)
    state.respond, state.keep_alive = send(200, body), True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    with serve(state, context) as endpoint:
        source = RemoteSource(
            f"{endpoint.replace('http://', 'https://')}/p.zarr", StoreConfig(timeout_s=5.0, retries=0)
        )
        assert [fetch(source, how) for _ in range(2)] == [body] * 2
        source.close()


# --- S3 listings --------------------------------------------------------------------------------


@pytest.mark.parametrize("body", [b"hello", b"<ListBucketResult><Contents>", b"\x00\xff"])
def test_a_listing_that_is_not_xml_is_a_store_error(hostile: tuple[Hostile, str], body: bytes) -> None:
    state, endpoint = hostile
    state.respond = send(200, body)
    source = _s3(endpoint, retries=0)
    with pytest.raises(StoreError, match=r"s3://bucket/plate: the listing .*is not S3 XML"):
        list(source.listing())


def test_a_listing_repeating_its_continuation_token_is_an_error(hostile: tuple[Hostile, str]) -> None:
    state, endpoint = hostile
    state.respond = send(200, listing(["zarr.json"], token="again"))
    source = _s3(endpoint, retries=0)
    error, _ = bounded(lambda: list(source.listing()))
    assert isinstance(error, StoreError) and "repeated its continuation token" in str(error), error
    assert len(state.requests) == 2


def test_a_listing_has_a_cap_on_its_pages(hostile: tuple[Hostile, str], monkeypatch: pytest.MonkeyPatch) -> None:
    state, endpoint = hostile
    pages = iter(range(10**6))
    state.respond = lambda handler: send(200, listing([f"k{next(pages)}.json"], token=f"t{next(pages)}"))(handler)
    monkeypatch.setattr(sources.remote, "MAX_LISTING_PAGES", 5)
    source = _s3(endpoint, retries=0)
    with pytest.raises(StoreError, match=r"more than 5 pages"):
        list(source.listing())
    assert len(state.requests) == 5


# --- the metadata mirror ------------------------------------------------------------------------

#: Keys that climb out of the mirror; ABSOLUTE becomes a path inside the test's own folder.
TRAVERSING_KEYS = ["../escape.json", "a/../../escape.json", "ABSOLUTE", "a/./../../../escape.zarr.json"]


@pytest.mark.parametrize("key", TRAVERSING_KEYS)
@pytest.mark.parametrize("scheme", ["http", "s3"])
def test_the_mirror_writes_only_inside_its_root(
    hostile: tuple[Hostile, str], tmp_path: Path, key: str, scheme: str
) -> None:
    state, endpoint = hostile
    key = key.replace("ABSOLUTE", str(tmp_path / "absolute.json"))
    keys = ["zarr.json", key]
    index = json.dumps({"objects": [[k, 2] for k in keys]}).encode()

    def respond(handler: BaseHTTPRequestHandler) -> None:
        if "list-type=2" in handler.path:
            send(200, listing(keys))(handler)
        elif handler.path.endswith(sources.INDEX_NAME):
            send(200, index)(handler)
        else:
            send(200, b"{}")(handler)

    state.respond = respond
    cache = tmp_path / "deep" / "cache"
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    if scheme == "s3":
        url, config = "s3://bucket/plate", StoreConfig(endpoint=endpoint, anonymous=True, retries=0)
    else:
        url, config = f"{endpoint}/plate", StoreConfig(retries=0)
    with pytest.raises(StoreError, match=r"key .* outside the plate"):
        mirror_metadata(url, config, cache_dir=cache)
    after = sorted(str(p) for p in tmp_path.rglob("*") if not str(p).startswith(str(cache)))
    assert after == [p for p in before if not p.startswith(str(cache))] + [str(tmp_path / "deep")]


def test_credentials_in_a_url_are_never_echoed(hostile: tuple[Hostile, str], tmp_path: Path) -> None:
    state, endpoint = hostile
    state.respond = send(404, b"")
    url = endpoint.replace("http://", "http://reader:s3cr3t@") + "/p.zarr"
    messages = []
    for call in (
        lambda: mirror_metadata(url, StoreConfig(retries=0), cache_dir=tmp_path),
        lambda: RemoteSource(url, StoreConfig(retries=0)).get_range("zarr.json", 0, 4),
        lambda: split_url(url.replace("127.0.0.1", "[::1")),
    ):
        with pytest.raises(CropbenchError) as caught:
            call()
        messages.append(str(caught.value))
    assert all("s3cr3t" not in message and "reader:***@" in message for message in messages), messages


def test_redaction_keeps_urls_without_credentials() -> None:
    assert sources.redact("s3://bucket/p.zarr") == "s3://bucket/p.zarr"
    assert sources.redact("http://u:p@h:9/x") == "http://u:***@h:9/x"
    assert sources.redact("http://token@h/x") == "http://***@h/x"


# --- local files that are not regular files ---------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_a_file_source_refuses_what_is_not_a_regular_file_before_opening_it(tmp_path: Path, kind: str) -> None:
    key = "c/0/0/0"
    path = make_special(tmp_path / key, kind)
    source = FileSource(tmp_path)
    for call in (
        lambda: source.get(key),
        lambda: source.descriptor(key),
        lambda: source.get_range(key, 0, 8),
        lambda: source.get_suffix(key, 8),
        lambda: source.path(key),
    ):
        error, _ = bounded(call, 3.0, release=path if kind == "fifo" else None)
        assert isinstance(error, StoreError) and "not a regular file" in str(error) and key in str(error), error
    source.close()


def test_a_client_librarys_message_has_the_credentials_masked() -> None:
    url = "http://reader:s3cr3t@host:9/p.zarr"
    error = sources.store_error(url, "zarr.json", OSError(f"cannot connect to {url}/zarr.json: refused"))
    assert "s3cr3t" not in str(error) and "reader:***@host:9/p.zarr/zarr.json" in str(error), error
    assert sources.scrub_credentials("nothing to hide", "s3://bucket/p.zarr") == "nothing to hide"


@pytest.mark.parametrize("field", ["timeout_s", "connect_timeout_s"])
@pytest.mark.parametrize("seconds", [float("inf"), float("nan"), 1e300, 0.0, -1.0])
def test_store_deadlines_are_finite(field: str, seconds: float) -> None:
    # An infinite deadline would never end a dripping request.
    with pytest.raises(ConfigError, match=field):
        StoreConfig(**{field: seconds})


def serve_files(root: Path) -> Callable[[BaseHTTPRequestHandler], None]:
    """Answers of a static file server with byte ranges (``bytes=a-b`` and ``bytes=-n``), as nginx gives."""

    def respond(handler: BaseHTTPRequestHandler) -> None:
        path = root / handler.path.partition("?")[0].lstrip("/")
        if not path.is_file():
            send(404, b"")(handler)
            return
        data = path.read_bytes()
        ranged = handler.headers.get("Range", "").removeprefix("bytes=")
        if not ranged:
            send(200, data)(handler)
            return
        first, _, last = ranged.partition("-")
        part = data[-int(last) :] if not first else data[int(first) : int(last) + 1]
        send(206, part)(handler)

    return respond


def test_credentials_in_a_plate_url_reach_no_row_and_no_cache_file(
    hostile: tuple[Hostile, str], tiny_plate: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class OneCase(Dataset):
        def cases(self, preset: str, context: object) -> list[DatasetCase]:
            return [DatasetCase(crop=CropConfig(), samples=4, warmup=1, cold_samples=1)]

    state, endpoint = hostile
    shutil.copytree(tiny_plate, tmp_path / "www" / "tiny.zarr")
    write_index(tmp_path / "www" / "tiny.zarr")
    state.respond = serve_files(tmp_path / "www")
    state.keep_alive = True
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    secret = "s3cr@t-pass"
    host = endpoint.removeprefix("http://")
    url = f"http://reader:{secret}@{host}/tiny.zarr"
    store = StoreConfig(endpoint=f"http://reader:{secret}@{host}")
    records = api.run(url, [OneCase()], out_dir=tmp_path / "out", store=store)
    assert records and records[0].config["plate"] == f"http://reader:***@{host}/tiny.zarr"
    assert records[0].config["store"]["endpoint"] == f"http://reader:***@{host}"
    written = [path for path in (tmp_path / "out").rglob("*") if path.is_file()]
    cached = [path for path in (tmp_path / "cache").rglob("*") if path.is_file()]
    for path in written + cached:
        assert b"s3cr" not in path.read_bytes(), path
    pointers = [path for path in cached if path.name == REMOTE_POINTER]
    assert pointers and all(path.stat().st_mode & 0o777 == 0o600 for path in pointers)
    assert not any("s3cr" in request for request in state.requests)


@pytest.mark.parametrize(
    ("field", "value"), [("in_flight", 10**9), ("in_flight", 0), ("retries", 10**6), ("retries", -1)]
)
def test_store_concurrency_and_retries_are_bounded(field: str, value: int) -> None:
    # A billion requests in flight would open as many connections; a million retries would hold a run for days.
    with pytest.raises(ConfigError, match=field):
        StoreConfig(**{field: value})
    assert getattr(StoreConfig(**{field: 1}), field) == 1
