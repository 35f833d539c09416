"""A lean HTTP/1.1 client for range GETs: keep-alive connections, a deadline per whole request, and the
body read straight into one buffer of its declared length.

Why not urllib3: a range GET through urllib3 and ``http.client`` runs about 870 Python function calls
(URL parsing, pool keys, ``email`` header parsing), which over an object store made the reader's own
client, not the store, its limit (docs/results/object-stores.md); obstore's Rust client does not
survive a fork, as DataLoader workers are started. Here a request is one ``sendall`` of a
preformatted head and a few ``recv_into`` calls.

A socket timeout bounds each read, not a request (a server sending a byte a second never trips it):
every blocking call here waits at most until the request's deadline, so an attempt ends by it
wherever it waits. Bodies are delimited by ``Content-Length``, chunked encoding or the connection's
close; a connection is reused only after a delimited body of an HTTP/1.1 response that did not ask to
close. A reused connection the server had closed while idle is retried once on a fresh one.

Many requests at once (:meth:`Client.request_many`) run on one thread over non-blocking sockets and a
selector, not a thread each: a thread per request spent about four times the CPU of the request itself
on hand-overs and the GIL, which bound an object-per-request read (one range GET a crop) to the
client's CPU rather than to the store.
"""

from __future__ import annotations

import errno
import os
import selectors
import socket
import ssl
import threading
import time
from collections import defaultdict, deque
from collections.abc import Sequence
from urllib.parse import urlsplit

#: Bytes of a response head (status line and headers) beyond which the response is refused.
MAX_HEAD_BYTES = 64 * 2**10
#: Bytes asked of the socket per read of a head, a chunk header or a body without a length.
READ_BYTES = 256 * 2**10


class ProtocolError(ConnectionError):
    """The server's answer is not well-formed HTTP/1.1, or the connection ended inside it
    (``before_response``: before any byte of the response came)."""

    def __init__(self, message: str, before_response: bool = False) -> None:
        super().__init__(message)
        self.before_response = before_response


#: One request of :meth:`Client.request_many`: (method, URL, headers, body).
Spec = tuple[str, str, dict[str, str], bytes]
#: What one request came to: (status, body), or what ended it.
Outcome = tuple[int, bytes] | BaseException


