"""The benchmark tracks, one module or package each, named by the track: ``tracks/NAME`` is track
``NAME`` (a hyphen in the name is an underscore in the module).

:data:`TRACKS` is the one table of them that the command line, :func:`cropbench.run` and the verdict
read. Track modules import only what lies below them (:mod:`cropbench.harness` and lower layers), never
one another; a track's module is imported only when the track is built, so reading the table is cheap.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cropbench.errors import ConfigError
from cropbench.records import DATASET_TRACK, FORMER_VALUES, LOADER_TRACK, TRAINING_TRACK

if TYPE_CHECKING:
    from cropbench.harness.runner import Track


@dataclass(frozen=True)
class TrackInfo:
    """One track: its name, what it measures, and how it is started.

    The name is the track's one word: its module (hyphens as underscores), the value its records carry
    in ``Record.track`` and what ``cropbench run --track`` takes. ``runner_class`` names the class in the
    track's module that ``cropbench run --track NAME`` builds with no arguments; a track without one takes
    a comparison of its own and is started by ``command``. ``aliases`` are other names ``--track`` accepts
    (Tracks 1-3 by their former numbers, which rows written before the names still carry; reading a row
    gives it the name, :func:`cropbench.records.track_name`).
    """

    name: str
    title: str
    aliases: tuple[str, ...] = ()
    runner_class: str | None = None
    command: str | None = None

    @property
    def module(self) -> str:
        """The track's module: ``cropbench.tracks.`` and its name, hyphens as underscores."""
        return f"{__name__}.{self.name.replace('-', '_')}"

    def build(self) -> Track:
        """A fresh track for the runner (tracks keep per-run state, such as the training track's shared baselines)."""
        if self.runner_class is None:
            raise ConfigError(f"track {self.name!r} is run by `cropbench {self.command}`, not `cropbench run --track`")
        track: Track = getattr(importlib.import_module(self.module), self.runner_class)()
        return track


#: Every track, by name, in the order the command line lists them.
TRACKS: dict[str, TrackInfo] = {
    info.name: info
    for info in (
        TrackInfo(DATASET_TRACK, "Dataset __getitem__", (FORMER_VALUES[DATASET_TRACK],), runner_class="Dataset"),
        TrackInfo(LOADER_TRACK, "DataLoader", (FORMER_VALUES[LOADER_TRACK],), runner_class="Loader"),
        TrackInfo(TRAINING_TRACK, "training loop", (FORMER_VALUES[TRAINING_TRACK],), runner_class="Training"),
        TrackInfo("peers", "peer loaders", runner_class="Peers"),
        TrackInfo("remote", "a plate in an object store", runner_class="Remote"),
        TrackInfo("targets", "direct reader against the copy ceiling and peers", runner_class="Targets"),
        TrackInfo("layouts", "storage layouts", command="compare-layouts"),
        TrackInfo("store-layouts", "layouts in an object store", command="compare-layouts --plate URL"),
        TrackInfo("formats", "crops converted to training formats", command="compare-formats"),
        TrackInfo("prefetch", "read-ahead over the emulated object store", command="prefetch-bench"),
        TrackInfo("scale", "costs against the object count", command="scale sweep"),
        TrackInfo("out-of-memory", "layouts on plates larger than memory", command="scale out-of-memory"),
    )
}

#: What each track measures, by its name (the value its records carry in ``Record.track``).
TITLES: dict[str, str] = {info.name: info.title for info in TRACKS.values()}


def runnable() -> list[str]:
    """The names ``cropbench run --track`` accepts: each runnable track's name, then its aliases."""
    infos = [info for info in TRACKS.values() if info.runner_class is not None]
    return [info.name for info in infos] + [alias for info in infos for alias in info.aliases]


def track_named(name: str) -> TrackInfo:
    """The track ``cropbench run --track NAME`` means (its name or an alias)."""
    for info in TRACKS.values():
        if name == info.name or name in info.aliases:
            return info
    raise ConfigError(f"track {name!r} is not one of {', '.join(runnable())}")


__all__ = ["TITLES", "TRACKS", "TrackInfo", "runnable", "track_named"]
