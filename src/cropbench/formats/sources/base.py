"""The byte-source interface: byte ranges of the objects under one plate root, counted."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence

from cropbench.errors import StoreError

#: One byte range to fetch: (key, start, length); ``length`` -1 is the whole object (None if absent).
Request = tuple[str, int, int]


class ByteSource(ABC):
    """Byte ranges of the objects (files) under one plate root; keys are relative to the root.

    ``requests`` and ``bytes_transferred`` count what crossed the wire (or the syscall boundary).
    """

    location: str = ""

    def __init__(self) -> None:
        self.requests = 0
        self.bytes_transferred = 0
        self._lock = threading.Lock()

    @abstractmethod
    def get(self, key: str) -> bytes | None:
        """The whole object, or None when it does not exist (an absent chunk is its fill value)."""

    @abstractmethod
    def get_range(self, key: str, start: int, length: int) -> bytes:
        """``length`` bytes from ``start``; a short object is a :class:`StoreError`."""

    @abstractmethod
    def get_suffix(self, key: str, length: int) -> bytes | None:
        """The last ``length`` bytes (a shard index at the end), or None when the object does not exist."""

    def get_many(self, requests: Sequence[Request]) -> list[bytes | None]:
        """Every request, in order; a remote source keeps several in flight."""
        return [self.get(key) if length < 0 else self.get_range(key, start, length) for key, start, length in requests]

    def get_suffixes(self, requests: Sequence[tuple[str, int]]) -> list[bytes | None]:
        """:meth:`get_suffix` of each (key, length), in order; a remote source keeps several in flight."""
        return [self.get_suffix(key, length) for key, length in requests]

    def close(self) -> None:  # noqa: B027 - a source with nothing open has nothing to release
        """Release handles and connections."""

    def _count(self, data: bytes | None) -> None:
        self.count(1, 0 if data is None else len(data))

    def count(self, requests: int, nbytes: int) -> None:
        """Add reads made elsewhere (the direct reader's native loads) to ``requests`` and ``bytes_transferred``."""
        with self._lock:
            self.requests += requests
            self.bytes_transferred += nbytes

    def _short(self, key: str, data: bytes, start: int, length: int) -> StoreError:
        return StoreError(
            f"{self.location.rstrip('/')}/{key} is truncated: {len(data)} of {length} bytes at offset {start}"
        )
