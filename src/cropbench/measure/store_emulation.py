"""An object store emulated on this machine whose limit is the modelled network, not the server.

nginx (a C event loop) serves a folder over HTTP with byte ranges from inside its own network
namespace, reached through a veth pair. What a real store adds is injected where it costs the
server no CPU:

- **first-byte latency**: each request sleeps in nginx's event loop (``ngx.sleep`` from
  ``libnginx-mod-http-lua``) for a delay drawn from a log-normal distribution with the model's
  median and 99th percentile, before the response starts;
- **per-connection bandwidth**: nginx's ``limit_rate`` caps each response's rate (one request at a
  time per keep-alive connection, so it is the connection's rate);
- **the node's link**: a token bucket (``tc qdisc ... tbf``) on the namespace's side of the veth
  caps every response byte together;
- **the request rate of one prefix**: nginx's ``limit_req`` queues requests beyond it (a real store
  answers 503 Slow Down instead; queueing keeps the readers' retries out of the measurement).

:class:`StoreModel` documents where each default comes from. The namespace, its veth, the qdisc
and nginx exist only while :func:`emulated_store` is open and are removed on exit, also after
SIGINT or SIGTERM, and with the process that opened it even when that one is killed
(:mod:`cropbench.measure.serving`); what a killed run left is swept by the next one.

Only the measuring process's user (root) can reach the store: a routing rule sends other users' packets
for its address nowhere (``ip rule ... prohibit``), nginx's workers run as an unprivileged account and
serve a private copy of the folder without following links (:func:`~cropbench.measure.serving.served_copy`).
:class:`ServerWindow` samples nginx's CPU time (``/proc/PID/stat``) and its
wait for a core (``/proc/PID/schedstat``) over a measured stretch: a stretch where the server was
busy half of the time or more (so every one where it used half a core) was bound by the server,
not by the model, and says so (``server_bound``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import ipaddress
import math
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from cropbench import metrics as m
from cropbench.errors import ConfigError
from cropbench.measure.endpoints import START_TIMEOUT_S, nginx_binary, stop_process
from cropbench.measure.serving import (
    NO_SYMLINKS,
    served_copy,
    served_sources,
    server_processes,
    start_server,
    user_directive,
)
from cropbench.scratch import process_alive, scratch_folder, sweep_stale_scratch

#: Debian's nginx modules: the Lua module (``ngx.sleep``) and the development kit it needs.
NGINX_MODULES = Path("/usr/share/nginx/modules")
LUA_MODULES = ("ndk_http_module.so", "ngx_http_lua_module.so")
#: What installs them (``scripts/setup.sh`` and ``.ci/run`` try it).
INSTALL_COMMAND = "apt-get install -y nginx libnginx-mod-http-lua iproute2"
#: Share of a measured stretch the server may be busy (running or ready to run) before it is server-bound.
SERVER_BOUND_SHARE = 0.5
#: The validity flag of a row whose store's server was the bound (see :attr:`ServerWindow.server_bound`).
SERVER_BOUND_FLAG = "server-bound"
#: The 99th percentile of a standard normal: a log-normal's p99 is its median times exp(2.326 sigma).
_Z99 = 2.3263478740408408
#: Namespaces, veths and addresses of this module: named by process id and a counter, in 10.251/16.
_NAME_PREFIX = "cbs"
#: A name this module gives: prefix, the creating process's id, ``x``, a counter (``h``/``n`` for the veth ends).
_NAME = re.compile(rf"^{_NAME_PREFIX}(?P<pid>\d+)x\d+(?P<end>[hn]?)$")
_SUBNET = ipaddress.IPv4Network("10.251.0.0/16")
_PORT = 8080
#: Priorities of the two routing rules per store: root's packets for its subnet route as usual, everyone
#: else's are prohibited (the kernel answers "permission denied").
_RULE_ALLOW, _RULE_PROHIBIT = 10251, 10252
#: Held while a subnet is chosen and claimed, so two stores started at once never share one.
_LOCK = Path("/run/cropbench-store.lock")
#: Capabilities a namespace, its veth and routing rules need (``/proc/self/status`` CapEff bits).
_CAPABILITIES = {"CAP_NET_ADMIN": 12, "CAP_SYS_ADMIN": 21}
#: The p99 first-byte latency over the median when only the median is given (the defaults' 100 / 20 ms).
TAIL_OVER_MEDIAN = 5.0


@dataclass(frozen=True)
class StoreModel:
    """What the emulated store injects; ``None`` switches a limit off.

    Defaults and their sources:

    - ``median_latency_ms`` 20, ``p99_latency_ms`` 100: AWS's S3 performance whitepaper (*Timeouts
      and Retries for Latency-Sensitive Applications*) says small requests (under 512 KB) see median
      latencies "often in the range of tens of milliseconds" and advises retrying the slowest 1 %,
      i.e. the tail is several times the median. 100 ms at p99 is our choice inside that.
    - ``request_rate`` 5,500 per second: S3's documented GET/HEAD rate per partitioned prefix
      (*Best practices design patterns: optimizing Amazon S3 performance*).
    - ``connection_mb_s`` 625 (5 Gbit/s): EC2's single-flow limit outside a cluster placement group
      (*Amazon EC2 instance network bandwidth*); a store may give one connection less.
    - ``link_gbit_s`` 10: a node's NIC for traffic to S3; a 32-core instance has 10 to 25 Gbit/s.
    - ``cpu_per_request_ms`` 0: CPU the server burns per request (a busy loop in Lua), for a server
      that is itself the bottleneck (tests; a store emulator written in Python costs a few ms).
    """

    median_latency_ms: float = 20.0
    p99_latency_ms: float = 100.0
    request_rate: float | None = 5500.0
    connection_mb_s: float | None = 625.0
    link_gbit_s: float | None = 10.0
    cpu_per_request_ms: float = 0.0
    workers: int = 1

    def __post_init__(self) -> None:
        if not (isinstance(self.median_latency_ms, (int, float)) and 0 <= self.median_latency_ms <= 60_000):
            raise ConfigError(f"median_latency_ms must be from 0 to 60000, got {self.median_latency_ms!r}")
        if not self.p99_latency_ms >= self.median_latency_ms:
            raise ConfigError(
                f"p99_latency_ms must be >= median_latency_ms ({self.median_latency_ms}), got {self.p99_latency_ms!r}"
            )
        for name in ("request_rate", "connection_mb_s", "link_gbit_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(f"{name} must be > 0 (or None for no limit), got {value!r}")
        if not self.cpu_per_request_ms >= 0:
            raise ConfigError(f"cpu_per_request_ms must be >= 0, got {self.cpu_per_request_ms!r}")
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise ConfigError(f"workers must be a whole number >= 1, got {self.workers!r}")

    @classmethod
    def at_median(cls, median_latency_ms: float) -> StoreModel:
        """The default model at another median first-byte latency, its tail scaled alike
        (p99 :data:`TAIL_OVER_MEDIAN` times the median)."""
        return cls(median_latency_ms=median_latency_ms, p99_latency_ms=median_latency_ms * TAIL_OVER_MEDIAN)

    @property
    def latency_sigma(self) -> float:
        """The log-normal's sigma: p99 = median x exp(2.326 sigma)."""
        if self.median_latency_ms == 0:
            return 0.0
        return math.log(self.p99_latency_ms / self.median_latency_ms) / _Z99

    @property
    def mean_latency_ms(self) -> float:
        """The log-normal's mean: median x exp(sigma^2 / 2)."""
        return self.median_latency_ms * math.exp(self.latency_sigma**2 / 2)

    def request_seconds(self, response_bytes: int) -> float:
        """Mean seconds of one request alone: first-byte latency, then the body at the connection's rate."""
        transfer = response_bytes / (self.connection_mb_s * 1e6) if self.connection_mb_s else 0.0
        return self.mean_latency_ms / 1e3 + transfer

    def predicted_requests_per_s(self, in_flight: int, response_bytes: int) -> float:
        """Requests/s a client keeping ``in_flight`` requests of ``response_bytes`` open gets from the model:
        Little's law on the mean request time, capped by the request rate and by the link."""
        limits = [in_flight / self.request_seconds(response_bytes)]
        if self.request_rate:
            limits.append(self.request_rate)
        if self.link_gbit_s and response_bytes:
            limits.append(self.link_gbit_s * 1e9 / 8 / response_bytes)
        return min(limits)


