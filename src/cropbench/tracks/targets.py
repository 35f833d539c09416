"""Track ``targets``: the direct reader against THE fetch ceiling and against peers at their best,
interleaved in one process on the same crops.

**The ceiling**, one definition (:class:`CopyCeiling`): the same crops cut from a raw in-memory copy
of the plate (the in-memory reference over the ``memmap`` layout, read once so the page cache holds
it) by the cheapest code that can do it, the direct reader's C piece copy over a whole batch with
the GIL released, split over the same number of threads as the reader it is compared with. It
decodes nothing and does no per-crop Python work, so no reader of the same crops can beat it: a
ratio above 1 is flagged ``impossible`` (the run, not the reader, is wrong). Every ratio row names
the ceiling's thread count.

**The codec ceiling** (:class:`CodecCeiling`): the stored chunks a batch's crops touch, each decoded
once by the codec alone (numcodecs' c-blosc for blosc chunks, the GIL released, into buffers allocated
once), split over the reader's thread count; the chunks' bytes are read into memory up front, so it
reads, plans, caches and copies nothing. The direct reader over it says how close the reader is to
decoding, where the copy ceiling says how close it is to copying. It is not a bound: a reader whose
cache holds some of a batch's chunks decodes fewer (the direct rows' ``chunks_decoded_per_crop`` beside
the ceiling's say how many), so a ratio above 1 is not flagged.

**Peers at their best**, each with its tuning in the row: tensorstore with ``data_copy_concurrency``
and ``file_io_concurrency`` at the machine's cores and its cache pool at the reader's budget, a batch
in one ``ts.Batch`` and a block of reads in flight as futures; zarr-python's async API with its
``async.concurrency`` set and a batch gathered at once. A peer that is not installed is left out,
saying why.

**Ratios** are paired per block: readers take turns block by block (the order rotating every block,
:func:`~cropbench.measure.protocol.interleaved_blocks`), and each block's ratio compares two readers
over the same crops moments apart, so a slowdown of the machine lands on both. A row reports the
median of the per-block ratios with their quartiles and extremes.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numcodecs.blosc
import numpy as np

from cropbench import metrics as m
from cropbench.config import DEFAULT_CROP_SIZE, CropConfig
from cropbench.data.dataset import CropDataset
from cropbench.data.sampling import access_order
from cropbench.errors import ConfigError, PeerUnavailableError
from cropbench.formats import DirectChunkReader, MemmapReader, open_plate
from cropbench.formats.atlas import FieldRun
from cropbench.formats.direct import ChunkLayout
from cropbench.formats.direct.codecs import BLOSC
from cropbench.harness.context import RunContext, usable_cores
from cropbench.harness.memory_reference import MemoryReference
from cropbench.harness.ratios import paired_ratios
from cropbench.harness.runner import Row
from cropbench.harness.validity import decoded_plate_bytes
from cropbench.harness.windows import CropWindows
from cropbench.measure.protocol import interleaved_blocks, load_into_page_cache, samples_per_s
from cropbench.plates.convert import materialize_layout

#: The flag of a ratio to the ceiling above 1: a reader cannot deliver the crops faster than copying them.
IMPOSSIBLE = "impossible"
#: Access patterns: the row label's name -> the sampler's.
ACCESSES = {"random": "random", "grouped": "grouped-field"}
#: Fraction of the decoded plate the decoded-chunk cache (and tensorstore's cache pool) may hold.
CACHE_FRACTION = 0.25

#: A reader of one block of object indices (the result is dropped after the clock).
Read = Callable[[Sequence[int]], Any]


@dataclass(frozen=True)
class TargetsCase:
    """One access pattern: every reader over the same ``objects`` crops, ``block`` crops per turn,
    ``rounds`` passes, batches of ``batch`` crops, the direct reader and the ceiling at each of ``threads``."""

    access: str = "random"
    objects: int = 3072
    block: int = 192
    rounds: int = 3
    batch: int = 64
    crop_size: int = DEFAULT_CROP_SIZE
    threads: tuple[int, ...] = (1, 2)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.access not in ACCESSES:
            raise ConfigError(f"access={self.access!r} is not one of {', '.join(ACCESSES)}")
        for knob in ("objects", "block", "rounds", "batch", "crop_size"):
            if getattr(self, knob) < 1:
                raise ConfigError(f"{knob} must be >= 1, got {getattr(self, knob)}")
        if not self.threads or min(self.threads) < 1:
            raise ConfigError(f"threads must name thread counts >= 1, got {self.threads}")

    @property
    def label(self) -> str:
        return self.access


@dataclass(frozen=True)
class ReaderCase:
    """One reader's crops/s within a targets case."""

    access: str
    reader: str
    tuning: dict[str, Any] = field(default_factory=dict, hash=False)
    seed: int = 0

    @property
    def label(self) -> str:
        return f"{self.access}/{self.reader}"


