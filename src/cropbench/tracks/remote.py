"""Track ``remote`` (``cropbench run --plate URL --track remote``): what a crop of a plate in an object
store costs in requests, and how fast crops come.

Per read path and DataLoader worker count, the reader's requests and bytes per random crop
(decoded-chunk cache off, so every crop fetches what it needs;
:func:`cropbench.measure.remote.count_requests`, over the run's objects) and random crops/s through the DataLoader
measurement of Track 2 (:func:`cropbench.harness.loader_case.loader_rates`), steady and over the whole
pass (reading ahead over a store fetches during the first batch what the next ones need), with the
chunk cache the reader held (``cache>=plate`` where it holds the plate). With ``--local-plate``
every row carries its ratio to the same case on local disk, read through a chunk cache as large as
the one the store's reader grows to read ahead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from cropbench import metrics as m
from cropbench.config import DEFAULT_CROP_SIZE
from cropbench.errors import ConfigError
from cropbench.harness.context import RunContext
from cropbench.harness.loader_case import loader_rates, read_ahead_cache_bytes
from cropbench.harness.runner import Row
from cropbench.harness.validity import CACHE_HOLDS_PLATE_FLAG
from cropbench.measure.remote import READ_PATHS, count_requests, crop_config


@dataclass(frozen=True)
class RemoteCase:
    """One read path of a plate in a store, at one worker count."""

    decode: str = "direct"
    workers: int = 0
    count_crops: int = 64
    crops: int = 128
    batch_size: int = 32
    crop_size: int = DEFAULT_CROP_SIZE
    seed: int = 0
    #: The chunk cache in bytes (None: the default): the one the store's reader grows to read ahead, so
    #: the same case on local disk (``--local-plate``) reads through as large a cache.
    cache_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.decode not in READ_PATHS:
            raise ConfigError(f"decode={self.decode!r} is not one of {', '.join(READ_PATHS)}")
        for knob in ("count_crops", "crops", "batch_size", "crop_size"):
            if getattr(self, knob) < 1:
                raise ConfigError(f"{knob} must be >= 1, got {getattr(self, knob)}")

    @property
    def label(self) -> str:
        return f"{self.decode}/w{self.workers}/b{self.batch_size}"


class Remote:
    """Track ``remote``: requests per crop and loader crops/s of the run's plate, per read path and workers.

    The smoke preset times 128 crops per case, the full preset 512 (``--samples`` overrides both).

    Args:
        workers: The DataLoader worker counts, one case each per read path.
        batch_size: Crops per batch.
        crop_size: The crop's side in pixels.
    """

    name = "remote"

    def __init__(
        self, workers: Sequence[int] = (0, 2), batch_size: int = 32, crop_size: int = DEFAULT_CROP_SIZE
    ) -> None:
        self.workers, self.batch_size, self.crop_size = tuple(workers), batch_size, crop_size

    def cases(self, preset: str, context: RunContext) -> list[RemoteCase]:
        """One case per read path and worker count, each with the chunk cache its read-ahead needs.

        Args:
            preset: The preset's name: ``smoke`` or ``full``.
            context: The run's plate; its ``samples`` overrides the crops timed.

        Returns:
            The cases in the order they run.

        Raises:
            ConfigError: An unknown preset.
        """
        if preset not in ("smoke", "full"):
            raise ConfigError(f"preset={preset!r} is not one of smoke, full")
        crops = context.samples or (128 if preset == "smoke" else 512)
        # The cache is sized for the crops that will be read: the run's --crop-size, which the runner sets
        # on each case after this, where it is given.
        overrides = context.overrides
        crop_size = overrides.crop_size if overrides is not None and overrides.crop_size is not None else self.crop_size
        held = {decode: read_ahead_cache_bytes(context, decode, self.batch_size, crop_size) for decode in READ_PATHS}
        return [
            RemoteCase(decode, workers, min(crops, 200), crops, self.batch_size, crop_size, cache_bytes=held[decode])
            for decode in READ_PATHS
            for workers in self.workers
        ]

    def decode(self, case: RemoteCase) -> str:
        """The read path ``case`` needs; the runner skips a case whose path the plate's layout lacks."""
        return case.decode

    def measure(self, case: RemoteCase, repeat: int, context: RunContext) -> Iterator[Row]:
        """Count the store's requests per crop (a plate in a store only), then the loader's rates.

        Args:
            case: One case of :meth:`cases`.
            repeat: The repeat's number; it is added to the case's seed.
            context: The run's plate.

        Yields:
            One row: requests per crop, steady and whole-run crops/s, the cache's share of the plate.
        """
        # Requests are a store's: a plate on local disk has none to count (not zero: none).
        metrics: dict[str, Any] = {}
        if context.remote is not None:
            uncached = context.dataset(crop_config(case.decode, case.crop_size, cache_bytes=0))
            metrics.update(count_requests(uncached, case.count_crops))
        rates = loader_rates(
            context, case.decode, case.crops, case.batch_size, case.crop_size, case.workers, case.cache_bytes
        )
        metrics[m.SAMPLES_PER_S] = rates.steady
        metrics[m.RUN_SAMPLES_PER_S] = rates.whole
        if rates.cache_bytes is not None:
            metrics[m.READER_CACHE_BYTES] = rates.cache_bytes
            metrics[m.CACHE_FRACTION_OF_PLATE] = rates.cache_fraction
        if rates.cache_holds_plate:
            metrics[m.VALIDITY_FLAGS] = [CACHE_HOLDS_PLATE_FLAG]
        yield Row(case, dataclasses.asdict(case), metrics, case.seed + repeat)
