"""Object-store endpoints on loopback for tests and the remote benchmark: an S3 server, an HTTP
server with Range support, and a proxy that delays every request.

- :func:`s3_server`: moto's server mode (``moto[server]``, what zarr-python and s3fs test with),
  one subprocess on 127.0.0.1 and a free port; it sets nothing globally, it returns the endpoint.
- :func:`loopback_s3`: that server with a bucket, and the AWS variables pointing at it meanwhile.
- :func:`http_server`: nginx serving a folder (``apt-get install nginx``), its own config and
  logs in a temporary folder, Range requests on (nginx's default for static files).
- :func:`http_plate`: a local plate served by nginx from a temporary copy, by URL.
- :func:`delay_proxy`: an asyncio TCP proxy that holds each chunk the client sends for
  ``latency_ms`` before forwarding it (order kept, many connections at once), so every request
  pays one injected round trip; ``tc netem`` needs privileges this does not.
- :func:`remote_plate`: a plate URL opened for a run (metadata mirrored, behind the delay proxy
  when the store config asks for latency).

Each is a context manager that stops its process on exit, also on error.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import dataclasses
import functools
import http.client
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cropbench.config import StoreConfig
from cropbench.errors import ConfigError
from cropbench.formats.sources import RemoteSource, mirror_metadata, s3_endpoint, split_url
from cropbench.measure.serving import NO_SYMLINKS, served_copy, start_server, user_directive
from cropbench.scratch import scratch_folder

#: Test credentials of the loopback S3 server (moto accepts any; these make requests signed).
S3_ACCESS_KEY = "cropbench"
S3_SECRET_KEY = "cropbench-secret"
#: The region clients of the loopback S3 server name (moto accepts any).
S3_REGION = "us-east-1"
#: Seconds a server may take to answer its first request.
START_TIMEOUT_S = 30.0


#: The server processes started here and still running, by endpoint URL (for :func:`stop_server`).
_RUNNING: dict[str, subprocess.Popen[bytes]] = {}


def stop_server(endpoint: str) -> None:
    """Stop a server started here before its context ends (a server that goes away mid-run)."""
    process = _RUNNING.get(endpoint)
    if process is not None:
        stop_process(process)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_until_up(url: str, process: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with code {process.returncode} before answering on {url}")
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except urllib.error.HTTPError:
            return  # it answers (an error status is an answer)
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not answer on {url} within {START_TIMEOUT_S:.0f} s")


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """Terminate a server process we started, killing it if it does not end within 5 s."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


def moto_available() -> bool:
    """Whether moto's server mode is installed (``pip install 'cropbench[remote]'``)."""
    try:
        import flask  # noqa: F401 - moto's server mode needs it
        import moto.server  # noqa: F401
    except ImportError:
        return False
    return True


def nginx_binary() -> str | None:
    """nginx's path, or None when it is not installed (``apt-get install -y nginx``)."""
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)


@contextlib.contextmanager
def s3_server(port: int | None = None, environment: dict[str, str] | None = None) -> Iterator[str]:
    """A moto S3 server on 127.0.0.1; yields its endpoint URL (``http://127.0.0.1:PORT``).

    ``environment`` adds moto settings (``INITIAL_NO_AUTH_ACTION_COUNT=1`` makes it check credentials).
    """
    port = port or free_port()
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    env = {**os.environ, **(environment or {})}
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    endpoint = f"http://127.0.0.1:{port}"
    _RUNNING[endpoint] = process
    try:
        _wait_until_up(f"{endpoint}/moto-api/", process, "moto server")
        yield endpoint
    finally:
        stop_process(process)
        _RUNNING.pop(endpoint, None)


def create_bucket(endpoint: str, bucket: str) -> None:
    """Create ``bucket`` on a loopback S3 endpoint (with the test credentials)."""
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=S3_ACCESS_KEY,
        aws_secret_access_key=S3_SECRET_KEY,
        region_name=S3_REGION,
    )
    client.create_bucket(Bucket=bucket)


@contextlib.contextmanager
def environment_variables(values: dict[str, str]) -> Iterator[None]:
    """``values`` in ``os.environ`` meanwhile (DataLoader workers and other children inherit them);
    each variable's old value, or its absence, restored on exit, so a user's own settings survive."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def loopback_s3(bucket: str, environment: dict[str, str] | None = None) -> Iterator[str]:
    """:func:`s3_server` holding an empty ``bucket``, with the standard AWS variables pointing every
    S3 client of this process (and its children) at it while it runs; yields the endpoint. The
    variables are restored on exit, so a user's own AWS settings survive."""
    with s3_server(environment=environment) as endpoint:
        aws = {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": S3_ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": S3_SECRET_KEY,
            "AWS_REGION": S3_REGION,
        }
        with environment_variables(aws):
            create_bucket(endpoint, bucket)
            yield endpoint


_NGINX_CONFIG = """
{user}
worker_processes 2;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    keepalive_requests 100000;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        {no_symlinks}
        location / {{ autoindex off; }}
    }}
}}
"""


@contextlib.contextmanager
def http_server(root: Path | Mapping[str, Path], port: int | None = None, *, index: bool = False) -> Iterator[str]:
    """nginx serving a private copy of ``root`` (a folder, or folders by the relative path they are
    served at, with their key index where ``index``) on 127.0.0.1 (byte ranges supported, links never
    followed, workers unprivileged: :mod:`cropbench.measure.serving`); yields ``http://127.0.0.1:PORT``."""
    binary = nginx_binary()
    if binary is None:
        raise ConfigError("nginx is not installed: apt-get install -y nginx")
    port = port or free_port()
    with served_copy(root, index=index) as served, scratch_folder("nginx") as tmp:
        config = tmp / "nginx.conf"
        config.write_text(
            _NGINX_CONFIG.format(user=user_directive(), tmp=tmp, port=port, root=served, no_symlinks=NO_SYMLINKS)
        )
        process = start_server([binary, "-c", str(config), "-p", str(tmp), "-e", f"{tmp}/error.log"])
        try:
            endpoint = f"http://127.0.0.1:{port}"
            _wait_until_up(f"{endpoint}/", process, "nginx")
            yield endpoint
        finally:
            stop_process(process)


