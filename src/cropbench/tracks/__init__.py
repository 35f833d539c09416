"""The benchmark tracks; each runner takes (plate, preset, RunContext) and returns rows written."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from cropbench.tracks.context import RunContext
from cropbench.tracks.track1 import run_track1
from cropbench.tracks.track2 import run_track2
from cropbench.tracks.track3 import run_track3

TrackRunner = Callable[[str | Path, str, RunContext], int]

#: Track number → runner.
TRACK_RUNNERS: dict[str, TrackRunner] = {"1": run_track1, "2": run_track2, "3": run_track3}

__all__ = ["TRACK_RUNNERS", "RunContext", "TrackRunner"]