@dataclass(frozen=True)
class RatioCase:
    """One reader over a reference (the ceiling at the same threads, or a peer), paired per block."""

    access: str
    reader: str
    reference: str
    seed: int = 0

    @property
    def label(self) -> str:
        return f"{self.access}/{self.reader}/over/{self.reference}"


def preset_cases(preset: str, samples: int | None = None) -> list[TargetsCase]:
    """Random and grouped access; ``smoke`` checks the wiring on a few blocks, ``full`` is the measurement
    (with the direct reader and the ceiling also at every usable core where the machine has more than 2)."""
    if preset == "smoke":
        base = TargetsCase(objects=samples or 256, block=64, rounds=1)
    elif preset == "full":
        base = TargetsCase(objects=samples or 3072, block=192, rounds=3, threads=tuple(sorted({1, 2, usable_cores()})))
    else:
        raise ConfigError(f"preset={preset!r} is not one of smoke, full")
    return [replace(base, access=access) for access in ACCESSES]


def split_over(pool: ThreadPoolExecutor | None, threads: int, items: Any, work: Callable[[Any], Any]) -> None:
    """``work`` over ``items`` cut into ``threads`` parts: the first on the calling thread, the others on
    ``pool``'s ``threads - 1`` threads (all on the calling thread without a pool)."""
    if pool is None or len(items) < 2:
        work(items)
        return
    share = -(-len(items) // threads)
    parts = [items[start : start + share] for start in range(0, len(items), share)]
    others = [pool.submit(work, part) for part in parts[1:]]
    work(parts[0])
    for other in others:
        other.result()


class CopyCeiling:
    """THE fetch ceiling: the crops of a batch cut from the plate's raw in-memory fields
    (:class:`~cropbench.harness.memory_reference.MemoryReference`) by the C piece copy (the GIL released for
    the whole copy), the batch split over ``threads`` threads (the calling thread and ``threads - 1`` pool
    threads). The reference works each object's rectangle out once, up front, so a call does no more Python
    than naming each crop's slot; a crop over a field's border has its padding zeroed, as the readers give it."""

    def __init__(self, reference: MemoryReference, threads: int, batch: int) -> None:
        if threads < 1:
            raise ConfigError(f"threads must be >= 1, got {threads}")
        self.reference, self.threads = reference, threads
        self.pool = ThreadPoolExecutor(threads - 1) if threads > 1 else None
        self.out = np.zeros((batch, *reference.crop_shape), dtype=reference.pixel_dtype)

    def __call__(self, indices: Sequence[int]) -> np.ndarray:
        pieces = self.reference.batch_pieces(indices, self.out)
        split_over(self.pool, self.threads, pieces, lambda part: self.reference.copy(part, self.out))
        return self.out

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


def decode_into(encoded: bytes, layout: ChunkLayout, out: np.ndarray) -> None:
    """One stored chunk through its codecs alone into ``out`` (uint8, the chunk's decoded bytes):
    c-blosc straight into ``out`` for blosc chunks, a copy for raw ones, each codec in turn otherwise."""
    codecs = [codec for codec, _ in layout.codecs]
    if codecs == [BLOSC]:
        numcodecs.blosc.decompress(encoded, out)
        return
    data: Any = encoded
    for codec, limit in layout.codecs:
        data = codec.decode(data, limit)
    out[:] = np.frombuffer(data, dtype=np.uint8)


class StoredChunks:
    """The stored bytes of every chunk the crops of a dataset touch, read into memory once through its
    direct reader, and which chunks each crop touches, read alone and in a grouped run of its field
    (a plate with a crop atlas reads a crop from its cell or from the field's chunks,
    :class:`~cropbench.formats.atlas.FieldRun`): what :class:`CodecCeiling` decodes."""

    def __init__(self, dataset: CropDataset) -> None:
        reader = dataset.reader
        if not isinstance(reader, DirectChunkReader):
            raise ConfigError(f"the codec ceiling decodes OME-Zarr chunks; the plate is {reader.metadata.format}")
        regions = dataset.regions_of(np.arange(len(dataset)))
        self.fields = regions.field
        #: Crop ``i`` touches chunks ``keys[starts[i]:starts[i + 1]]`` of (starts, keys), read alone.
        self.alone = _flattened(reader.region_chunks(regions))
        #: The same, in a grouped run of its field (the same as alone on a plate without an atlas).
        self.in_run = _flattened(reader.region_chunks(regions, grouped=True)) if reader.atlases else self.alone
        keys = np.union1d(self.alone[1], self.in_run[1])
        #: Chunk key -> (its stored bytes, its array's layout); chunks the store lacks decode to nothing.
        self.chunks = reader.stored_chunks(keys.tolist())
        self.most_per_crop = int(max(np.diff(self.alone[0]).max(initial=0), np.diff(self.in_run[0]).max(initial=0)))
        self.chunk_bytes = max((layout.chunk_bytes for _, layout in self.chunks.values()), default=0)

    def of(self, indices: Sequence[int], run: FieldRun) -> tuple[list[tuple[bytes, ChunkLayout]], FieldRun]:
        """The stored chunks the crops ``indices`` touch read in this order after ``run``, each once, in
        key order; and the run after them."""
        in_fields, after = run.in_fields(self.fields[np.asarray(indices, dtype=np.int64)])
        touched = []
        for index, grouped in zip(indices, in_fields.tolist(), strict=True):
            starts, keys = self.in_run if grouped else self.alone
            touched.append(keys[starts[index] : starts[index + 1]])
        chunks = self.chunks
        return [chunks[key] for key in np.unique(np.concatenate(touched)).tolist() if key in chunks], after


def _flattened(touched: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(starts, keys): the chunk keys of every crop in one array, crop ``i``'s from ``starts[i]``."""
    starts = np.concatenate([[0], np.cumsum([len(keys) for keys in touched])]).astype(np.int64)
    return starts, np.concatenate(touched) if touched else np.empty(0, dtype=np.int64)


class CodecCeiling:
    """The codec ceiling: the stored chunks a batch's crops touch (:class:`StoredChunks`), each decoded
    once by :func:`decode_into` into buffers allocated once, split over ``threads`` threads (the calling
    thread and ``threads - 1`` pool threads). Counts the chunks and bytes it decodes."""

    def __init__(self, stored: StoredChunks, threads: int, batch: int) -> None:
        if threads < 1:
            raise ConfigError(f"threads must be >= 1, got {threads}")
        self.stored, self.threads = stored, threads
        self.pool = ThreadPoolExecutor(threads - 1) if threads > 1 else None
        numcodecs.blosc.use_threads = False  # one thread per call, as the reader decodes: the threads are ``threads``
        self.buffers = np.empty((batch * stored.most_per_crop, stored.chunk_bytes), dtype=np.uint8)
        self.chunks_decoded = self.bytes_decoded = 0
        #: The run of one field just decoded, as the reader keeps its own.
        self.run = FieldRun()

    def __call__(self, indices: Sequence[int]) -> None:
        chunks, self.run = self.stored.of(indices, self.run)
        if len(chunks) > len(self.buffers):  # a batch larger than the one it was built for
            self.buffers = np.empty((len(chunks), self.buffers.shape[1]), dtype=np.uint8)
        buffers = self.buffers

        def decode(slots: Sequence[int]) -> None:
            for slot in slots:
                encoded, layout = chunks[slot]
                decode_into(encoded, layout, buffers[slot, : layout.chunk_bytes])

        split_over(self.pool, self.threads, range(len(chunks)), decode)
        self.chunks_decoded += len(chunks)
        self.bytes_decoded += sum(layout.chunk_bytes for _, layout in chunks)

    def reset(self) -> None:
        self.chunks_decoded = self.bytes_decoded = 0

    def per_crop(self, crops: int) -> dict[str, float]:
        """Chunks and bytes decoded per crop since :meth:`reset`, as the readers' stats name them."""
        return {
            m.CHUNKS_DECODED_PER_CROP: self.chunks_decoded / max(crops, 1),
            m.BYTES_DECODED_PER_CROP: self.bytes_decoded / max(crops, 1),
        }

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


def batched(get: Callable[[Sequence[int]], Any], batch: int) -> Read:
    """A block read as consecutive batches of ``batch`` through ``get``."""
    return lambda block: [get(block[start : start + batch]) for start in range(0, len(block), batch)]


def direct_name(threads: int) -> str:
    return f"direct-batched-{threads}t"


def ceiling_name(threads: int) -> str:
    return f"ceiling-{threads}t"


def codec_ceiling_name(threads: int) -> str:
    return f"codec-ceiling-{threads}t"


def tensorstore_context(cache_bytes: int, cores: int) -> dict[str, Any]:
    """tensorstore at its best on this machine: I/O and copies over every core, the reader's cache budget."""
    return {
        "cache_pool": {"total_bytes_limit": cache_bytes},
        "data_copy_concurrency": {"limit": cores},
        "file_io_concurrency": {"limit": cores},
    }


class TensorStoreReads:
    """tensorstore's ``zarr3`` driver over the plate's field arrays, reads issued together: one
    ``ts.Batch`` per batch (``mode="batch"``), or a whole block of futures in flight (``mode="futures"``)."""

    def __init__(self, windows: CropWindows, cache_bytes: int, cores: int, mode: str) -> None:
        try:
            import tensorstore as ts
        except ImportError as error:
            raise PeerUnavailableError(
                f"tensorstore is not installed ({error}): .venv/bin/pip install -e '.[tensorstore]'"
            ) from error
        if windows.layout != "ome-zarr":
            raise PeerUnavailableError(f"tensorstore reads OME-Zarr; the plate is {windows.layout}")
        self.ts, self.windows, self.mode = ts, windows, mode
        self.tuning = {"context": tensorstore_context(cache_bytes, cores), "mode": mode}
        context = ts.Context(self.tuning["context"])
        self.arrays = []
        for path in windows.array_paths:
            spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)}}
            array = ts.open(spec, context=context, read=True).result()
            self.arrays.append(array[windows.prefix(array.ndim)])

    def __call__(self, indices: Sequence[int]) -> np.ndarray:
        channels, height, width = self.windows.field_shape
        size = self.windows.size
        out = np.zeros((len(indices), channels, size, size), dtype=self.windows.dtype)
        pending = []

        def issue(batch: Any) -> None:
            for slot, index in enumerate(indices):
                field_index, y0, x0 = self.windows.window(int(index))
                cy0, cx0, cy1, cx1 = max(y0, 0), max(x0, 0), min(y0 + size, height), min(x0 + size, width)
                future = self.arrays[field_index][:, cy0:cy1, cx0:cx1].read(batch=batch)
                pending.append((slot, cy0 - y0, cy1 - y0, cx0 - x0, cx1 - x0, future))

        if self.mode == "batch":
            with self.ts.Batch() as batch:
                issue(batch)
        else:
            issue(None)
        for slot, top, bottom, left, right, future in pending:
            out[slot, :, top:bottom, left:right] = future.result()
        return out


