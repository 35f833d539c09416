"""The benchmark tracks, run by one loop (:mod:`cropbench.tracks.runner`) on one plate (:class:`RunContext`)."""

from __future__ import annotations

from collections.abc import Callable

from cropbench.tracks.context import RunContext
from cropbench.tracks.peers import Peers
from cropbench.tracks.runner import Row, Track, case_identity, run_tracks
from cropbench.tracks.stores import Remote
from cropbench.tracks.targets import Targets
from cropbench.tracks.track1 import Track1
from cropbench.tracks.track2 import Track2
from cropbench.tracks.track3 import Track3

#: Track name → a fresh track (tracks keep per-run state, such as Track 3's shared baselines).
TRACKS: dict[str, Callable[[], Track]] = {
    "1": Track1,
    "2": Track2,
    "3": Track3,
    "peers": Peers,
    "remote": Remote,
    "targets": Targets,
}

__all__ = ["TRACKS", "Row", "RunContext", "Track", "case_identity", "run_tracks"]