def unavailable() -> str | None:
    """Why the emulation cannot run here (with the command that fixes it), or None."""
    if nginx_binary() is None:
        return f"nginx is not installed: {INSTALL_COMMAND}"
    missing = [name for name in LUA_MODULES if not (NGINX_MODULES / name).exists()]
    if missing:
        return f"nginx's Lua module is missing ({', '.join(missing)} in {NGINX_MODULES}): {INSTALL_COMMAND}"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return f"ip and tc (iproute2) are not installed: {INSTALL_COMMAND}"
    if os.geteuid() != 0:
        return "network namespaces need root: run as root (or in a container started as root)"
    missing = [name for name, bit in _CAPABILITIES.items() if not _effective_capabilities() >> bit & 1]
    if missing:
        return (
            f"root here lacks {' and '.join(missing)} (a container's default): start the container with "
            f"--cap-add {' --cap-add '.join(name.removeprefix('CAP_') for name in missing)} (or --privileged)"
        )
    return None


def _effective_capabilities() -> int:
    """This process's effective capability bits (all of them when ``/proc`` does not say)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return -1


def _run(*command: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}): {result.stderr.strip()}")


@contextlib.contextmanager
def _subnet_lock() -> Iterator[None]:
    """Held while a store chooses and claims its subnet (or a sweep removes stale claims): the address
    on the host's veth is the claim, so choosing and claiming must not interleave with another store's."""
    descriptor = os.open(_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)


def _used_addresses() -> str:
    return subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=False).stdout


def _free_subnet() -> ipaddress.IPv4Network:
    """A /30 of 10.251/16 that no interface of this namespace uses (call under :func:`_subnet_lock`)."""
    used = set(re.findall(r"inet (\d+\.\d+\.\d+\.\d+)", _used_addresses()))
    start = (os.getpid() * 4) % _SUBNET.num_addresses
    for offset in range(0, _SUBNET.num_addresses, 4):
        network = ipaddress.IPv4Network(f"{_SUBNET[(start + offset) % _SUBNET.num_addresses]}/30")
        if str(network[1]) not in used and str(network[2]) not in used:
            return network
    raise RuntimeError(f"every /30 of {_SUBNET} is in use")


def _rules(network: ipaddress.IPv4Network) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The two routing rules that let only root reach ``network``: root's packets look up the main table
    as usual, every other user's are prohibited."""
    uid = str(os.geteuid())
    allow = ("priority", str(_RULE_ALLOW), "to", str(network), "uidrange", f"{uid}-{uid}", "lookup", "main")
    return allow, ("priority", str(_RULE_PROHIBIT), "to", str(network), "prohibit")