class ZarrAsyncReads:
    """zarr-python's async API with ``async.concurrency`` set: a batch's reads gathered at once. With
    ``zarrs``, zarr-python decodes through the zarrs codec pipeline (Rust) with its own ``threads``."""

    def __init__(self, windows: CropWindows, concurrency: int, zarrs_threads: int | None = None) -> None:
        import zarr
        import zarr.api.asynchronous as zarr_async
        from zarr.core.sync import sync

        if windows.layout != "ome-zarr":
            raise PeerUnavailableError(f"zarr-python reads OME-Zarr; the plate is {windows.layout}")
        self.windows, self.sync, self.config = windows, sync, zarr.config
        self.settings: dict[str, Any] = {"async.concurrency": concurrency}
        if zarrs_threads is not None:
            try:
                import zarrs  # noqa: F401
            except ImportError as error:
                raise PeerUnavailableError(
                    f"zarrs is not installed ({error}): .venv/bin/pip install -e '.[zarrs]'"
                ) from error
            self.settings.update(
                {"codec_pipeline.path": "zarrs.ZarrsCodecPipeline", "threading.max_workers": zarrs_threads}
            )
        self.tuning = {**self.settings, "zarr": zarr.__version__}
        with self.config.set(self.settings):
            self.arrays = [sync(zarr_async.open_array(store=str(path), mode="r")) for path in windows.array_paths]

    def __call__(self, indices: Sequence[int]) -> np.ndarray:
        import asyncio

        channels, height, width = self.windows.field_shape
        size = self.windows.size
        out = np.zeros((len(indices), channels, size, size), dtype=self.windows.dtype)
        places, reads = [], []
        for slot, index in enumerate(indices):
            field_index, y0, x0 = self.windows.window(int(index))
            cy0, cx0, cy1, cx1 = max(y0, 0), max(x0, 0), min(y0 + size, height), min(x0 + size, width)
            array = self.arrays[field_index]
            prefix = self.windows.prefix(array.ndim)
            reads.append(array.getitem((*prefix, slice(cy0, cy1), slice(cx0, cx1))))
            places.append((slot, cy0 - y0, cy1 - y0, cx0 - x0, cx1 - x0))

        async def gather() -> list[Any]:
            return list(await asyncio.gather(*reads))

        with self.config.set(self.settings):  # this reader's settings only, not the process's
            gathered = self.sync(gather())
        for (slot, top, bottom, left, right), pixels in zip(places, gathered, strict=True):
            out[slot, :, top:bottom, left:right] = pixels
        return out


