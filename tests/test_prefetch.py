"""The direct reader's prefetch: told the next batches, it reads their chunks into its cache while the
current batch decodes. Over a plate served by nginx and a local one: the same bytes as without
prefetch, each chunk fetched once, the bytes in flight bounded, cancellation that leaves no
thread running and a consistent cache; through cropbench's DataLoader, chunks fetched ahead of the
batch that needs them; and a chunk cache too small for the read-ahead refused or grown."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY_SPEC
from torch.utils.data import BatchSampler, DataLoader

from cropbench import metrics as m
from cropbench.config import DEFAULT_REMOTE_PREFETCH_BATCHES, LAYOUTS, CropConfig, PrefetchConfig, StoreConfig
from cropbench.data.dataset import CropBatch, CropDataset
from cropbench.data.loader import LoaderSpec, ScheduledSampler, batch_collate, build_loader, schedule
from cropbench.data.sampling import RandomObjectSampler, ReadAheadBatches, with_upcoming
from cropbench.errors import ConfigError
from cropbench.formats import DirectChunkReader, Regions, open_plate
from cropbench.formats.direct.keys import FIELD_SHIFT
from cropbench.formats.sources import mirror_metadata, write_index
from cropbench.harness.context import RunContext
from cropbench.harness.loader_case import loader_rates, read_ahead_cache_bytes
from cropbench.harness.validity import decoded_plate_bytes
from cropbench.measure import endpoints
from cropbench.plates.generate import generate_plate

BATCH = 8
#: A cache that holds the whole tiny plate: every prefetched chunk stays until it is read.
WHOLE_PLATE_CACHE = 64 * 2**20


@pytest.fixture(scope="module")
def plate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("prefetch") / "tiny.zarr"
    generate_plate(path, TINY_SPEC, LAYOUTS["default"], progress=False)
    return path


@pytest.fixture(scope="module")
def served_plate(plate: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The plate served by nginx, opened through its metadata mirror."""
    if endpoints.nginx_binary() is None:
        pytest.skip("nginx is not installed: apt-get install -y nginx")
    www = tmp_path_factory.mktemp("www")
    shutil.copytree(plate, www / plate.name)
    write_index(www / plate.name)
    with endpoints.http_server(www) as endpoint:
        yield mirror_metadata(f"{endpoint}/{plate.name}", StoreConfig(), cache_dir=www.parent / "mirror")


def _dataset(path: Path, prefetch: PrefetchConfig, cache: int = WHOLE_PLATE_CACHE) -> CropDataset:
    reader = open_plate(path, "direct", cache, prefetch=prefetch)
    return CropDataset(path, CropConfig(dtype="uint16", chunk_cache_bytes=cache), reader=reader)


def _batches(dataset: CropDataset) -> list[list[int]]:
    return list(BatchSampler(RandomObjectSampler(len(dataset), seed=3), BATCH, drop_last=False))


def _prefetch_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith("cropbench-prefetch")]


def _read_all(dataset: CropDataset, batches: list[list[int]]) -> list[torch.Tensor]:
    ahead = with_upcoming(batches, 0, dataset.read_ahead_batches(BATCH))
    return [dataset.__getitems__(batch).collated()["image"].clone() for batch in ahead]


@pytest.mark.parametrize("where", ["local", "http"])
def test_prefetch_gives_the_same_bytes_and_fetches_each_chunk_once(where: str, plate: Path, served_plate: Path) -> None:
    path = plate if where == "local" else served_plate
    plain = _dataset(path, PrefetchConfig(batches=0))
    ahead = _dataset(path, PrefetchConfig(batches=3))
    batches = _batches(plain)
    expected = _read_all(plain, batches)
    got = _read_all(ahead, batches)
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))
    assert isinstance(ahead.reader, DirectChunkReader) and ahead.reader.prefetcher is not None
    assert not ahead.reader.prefetcher.errors
    # The cache holds the whole plate, so each chunk is loaded once however it was split between the
    # prefetch and the batch reads: nothing fetched twice (requests may differ: reads coalesce differently).
    assert ahead.reader.stats.chunks_decoded == plain.reader.stats.chunks_decoded
    ahead.reader.close()
    plain.reader.close()
    assert not _prefetch_threads()


