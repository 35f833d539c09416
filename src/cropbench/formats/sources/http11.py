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
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections import defaultdict
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


class Client:
    """Keep-alive HTTP/1.1 connections, pooled per origin (``scheme://host:port``), shared by threads.

    :meth:`request` is safe from many threads at once: each takes its own connection. Not for use
    across a fork (a child builds its own: sockets would be shared with the parent)."""

    def __init__(self, connect_timeout_s: float, max_idle: int) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.max_idle = max_idle
        self._idle: defaultdict[str, list[_Connection]] = defaultdict(list)
        self._lock = threading.Lock()
        self._ssl: ssl.SSLContext | None = None

    def request(
        self, method: str, url: str, headers: dict[str, str], body: bytes, deadline: float
    ) -> tuple[int, bytes]:
        """(status, body) of one request, ended by ``deadline`` (``time.monotonic()`` seconds) wherever it
        waits. Raises ``TimeoutError``, ``OSError`` (connection failures) or :class:`ProtocolError`."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ProtocolError(f"not an http(s) URL: {url}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        origin = f"{parts.scheme}://{parts.hostname}:{port}"
        target = parts.path or "/"
        if parts.query:
            target += f"?{parts.query}"
        lines = [f"{method} {target} HTTP/1.1", f"Host: {parts.netloc.rpartition('@')[2]}"]
        lines += [f"{name}: {value}" for name, value in headers.items() if name.lower() != "host"]
        if body and not any(name.lower() == "content-length" for name in headers):
            lines.append(f"Content-Length: {len(body)}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        while True:
            connection = self._take(origin, parts.scheme, parts.hostname, port, deadline)
            try:
                status, data, keep = self._exchange(connection, head + body, method, deadline)
            except ProtocolError as error:
                connection.close()
                if connection.reused and error.before_response:
                    continue  # the server closed it while idle: once more on a fresh connection
                raise
            except BaseException:
                connection.close()
                raise
            if keep:
                self._give_back(origin, connection)
            else:
                connection.close()
            return status, data

    def close(self) -> None:
        """Close every idle connection (those in use close when their request ends)."""
        with self._lock:
            idle = [connection for pool in self._idle.values() for connection in pool]
            self._idle.clear()
        for connection in idle:
            connection.close()

    def _take(self, origin: str, scheme: str, host: str, port: int, deadline: float) -> _Connection:
        with self._lock:
            pool = self._idle.get(origin)
            if pool:
                connection = pool.pop()
                connection.reused = True
                return connection
        sock = socket.create_connection((host, port), timeout=min(self.connect_timeout_s, _remaining(deadline)))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            sock.settimeout(_remaining(deadline))
            sock = self._ssl.wrap_socket(sock, server_hostname=host)
        return _Connection(sock)

    def _give_back(self, origin: str, connection: _Connection) -> None:
        with self._lock:
            pool = self._idle[origin]
            if len(pool) < self.max_idle:
                pool.append(connection)
                return
        connection.close()

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
        if method == "HEAD" or status in (204, 304):
            data, delimited = b"", True
        elif "chunked" in fields.get("transfer-encoding", "").lower():
            data, delimited = self._chunked(connection, deadline), True
        elif "content-length" in fields:
            try:
                length = int(fields["content-length"])
            except ValueError:
                raise ProtocolError(f"Content-Length is not a number: {fields['content-length']!r}") from None
            if length < 0:
                raise ProtocolError(f"Content-Length is negative: {length}")
            data, delimited = self._exactly(connection, length, deadline), True
        else:
            data, delimited = self._until_close(connection, deadline), False
        close = "close" in fields.get("connection", "").lower() or version == "HTTP/1.0"
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
        while (end := connection.pending.find(b"\r\n\r\n")) < 0:
            if len(connection.pending) > MAX_HEAD_BYTES:
                raise ProtocolError(f"the response head is over {MAX_HEAD_BYTES} bytes")
            self._fill(connection, deadline, "before the response head ended", before_response=first)
            first = False
        head = bytes(connection.pending[:end]).decode("latin-1")
        del connection.pending[: end + 4]
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
