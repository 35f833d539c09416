"""The benchmark tracks; each runner takes (plate, preset, RunContext) and returns rows written."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from cropbench.tracks.context import RunContext
from cropbench.tracks.track1 import run_track1

TrackRunner = Callable[[str | Path, str, RunContext], int]

#: Track number → runner. Tracks 2 and 3 register here too.
TRACK_RUNNERS: dict[str, TrackRunner] = {"1": run_track1}

__all__ = ["TRACK_RUNNERS", "RunContext", "TrackRunner"]
