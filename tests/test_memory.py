"""Peak resident memory of a block: reset for the block where the kernel allows it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cropbench.measure import memory
from cropbench.measure.memory import PeakMemory, peak_rss_bytes


def test_the_peak_covers_what_the_block_held_and_is_reset_for_the_next() -> None:
    if peak_rss_bytes() is None:
        pytest.skip("/proc/self/status has no VmHWM here")
    held = 64 * 2**20
    with PeakMemory() as block:
        pixels = np.ones(held, dtype=np.uint8)
        del pixels
    assert block.peak_bytes is not None and block.peak_bytes - block.start_bytes >= held * 0.9
    with PeakMemory() as later:
        pass
    if later.reset:  # the kernel reset the peak: the earlier block's 64 MiB is not counted again
        assert later.peak_bytes is not None and later.peak_bytes - later.start_bytes < held / 2


def test_without_a_reset_the_peak_is_the_processs_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "CLEAR_REFS", tmp_path / "missing" / "clear_refs")
    with PeakMemory() as block:
        pass
    assert block.reset is False


def test_no_status_file_means_no_peak(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "STATUS", tmp_path / "status")
    assert peak_rss_bytes() is None
    (tmp_path / "status").write_text("Name:\tpython\nVmHWM:\t  2048 kB\n")
    assert peak_rss_bytes() == 2048 * 1024