@contextlib.contextmanager
def http_plate(plate: Path) -> Iterator[str]:
    """A local plate served over HTTP by nginx from a private copy with its key index (HTTP cannot
    list; the plate folder itself is left untouched); yields the plate's URL. Stops nginx on exit."""
    with http_server({plate.name: plate}, index=True) as endpoint:
        yield f"{endpoint}/{plate.name}"


@contextlib.contextmanager
def delay_proxy(target: str, latency_ms: float, port: int | None = None) -> Iterator[str]:
    """A loopback proxy to ``target`` (``http://host:port``) delaying each request by ``latency_ms``;
    yields the proxy's URL. Runs in its own process so it never competes with the measured one for the GIL."""
    host, _, target_port = target.removeprefix("http://").rstrip("/").partition(":")
    port = port or free_port()
    command = [
        sys.executable,
        "-m",
        "cropbench.measure.endpoints",
        "--listen",
        str(port),
        "--target",
        f"{host}:{target_port or 80}",
        "--latency-ms",
        str(latency_ms),
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stopper = functools.partial(stop_process, process)
    atexit.register(stopper)  # also when the caller's cleanup never runs
    try:
        endpoint = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"delay proxy exited with code {process.returncode}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"delay proxy did not listen on {endpoint}")
            time.sleep(0.05)
        yield endpoint
    finally:
        stop_process(process)
        atexit.unregister(stopper)


@contextlib.contextmanager
def remote_plate(url: str, store: StoreConfig, cache_dir: Path | None = None) -> Iterator[Path]:
    """Open the plate at ``url``: its metadata mirrored locally (see :func:`mirror_metadata`), behind a
    delay proxy when ``store.latency_ms`` > 0; yields the mirror folder. The proxy stops on exit."""
    with contextlib.ExitStack() as stack:
        if store.latency_ms > 0:
            scheme, netloc, _ = split_url(url)
            target = s3_endpoint(store) if scheme == "s3" else f"{scheme}://{netloc}"
            if not target.startswith("http://"):
                raise ConfigError(
                    f"latency_ms={store.latency_ms} injects delay on a loopback http:// endpoint; {url} is served by "
                    f"{target or 'AWS'} (set AWS_ENDPOINT_URL to a local server, or latency_ms=0)"
                )
            proxy = stack.enter_context(delay_proxy(target, store.latency_ms))
            store = dataclasses.replace(store, endpoint=proxy)
        yield mirror_metadata(url, store, cache_dir)


#: Seconds :func:`server_ceiling` spends measuring a run's server.
CEILING_SECONDS = 1.0


def server_ceiling(url: str, store: StoreConfig) -> float | None:
    """Requests/s a trivial client gets from the loopback server behind a plate URL (no injected delay),
    measured once per run so its rows say whether the reader or the server was the bound; None when
    no delay is injected (the endpoint may be a real store, where hammering it is not ours to do)."""
    if store.latency_ms <= 0:
        return None
    probe = RemoteSource(url, dataclasses.replace(store, latency_ms=0.0)).object_url("zarr.json")
    try:
        return request_ceiling(probe, seconds=CEILING_SECONDS, threads=8)
    except (OSError, http.client.HTTPException):  # the run's own requests will report the failure
        return None


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
    """Forward what ``reader`` receives to ``writer``, each chunk ``delay_s`` after it arrived (order kept)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def receive() -> None:
        while data := await reader.read(1 << 16):
            queue.put_nowait((loop.time() + delay_s, data))
        queue.put_nowait((0.0, b""))

    receiving = asyncio.create_task(receive())
    try:
        while True:
            due, data = await queue.get()
            if not data:
                break
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        receiving.cancel()
        with contextlib.suppress(Exception):
            writer.close()


async def _serve(listen: int, target: tuple[str, int], latency_ms: float) -> None:
    delay = latency_ms / 1e3

    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection(*target)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(
            _pipe(client_reader, server_writer, delay),  # requests wait: one injected round trip each
            _pipe(server_reader, client_writer, 0.0),
            return_exceptions=True,
        )

    server = await asyncio.start_server(handle, "127.0.0.1", listen, backlog=1024)
    async with server:
        await server.serve_forever()


def request_ceiling(url: str, seconds: float = 2.0, threads: int = 8) -> float:
    """Requests/s a trivial client gets from ``url`` (a small object) with ``threads`` keep-alive clients:
    the server's own ceiling, to tell whether a row was bound by the client or the server."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    deadline = time.monotonic() + seconds

    def client() -> int:
        connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=10)
        done = 0
        while True:  # at least one request: on a busy machine a thread may start after the deadline
            connection.request("GET", parts.path or "/", headers={"Range": "bytes=0-0"})
            connection.getresponse().read()
            done += 1
            if time.monotonic() >= deadline:
                break
        connection.close()
        return done

    started = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        total = sum(pool.map(lambda _: client(), range(threads)))
    return total / (time.monotonic() - started)


def main(argv: list[str] | None = None) -> None:
    """``python -m cropbench.measure.endpoints --listen PORT --target HOST:PORT --latency-ms MS``: the delay proxy."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", type=int, required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    args = parser.parse_args(argv)
    host, _, port = args.target.rpartition(":")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.listen, (host, int(port)), args.latency_ms))


if __name__ == "__main__":
    main()