def _delete_rules(network: ipaddress.IPv4Network) -> None:
    for rule in _rules(network):
        subprocess.run(["ip", "rule", "delete", *rule], capture_output=True, check=False)


def _stale_rule_networks() -> list[ipaddress.IPv4Network]:
    """Subnets of this module's routing rules whose host-side address no interface holds any more."""
    listing = subprocess.run(["ip", "-4", "rule", "show"], capture_output=True, text=True, check=False).stdout
    used = _used_addresses()
    stale = set()
    for line in listing.splitlines():
        match = re.match(rf"^({_RULE_ALLOW}|{_RULE_PROHIBIT}):.* to (\S+)", line)
        if match is None:
            continue
        with contextlib.suppress(ValueError):
            network = ipaddress.IPv4Network(match[2] if "/" in match[2] else f"{match[2]}/32", strict=False)
            if network.subnet_of(_SUBNET) and f"inet {network[1]}/" not in used:
                stale.add(network)
    return sorted(stale)


_NGINX_CONFIG = """
{user}
{modules}
worker_processes {workers};
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    log_format trace '$request_method $uri "$http_range" $status $body_bytes_sent $msec $request_time';
    access_log {tmp}/requests.log trace;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 300s;
    {rate_zone}
    init_worker_by_lua_block {{ math.randomseed(ngx.worker.pid() * 7919 + ngx.now() * 1000) }}
    server {{
        listen {address}:{port} backlog=4096;
        root {root};
        {no_symlinks}
        {limit_rate}
        {rate_limit}
        location / {{
            autoindex off;
            access_by_lua_block {{
                local burn = {burn_s}
                if burn > 0 then
                    local started = os.clock()
                    while os.clock() - started < burn do end
                end
                local median, sigma = {median_s}, {sigma}
                if median > 0 then
                    -- Box-Muller: one standard normal draw per request, then the log-normal delay.
                    local z = math.sqrt(-2 * math.log(1 - math.random())) * math.cos(2 * math.pi * math.random())
                    ngx.sleep(median * math.exp(sigma * z))
                end
            }}
        }}
    }}
}}
"""


