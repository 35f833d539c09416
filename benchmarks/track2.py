"""Track 2 in asv: DataLoader epochs and what the training loop waits for.

``Loader.track_relative_epoch`` is the time of an epoch read from the plate over the time of the
same loader serving crops already in memory (:class:`cropbench.harness.loader_case.MemoryCrops`), the
two taking turns epoch by epoch inside one call (:func:`cropbench.measure.protocol.relative_cost`
with one epoch per block, the extreme pairs trimmed). It is not part of the recommended gate:
worker start-up dominates a 512-sample epoch and the ratio still moves between processes (see
README). ``FullLoader`` and ``LoaderLatency`` are the full grid (``CROPBENCH_ASV_FULL=1``), the
latter with the raw wall-clock numbers of :func:`cropbench.harness.loader_case.run_case`. asv's
``peakmem_*`` sees only the main process, so worker memory is left to ``cropbench run``.
"""

from __future__ import annotations

from typing import Any

from .common import (
    FullSuite,
    Suite,
    crop_config,
    crop_dataset,
    full_layouts,
    import_track_piece,
    one_thread,
    plate_for,
    require_full_grid,
    skips_older_commits,
)

#: Samples per epoch: a few dozen batches, so an epoch is short but not one batch.
EPOCH_SAMPLES = 512
#: Plate/memory epoch pairs behind one ``track_relative_epoch`` value.
EPOCH_PAIRS = 5
#: Pairs dropped at each end (by ratio) before averaging: 1 of 5.
EPOCH_TRIM = 0.2


def drain(loader: Any) -> None:
    """One epoch, worker start-up and shutdown included."""
    for _ in loader:
        pass


class _Loading:
    """One crop configuration served by one DataLoader configuration (random access; no benchmarks)."""

    #: An epoch forks workers; fewer, longer samples than Track 1's.
    repeat = (5, 10, 4.0)

    def prepare(self, plate: str, num_workers: int, batch_size: int, decode: str, tier: str) -> None:
        from cropbench.data.loader import LoaderSpec, ScheduledSampler, build_loader, schedule
        from cropbench.data.sampling import sampler_for
        from cropbench.measure.protocol import relative_cost

        one_thread()
        self.plate = plate
        self.loader_case, self.run_context = import_track_piece("loader case"), import_track_piece("run context")
        self.loader_spec = LoaderSpec(num_workers=num_workers, batch_size=batch_size)
        crop = crop_config(crop_size=96, decode=decode, tier=tier)
        self.case = self.loader_case.Track2Case(crop=crop, loader=self.loader_spec, samples=EPOCH_SAMPLES, epochs=2)
        self.dataset = crop_dataset(plate, crop)
        self.orders = schedule(sampler_for(self.dataset, "random", 0), EPOCH_SAMPLES, 1)
        self.scheduled_sampler, self.build_loader, self.relative_cost = ScheduledSampler, build_loader, relative_cost
        self.loader = self.build(self.dataset)

    def build(self, dataset: Any) -> Any:
        return self.build_loader(dataset, self.loader_spec, self.scheduled_sampler(self.orders), 0)

    def relative_epoch(self) -> float:
        """Plate epochs over memory epochs, taking turns pair by pair; trimmed mean of the pairs' ratios."""
        memory_loader = self.build(self.loader_case.MemoryCrops(self.dataset))
        return float(
            self.relative_cost(
                lambda _: drain(self.loader), lambda _: drain(memory_loader), range(EPOCH_PAIRS), 1, EPOCH_TRIM
            )
        )


class _DefaultLoading(_Loading, Suite):
    """The default grid: 0 and 2 workers, batches of 64, the smoke plate."""

    params = ([0, 2], [64], ["direct"], ["none"])
    param_names = ("num_workers", "batch_size", "decode", "tier")
    version = "2"

    @skips_older_commits()
    def setup(self, plates: dict[str, str], num_workers: int, batch_size: int, decode: str, tier: str) -> None:
        self.prepare(plate_for(plates, "default"), num_workers, batch_size, decode, tier)


class Loader(_DefaultLoading):
    """Whole epochs through the DataLoader, from the plate and from memory."""

    def track_relative_epoch(self, *params: Any) -> float:
        return self.relative_epoch()

    track_relative_epoch.unit = "x in-memory epoch"  # type: ignore[attr-defined]

    def peakmem_epoch(self, *params: Any) -> None:
        drain(self.loader)


class _FullLoading(_Loading, FullSuite):
    """The full grid: more workers, batch sizes, decode paths and tiers, every layout of the full plate."""

    params = ([0, 1, 2, 4], [16, 64, 256], ["direct", "zarr", "field"], ["none", "typical"], full_layouts())
    param_names = ("num_workers", "batch_size", "decode", "tier", "layout")

    @skips_older_commits()
    def setup(
        self, plates: dict[str, str], num_workers: int, batch_size: int, decode: str, tier: str, layout: str
    ) -> None:
        require_full_grid(type(self).__name__)
        self.prepare(plate_for(plates, layout), num_workers, batch_size, decode, tier)


class FullLoader(_FullLoading):
    """``Loader.track_relative_epoch`` over the full grid."""

    def track_relative_epoch(self, *params: Any) -> float:
        return self.relative_epoch()

    track_relative_epoch.unit = "x in-memory epoch"  # type: ignore[attr-defined]


class LoaderLatency(_FullLoading):
    """Raw milliseconds from ``run_case`` (full grid only)."""

    def _run_case(self) -> dict[str, Any]:
        return self.loader_case.run_case(self.run_context.RunContext(plate=self.plate), self.case)

    def time_epoch(self, *params: Any) -> None:
        drain(self.loader)

    def track_first_batch_ms(self, *params: Any) -> float:
        return float(self._run_case()["first_batch_ms"])

    track_first_batch_ms.unit = "ms"  # type: ignore[attr-defined]

    def track_ms_per_sample(self, *params: Any) -> float:
        """Steady throughput, inverted: asv reads every value as lower-is-better (1000 / samples per s)."""
        return 1000.0 / float(self._run_case()["samples_per_s"])

    track_ms_per_sample.unit = "ms/sample"  # type: ignore[attr-defined]

    def track_batch_p95_ms(self, *params: Any) -> float:
        return float(self._run_case()["batch_p95_ms"])

    track_batch_p95_ms.unit = "ms"  # type: ignore[attr-defined]
