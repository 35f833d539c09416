"""The peers track: every peer by name, one comparison's settings, the steady-state measurement of a
loader, and the rows beside cropbench's own decode paths."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cropbench import metrics as m
from cropbench.config import DEFAULT_CROP_SIZE, CropConfig
from cropbench.data.dataset import CropDataset
from cropbench.data.sampling import access_order
from cropbench.errors import ConfigError, PeerUnavailableError
from cropbench.harness.context import RunContext
from cropbench.harness.runner import Row
from cropbench.harness.validity import validity
from cropbench.measure.protocol import (
    STEADY_LOOPS,
    Stopwatch,
    load_into_page_cache,
    resident_fraction,
    steady_state,
    time_each,
)
from cropbench.tracks.peers.arrow_rows import ArrowCropRows, ArrowFieldRows
from cropbench.tracks.peers.base import CropWindows, PeerDataset
from cropbench.tracks.peers.dask_arrays import DaskPerCrop
from cropbench.tracks.peers.spatialdata_tiles import SpatialDataTiles
from cropbench.tracks.peers.tensorstores import TensorStoreBatched, TensorStorePerCrop
from cropbench.tracks.peers.zarr_python import ZarrKeptOpen, ZarrOpenPerCrop, ZarrsKeptOpen

TRACK = "peers"
#: cropbench's own decode paths, measured before the peers (direct first: the others' denominator).
CROPBENCH_DECODES = ("direct", "zarr", "field")
#: Fewest steady samples per loader, however slow it is (p50 is still meaningful).
MIN_SAMPLES = 20


#: Every peer, in the order rows are written.
PEERS: dict[str, type[PeerDataset]] = {
    peer.name: peer
    for peer in (
        ZarrOpenPerCrop,
        ZarrKeptOpen,
        ZarrsKeptOpen,
        TensorStorePerCrop,
        TensorStoreBatched,
        DaskPerCrop,
        SpatialDataTiles,
        ArrowCropRows,
        ArrowFieldRows,
    )
}


def open_peer(name: str, windows: CropWindows, work_dir: Path | None = None) -> PeerDataset:
    """The peer called ``name`` over ``windows``; raises PeerUnavailableError when it cannot run here."""
    if name not in PEERS:
        raise ConfigError(f"peer={name!r} is not one of {', '.join(PEERS)}")
    return PEERS[name](windows, work_dir)


@dataclass(frozen=True)
class PeerComparison:
    """One side-by-side run: cropbench's decode paths and the peers on one random order of objects.

    ``seconds`` bounds each loader's steady state (tight loop plus timed loop); slow peers then
    measure a prefix of the same order (at least ``MIN_SAMPLES``), and each row records how many.
    """

    samples: int = 1000
    warmup: int = 50
    seconds: float = 10.0
    crop_size: int = DEFAULT_CROP_SIZE
    seed: int = 0
    peers: tuple[str, ...] = tuple(PEERS)

    def __post_init__(self) -> None:
        if self.samples < MIN_SAMPLES:
            raise ConfigError(f"samples must be >= {MIN_SAMPLES}, got {self.samples}")
        if self.warmup < 1:
            raise ConfigError(f"warmup must be >= 1, got {self.warmup}")
        if self.seconds <= 0:
            raise ConfigError(f"seconds must be positive, got {self.seconds}")
        unknown = [name for name in self.peers if name not in PEERS]
        if unknown:
            raise ConfigError(f"peer {unknown[0]!r} is not one of {', '.join(PEERS)}")

    @classmethod
    def for_preset(cls, preset: str, samples: int | None = None) -> PeerComparison:
        presets = {"smoke": cls(samples=300, warmup=20, seconds=3.0), "full": cls(samples=1000, warmup=50)}
        if preset not in presets:
            raise ConfigError(f"preset={preset!r} is not one of {', '.join(presets)}")
        return dataclasses.replace(presets[preset], samples=samples) if samples else presets[preset]


def measure_loader(
    get: Callable[[Any], Any],
    indices: Sequence[Any],
    comparison: PeerComparison,
    before_steady: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Warm up, then Track 1's steady state (tight loop + timed loop) within the time budget.

    ``before_steady`` runs between the two (a reader resets its read-amplification counters there).
    """
    warm, steady = list(indices[: comparison.warmup]), list(indices[comparison.warmup :])
    # Medians, so a one-off first-call cost does not shrink the sample count of a fast loader.
    first = time_each(get, warm[:3])
    typical_s = max(float(np.median(first)) / 1e9, 1e-7)
    rest = warm[3 : 3 + int(comparison.seconds / 4 / typical_s)]
    warmup_latencies = np.concatenate([first, time_each(get, rest)])
    typical_s = max(float(np.median(warmup_latencies)) / 1e9, 1e-7)
    # ``count`` timings: the timed loop reads half of the steady indices, the tight loop the other half.
    count = min(len(steady) // STEADY_LOOPS, max(MIN_SAMPLES, int(comparison.seconds / 2 / typical_s)))
    if before_steady is not None:
        before_steady()
    return {
        **steady_state(get, steady[: STEADY_LOOPS * count]),
        m.WARMUP_ITEMS: len(warmup_latencies),
        m.WARMUP_MEAN_MS: float(warmup_latencies.mean() / 1e6),
        m.SAMPLES_REQUESTED: len(steady) // STEADY_LOOPS,
        m.BUDGET_CAPPED: count < len(steady) // STEADY_LOOPS,
    }


def measure_peer(peer: PeerDataset, indices: Sequence[int], comparison: PeerComparison) -> dict[str, Any]:
    """:func:`measure_loader` on a peer: one crop per call, or up to ``batch_size`` per call for a
    batched peer (rates then count crops, latencies are per call), as many as still leave
    ``MIN_SAMPLES`` steady calls."""
    steady = max(len(indices) - comparison.warmup, 1)
    batch_size = max(1, min(int(getattr(peer, "batch_size", 1)), steady // MIN_SAMPLES))
    if not hasattr(peer, "__getitems__"):
        return measure_loader(peer.__getitem__, indices, comparison)
    calls = [list(indices[start : start + batch_size]) for start in range(0, len(indices), batch_size)]
    batched = dataclasses.replace(comparison, warmup=max(-(-comparison.warmup // batch_size), 1))
    metrics = measure_loader(peer.__getitems__, calls, batched)
    metrics[m.SAMPLES_PER_S] *= batch_size
    return {**metrics, m.ITEMS_PER_CALL: batch_size}


@dataclass(frozen=True)
class PeerCase:
    """One loader of a side-by-side run: ``cropbench-<decode>`` or a peer's name."""

    loader: str
    comparison: PeerComparison

    @property
    def label(self) -> str:
        return f"{self.loader}/{self.comparison.crop_size}px/all"


@dataclass
class _Repeat:
    """What every loader of one repeat shares: the objects' windows, one order, the files read warm."""

    reference: CropDataset
    windows: CropWindows
    indices: list[int]
    files: list[Path]
    config: dict[str, Any]
    direct_samples_per_s: float | None = None


class Peers:
    """Track ``peers`` for the runner: cropbench's decode paths, then every peer, on the same objects.

    Every loader gets a row (a peer that cannot run here gets one saying why), with its ratio to
    cropbench direct of the same repeat.

    Args:
        comparison: The settings of the comparison; None: the preset's.
        work_dir: Where peers that read a copy of the plate keep it; None: ``PLATE.peers`` beside the
            plate, reused by later runs.
    """

    name = TRACK

    def __init__(self, comparison: PeerComparison | None = None, work_dir: Path | None = None) -> None:
        self.comparison = comparison
        self.work_dir = work_dir
        self.repeats: dict[tuple[PeerComparison, int], _Repeat] = {}

    def cases(self, preset: str, context: RunContext) -> list[PeerCase]:
        """One case per loader: cropbench's read paths first, then every peer.

        Args:
            preset: The preset's name: ``smoke`` or ``full`` (ignored with a fixed ``comparison``).
            context: The run's plate; its ``samples`` overrides the preset's.

        Returns:
            The cases in the order they run.

        Raises:
            ConfigError: An unknown preset.
        """
        comparison = self.comparison or PeerComparison.for_preset(preset, context.samples)
        loaders = [f"cropbench-{decode}" for decode in CROPBENCH_DECODES] + list(comparison.peers)
        return [PeerCase(loader, comparison) for loader in loaders]

    def decode(self, case: PeerCase) -> None:
        """None: every loader gets a row, one that does not apply here saying why."""
        return None  # a loader that does not apply still gets a row saying why

    def _repeat(self, comparison: PeerComparison, repeat: int, context: RunContext) -> _Repeat:
        key = (comparison, repeat)
        if key not in self.repeats:
            seed = comparison.seed + repeat
            reference = context.dataset(CropConfig(crop_size=comparison.crop_size, dtype="uint16"))
            files = reference.reader.files()
            load_into_page_cache(files)
            config = {
                "crop_size": comparison.crop_size,
                "channels": "all",
                "access": "random",
                "dtype": "uint16",
                "tier": "none",
                "samples": comparison.samples,
                "warmup": comparison.warmup,
                "seconds": comparison.seconds,
                "seed": seed,
            }
            self.repeats[key] = _Repeat(
                reference,
                CropWindows.from_dataset(reference),
                access_order(reference, "random", comparison.warmup + STEADY_LOOPS * comparison.samples, seed),
                files,
                config,
            )
        return self.repeats[key]

    def measure(self, case: PeerCase, repeat: int, context: RunContext) -> Iterator[Row]:
        """Measure one loader's steady state over the repeat's shared random order of objects.

        Args:
            case: One loader of :meth:`cases`.
            repeat: The repeat's number; it is added to the case's seed.
            context: The run's plate.

        Yields:
            One row: the loader's crops/s and its ratio to cropbench direct, or why it was skipped.
        """
        comparison, name = case.comparison, case.loader
        shared = self._repeat(comparison, repeat, context)
        metrics: dict[str, Any]
        config: dict[str, Any]
        if name.startswith("cropbench-"):
            decode = name.removeprefix("cropbench-")
            kind, config = "cropbench", {"decode": decode}
            if decode not in context.decodes:
                metrics = {m.SKIPPED: True, m.SKIP_REASON: f"decode {decode} does not apply to {context.layout}"}
            else:
                with Stopwatch() as setup:
                    dataset = context.dataset(shared.reference.config.replace(decode=decode))
                metrics = measure_loader(dataset.__getitem__, shared.indices, comparison, dataset.reader.stats.reset)
                metrics = {**metrics, **dataset.reader.stats.per_region(), m.SETUP_SECONDS: setup.seconds}
        else:
            kind, config = "peer", {"extra": PEERS[name].extra, "description": PEERS[name].description}
            setup = Stopwatch()
            try:
                with setup:
                    peer = open_peer(name, shared.windows, self.work_dir)
            except PeerUnavailableError as error:
                metrics = {m.SKIPPED: True, m.SKIP_REASON: str(error)}
            else:
                metrics = {
                    **measure_peer(peer, shared.indices, comparison),
                    **peer.info(),
                    m.SETUP_SECONDS: setup.seconds,
                }
        rate = metrics.get(m.SAMPLES_PER_S)
        if not metrics.get(m.SKIPPED):
            metrics[m.RESIDENT_AFTER] = resident_fraction(shared.files)
            # Track 1's flags on the same terms: a p95 on fewer than 200 timed calls (a time-capped
            # loop) or crops drawn more than once are not numbers to quote.
            metrics.update(
                validity(
                    shared.reference.config,
                    None,
                    items_drawn=len(shared.indices),
                    objects=len(shared.reference),
                    enough_timings=bool(metrics.get(m.P95_RELIABLE)),
                )
            )
        if name == "cropbench-direct" and rate:
            shared.direct_samples_per_s = rate
        direct = shared.direct_samples_per_s
        if rate and direct:
            metrics[m.RATIO_TO_DIRECT] = rate / direct
            metrics[m.DIRECT_SPEEDUP] = direct / rate
        yield Row(case, {**shared.config, "peer": name, "kind": kind, **config}, metrics, shared.config["seed"])