@dataclass(frozen=True)
class RequestTrace:
    """One request the server answered: key, byte range (as sent), status, body bytes, start and end (epoch s)."""

    method: str
    key: str
    byte_range: str
    status: int
    body_bytes: int
    start_s: float
    end_s: float

    @classmethod
    def parse(cls, line: str) -> RequestTrace:
        method, key, rest = line.split(" ", 2)
        byte_range, _, tail = rest[1:].partition('" ')
        status, body, end, duration = tail.split()
        return cls(method, key, byte_range, int(status), int(body), float(end) - float(duration), float(end))


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (``/proc/PID/stat``: fields 14 and 15, in clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _runqueue_seconds(pid: int) -> float:
    """Seconds a process has waited, ready to run, for a core (``/proc/PID/schedstat``, second field)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9


def _machine_ticks() -> tuple[int, int]:
    """Clock ticks the machine's cores have been busy (every state but idle and I/O wait) and in total,
    summed over cores since boot (``/proc/stat``'s ``cpu`` line)."""
    ticks = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    return sum(ticks) - idle, sum(ticks)


def machine_seconds() -> tuple[float, float]:
    """Seconds the machine's cores have been busy and in total since boot (:func:`_machine_ticks`)."""
    busy, total = _machine_ticks()
    scale = os.sysconf("SC_CLK_TCK")
    return busy / scale, total / scale


@dataclass
class ServerWindow:
    """A measured stretch of a store's life: wall seconds, the server's CPU seconds and the seconds it
    waited, ready, for a core (``/proc/PID/schedstat``), its requests, and the seconds the machine's
    cores were busy and counted in all (``/proc/stat``: the reader, the server and the kernel together)."""

    store: EmulatedStore
    wall_s: float = 0.0
    server_cpu_s: float = 0.0
    server_runqueue_s: float = 0.0
    requests: list[RequestTrace] = field(default_factory=list)
    machine_busy_s: float = 0.0
    machine_total_s: float = 0.0

    @property
    def machine_busy_share(self) -> float:
        """The share of the machine's cores busy over the stretch: near 1.0, the reader and the server
        competed for cores, which no model of one core per process foresees."""
        return self.machine_busy_s / self.machine_total_s if self.machine_total_s > 0 else 0.0

    @property
    def server_core_share(self) -> float:
        """The server's CPU seconds over wall seconds: 1.0 is one core busy the whole stretch."""
        return self.server_cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def server_busy_share(self) -> float:
        """The share of the stretch the server ran or was ready to run: on a machine shared with the
        readers, a server waiting for a core limits the requests as much as one using it."""
        return (self.server_cpu_s + self.server_runqueue_s) / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def server_bound(self) -> bool:
        """Whether the server was busy :data:`SERVER_BOUND_SHARE` of the stretch or more (running, or
        ready and waiting for a core): its limit, not the model's. Every stretch whose server used half
        a core or more is flagged."""
        return self.server_busy_share >= SERVER_BOUND_SHARE

    @property
    def body_bytes(self) -> int:
        return sum(trace.body_bytes for trace in self.requests)

    def metrics(self, delivered: int) -> dict[str, Any]:
        """The stretch as a row's metrics: requests and body bytes per crop ``delivered``, the server's
        shares and whether it was the bound, and the store's model."""
        return {
            m.SERVER_REQUESTS: len(self.requests),
            m.REQUESTS_PER_CROP: len(self.requests) / max(delivered, 1),
            m.BYTES_TRANSFERRED_PER_CROP: self.body_bytes / max(delivered, 1),
            m.SERVER_CORE_SHARE: self.server_core_share,
            m.SERVER_BUSY_SHARE: self.server_busy_share,
            m.SERVER_BOUND: self.server_bound,
            m.MACHINE_BUSY_SHARE: self.machine_busy_share,
            m.STORE_MODEL: dataclasses.asdict(self.store.model),
        }


@dataclass
class EmulatedStore:
    """A running emulation: its endpoint (``http://ADDRESS:PORT``), model, namespace and nginx's processes."""

    endpoint: str
    model: StoreModel
    namespace: str
    nginx_pid: int
    worker_pids: tuple[int, ...]
    log: Path

    def server_seconds(self) -> tuple[float, float]:
        """CPU seconds nginx's master and workers have used so far, and seconds they waited for a core."""
        cpu = waited = 0.0
        for pid in (self.nginx_pid, *self.worker_pids):
            with contextlib.suppress(OSError):
                cpu += _cpu_seconds(pid)
                waited += _runqueue_seconds(pid)
        return cpu, waited

    def _settled_log(self) -> None:
        """Wait until the request log stops growing (at most :data:`LOG_SETTLE_LIMIT_S`): nginx writes a
        request's line after its last byte is sent, so a client can see the answer before the line is
        there, and on a busy machine the server may not run again for a while. A window waits so when it
        opens and when it closes."""
        deadline = time.monotonic() + LOG_SETTLE_LIMIT_S
        size = self.log.stat().st_size if self.log.exists() else 0
        while time.monotonic() < deadline:
            time.sleep(LOG_SETTLE_S)
            now = self.log.stat().st_size if self.log.exists() else 0
            if now == size:
                return
            size = now

    @contextlib.contextmanager
    def window(self) -> Iterator[ServerWindow]:
        """Measure a stretch: on exit the window holds its wall and server CPU seconds and its requests."""
        window = ServerWindow(self)
        # The lines of requests answered before the stretch land first, or one written late would count in it.
        self._settled_log()
        offset = self.log.stat().st_size if self.log.exists() else 0
        (cpu, waited), started = self.server_seconds(), time.perf_counter()
        busy, total = _machine_ticks()
        try:
            yield window
        finally:
            window.wall_s = time.perf_counter() - started
            cpu_after, waited_after = self.server_seconds()
            window.server_cpu_s, window.server_runqueue_s = cpu_after - cpu, waited_after - waited
            # Differenced in whole ticks: seconds since boot differenced as floats could make busy > total.
            busy_after, total_after = _machine_ticks()
            scale = os.sysconf("SC_CLK_TCK")
            window.machine_busy_s = (busy_after - busy) / scale
            window.machine_total_s = (total_after - total) / scale
            self._settled_log()
            with self.log.open() as log:
                log.seek(offset)
                window.requests = [RequestTrace.parse(line) for line in log.read().splitlines() if line]


#: A request log unchanged for this long is taken as complete when a window closes.
LOG_SETTLE_S = 0.05
#: The longest a closing window waits for the request log to stop growing.
LOG_SETTLE_LIMIT_S = 2.0


@contextlib.contextmanager
def _cleanup_on_signals() -> Iterator[None]:
    """Where SIGTERM would end the process at once (its default), it raises SystemExit (143) meanwhile,
    as SIGINT raises KeyboardInterrupt, so ``finally`` blocks run. A handler already in place (the
    command line's, which prints its one line) is left as it is."""

    def terminated(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    try:
        previous = signal.signal(signal.SIGTERM, terminated)
    except ValueError:  # not the main thread: signals are the main thread's to handle
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait while the emulation is torn down, so a second Ctrl-C cannot leave half of it."""
    try:
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    except ValueError:
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


_COUNTER = iter(range(1_000_000))


def _config(model: StoreModel, root: Path, tmp: Path, address: str) -> str:
    modules = "\n".join(f"load_module {NGINX_MODULES / name};" for name in LUA_MODULES)
    rate_zone = rate_limit = limit_rate = ""
    if model.request_rate:
        # One zone for the whole store, keyed on its one port: every key is under one prefix, as a plate's
        # are. (A key that is empty, as $server_name is without a server_name, is never limited.)
        rate_zone = f"limit_req_zone $server_port zone=prefix:1m rate={max(1, round(model.request_rate))}r/s;"
        rate_limit = "limit_req zone=prefix burst=100000;"
    if model.connection_mb_s:
        limit_rate = f"limit_rate {max(1, round(model.connection_mb_s * 1e6))};"
    return _NGINX_CONFIG.format(
        user=user_directive(),
        modules=modules,
        workers=model.workers,
        tmp=tmp,
        rate_zone=rate_zone,
        address=address,
        port=_PORT,
        root=root.resolve(),
        no_symlinks=NO_SYMLINKS,
        limit_rate=limit_rate,
        rate_limit=rate_limit,
        burn_s=repr(model.cpu_per_request_ms / 1e3),
        median_s=repr(model.median_latency_ms / 1e3),
        sigma=repr(model.latency_sigma),
    )


def _shape(namespace: str, device: str, model: StoreModel) -> None:
    """The link: a token bucket on the server's side of the veth (every response byte passes it)."""
    if not model.link_gbit_s:
        return
    rate_bytes = model.link_gbit_s * 1e9 / 8
    burst = max(64 * 1024, int(rate_bytes * 0.004))  # 4 ms at the rate: at least one timer tick's worth
    _run(
        "ip", "netns", "exec", namespace, "tc", "qdisc", "add", "dev", device, "root", "tbf",
        "rate", f"{int(model.link_gbit_s * 1e9)}bit", "burst", str(burst), "latency", "50ms",
    )  # fmt: skip


def _wait_until_up(endpoint: str, process: subprocess.Popen[bytes], error_log: Path) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            said = error_log.read_text().strip().splitlines()[-1:] if error_log.exists() else []
            raise RuntimeError(f"nginx exited with code {process.returncode} before answering: {' '.join(said)}")
        try:
            urllib.request.urlopen(f"{endpoint}/", timeout=1).close()
            return
        except urllib.error.HTTPError:
            return  # an error status is an answer
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nginx did not answer on {endpoint} within {START_TIMEOUT_S:.0f} s")


def _stale(name: str) -> bool:
    """Whether ``name`` is one this module gave to a process that no longer runs (a run killed with SIGKILL)."""
    match = _NAME.match(name)
    return match is not None and not process_alive(int(match["pid"]))


def sweep_stale() -> list[str]:
    """Remove what a killed run of this module left: its namespaces (with nginx inside), host-side
    veths, routing rules and scratch folders (:func:`cropbench.scratch.sweep_stale_scratch`).

    Only names of this module's pattern whose creating process is gone are touched, so another
    program's namespaces and a running emulation's are left alone. Returns the names removed."""
    removed = [str(folder) for folder in sweep_stale_scratch()]
    for namespace in namespaces():
        if not _stale(namespace):
            continue
        pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True, check=False)
        for pid in (int(word) for word in pids.stdout.split() if word.isdigit()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        subprocess.run(["ip", "netns", "delete", namespace], capture_output=True, check=False)
        removed.append(namespace)
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=False).stdout
    for line in links.splitlines():
        parts = line.split(":", 2)
        name = parts[1].strip().split("@")[0] if len(parts) > 2 else ""
        if _stale(name):
            subprocess.run(["ip", "link", "delete", name], capture_output=True, check=False)
            removed.append(name)
    with _subnet_lock():
        for network in _stale_rule_networks():
            _delete_rules(network)
            removed.append(f"rules to {network}")
    return removed


@contextlib.contextmanager
def emulated_store(
    root: Path | Mapping[str, Path], model: StoreModel | None = None, *, index: bool = False
) -> Iterator[EmulatedStore]:
    """Serve a private copy of ``root`` (a folder, or folders by the relative path they are served at)
    as an emulated object store (see the module docstring); yields the running store. With ``index``,
    each folder of a mapping gets the key index a plate served over HTTP needs.

    Everything it creates (namespace, veth, routing rules, qdisc, nginx, its scratch folders) is removed
    on exit, on error, on SIGINT and on SIGTERM; nginx ends with the process that started it even
    after a SIGKILL, and what such a run left is removed when the next one starts (:func:`sweep_stale`).
    Raises :class:`ConfigError` naming the install command where the emulation cannot run
    (:func:`unavailable`).
    """
    model = model or StoreModel()
    reason = unavailable()
    if reason is not None:
        raise ConfigError(f"the store emulation cannot run: {reason}")
    for source in served_sources(root).values():
        if not source.is_dir():
            raise ConfigError(f"root={str(source)!r} is not a folder to serve")
    sweep_stale()
    name = f"{_NAME_PREFIX}{os.getpid()}x{next(_COUNTER)}"
    namespace, host_side, server_side = name, f"{name}h", f"{name}n"
    process: subprocess.Popen[bytes] | None = None
    network: ipaddress.IPv4Network | None = None
    with (
        _cleanup_on_signals(),
        served_copy(root, index=index) as served,
        scratch_folder("store") as tmp,
    ):
        try:
            _run("ip", "netns", "add", namespace)
            _run("ip", "link", "add", host_side, "type", "veth", "peer", "name", server_side)
            _run("ip", "link", "set", server_side, "netns", namespace)
            with _subnet_lock():
                network = _free_subnet()
                host_address, server_address = str(network[1]), str(network[2])
                _run("ip", "addr", "add", f"{host_address}/30", "dev", host_side)
                for rule in _rules(network):
                    _run("ip", "rule", "add", *rule)
            _run("ip", "link", "set", host_side, "up")
            _run("ip", "-n", namespace, "addr", "add", f"{server_address}/30", "dev", server_side)
            _run("ip", "-n", namespace, "link", "set", server_side, "up")
            _run("ip", "-n", namespace, "link", "set", "lo", "up")
            _shape(namespace, server_side, model)
            config = tmp / "nginx.conf"
            config.write_text(_config(model, served, tmp, server_address))
            binary = nginx_binary()
            assert binary is not None  # checked by unavailable()
            process = start_server(
                [
                    "ip",
                    "netns",
                    "exec",
                    namespace,
                    binary,
                    "-c",
                    str(config),
                    "-p",
                    str(tmp),
                    "-e",
                    str(tmp / "error.log"),
                ]
            )
            endpoint = f"http://{server_address}:{_PORT}"
            _wait_until_up(endpoint, process, tmp / "error.log")
            master, workers = server_processes(process)
            yield EmulatedStore(endpoint, model, namespace, master, workers, tmp / "requests.log")
        finally:
            with _signals_held():
                _teardown(process, namespace, host_side, network)


def _teardown(
    process: subprocess.Popen[bytes] | None, namespace: str, host_side: str, network: ipaddress.IPv4Network | None
) -> None:
    if process is not None:
        stop_process(process)
    if network is not None:
        _delete_rules(network)
    # Deleting the namespace deletes its veth end (and so the pair) and the qdisc on it.
    subprocess.run(["ip", "netns", "delete", namespace], capture_output=True, check=False)
    subprocess.run(["ip", "link", "delete", host_side], capture_output=True, check=False)


@contextlib.contextmanager
def emulated_plate(plate: Path, model: StoreModel | None = None) -> Iterator[tuple[EmulatedStore, str]]:
    """A local plate in an emulated store, from a private copy with its key index (HTTP cannot list;
    the plate folder itself is left untouched); yields the running store and the plate's URL."""
    with emulated_store({plate.name: plate}, model, index=True) as store:
        yield store, f"{store.endpoint}/{plate.name}"


def namespaces() -> list[str]:
    """The names ``ip netns list`` shows (to check that a run left none behind)."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    return [line.split()[0] for line in listing.splitlines() if line.strip()]


__all__ = [
    "SERVER_BOUND_FLAG",
    "SERVER_BOUND_SHARE",
    "EmulatedStore",
    "RequestTrace",
    "ServerWindow",
    "StoreModel",
    "emulated_plate",
    "emulated_store",
    "machine_seconds",
    "namespaces",
    "sweep_stale",
    "unavailable",
]
