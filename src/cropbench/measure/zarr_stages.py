"""Where zarr-python spends a crop: store reads, the codec pipeline, and indexing and assembly.

A regression inside zarr-python moves the time of a whole crop, but a benchmark that only times
whole crops cannot say where it lives (a blosc decode done twice moved zarr-python's random crops
by a few per cent: decoding is a small part of them). This splits the crop path of the ``zarr``
decode path by wrapping zarr's own objects while crops are read, not with a sampling profiler:

- ``store``: ``LocalStore.get`` and ``get_partial_values`` (every read of a chunk, a shard's
  index or a piece of a shard; for a sharded array these run inside the sharding codec);
- ``codec``: ``BatchedCodecPipeline.decode_batch`` (the bytes-to-bytes codecs such as blosc or
  zstd, then bytes to array, for a batch of chunks; inside a shard, the inner chunks), less any
  store read it overlaps;
- ``index_assemble``: the rest of the crop's wall time: zarr's indexing (selections, the chunk
  grid, the shard index lookups), copying decoded chunks into the output, the hop to zarr's event
  loop and back, and the dataset's own work on the crop (channel order, the tensor).

zarr-python runs its reads concurrently on an event loop in another thread, so the wrapped calls
overlap: each stage is the length of the union of its intervals, so the three add up to the
crops' wall time exactly. Beside the times, counts that do not read a clock: store reads, bytes
returned by the store, and chunks decoded, per crop.

The wrappers are installed on zarr's classes for the duration of :func:`measure_stages` and
removed after it; the store wrappers count only local stores (``LocalStore``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from cropbench.measure.protocol import clock_ns, relative_cost
from cropbench.metrics import CHUNKS_DECODED_PER_CROP

#: The stages, in the order of the crop path (metric names the benchmarks and tests read).
STORE = "store"
CODEC = "codec"
INDEX_ASSEMBLE = "index_assemble"
STAGES = (STORE, CODEC, INDEX_ASSEMBLE)
#: The counts per crop (chunks decoded per crop is the count of that name a Track 1 row holds).
STORE_READS_PER_CROP = "store_reads_per_crop"
STORE_BYTES_PER_CROP = "store_bytes_per_crop"
COUNTS = (STORE_READS_PER_CROP, STORE_BYTES_PER_CROP, CHUNKS_DECODED_PER_CROP)


@dataclass
class StageRecord:
    """What the wrappers saw: wall-clock intervals (ns) per stage, and the work counted."""

    store: list[tuple[int, int]] = field(default_factory=list)
    codec: list[tuple[int, int]] = field(default_factory=list)
    store_reads: int = 0
    store_bytes: int = 0
    chunks_decoded: int = 0

    def reset(self) -> None:
        self.store.clear()
        self.codec.clear()
        self.store_reads = self.store_bytes = self.chunks_decoded = 0


def union_ns(intervals: Sequence[tuple[int, int]]) -> int:
    """Total length of the union of ``(start, end)`` intervals (overlapping calls counted once)."""
    total, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def split_ns(record: StageRecord, total_ns: int) -> dict[str, int]:
    """``total_ns`` of crop time split into the stages: store, codec outside store reads, and the rest."""
    store = union_ns(record.store)
    store_or_codec = union_ns(record.store + record.codec)
    return {STORE: store, CODEC: store_or_codec - store, INDEX_ASSEMBLE: max(total_ns - store_or_codec, 0)}


def _size(buffer: Any) -> int:
    return 0 if buffer is None else len(buffer)


@contextlib.contextmanager
def instrumented(record: StageRecord) -> Iterator[StageRecord]:
    """zarr's ``LocalStore`` reads and ``BatchedCodecPipeline.decode_batch`` recorded into ``record``."""
    from zarr.core.codec_pipeline import BatchedCodecPipeline
    from zarr.storage import LocalStore

    get, get_partial_values, decode_batch = (
        LocalStore.get,
        LocalStore.get_partial_values,
        BatchedCodecPipeline.decode_batch,
    )

    async def timed_get(self: Any, *args: Any, **kwargs: Any) -> Any:
        started = clock_ns()
        try:
            value = await get(self, *args, **kwargs)
        finally:
            record.store.append((started, clock_ns()))
        record.store_reads += 1
        record.store_bytes += _size(value)
        return value

    async def timed_get_partial_values(self: Any, *args: Any, **kwargs: Any) -> Any:
        started = clock_ns()
        try:
            values = await get_partial_values(self, *args, **kwargs)
        finally:
            record.store.append((started, clock_ns()))
        record.store_reads += len(values)
        record.store_bytes += sum(_size(value) for value in values)
        return values

    async def timed_decode_batch(self: Any, chunk_bytes_and_specs: Any) -> Any:
        batch = list(chunk_bytes_and_specs)
        started = clock_ns()
        try:
            return await decode_batch(self, batch)
        finally:
            record.codec.append((started, clock_ns()))
            record.chunks_decoded += sum(1 for chunk_bytes, _ in batch if chunk_bytes is not None)

    LocalStore.get = timed_get  # type: ignore[method-assign]
    LocalStore.get_partial_values = timed_get_partial_values  # type: ignore[method-assign]
    BatchedCodecPipeline.decode_batch = timed_decode_batch  # type: ignore[method-assign]
    try:
        yield record
    finally:
        LocalStore.get, LocalStore.get_partial_values = get, get_partial_values  # type: ignore[method-assign]
        BatchedCodecPipeline.decode_batch = decode_batch  # type: ignore[method-assign]