def test_prefetched_chunks_are_cache_hits(served_plate: Path) -> None:
    """Chunks prefetched before a batch is read are not requested by the batch."""
    dataset = _dataset(served_plate, PrefetchConfig(batches=1))
    reader = dataset.reader
    assert isinstance(reader, DirectChunkReader) and reader.prefetcher is not None
    batches = _batches(dataset)
    regions = dataset.regions_of(np.asarray(batches[1]))
    reader.prefetch([regions])
    reader.prefetcher.wait()
    before = reader.source.requests
    assert before > 0
    reader.read_regions(regions, np.empty((len(regions), 5, 96, 96), dtype=np.uint16))
    assert reader.source.requests == before
    reader.close()


def test_bytes_in_flight_stay_within_the_bound(served_plate: Path) -> None:
    """Counted at the byte source: the bytes of ranges requested and not yet answered."""
    bound = 40_000  # about one coalesced read of the tiny plate: the reads go nearly one at a time
    dataset = _dataset(served_plate, PrefetchConfig(batches=4, bytes_in_flight=bound, threads=3))
    reader = dataset.reader
    assert isinstance(reader, DirectChunkReader) and reader.prefetcher is not None
    source = reader.source
    lock, in_flight, peak, largest = threading.Lock(), [0], [0], [0]
    fetch_many = source.get_many

    def counted(requests: list[tuple[str, int, int]]) -> list[bytes | None]:
        nbytes = sum(max(length, 0) for _, _, length in requests)
        with lock:
            in_flight[0] += nbytes
            peak[0] = max(peak[0], in_flight[0])
            largest[0] = max(largest[0], nbytes)
        try:
            return fetch_many(requests)
        finally:
            with lock:
                in_flight[0] -= nbytes

    source.get_many = counted  # type: ignore[method-assign]
    batches = _batches(dataset)
    reader.prefetch([dataset.regions_of(np.asarray(batch)) for batch in batches[1:]])
    reader.prefetcher.wait()
    assert reader.prefetcher.budget.used == 0
    assert largest[0] > 0, "the prefetch fetched nothing"
    assert peak[0] <= max(bound, largest[0])
    assert reader.prefetcher.budget.peak <= max(bound, largest[0])
    reader.close()


def test_cancel_leaves_no_thread_and_a_consistent_cache(served_plate: Path, plate: Path) -> None:
    dataset = _dataset(served_plate, PrefetchConfig(batches=8, bytes_in_flight=20_000))
    reader = dataset.reader
    assert isinstance(reader, DirectChunkReader) and reader.prefetcher is not None
    batches = _batches(dataset)
    reader.prefetch([dataset.regions_of(np.asarray(batch)) for batch in batches])
    assert _prefetch_threads()
    reader.cancel_prefetch()
    reader.prefetcher.close()
    assert not _prefetch_threads()
    assert len(reader.prefetcher.claims) == 0
    # Whatever reached the cache decoded whole: every cached chunk reads as the local plate's.
    local = open_plate(plate, "direct")
    assert isinstance(local, DirectChunkReader)
    keys = list(reader.cache.lru._items)
    for key, chunk in reader.cache.get_many(keys).items():
        local.layouts.get(key >> FIELD_SHIFT)  # the field's layout, read before its chunks are planned
        fresh = local.loader.load(local.reads.plan([key], local.source)[0]).chunks
        assert [k for k, _, _ in fresh] == [key]
        assert np.array_equal(fresh[0][1], chunk)
    local.close()
    reader.close()


def test_a_dataloader_worker_prefetches_its_own_batches(served_plate: Path) -> None:
    """Two workers: each hints the batches torch deals it; the bytes are those read without prefetch."""
    plain = _dataset(served_plate, PrefetchConfig(batches=0))
    ahead = _dataset(served_plate, PrefetchConfig(batches=2))
    batches = _batches(plain)
    expected = _read_all(plain, batches)
    loader = DataLoader(ahead, batch_sampler=with_upcoming(batches, 2, 2), num_workers=2, collate_fn=batch_collate)
    got = [batch["image"] for batch in loader]
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))
    plain.reader.close()
    ahead.reader.close()


