"""One crop configuration read as a training loop reads it, set beside the same crops cut from memory.

This is what the asv suites in ``benchmarks/`` call. A :class:`CropPath` is a dataset read through
an access pattern's sampler; its values are:

- the relative cost: the sampler's next index and its crop, over the time of cutting the same crop
  from fields in memory (:class:`~cropbench.harness.memory_reference.MemoryReference`), measured
  block by block with the two taking turns (:func:`cropbench.measure.protocol.relative_cost`), so a
  neighbour's job slows both and cancels;
- that cost split into the ``direct`` reader's stages (fetch, decode, assembly) or zarr-python's
  (:mod:`cropbench.measure.zarr_stages`), in the same units;
- the decode step's work over one epoch (bytes and calls): counts, so identical code gives
  identical values.

The decoded-chunk cache of the ``bounded`` cases is 1 MiB, far below the smoke plate's 11.7 MB of
decoded pixels, so nearly every sample decodes its chunks; ``default`` is cropbench's own budget.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from cropbench.config import CropConfig
from cropbench.data.dataset import CropDataset, PairedViews
from cropbench.data.sampling import EpochSampler, access_order, sampler_for
from cropbench.formats import read_plate_metadata
from cropbench.formats.direct import StageTimedChunkReader
from cropbench.harness.memory_reference import MemoryReference
from cropbench.measure import zarr_stages
from cropbench.measure.protocol import Stopwatch, relative_cost

#: Crops per block of the relative-cost measurement (and per ``time_*`` sample of a block).
BLOCK = 32
#: Blocks whose ratios make one relative cost (40 blocks varied twice as much).
RELATIVE_BLOCKS = 120
#: Fraction of blocks dropped at each end before averaging the ratios.
TRIM = 0.1
#: The decoded-chunk cache of the ``bounded`` cases: 1 MiB, far below the smoke plate (11.7 MB).
BOUNDED_CACHE_BYTES = 2**20
#: The ``cache`` cases: ``bounded`` (every timed sample decodes) or cropbench's ``default`` budget.
CACHES = ("bounded", "default")
#: The stages of the ``direct`` reader that :meth:`CropPath.stage_costs` splits the relative cost into.
STAGES = ("fetch", "decode", "assemble")


def cache_knobs(cache: str) -> dict[str, int]:
    """A ``cache`` case -> CropConfig knobs: the ``bounded`` budget, or none (cropbench's default)."""
    if cache not in CACHES:
        raise ValueError(f"cache must be one of {CACHES}, got {cache!r}")
    return {"chunk_cache_bytes": BOUNDED_CACHE_BYTES} if cache == "bounded" else {}


def channel_names(channels: str) -> tuple[str, ...] | None:
    """A channel set as one word -> CropConfig.channels: ``all`` or names joined by ``+``."""
    return None if channels == "all" else tuple(channels.split("+"))


def unmeasured(decode: str, cache: str, *, instruments: bool = False, misses: bool = False) -> str | None:
    """Why a (decode path, cache) case has no value, or None: ``instruments`` when it reads the ``direct``
    reader's stage clocks or decode counters, ``misses`` when it needs crops that miss the cache."""
    if misses and cache != "bounded":
        return "the whole plate is in the cache: nothing is fetched or decoded (see 'bounded')"
    if instruments and decode != "direct":
        return f"the {decode} path has no stage clocks or decode counters (only 'direct')"
    if decode != "direct" and cache != "bounded":
        return f"the {decode} path has no decoded-chunk cache: only the 'bounded' case runs"
    return None


def block_cost(get: Callable[[int], Any], reference: Callable[[int], Any], indices: Sequence[int]) -> float:
    """:func:`cropbench.measure.protocol.relative_cost` over blocks of ``BLOCK`` crops, ``TRIM`` dropped at each end."""
    return float(relative_cost(get, reference, indices, BLOCK, TRIM))


def stage_timed_dataset(plate: str | Path, crop: CropConfig) -> CropDataset:
    """A ``direct`` dataset whose reader clocks fetch, decode and assembly and counts the decode step's work."""
    reader = StageTimedChunkReader(read_plate_metadata(plate), crop.chunk_cache_bytes)
    return CropDataset(plate, crop, reader=reader)


def getter(dataset: CropDataset, access: str) -> Callable[[int], Any]:
    """What a training loop calls per object: one view, or two views for ``paired``."""
    return PairedViews(dataset).__getitem__ if access == "paired" else dataset.__getitem__


class SamplerStream:
    """What a training loop does before each crop: take the sampler's next index, epoch after epoch.

    Called with the index the access order expects (and ignoring it), so :func:`block_cost` can
    time the sampler and the crop together against a reference that reads the same crop.
    """

    def __init__(self, sampler: EpochSampler) -> None:
        self.sampler = sampler
        self.epoch = 0
        self._indices: Iterator[int] = iter(())

    def __call__(self, expected: int) -> int:
        index = next(self._indices, None)
        if index is None:
            self.sampler.set_epoch(self.epoch)
            self.epoch += 1
            self._indices = iter(self.sampler)
            index = next(self._indices)
        return index


def sampled(get: Callable[[int], Any], dataset: CropDataset, access: str) -> Callable[[int], Any]:
    """``get`` of the index the access pattern's sampler yields next (the same order as ``access_order``)."""
    stream = SamplerStream(sampler_for(dataset, access, 0))
    return lambda expected: get(stream(expected))


def stage_costs(
    dataset: CropDataset, get: Callable[[int], Any], reference: Callable[[int], Any], indices: Sequence[int]
) -> dict[str, float]:
    """Each stage's part of :func:`block_cost`: the relative cost times the stage's share of the crop path's time.

    The reader's stage clocks run inside the same calls that :func:`block_cost` times, so a stage's
    share and the cost come from one measurement; ``assemble`` is the reader's time outside fetch and
    decode (planning, cache lookups, copying pieces into the crop).
    """
    stage_ns = dataset.reader.stage_ns  # type: ignore[attr-defined]  # a stage_timed_dataset's reader
    stage_ns.update(fetch=0, decode=0, region=0)
    total = Stopwatch()
    cost = block_cost(total.wrap(get), reference, indices) / max(total.ns, 1)
    assemble = stage_ns["region"] - stage_ns["fetch"] - stage_ns["decode"]
    return {"fetch": cost * stage_ns["fetch"], "decode": cost * stage_ns["decode"], "assemble": cost * assemble}


def decode_work(plate: str | Path, crop: CropConfig, access: str, indices: Sequence[int]) -> StageTimedChunkReader:
    """The stage-timed reader after one epoch through the access pattern's sampler, from a fresh dataset."""
    dataset = stage_timed_dataset(plate, crop)
    get = sampled(getter(dataset, access), dataset, access)
    for index in indices[: len(dataset)]:
        get(index)
    reader: StageTimedChunkReader = dataset.reader  # type: ignore[assignment]
    return reader


def store_over_local(store: str | Path, local: str | Path, crop: CropConfig, blocks: int) -> float:
    """Random crops of a plate in a store over the same crops of the plate on disk, ``blocks`` blocks of
    ``BLOCK`` taking turns, read by datasets opened for this call (no warm-up epoch)."""
    remote, on_disk = CropDataset(store, crop), CropDataset(local, crop)
    indices = access_order(on_disk, "random", BLOCK * blocks)
    return block_cost(remote.__getitem__, on_disk.__getitem__, indices)


class CropPath:
    """The crops of ``plate`` under ``crop``, read through the ``access`` pattern, warmed by one epoch.

    ``blocks`` blocks of ``BLOCK`` indices make one relative cost; ``stage_timed`` reads through the
    ``direct`` reader's instruments (stage clocks and decode counters), which :meth:`stage_costs`
    and the decode counts need.
    """

    def __init__(
        self,
        plate: str | Path,
        crop: CropConfig,
        access: str = "random",
        *,
        blocks: int = RELATIVE_BLOCKS,
        stage_timed: bool = False,
    ) -> None:
        self.plate, self.crop, self.access = str(plate), crop, access
        self.dataset = stage_timed_dataset(plate, crop) if stage_timed else CropDataset(plate, crop)
        self.get = getter(self.dataset, access)
        self.indices = access_order(self.dataset, access, BLOCK * blocks)
        for index in self.indices[: len(self.dataset)]:  # every field opened: no metadata reads later
            self.get(index)

    def read_block(self) -> None:
        """One block of ``BLOCK`` crops in the access order."""
        for index in self.indices[:BLOCK]:
            self.get(index)

    def read_epoch(self) -> None:
        """Every crop once, in index order."""
        for index in range(len(self.dataset)):
            self.get(index)

    def next_crop(self) -> Callable[[int], Any]:
        """The sampler's next index and its crop, from the sampler's first epoch."""
        return sampled(self.get, self.dataset, self.access)

    def relative_cost(self) -> float:
        """The sampler's next index and its crop, over cutting the same crop from fields in memory."""
        return block_cost(self.next_crop(), MemoryReference.of_dataset(self.dataset), self.indices)

    def stage_cost(self, stage: str) -> float:
        """One of :data:`STAGES`' part of :meth:`relative_cost` (the path must be ``stage_timed``)."""
        get = self.next_crop()
        return stage_costs(self.dataset, get, MemoryReference.of_dataset(self.dataset), self.indices)[stage]

    def decode_amplification(self) -> float:
        """Bytes out of the decode step per byte delivered over one epoch from a fresh dataset."""
        reader = decode_work(self.plate, self.crop, self.access, self.indices)
        return reader.decoded_bytes / reader.stats.bytes_delivered

    def decode_calls_per_mib(self) -> float:
        """Decode calls per MiB delivered over one epoch from a fresh dataset."""
        reader = decode_work(self.plate, self.crop, self.access, self.indices)
        return reader.decode_calls / (reader.stats.bytes_delivered / 2**20)

    def zarr_stage_cost(self, stage: str) -> float:
        """One of zarr-python's stages' part of :meth:`relative_cost` (a ``zarr``-path dataset)."""
        measured = zarr_stages.measure_stages(
            self.next_crop(), self.indices, reference=MemoryReference.of_dataset(self.dataset), block=BLOCK
        )
        return float(measured.relative_stages()[stage])

    def zarr_count(self, name: str, crops: int) -> float:
        """A count of zarr-python's work per crop over the first ``crops`` crops (a ``zarr``-path dataset)."""
        return float(zarr_stages.measure_stages(self.next_crop(), self.indices[:crops]).counts()[name])