@dataclass(frozen=True)
class ZarrStages:
    """One measurement of the ``zarr`` crop path: crops read, their wall time, its split, and the counts."""

    crops: int
    total_ns: int
    stage_ns: dict[str, int]
    store_reads: int
    store_bytes: int
    chunks_decoded: int
    #: The crops' wall time over the reference's (:func:`cropbench.measure.protocol.relative_cost`); None if not asked.
    relative: float | None = None

    def counts(self) -> dict[str, float]:
        """The work per crop: store reads, bytes returned by the store, chunks decoded."""
        return {
            STORE_READS_PER_CROP: self.store_reads / self.crops,
            STORE_BYTES_PER_CROP: self.store_bytes / self.crops,
            CHUNKS_DECODED_PER_CROP: self.chunks_decoded / self.crops,
        }

    def relative_stages(self) -> dict[str, float]:
        """Each stage's part of :attr:`relative`, in the same units (they add up to it)."""
        if self.relative is None:
            raise ValueError("relative_stages needs a measurement against a reference (measure_stages(reference=...))")
        return {stage: self.relative * ns / max(self.total_ns, 1) for stage, ns in self.stage_ns.items()}


def measure_stages(
    get: Callable[[int], Any],
    indices: Sequence[int],
    reference: Callable[[int], Any] | None = None,
    block: int = 32,
    trim: float = 0.1,
) -> ZarrStages:
    """Read ``indices`` through ``get`` (a ``zarr``-path dataset's crops) with zarr's stages recorded.

    With a ``reference``, the crops are timed against it block by block
    (:func:`cropbench.measure.protocol.relative_cost`), and the stages split that ratio; the stage
    clocks run inside the same calls. Without one, each index is read once.
    """
    if not indices:
        raise ValueError("measure_stages needs at least one index")
    record = StageRecord()
    crops = 0
    total_ns = 0

    def timed(index: int) -> Any:
        nonlocal crops, total_ns
        started = clock_ns()
        try:
            return get(index)
        finally:
            total_ns += clock_ns() - started
            crops += 1

    relative = None
    with instrumented(record):
        if reference is None:
            for index in indices:
                timed(index)
        else:
            relative = relative_cost(timed, reference, indices, block, trim)
    return ZarrStages(
        crops=crops,
        total_ns=total_ns,
        stage_ns=split_ns(record, total_ns),
        store_reads=record.store_reads,
        store_bytes=record.store_bytes,
        chunks_decoded=record.chunks_decoded,
        relative=relative,
    )
