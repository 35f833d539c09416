"""Peak resident memory of one block of work, from the kernel's high-water mark.

Linux keeps each process's peak resident set size (``VmHWM`` in ``/proc/self/status``) and resets
it when ``5`` is written to ``/proc/self/clear_refs``. :class:`PeakMemory` resets it on entry and
reads it on exit, so the peak is that of the block, not of everything the process did before; where
the reset is refused (another kernel, a locked-down ``/proc``) the peak is the process's since it
started, and ``reset`` says so. Memory of other processes the block starts is not counted.
"""

from __future__ import annotations

from pathlib import Path

from cropbench.measure.protocol import rss_bytes

CLEAR_REFS = Path("/proc/self/clear_refs")
STATUS = Path("/proc/self/status")


def reset_peak() -> bool:
    """Reset this process's peak resident size to its current one; False where the kernel refuses."""
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def peak_rss_bytes() -> int | None:
    """This process's peak resident size (``VmHWM``) in bytes; None where ``/proc`` does not say."""
    try:
        for line in STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                value, unit = line.split()[1:3]
                return int(value) * (1024 if unit.lower() == "kb" else 1)
    except (OSError, ValueError, IndexError):
        return None
    return None


class PeakMemory:
    """``with PeakMemory() as memory: ...``: the block's peak resident bytes (``peak_bytes``), the resident
    bytes when it started (``start_bytes``), and whether the peak was reset for it (``reset``)."""

    def __init__(self) -> None:
        self.start_bytes = 0
        self.peak_bytes: int | None = None
        self.reset = False

    def __enter__(self) -> PeakMemory:
        self.reset = reset_peak()
        self.start_bytes = rss_bytes()
        return self

    def __exit__(self, *exc: object) -> None:
        peak = peak_rss_bytes()
        self.peak_bytes = max(peak, rss_bytes()) if peak is not None else None
