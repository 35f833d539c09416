"""The local byte source: ``os.pread`` on the regular files under a plate folder, and the check that
refuses anything else (a FIFO, a device, a directory) before it is opened."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from cropbench.errors import StoreError
from cropbench.formats.sources.base import ByteSource


def check_regular(path: str | Path) -> bool:
    """Whether ``path`` exists; a :class:`StoreError` when it is something other than a regular file
    (a FIFO blocks a reader forever, a device such as ``/dev/zero`` never ends), checked without opening it."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return False
    except OSError as error:
        raise StoreError(f"cannot read {path}: {error.strerror or error}") from error
    if not stat.S_ISREG(mode):
        raise not_regular(path, mode)
    return True


def not_regular(path: str | Path, mode: int) -> StoreError:
    """The error for a plate file that is not a regular file, naming what it is."""
    kinds = [(stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a device")]
    kinds += [(stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket")]
    kind = next((name for test, name in kinds if test(mode)), "special")
    return StoreError(f"{path} is not a regular file ({kind}); a plate holds regular files only")


class FileSource(ByteSource):
    """Objects as files under a local folder: ``os.pread`` on descriptors opened once per process.

    Only regular files are opened: a FIFO would block the reader forever, a device (``/dev/zero``)
    never ends, a directory is not an object; each is a :class:`StoreError` before it is opened.
    """

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.location = str(root)
        self._prefix = f"{root}{os.sep}"
        self._descriptors: dict[str, int] = {}

    def get(self, key: str) -> bytes | None:
        descriptor = self._open(key)
        if descriptor is None:
            return None
        try:
            with open(descriptor, "rb", buffering=0) as handle:
                data = handle.readall()
        except OSError as error:
            raise StoreError(f"cannot read {self._prefix}{key}: {error.strerror or error}") from error
        self._count(data)
        return data

    def path(self, key: str) -> str:
        """The file that holds object ``key`` (for a reader that opens it itself): a :class:`StoreError`
        when something other than a regular file is there."""
        path = self._prefix + key
        check_regular(path)
        return path

    def _open(self, key: str) -> int | None:
        """A descriptor of ``key``'s file, or None when it does not exist; refuses anything but a regular file.

        Checked before opening (opening a device may act on it), and again on the descriptor, opened
        non-blocking (a FIFO swapped in between cannot block the open), so nothing else is ever read.
        """
        self.path(key)
        try:
            descriptor = os.open(self._prefix + key, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as error:
            raise StoreError(f"cannot read {self._prefix}{key}: {error.strerror or error}") from error
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            os.close(descriptor)
            raise not_regular(self._prefix + key, mode)
        os.set_blocking(descriptor, True)
        return descriptor

    def descriptor(self, key: str) -> int | None:
        """A descriptor of object ``key``'s file, opened once per process and kept; None when it does not exist."""
        descriptor = self._descriptors.get(key)
        if descriptor is None:
            with self._lock:  # decode threads may ask for the same new shard at once: open it once
                descriptor = self._descriptors.get(key)
                if descriptor is None:
                    descriptor = self._open(key)
                    if descriptor is None:
                        return None
                    self._descriptors[key] = descriptor
        return descriptor

    def get_range(self, key: str, start: int, length: int) -> bytes:
        descriptor = self.descriptor(key)
        if descriptor is None:
            raise StoreError(f"{self._prefix}{key} does not exist")
        data = os.pread(descriptor, length, start)
        self._count(data)
        if len(data) != length:
            raise self._short(key, data, start, length)
        return data

    def get_suffix(self, key: str, length: int) -> bytes | None:
        descriptor = self.descriptor(key)
        if descriptor is None:
            return None
        start = os.fstat(descriptor).st_size - length
        if start < 0:
            raise self._short(key, b"", 0, length)
        return self.get_range(key, start, length)

    def close(self) -> None:
        for descriptor in self._descriptors.values():
            os.close(descriptor)
        self._descriptors.clear()