def test_prefetch_is_off_on_a_local_plate_unless_asked(plate: Path, served_plate: Path) -> None:
    assert open_plate(plate, "direct").prefetch_batches == 0  # type: ignore[attr-defined]
    assert open_plate(plate, "direct", prefetch=PrefetchConfig(batches=2)).prefetch_batches == 2  # type: ignore[attr-defined]
    assert open_plate(served_plate, "direct").prefetch_batches == DEFAULT_REMOTE_PREFETCH_BATCHES  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("settings", "named"),
    [({"batches": -1}, "batches"), ({"bytes_in_flight": 0}, "bytes_in_flight"), ({"threads": 0}, "threads")],
)
def test_bad_prefetch_settings_are_named(settings: dict[str, int], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        PrefetchConfig(**settings)


def test_a_worker_hints_the_batches_torch_deals_it(plate: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker 0 of 2 reads batches 0, 2, 4, ...: batch 0 carries batches 2 and 4, not 1, and the
    dataset hints the reader with exactly those."""
    dataset = _dataset(plate, PrefetchConfig(batches=2))
    reader = dataset.reader
    assert isinstance(reader, DirectChunkReader)
    hinted: list[Regions] = []
    monkeypatch.setattr(reader, "prefetch", lambda upcoming, channels=None: hinted.extend(upcoming))
    batches = _batches(dataset)
    dealt = with_upcoming(batches, 2, 2)
    assert dealt[0].upcoming == (batches[2], batches[4]) and dealt[-1].upcoming == ()
    assert with_upcoming(batches, 0, 1)[0].upcoming == (batches[1],)
    dataset.__getitems__(dealt[0])
    expected = [dataset.regions_of(np.asarray(batches[position])) for position in (2, 4)]
    assert [regions.table().tolist() for regions in hinted] == [regions.table().tolist() for regions in expected]
    hinted.clear()
    dataset.__getitems__(list(batches[0]))  # a batch that says nothing of what comes next: no hint
    assert hinted == []
    reader.close()


class CountedDataset(CropDataset):
    """Counts, in the process that reads each batch, the chunks of the batch its reader's cache lacks
    when the batch is asked for, once the read-ahead already started has finished (no race with the
    reads: the count depends on the order only)."""

    def __getitems__(self, indices: Sequence[int]) -> CropBatch:
        reader = self.reader
        assert isinstance(reader, DirectChunkReader)
        if reader.prefetcher is not None:
            reader.prefetcher.wait()
        regions = self.regions_of(np.asarray(indices, dtype=np.int64))
        lacking = len(reader.cache.absent(reader.pieces.plan_regions(regions, None).runs))
        batch = super().__getitems__(indices)
        batch.columns["lacking"] = torch.tensor([os.getpid(), lacking])
        return batch


def _counted_epoch(path: Path, batches: int, workers: int) -> tuple[list[torch.Tensor], list[int]]:
    """One epoch through :func:`build_loader`: each batch's images, and per batch after its process's
    first, the chunks it lacked when asked for."""
    reader = open_plate(path, "direct", WHOLE_PLATE_CACHE, prefetch=PrefetchConfig(batches=batches))
    dataset = CountedDataset(path, CropConfig(dtype="uint16", chunk_cache_bytes=WHOLE_PLATE_CACHE), reader=reader)
    loader = build_loader(dataset, LoaderSpec(num_workers=workers, batch_size=BATCH), RandomObjectSampler(len(dataset)))
    assert isinstance(loader.batch_sampler, ReadAheadBatches) == (batches > 0)
    images, lacking, seen = [], [], set()
    for batch in loader:
        images.append(batch["image"].clone())
        pid, count = batch["lacking"].tolist()
        if pid in seen:
            lacking.append(count)
        seen.add(pid)
    assert len(seen) == max(workers, 1)
    reader.close()
    return images, lacking


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_reads_ahead_of_the_batch_asked_for(served_plate: Path, workers: int) -> None:
    """Through cropbench's DataLoader (no worker, and two): with read-ahead on, every batch after a
    process's first finds all its chunks fetched before it is asked for (without, some batch lacks
    some), and the bytes are those of the same loader without read-ahead."""
    plain, plain_lacking = _counted_epoch(served_plate, 0, workers)
    ahead, ahead_lacking = _counted_epoch(served_plate, 2, workers)
    assert all(torch.equal(a, b) for a, b in zip(plain, ahead, strict=True))
    assert sum(plain_lacking) > 0  # the order needs new chunks after each process's first batch
    assert ahead_lacking == [0] * len(ahead_lacking)


def test_chunks_an_upcoming_batch_finds_cached_outlive_the_read_ahead(plate: Path) -> None:
    """A cache smaller than the plate: the chunks a coming batch would find cached are marked used
    when it is read ahead, so what is fetched meanwhile evicts others; every batch after the first
    finds all its chunks cached (counted once the read-ahead finished: no race with the reads)."""
    crop = CropConfig(crop_size=16, dtype="uint16", chunk_cache_bytes=2**20)
    reader = open_plate(plate, "direct", crop.chunk_cache_bytes, prefetch=PrefetchConfig(batches=2))
    dataset = CropDataset(plate, crop, reader=reader)
    assert isinstance(reader, DirectChunkReader) and reader.prefetcher is not None
    size = 2
    batches = list(BatchSampler(RandomObjectSampler(len(dataset), seed=3), size, drop_last=False))
    lacking = []
    for batch in with_upcoming(batches, 0, dataset.read_ahead_batches(size)):
        reader.prefetcher.wait()
        plan = reader.pieces.plan_regions(dataset.regions_of(np.asarray(batch)), None)
        lacking.append(len(reader.cache.absent(plan.runs)))
        dataset.__getitems__(batch)
    assert reader.stats.chunks_decoded * reader.layouts.get(0).chunk_bytes > crop.chunk_cache_bytes  # it evicted
    assert lacking[0] > 0 and lacking[1:] == [0] * (len(lacking) - 1)
    reader.close()


class HintedDataset(CropDataset):
    """Says, with each batch, how many upcoming batches came with its indices to the worker."""

    def __getitems__(self, indices: Sequence[int]) -> CropBatch:
        batch = super().__getitems__(indices)
        batch.columns["upcoming"] = len(getattr(indices, "upcoming", ()))
        return batch


def test_persistent_workers_learn_each_epochs_order(served_plate: Path) -> None:
    """Workers started once still get every later epoch's upcoming batches (they travel with the indices)."""
    reader = open_plate(served_plate, "direct", WHOLE_PLATE_CACHE, prefetch=PrefetchConfig(batches=2))
    dataset = HintedDataset(
        served_plate, CropConfig(dtype="uint16", chunk_cache_bytes=WHOLE_PLATE_CACHE), reader=reader
    )
    sampler = ScheduledSampler(schedule(RandomObjectSampler(len(dataset)), len(dataset), 2))
    loader = build_loader(dataset, LoaderSpec(num_workers=2, batch_size=BATCH, persistent_workers=True), sampler)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        upcoming = [batch["upcoming"] for batch in loader]
        # each worker's next two batches, fewer at the end of the epoch
        assert upcoming == [min(2, (len(upcoming) - 1 - position) // 2) for position in range(len(upcoming))]
    reader.close()


def test_read_ahead_the_cache_cannot_hold_is_refused_or_the_cache_grows(served_plate: Path) -> None:
    """Asked for: a one-line error naming both options. By default over a store: the cache grows to
    hold the batches read ahead and the one read."""
    small = 2**20
    asked = _dataset(served_plate, PrefetchConfig(batches=2), cache=small)
    with pytest.raises(ConfigError, match=r"chunk_cache_bytes=1048576 .*PrefetchConfig\(batches=") as error:
        build_loader(asked, LoaderSpec(batch_size=BATCH), RandomObjectSampler(len(asked)))
    assert "\n" not in str(error.value)
    default = _dataset(served_plate, PrefetchConfig(), cache=small)
    reader = default.reader
    assert isinstance(reader, DirectChunkReader)
    per_batch = BATCH * reader.region_chunk_bytes(96, 96)
    assert default.read_ahead_batches(BATCH) == DEFAULT_REMOTE_PREFETCH_BATCHES
    held = (DEFAULT_REMOTE_PREFETCH_BATCHES + 1) * per_batch
    assert reader.chunk_cache_bytes == reader.cache.lru.budget == held > small
    asked.reader.close()
    reader.close()


def test_a_loader_case_reports_the_cache_its_reader_grew_to(served_plate: Path, plate: Path) -> None:
    """Reading ahead over a store grows the chunk cache: the case's cache fraction (and its cache>=plate
    flag) is the grown cache's, and a local read given that cache holds the same."""
    small = 2**16
    over_store = loader_rates(RunContext(plate=served_plate), "direct", 4 * BATCH, BATCH, 32, cache_bytes=small)
    assert over_store.cache_bytes is not None and over_store.cache_bytes > small
    reader = open_plate(plate, "direct")
    decoded = decoded_plate_bytes(reader)
    reader.close()
    assert over_store.cache_fraction == pytest.approx(over_store.cache_bytes / decoded)
    assert over_store.cache_holds_plate == (over_store.cache_bytes >= decoded)
    local = loader_rates(RunContext(plate=plate), "direct", 4 * BATCH, BATCH, 32, cache_bytes=over_store.cache_bytes)
    assert (local.cache_bytes, local.cache_fraction) == (over_store.cache_bytes, over_store.cache_fraction)
    assert (
        loader_rates(RunContext(plate=plate), "direct", 4 * BATCH, BATCH, 32, cache_bytes=small).cache_bytes == small
    ), "no read-ahead"
    assert loader_rates(RunContext(plate=plate), "zarr", 4 * BATCH, BATCH, 32).cache_bytes is None, (
        "the zarr path keeps no chunk cache"
    )


def test_the_cache_a_reader_will_grow_to_is_known_before_it_reads(served_plate: Path, plate: Path) -> None:
    """What the remote track gives the local reference: the cache the store's reader holds once it
    reads ahead, from the metadata alone, equal to what a loader case then reports."""
    small = 2**16
    ahead = read_ahead_cache_bytes(RunContext(plate=served_plate), "direct", BATCH, 32, cache_bytes=small)
    assert ahead is not None and ahead > small
    assert (
        loader_rates(RunContext(plate=served_plate), "direct", 4 * BATCH, BATCH, 32, cache_bytes=small).cache_bytes
        == ahead
    )
    assert read_ahead_cache_bytes(RunContext(plate=plate), "direct", BATCH, 32, cache_bytes=small) == small
    assert read_ahead_cache_bytes(RunContext(plate=plate), "zarr", BATCH, 32) is None


def test_a_regions_chunk_bytes_bound_every_batch(plate: Path) -> None:
    """The most chunk bytes a crop may touch, times the batch size, is never below what a batch touches."""
    dataset = _dataset(plate, PrefetchConfig(batches=0))
    reader = dataset.reader
    assert isinstance(reader, DirectChunkReader)
    bound = reader.region_chunk_bytes(96, 96)
    chunk = reader.layouts.get(0).chunk_bytes
    assert bound == 3 * 3 * chunk  # 96 px over 64 px chunks: at most 3 rows and 3 columns of them
    touched = [
        len(reader.pieces.plan_regions(dataset.regions_of(np.asarray(batch)), None).runs) for batch in _batches(dataset)
    ]
    assert max(touched) * chunk <= BATCH * bound
    reader.close()


@pytest.mark.parametrize(
    ("decode", "workers", "start"), [("direct", 2, "fork"), ("zarr", 2, "forkserver"), ("zarr", 0, "fork")]
)
def test_a_loader_case_forks_the_direct_paths_workers_and_not_the_zarr_paths(
    decode: str, workers: int, start: str, plate: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The direct path's client starts afresh in a forked worker, so its workers fork (a forkserver's
    seconds of start-up would count in the whole-pass rate); obstore, a client of the zarr path, does not
    survive a fork."""
    import cropbench.harness.loader_case as loader_case

    started: list[str] = []

    def measured(context: object, case: loader_case.LoaderCase) -> dict[str, object]:
        started.append(case.loader.start_method)
        return {m.SAMPLES_PER_S: 1.0, m.RUN_SAMPLES_PER_S: 1.0, m.READER_CACHE_BYTES: None}

    monkeypatch.setattr(loader_case, "run_case", measured)
    loader_case.loader_rates(RunContext(plate=plate), decode, 4 * BATCH, BATCH, 32, workers)
    assert started == [start]