@dataclass
class Readers:
    """The readers of one case by name, each one's tuning, and whose counters to report."""

    calls: dict[str, Read] = field(default_factory=dict)
    batches: dict[str, Callable[[Sequence[int]], Any]] = field(default_factory=dict)
    tuning: dict[str, dict[str, Any]] = field(default_factory=dict)
    datasets: dict[str, CropDataset] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    ceilings: list[CopyCeiling] = field(default_factory=list)
    codec_ceilings: dict[str, CodecCeiling] = field(default_factory=dict)

    def close(self) -> None:
        for ceiling in self.ceilings:
            ceiling.close()
        for codec in self.codec_ceilings.values():
            codec.close()


def memmap_fields(memmap: Path) -> dict[int, np.ndarray]:
    """The raw fields of a plate in the ``memmap`` layout, in the page cache and mapped into this process:
    one value of every page is read, so the ceiling's copies take no page fault (a reader's would not)."""
    load_into_page_cache([path for path in memmap.rglob("*") if path.is_file()])
    reader = open_plate(memmap, "direct")
    if not isinstance(reader, MemmapReader):
        raise ConfigError(f"{memmap} is not a plate in the memmap layout")
    pixels = reader.pixels()
    fields = {index: pixels[index] for index in range(len(pixels))}
    for field_pixels in fields.values():
        flat = field_pixels.reshape(-1)
        int(flat[:: max(mmap.PAGESIZE // flat.itemsize, 1)].sum())  # touch every page
    return fields


def build_readers(case: TargetsCase, context: RunContext, fields: dict[int, np.ndarray], budget: int) -> Readers:
    """Every reader of ``case``: the direct reader and the ceiling at each thread count, then the peers."""
    readers = Readers()
    crop = CropConfig(crop_size=case.crop_size, dtype="uint16", chunk_cache_bytes=budget)
    windows: CropWindows | None = None
    reference: MemoryReference | None = None
    stored: StoredChunks | None = None
    for threads in case.threads:
        dataset = context.dataset(crop.replace(decode_threads=threads))
        if windows is None or reference is None:
            windows = CropWindows.from_dataset(dataset)
            reference = MemoryReference.of_windows(fields, windows)
        if stored is None and isinstance(dataset.reader, DirectChunkReader):
            stored = StoredChunks(dataset)
        name = direct_name(threads)
        readers.calls[name] = batched(dataset.__getitems__, case.batch)
        readers.batches[name] = dataset.__getitems__
        readers.tuning[name] = {"decode_threads": threads, "chunk_cache_bytes": budget, "batch": case.batch}
        readers.datasets[name] = dataset
        ceiling = CopyCeiling(reference, threads, case.batch)
        readers.ceilings.append(ceiling)
        readers.calls[ceiling_name(threads)] = batched(ceiling, case.batch)
        readers.batches[ceiling_name(threads)] = ceiling
        readers.tuning[ceiling_name(threads)] = {"threads": threads, "batch": case.batch, "copy": "C, GIL released"}
        if stored is not None:
            codec = CodecCeiling(stored, threads, case.batch)
            name = codec_ceiling_name(threads)
            readers.codec_ceilings[name] = codec
            readers.calls[name] = batched(codec, case.batch)
            readers.tuning[name] = {
                "threads": threads,
                "batch": case.batch,
                "decode": "codec alone (c-blosc), GIL released, every chunk a batch touches once",
            }
    assert windows is not None
    cores = usable_cores()
    peers: dict[str, tuple[Callable[[], Any], int]] = {
        "tensorstore-batch": (lambda: TensorStoreReads(windows, budget, cores, "batch"), case.batch),
        "tensorstore-futures": (lambda: TensorStoreReads(windows, budget, cores, "futures"), case.block),
        "zarr-async": (lambda: ZarrAsyncReads(windows, cores), case.batch),
        "zarrs-async": (lambda: ZarrAsyncReads(windows, cores, zarrs_threads=cores), case.batch),
    }
    for name, (make, batch) in peers.items():
        try:
            peer = make()
        except (PeerUnavailableError, ImportError) as error:
            readers.skipped[name] = str(error)
            context.progress(f"targets: {name} left out ({error})")
            continue
        readers.calls[name] = batched(peer, batch)
        readers.batches[name] = peer
        readers.tuning[name] = {**peer.tuning, "reads_in_flight": batch}
    return readers


def pixels(result: Any, count: int) -> np.ndarray:
    """The (B, C, H, W) pixels of the first ``count`` crops a reader gave for one batch (a dataset's
    batch, a tensor or an array)."""
    image = getattr(result, "image", result)
    return np.asarray(image.numpy() if hasattr(image, "numpy") else image)[:count]


def identical_bytes(readers: Readers, reference: str, indices: Sequence[int]) -> dict[str, bool]:
    """Per reader, whether its crops of ``indices`` are byte for byte those of ``reference``."""
    expected = pixels(readers.batches[reference](indices), len(indices)).copy()
    return {
        name: bool(np.array_equal(pixels(read(indices), len(indices)), expected))
        for name, read in readers.batches.items()
    }


def ceiling_flags(ratio: dict[str, Any]) -> list[str]:
    """``impossible`` when a reader's median ratio to the ceiling exceeds 1 (nothing beats the ceiling)."""
    return [IMPOSSIBLE] if ratio[m.RATIO_MEDIAN] > 1.0 else []


def comparisons(names: Sequence[str], threads: Sequence[int]) -> list[tuple[str, str]]:
    """(reader, reference) pairs: each direct reader over the ceiling and the codec ceiling at its thread
    count (those measured) and over every peer."""
    peers = [name for name in names if not name.startswith(("direct-", "ceiling-", "codec-ceiling-"))]
    return [
        (direct_name(t), reference)
        for t in threads
        for reference in (ceiling_name(t), codec_ceiling_name(t), *peers)
        if reference in names
    ]


class Targets:
    """Track ``targets`` for the runner (``cropbench run --track targets``).

    The direct reader beside the ceilings (a copy out of the plate held decoded in memory, and the
    codec alone) and the peers, read in interleaved blocks over the same objects, with paired ratios.
    """

    name = "targets"

    def cases(self, preset: str, context: RunContext) -> list[TargetsCase]:
        """One case per access pattern (random, grouped).

        Args:
            preset: The preset's name: ``smoke`` (checks the wiring) or ``full``.
            context: The run's plate; its ``samples`` overrides the objects read.

        Returns:
            The cases in the order they run.

        Raises:
            ConfigError: An unknown preset.
        """
        return preset_cases(preset, context.samples)

    def decode(self, case: TargetsCase) -> str:
        """``direct``: every case compares the direct reader."""
        return "direct"

    def measure(self, case: TargetsCase, repeat: int, context: RunContext) -> Iterator[Row]:
        """Read the case's blocks with every reader and ceiling in turns, then compare them in pairs.

        Args:
            case: One case of :meth:`cases`.
            repeat: The repeat's number; it is added to the case's seed.
            context: The run's plate.

        Yields:
            A row per reader (crops/s, spread over rounds), a row per paired ratio, then the
            case's summary row.

        Raises:
            ConfigError: The plate is in an object store (the track reads a local plate).
        """
        seed = case.seed + repeat
        if context.remote is not None:
            raise ConfigError(f"track targets reads a local plate; {context.location} is in a store")
        memmap = materialize_layout(context.plate, "memmap")
        fields = memmap_fields(memmap)
        load_into_page_cache([path for path in context.plate.rglob("*") if path.is_file()])
        reference = context.dataset(CropConfig(crop_size=case.crop_size, dtype="uint16"))
        decoded = decoded_plate_bytes(reference.reader)
        budget = int(decoded * CACHE_FRACTION)
        readers = build_readers(case, context, fields, budget)
        order = access_order(reference, ACCESSES[case.access], case.objects, seed)
        blocks = [order[start : start + case.block] for start in range(0, len(order), case.block)]
        identical = identical_bytes(readers, direct_name(case.threads[0]), blocks[0][: case.batch])
        loadavg_start = os.getloadavg()
        for read in readers.calls.values():  # warm-up: the first block, untimed
            read(blocks[0])
        for dataset in readers.datasets.values():
            dataset.reader.stats.reset()
        for codec in readers.codec_ceilings.values():
            codec.reset()
        seconds = interleaved_blocks(readers.calls, blocks, case.rounds)
        loadavg_end = os.getloadavg()
        readers.close()
        crops = sum(len(block) for block in blocks)
        for name, spent in seconds.items():
            per_round = [samples_per_s(crops, float(s)) for s in spent.sum(axis=1)]
            metrics: dict[str, Any] = {
                m.CROPS_PER_S: samples_per_s(crops * case.rounds, float(spent.sum())),
                m.ROUND_MIN: min(per_round),
                m.ROUND_MAX: max(per_round),
                m.ROUND_MEDIAN: float(np.median(per_round)),
            }
            if name in identical:  # the codec ceiling decodes chunks and makes no crops
                metrics[m.IDENTICAL_TO_DIRECT] = identical[name]
            if name in readers.datasets:
                metrics.update(readers.datasets[name].reader.stats.per_region())
            if name in readers.codec_ceilings:
                metrics.update(readers.codec_ceilings[name].per_crop(crops * case.rounds))
            reader_case = ReaderCase(case.access, name, readers.tuning[name], seed)
            named = {"reader_name": name, "tuning": readers.tuning[name], "case": asdict(case)}
            yield Row(reader_case, named, metrics, seed)
        for reader, against in comparisons(list(readers.calls), case.threads):
            ratio = paired_ratios(seconds[reader], seconds[against])
            config: dict[str, Any] = {
                "access": case.access,
                "reader_name": reader,
                "reference_name": against,
                "reader": readers.tuning[reader],
                "reference": readers.tuning[against],
            }
            if against.startswith("ceiling-"):
                ratio[m.CEILING_THREADS] = readers.tuning[against]["threads"]
                ratio[m.VALIDITY_FLAGS] = ceiling_flags(ratio)
            yield Row(RatioCase(case.access, reader, against, seed), config, ratio, seed)
        summary = {
            m.OBJECTS: len(reference),
            m.CHUNK_CACHE_FRACTION_OF_PLATE: budget / decoded,
            m.LOADAVG_START: list(loadavg_start),
            m.LOADAVG_END: list(loadavg_end),
            m.SKIPPED_PEERS: readers.skipped,
        }
        yield Row(case, {**asdict(case), "chunk_cache_bytes": budget, "cores": usable_cores()}, summary, seed)