class _Connection:
    """One socket to one origin, with the bytes read past the response that was last parsed."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.pending = bytearray()
        self.reused = False

    def close(self) -> None:
        self.sock.close()


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out: no whole response within the request's deadline")
    return left


class _Target:
    """Where one request goes and the bytes that ask for it."""

    __slots__ = ("host", "message", "method", "origin", "port", "scheme")

    def __init__(self, method: str, url: str, headers: dict[str, str], body: bytes) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ProtocolError(f"not an http(s) URL: {url}")
        self.method, self.scheme, self.host = method, parts.scheme, parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.origin = f"{parts.scheme}://{parts.hostname}:{self.port}"
        target = parts.path or "/"
        if parts.query:
            target += f"?{parts.query}"
        lines = [f"{method} {target} HTTP/1.1", f"Host: {parts.netloc.rpartition('@')[2]}"]
        lines += [f"{name}: {value}" for name, value in headers.items() if name.lower() != "host"]
        if body and not any(name.lower() == "content-length" for name in headers):
            lines.append(f"Content-Length: {len(body)}")
        self.message = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


#: The stages of one exchange of :meth:`Client.request_many`.
_CONNECTING, _HANDSHAKE, _SENDING, _HEAD, _BODY = range(5)


class _Exchange:
    """One request of :meth:`Client.request_many` under way on its connection (``fd``, which stays the
    socket's through a TLS wrap). ``deadline`` is the connect's while connecting, then the request's
    (``due``); ``wants`` the selector event it waits for."""

    __slots__ = (
        "body",
        "close",
        "connection",
        "deadline",
        "due",
        "fd",
        "got",
        "index",
        "sent",
        "stage",
        "status",
        "target",
        "view",
        "wants",
    )

    def __init__(
        self, index: int, target: _Target, connection: _Connection, stage: int, deadline: float, due: float
    ) -> None:
        self.index, self.target, self.connection, self.stage = index, target, connection, stage
        self.deadline, self.due = deadline, due
        self.fd = connection.sock.fileno()
        self.sent = self.got = self.status = 0
        self.close = False
        self.body = bytearray()
        self.view = memoryview(self.body)
        self.wants = selectors.EVENT_WRITE


class Client:
    """Keep-alive HTTP/1.1 connections, pooled per origin (``scheme://host:port``), shared by threads.

    :meth:`request` is safe from many threads at once: each takes its own connection; so is
    :meth:`request_many`, whose requests of all threads together hold at most ``max_idle`` connections.
    Not for use across a fork (a child builds its own: sockets would be shared with the parent)."""

    def __init__(self, connect_timeout_s: float, max_idle: int) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.max_idle = max_idle
        self._idle: defaultdict[str, list[_Connection]] = defaultdict(list)
        self._lock = threading.Lock()
        self._ssl: ssl.SSLContext | None = None
        self._slots = threading.BoundedSemaphore(max(max_idle, 1))
        self._addresses: dict[tuple[str, int], tuple[int, tuple[object, ...]]] = {}

    def request(
        self, method: str, url: str, headers: dict[str, str], body: bytes, deadline: float
    ) -> tuple[int, bytes]:
        """(status, body) of one request, ended by ``deadline`` (``time.monotonic()`` seconds) wherever it
        waits. Raises ``TimeoutError``, ``OSError`` (connection failures) or :class:`ProtocolError`."""
        target = _Target(method, url, headers, body)
        while True:
            connection = self._take(target.origin, target.scheme, target.host, target.port, deadline)
            try:
                status, data, keep = self._exchange(connection, target.message, method, deadline)
            except ProtocolError as error:
                connection.close()
                if connection.reused and error.before_response:
                    continue  # the server closed it while idle: once more on a fresh connection
                raise
            except BaseException:
                connection.close()
                raise
            self._finish(target.origin, connection, keep)
            return status, data

    def request_many(self, specs: Sequence[Spec], timeout_s: float) -> list[Outcome]:
        """The outcome of each request, in order: (status, body), or the ``TimeoutError``, ``OSError`` or
        :class:`ProtocolError` that ended it. One thread keeps them in flight over non-blocking sockets,
        each request ended ``timeout_s`` after it started wherever it waits. A body that is not delimited
        by ``Content-Length`` (chunked, or up to the connection's close) is read on, blocking, as
        :meth:`request` reads it: an object store sends lengths."""
        outcomes: list[Outcome | None] = [None] * len(specs)
        waiting: deque[tuple[int, bool]] = deque()  # (index, on a fresh connection)
        targets: list[_Target | None] = [None] * len(specs)
        for index, (method, url, headers, body) in enumerate(specs):
            try:
                targets[index] = _Target(method, url, headers, body)
                waiting.append((index, False))
            except ProtocolError as error:
                outcomes[index] = error
        active: dict[int, _Exchange] = {}
        scratch = memoryview(bytearray(READ_BYTES))  # what a head's read lands in (one buffer: no allocation a read)
        with selectors.DefaultSelector() as selector:
            try:
                while waiting or active:
                    while waiting and self._slots.acquire(blocking=not active):
                        index, fresh = waiting.popleft()
                        target = targets[index]
                        assert target is not None
                        try:
                            exchange = self._start(index, target, fresh, time.monotonic() + timeout_s)
                        except (OSError, ssl.SSLError) as error:
                            self._slots.release()
                            outcomes[index] = error
                            continue
                        active[id(exchange)] = exchange
                        selector.register(exchange.fd, exchange.wants, exchange)
                    if not active:
                        continue
                    now = time.monotonic()
                    soonest = min(exchange.deadline for exchange in active.values())
                    for key, _ in selector.select(max(soonest - now, 0.0)):
                        exchange = key.data
                        waited = key.events
                        try:
                            done = self._advance(exchange, scratch)
                        except (OSError, ssl.SSLError, ProtocolError) as error:
                            self._end(selector, active, exchange, keep=False)
                            if _idle_close(exchange, error):  # once more on a fresh connection
                                waiting.appendleft((exchange.index, True))
                            else:
                                outcomes[exchange.index] = error
                            continue
                        if done is None:
                            if exchange.wants != waited:
                                selector.modify(exchange.fd, exchange.wants, exchange)
                        else:
                            outcomes[exchange.index] = (exchange.status, done[0])
                            self._end(selector, active, exchange, keep=done[1])
                    now = time.monotonic()
                    for exchange in [exchange for exchange in active.values() if exchange.deadline <= now]:
                        self._end(selector, active, exchange, keep=False)
                        outcomes[exchange.index] = TimeoutError(
                            "timed out: no whole response within the request's deadline"
                        )
            finally:
                for exchange in list(active.values()):
                    self._end(selector, active, exchange, keep=False)
        return [outcome if outcome is not None else ProtocolError("no outcome") for outcome in outcomes]

    def close(self) -> None:
        """Close every idle connection (those in use close when their request ends)."""
        with self._lock:
            idle = [connection for pool in self._idle.values() for connection in pool]
            self._idle.clear()
        for connection in idle:
            connection.close()

    # --- request_many's steps ----------------------------------------------------------------------

    def _start(self, index: int, target: _Target, fresh: bool, deadline: float) -> _Exchange:
        """An exchange on an idle connection of the target's origin (unless ``fresh``) or on a new one
        whose connect is under way."""
        connection = None if fresh else self._idle_connection(target.origin)
        if connection is not None:
            connection.sock.setblocking(False)
            return _Exchange(index, target, connection, _SENDING, deadline, deadline)
        family, address = self._address(target.host, target.port)
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            code = sock.connect_ex(address)
            if code not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
                raise ConnectionRefusedError(code, f"cannot connect to {target.origin}: {os.strerror(code)}")
        except BaseException:
            sock.close()
            raise
        connect_by = min(deadline, time.monotonic() + self.connect_timeout_s)
        return _Exchange(index, target, _Connection(sock), _CONNECTING, connect_by, deadline)

    def _advance(self, exchange: _Exchange, scratch: memoryview) -> tuple[bytes, bool] | None:
        """Take the exchange as far as its socket allows now: (body, connection reusable) once the
        response is whole, else None (its stage says what it waits for)."""
        connection = exchange.connection
        sock = connection.sock
        try:
            if exchange.stage == _CONNECTING:
                code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if code:
                    origin = exchange.target.origin
                    raise ConnectionRefusedError(code, f"cannot connect to {origin}: {os.strerror(code)}")
                exchange.deadline = exchange.due
                exchange.stage = _SENDING
                if exchange.target.scheme == "https":  # the TLS socket takes over the same descriptor
                    sock = connection.sock = self._context().wrap_socket(
                        sock, server_hostname=exchange.target.host, do_handshake_on_connect=False
                    )
                    exchange.stage = _HANDSHAKE
            if exchange.stage == _HANDSHAKE:
                assert isinstance(sock, ssl.SSLSocket)
                sock.do_handshake()
                exchange.stage = _SENDING
            if exchange.stage == _SENDING:
                message = exchange.target.message
                while exchange.sent < len(message):
                    try:
                        exchange.sent += sock.send(message[exchange.sent :])
                    except ConnectionError as error:
                        raise ProtocolError(f"the connection failed sending the request ({error})", True) from error
                exchange.stage = _HEAD
            while True:  # read until the socket has no more for now (a TLS record may hold more than one read)
                if exchange.stage == _BODY:
                    count = sock.recv_into(exchange.view[exchange.got :])
                    if not count:
                        length = len(exchange.body)
                        raise ProtocolError(f"the connection closed after {exchange.got} of {length} body bytes")
                    exchange.got += count
                    if exchange.got == len(exchange.body):
                        return self._whole(exchange)
                    continue
                try:
                    count = sock.recv_into(scratch)
                except ConnectionError as error:
                    raise ProtocolError(
                        f"the connection failed before the response head ended ({error})", not connection.pending
                    ) from error
                if not count:
                    raise ProtocolError("the connection closed before the response head ended", not connection.pending)
                connection.pending += scratch[:count]
                answer = self._after_head(exchange)
                if answer is not None:
                    return answer
        except ssl.SSLWantReadError:
            exchange.wants = selectors.EVENT_READ
            return None
        except (BlockingIOError, ssl.SSLWantWriteError) as error:
            blocked_sending = isinstance(error, ssl.SSLWantWriteError) or exchange.stage == _SENDING
            exchange.wants = selectors.EVENT_WRITE if blocked_sending else selectors.EVENT_READ
            return None

    def _after_head(self, exchange: _Exchange) -> tuple[bytes, bool] | None:
        """Once the pending bytes hold a whole final head, the body's start; None while they do not."""
        connection = exchange.connection
        while True:
            head = _parse_head(connection)
            if head is None:
                return None
            status, version, fields = head
            if not 100 <= status < 200:
                break
        exchange.status = status
        size, chunked, close = _framing(exchange.target.method, status, version, fields)
        if size is not None:
            pending = connection.pending
            exchange.close = close
            if len(pending) >= size:  # the whole body came with the head: one copy
                with memoryview(pending) as view:
                    data = bytes(view[:size])
                del pending[:size]
                return data, not close and not pending
            exchange.body = bytearray(size)
            exchange.view = memoryview(exchange.body)
            exchange.got = len(pending)
            exchange.view[: exchange.got] = pending
            pending.clear()
            exchange.stage = _BODY
            return None
        # Chunked, or up to the close: read on, blocking, as request() does.
        connection.sock.setblocking(True)
        if chunked:
            data, delimited = self._chunked(connection, exchange.deadline), True
        else:
            data, delimited = self._until_close(connection, exchange.deadline), False
        return data, delimited and not close and not connection.pending

    def _whole(self, exchange: _Exchange) -> tuple[bytes, bool]:
        exchange.view.release()
        keep = not exchange.close and not exchange.connection.pending
        return bytes(exchange.body), keep

    def _end(
        self, selector: selectors.BaseSelector, active: dict[int, _Exchange], exchange: _Exchange, keep: bool
    ) -> None:
        """The exchange is over: its socket leaves the selector, its connection goes back to the pool (or
        closes) and its slot frees."""
        del active[id(exchange)]
        selector.unregister(exchange.fd)
        self._finish(exchange.target.origin, exchange.connection, keep)
        self._slots.release()

    # --- connections --------------------------------------------------------------------------------

    def _address(self, host: str, port: int) -> tuple[int, tuple[object, ...]]:
        """The first TCP address of ``host:port`` (looked up once per client)."""
        known = self._addresses.get((host, port))
        if known is None:
            family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
            known = self._addresses[(host, port)] = (family, address)
        return known

    def _context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    def _idle_connection(self, origin: str) -> _Connection | None:
        with self._lock:
            pool = self._idle.get(origin)
            if pool:
                connection = pool.pop()
                connection.reused = True
                return connection
        return None

    def _take(self, origin: str, scheme: str, host: str, port: int, deadline: float) -> _Connection:
        connection = self._idle_connection(origin)
        if connection is not None:
            return connection
        sock = socket.create_connection((host, port), timeout=min(self.connect_timeout_s, _remaining(deadline)))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if scheme == "https":
            sock.settimeout(_remaining(deadline))
            sock = self._context().wrap_socket(sock, server_hostname=host)
        return _Connection(sock)

    def _finish(self, origin: str, connection: _Connection, keep: bool) -> None:
        """A connection whose exchange ended: back to the pool if it may carry another, else closed."""
        if keep:
            with self._lock:
                pool = self._idle[origin]
                if len(pool) < self.max_idle:
                    pool.append(connection)
                    return
        connection.close()

    # --- blocking reads -----------------------------------------------------------------------------

    def _exchange(
        self, connection: _Connection, message: bytes, method: str, deadline: float
    ) -> tuple[int, bytes, bool]:
        sock = connection.sock
        sock.settimeout(_remaining(deadline))
        try:
            sock.sendall(message)
        except ConnectionError as error:
            raise ProtocolError(f"the connection failed sending the request ({error})", True) from error
        while True:
            status, version, fields = self._head(connection, deadline)
            if not 100 <= status < 200:
                break
        size, chunked, close = _framing(method, status, version, fields)
        if size is not None:
            data, delimited = self._exactly(connection, size, deadline), True
        elif chunked:
            data, delimited = self._chunked(connection, deadline), True
        else:
            data, delimited = self._until_close(connection, deadline), False
        return status, data, delimited and not close and not connection.pending

    def _fill(self, connection: _Connection, deadline: float, what: str, before_response: bool = False) -> None:
        """Read more bytes into ``connection.pending``; the connection ending here is a ProtocolError."""
        sock = connection.sock
        sock.settimeout(_remaining(deadline))
        before_response = before_response and not connection.pending
        try:
            more = sock.recv(READ_BYTES)
        except ConnectionError as error:
            raise ProtocolError(f"the connection failed {what} ({error})", before_response) from error
        if not more:
            raise ProtocolError(f"the connection closed {what}", before_response)
        connection.pending += more

    def _head(self, connection: _Connection, deadline: float) -> tuple[int, str, dict[str, str]]:
        first = True
        while (head := _parse_head(connection)) is None:
            self._fill(connection, deadline, "before the response head ended", before_response=first)
            first = False
        return head

    def _exactly(self, connection: _Connection, length: int, deadline: float) -> bytes:
        """``length`` body bytes: what was read with the head, then ``recv_into`` the rest of one buffer."""
        pending = connection.pending
        if len(pending) >= length:
            data = bytes(pending[:length])
            del pending[:length]
            return data
        buffer = bytearray(length)
        view = memoryview(buffer)
        got = len(pending)
        view[:got] = pending
        pending.clear()
        sock = connection.sock
        while got < length:
            sock.settimeout(_remaining(deadline))
            count = sock.recv_into(view[got:])
            if not count:
                raise ProtocolError(f"the connection closed after {got} of {length} body bytes")
            got += count
        view.release()
        return bytes(buffer)

    def _line(self, connection: _Connection, deadline: float) -> bytes:
        while (end := connection.pending.find(b"\r\n")) < 0:
            if len(connection.pending) > MAX_HEAD_BYTES:
                raise ProtocolError("a chunk header is too long")
            self._fill(connection, deadline, "inside a chunked body")
        line = bytes(connection.pending[:end])
        del connection.pending[: end + 2]
        return line

    def _chunked(self, connection: _Connection, deadline: float) -> bytes:
        pieces: list[bytes] = []
        while True:
            size_text = self._line(connection, deadline).split(b";")[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise ProtocolError(f"not a chunk size: {size_text[:20]!r}") from None
            if size == 0:
                while self._line(connection, deadline):  # trailers, up to the empty line
                    pass
                return b"".join(pieces)
            pieces.append(self._exactly(connection, size, deadline))
            if self._line(connection, deadline):
                raise ProtocolError("a chunk is longer than its size says")

    def _until_close(self, connection: _Connection, deadline: float) -> bytes:
        sock = connection.sock
        while True:
            sock.settimeout(_remaining(deadline))
            more = sock.recv(READ_BYTES)
            if not more:
                data = bytes(connection.pending)
                connection.pending.clear()
                return data
            connection.pending += more


def _idle_close(exchange: _Exchange, error: BaseException) -> bool:
    """Whether ``error`` is the server having closed a kept connection while it was idle."""
    return exchange.connection.reused and isinstance(error, ProtocolError) and error.before_response


def _parse_head(connection: _Connection) -> tuple[int, str, dict[str, str]] | None:
    """(status, version, fields) of the response head at the start of ``connection.pending``, taken off
    it; None while the head has not ended there."""
    pending = connection.pending
    end = pending.find(b"\r\n\r\n")
    if end < 0:
        if len(pending) > MAX_HEAD_BYTES:
            raise ProtocolError(f"the response head is over {MAX_HEAD_BYTES} bytes")
        return None
    head = bytes(pending[:end]).decode("latin-1")
    del pending[: end + 4]
    status_line, *header_lines = head.split("\r\n")
    version, _, rest = status_line.partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise ProtocolError(f"not an HTTP/1 status line: {status_line[:80]!r}")
    fields: dict[str, str] = {}
    for line in header_lines:
        name, colon, value = line.partition(":")
        if not colon:
            raise ProtocolError(f"not a header line: {line[:80]!r}")
        key = name.strip().lower()
        fields[key] = f"{fields[key]}, {value.strip()}" if key in fields else value.strip()
    return int(code), version, fields


def _framing(method: str, status: int, version: str, fields: dict[str, str]) -> tuple[int | None, bool, bool]:
    """How the body after a final head ends: (its length where the head gives it, 0 where there is no
    body; None where it is chunked or runs to the connection's close), whether it is chunked, and
    whether the connection closes after it."""
    length = _content_length(fields)
    chunked = "chunked" in fields.get("transfer-encoding", "").lower()
    close = "close" in fields.get("connection", "").lower() or version == "HTTP/1.0"
    if method == "HEAD" or status in (204, 304):
        return 0, False, close
    return (None if chunked else length), chunked, close


def _content_length(fields: dict[str, str]) -> int | None:
    """The body's declared length, or None where the head declares none."""
    if "content-length" not in fields:
        return None
    try:
        length = int(fields["content-length"])
    except ValueError:
        raise ProtocolError(f"Content-Length is not a number: {fields['content-length']!r}") from None
    if length < 0:
        raise ProtocolError(f"Content-Length is negative: {length}")
    return length
