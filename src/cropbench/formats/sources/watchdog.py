"""Deadlines for whole HTTP requests: a watchdog thread shuts the socket of an attempt that outlives its
deadline, wherever it waits, and a urllib3 pool manager whose connections attach to the attempt they
serve. A socket timeout bounds each read, not a request: a server sending a byte a second never trips it."""

from __future__ import annotations

import contextlib
import heapq
import itertools
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any


class Watch:
    """One request attempt's deadline and the connection it runs on (attached when it sends)."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.expired = False
        self.done = False
        self.connection: Any = None
        self.lock = threading.Lock()

    def attach(self, connection: Any) -> None:
        with self.lock:
            if self.expired:
                raise TimeoutError("the request's deadline passed before it was sent")
            self.connection = connection

    def detach(self) -> None:
        with self.lock:
            self.connection = None

    def finish(self) -> None:
        with self.lock:
            self.done = True
            self.connection = None

    def expire(self) -> None:
        """Past the deadline: shut the connection's socket, so a read blocked on it returns at once."""
        with self.lock:
            if self.done:
                return
            self.expired = True
            sock = getattr(self.connection, "sock", None)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


#: The attempt the calling thread is making (the connection class attaches itself to it).
_CURRENT = threading.local()


class Watchdog:
    """Ends request attempts that outlive their deadline, from one thread per source and process.

    A socket timeout bounds each read, not a request: a server sending a byte a second never trips it.
    Shutting the socket at the deadline ends the attempt wherever it waits (headers or body).
    """

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._watches: list[tuple[float, int, Watch]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def watch(self, seconds: float) -> Watch:
        watch = Watch(time.monotonic() + seconds)
        with self._condition:
            heapq.heappush(self._watches, (watch.deadline, next(self._order), watch))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="cropbench-deadlines", daemon=True)
                self._thread.start()
            self._condition.notify()
        return watch

    def stop(self) -> None:
        with self._condition:
            self._stopped = True
            self._condition.notify()

    def _run(self) -> None:
        with self._condition:
            while not self._stopped:
                while self._watches and self._watches[0][2].done:
                    heapq.heappop(self._watches)
                if not self._watches:
                    self._condition.wait()
                    continue
                wait = self._watches[0][0] - time.monotonic()
                if wait > 0:
                    self._condition.wait(wait)
                    continue
                heapq.heappop(self._watches)[2].expire()


@contextlib.contextmanager
def watching(watch: Watch) -> Iterator[Watch]:
    """Make ``watch`` the calling thread's attempt for the block (the connection that sends the request
    attaches to it), and finish it when the block ends, however it ends."""
    _CURRENT.watch = watch
    try:
        yield watch
    finally:
        _CURRENT.watch = None
        watch.finish()


def watched_pool_manager(**options: Any) -> Any:
    """A urllib3 pool manager whose connections attach to the calling thread's :class:`Watch` when
    they send, and detach before they go back to the pool (a late deadline never shuts a socket that
    another request has taken)."""
    import urllib3
    from urllib3.connection import HTTPConnection, HTTPSConnection
    from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

    class Watched:
        def request(self, *args: Any, **kwargs: Any) -> None:
            watch = getattr(_CURRENT, "watch", None)
            if watch is not None:
                watch.attach(self)
                self._cropbench_watch = watch
            super().request(*args, **kwargs)  # type: ignore[misc]

    class WatchedPool:
        def _put_conn(self, conn: Any) -> None:
            watch = getattr(conn, "_cropbench_watch", None)
            if watch is not None:
                watch.detach()
                conn._cropbench_watch = None
            super()._put_conn(conn)  # type: ignore[misc]

    class WatchedHTTPConnection(Watched, HTTPConnection):
        pass

    class WatchedHTTPSConnection(Watched, HTTPSConnection):
        pass

    class WatchedHTTPPool(WatchedPool, HTTPConnectionPool):
        ConnectionCls = WatchedHTTPConnection

    class WatchedHTTPSPool(WatchedPool, HTTPSConnectionPool):
        ConnectionCls = WatchedHTTPSConnection

    manager = urllib3.PoolManager(**options)
    manager.pool_classes_by_scheme = {"http": WatchedHTTPPool, "https": WatchedHTTPSPool}
    return manager
