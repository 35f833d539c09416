"""DataLoader construction shared by Tracks 2 and 3: seeded workers, a fixed schedule, cheap collate.

Everything that makes two loader runs comparable lives here: the sample order is fixed before the
loader starts (so it cannot depend on worker timing), workers are seeded from one generator, and
the knobs are one frozen :class:`LoaderSpec` that goes into the record as it is.
"""

from __future__ import annotations

import contextlib
import math
import os
import pickle
import random
import signal
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import psutil
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.data import DataLoader, Dataset, Sampler, get_worker_info
from torch.utils.data._utils.collate import default_collate

from cropbench import metrics as m
from cropbench.config import check_workers
from cropbench.data.dataset import (
    SEGMENT_MARKER,
    SEGMENT_TAIL_BYTES,
    CropBatch,
    CropDataset,
    SegmentPool,
    batch_tensor,
    use_segments,
)
from cropbench.data.sampling import EpochSampler, ReadAheadBatches, continued_order
from cropbench.errors import ConfigError, WorkerError

START_METHODS = ("fork", "forkserver", "spawn")
COLLATES = ("default", "stack")
#: Seconds past ``timeout_s`` before the watchdog terminates the workers of a ``next()`` still waiting.
WATCHDOG_MARGIN_S = 2.0
#: Metadata columns the ``stack`` collate keeps, as numpy arrays (no per-sample strings or dicts).
STACK_COLUMNS = ("index", "object_id", "field_index")
MIB = 2**20
#: Shared-memory segments each worker keeps for its batches beyond the ``prefetch_factor`` in flight:
#: the one being filled, the one the training loop holds, and one whose return is not yet seen.
SPARE_SEGMENTS = 3


@dataclass(frozen=True)
class LoaderSpec:
    """The DataLoader knobs of one measurement.

    ``prefetch_factor=None`` keeps torch's default (2 with workers); it and ``persistent_workers``
    only apply with workers, so asking for them without workers is an error rather than a no-op.
    ``start_method`` is explicit because Python 3.14 changes the Linux default from fork.
    ``timeout_s`` bounds the wait for one batch from the workers, so a hung worker surfaces as an
    error instead of a silent hang (a crashed worker is reported by torch at once). torch's own
    timeout does not cover fetching a batch's shared-memory descriptor from its worker, so a
    watchdog bounds each whole ``next()`` by ``timeout_s + WATCHDOG_MARGIN_S`` (see :func:`build_loader`).
    """

    num_workers: int = 0
    batch_size: int = 64
    pin_memory: bool = False
    persistent_workers: bool = False
    prefetch_factor: int | None = None
    collate: str = "default"
    start_method: str = "fork"
    timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if not _is_number(self.timeout_s) or not math.isfinite(self.timeout_s) or self.timeout_s < 0:
            raise ConfigError(f"timeout_s must be a finite number >= 0 (0 = wait forever), got {self.timeout_s!r}")
        check_workers(self.num_workers, "num_workers")
        if not _is_integer(self.batch_size) or self.batch_size < 1:
            raise ConfigError(f"batch_size must be a positive integer, got {self.batch_size!r}")
        for name in ("pin_memory", "persistent_workers"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.collate not in COLLATES:
            raise ConfigError(f"collate={self.collate!r} is not one of {', '.join(COLLATES)}")
        if self.start_method not in START_METHODS:
            raise ConfigError(f"start_method={self.start_method!r} is not one of {', '.join(START_METHODS)}")
        if self.num_workers == 0 and (self.persistent_workers or self.prefetch_factor is not None):
            raise ConfigError(
                "persistent_workers and prefetch_factor only apply with num_workers > 0 "
                f"(got persistent_workers={self.persistent_workers}, prefetch_factor={self.prefetch_factor})"
            )
        if self.prefetch_factor is not None and (not _is_integer(self.prefetch_factor) or self.prefetch_factor < 1):
            raise ConfigError(f"prefetch_factor must be an integer >= 1, got {self.prefetch_factor!r}")

    @property
    def label(self) -> str:
        parts = [f"w{self.num_workers}", f"b{self.batch_size}"]
        parts += ["pin"] if self.pin_memory else []
        parts += ["persistent"] if self.persistent_workers else []
        parts += [f"prefetch{self.prefetch_factor}"] if self.prefetch_factor is not None else []
        parts += [f"{self.collate}-collate"] if self.collate != "default" else []
        parts += [self.start_method] if self.start_method != "fork" and self.num_workers else []
        return "/".join(parts)


def _is_integer(value: object) -> bool:
    """An int that is not a bool (``True`` is an int to Python, never a worker count to a user)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def schedule(sampler: EpochSampler, per_epoch: int, epochs: int = 1) -> list[np.ndarray]:
    """``epochs`` index arrays of ``per_epoch`` indices, continuing through the sampler's epochs.

    A loop of a fixed number of steps may need more samples than the dataset holds; the order then
    continues into the sampler's next epoch, as a training loop would.
    """
    flat = continued_order(sampler, per_epoch * epochs)
    return [flat[i * per_epoch : (i + 1) * per_epoch] for i in range(epochs)]


class ScheduledSampler(Sampler[int]):
    """Yields a precomputed index array per epoch; ``set_epoch`` picks which."""

    def __init__(self, orders: Sequence[np.ndarray]) -> None:
        if not orders or any(len(order) == 0 for order in orders):
            raise ConfigError("a scheduled sampler needs at least one non-empty epoch")
        self.orders = [np.asarray(order, dtype=np.int64) for order in orders]
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        if not 0 <= epoch < len(self.orders):
            raise ConfigError(f"epoch {epoch} outside the {len(self.orders)} scheduled epochs")
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.orders[self.epoch])

    def __iter__(self) -> Any:
        return iter(self.orders[self.epoch].tolist())


def seed_worker(worker_id: int) -> None:
    """Seed Python's and numpy's global RNGs from torch's per-worker seed; one intra-op thread.

    Torch derives each worker's seed from the loader's generator, so a seeded generator makes every
    worker's RNGs reproducible. cropbench's transforms do not use global RNGs (they seed from the
    sample index), so this only protects user code and third-party libraries.
    """
    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    np.random.seed(seed)
    torch.set_num_threads(1)


#: Environment variables a worker takes from the process that built its loader: where and as whom
#: object stores are read. A forkserver or spawn worker otherwise has the environment its server
#: process started with, which misses what was set since (a loopback store's endpoint, say).
STORE_VARIABLE_PREFIXES = ("AWS_",)


class SegmentReturns:
    """The main process's side of the workers' :class:`~cropbench.data.dataset.SegmentPool`: which
    batch segments it has let go of.

    ``table[worker, slot]`` is in shared memory. Each delivered batch's image that lies in a pooled
    segment is watched through a weak reference to its storage; once nothing in this process holds
    that storage any more (no tensor, view or numpy array of it), the segment's ticket is written
    into the table and its worker may fill it again. A batch passed on to yet another process must be
    cloned first: that process's hold on the segment is not seen here.
    """

    def __init__(self, workers: int, slots: int) -> None:
        self.table = torch.zeros((workers, slots), dtype=torch.int64).share_memory_()
        self._held: list[tuple[StorageWeakRef, int, int, int]] = []

    @property
    def slots(self) -> int:
        return int(self.table.shape[1])

    def watch(self, batch: Any) -> None:
        """Watch the image of a delivered batch (a dict with ``"image"``), if it lies in a pooled segment."""
        image = batch.get("image") if isinstance(batch, dict) else None
        if not isinstance(image, torch.Tensor):
            return
        segment = segment_of(image)
        if segment is not None and segment[0] < self.table.shape[0] and segment[1] < self.slots:
            self._held.append((StorageWeakRef(image.untyped_storage()), *segment))

    def collect(self) -> None:
        """Return every watched segment this process no longer holds to its worker."""
        held = []
        table = self.table.numpy()
        for reference, worker, slot, ticket in self._held:
            if reference.expired():
                table[worker, slot] = ticket
            else:
                held.append((reference, worker, slot, ticket))
        self._held = held


def segment_of(image: torch.Tensor) -> tuple[int, int, int] | None:
    """(worker, slot, ticket) of a batch image that fills a worker's pooled segment, else None."""
    if not image.is_shared() or image.storage_offset() != 0 or not image.is_contiguous():
        return None
    storage = image.untyped_storage()
    padded = -(-image.nbytes // 8) * 8
    if storage.nbytes() != padded + SEGMENT_TAIL_BYTES:
        return None
    marker, worker, slot, ticket = torch.empty(0, dtype=torch.int64).set_(storage, padded // 8, (4,), (1,)).tolist()
    return (worker, slot, ticket) if marker == SEGMENT_MARKER and worker >= 0 and slot >= 0 else None


@dataclass(frozen=True)
class WorkerStart:
    """A worker's init function: the builder's store variables (as :data:`STORE_VARIABLE_PREFIXES`
    selects them, held in memory only), the worker's segment pool over ``returns`` (when given), then
    :func:`seed_worker`."""

    variables: tuple[tuple[str, str], ...]
    returns: torch.Tensor | None = None

    @classmethod
    def now(cls, returns: torch.Tensor | None = None) -> WorkerStart:
        return cls(tuple((k, v) for k, v in os.environ.items() if k.startswith(STORE_VARIABLE_PREFIXES)), returns)

    def __call__(self, worker_id: int) -> None:
        for name in [name for name in os.environ if name.startswith(STORE_VARIABLE_PREFIXES)]:
            del os.environ[name]
        os.environ.update(self.variables)
        use_segments(None if self.returns is None else SegmentPool(self.returns, worker_id))
        seed_worker(worker_id)


def stack_collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """A cheaper collate: one stacked image tensor plus a few int64 numpy columns.

    Inside a worker the images are stacked straight into shared memory (as default_collate does),
    so crossing the process boundary costs one copy, not two. Every torch tensor in a batch travels
    as its own shared-memory segment whose file descriptor the main process fetches over a socket,
    a round trip per tensor; numpy columns travel inside the pickle instead. default_collate
    makes a tensor per numeric metadata key, ten per cropbench batch. A :class:`CropBatch` is one
    tensor already: it is passed on without stacking.
    """
    if isinstance(samples, CropBatch):
        columns = samples.columns
        labels = {"labels": {n: v.numpy() for n, v in columns["labels"].items()}} if "labels" in columns else {}
        return {"image": samples.image, **{c: columns[c].numpy() for c in STACK_COLUMNS if c in columns}, **labels}
    image = samples[0]["image"]
    out = batch_tensor((len(samples), *image.shape), image.dtype) if get_worker_info() is not None else None
    batch: dict[str, Any] = {"image": torch.stack([sample["image"] for sample in samples], out=out)}
    for column in STACK_COLUMNS:
        if column in samples[0]:
            batch[column] = np.fromiter((sample[column] for sample in samples), dtype=np.int64, count=len(samples))
    if "labels" in samples[0]:  # training targets (CropDataset(labels=...)), one numpy column each
        names = samples[0]["labels"]
        batch["labels"] = {name: np.array([sample["labels"][name] for sample in samples]) for name in names}
    return batch


class TimedCollate:
    """Wraps a collate function and adds its own duration (``collate_ns``) to each batch.

    Run inside a worker, this times the stack into shared memory: into one of the worker's pooled
    segments when the main process has returned one, else into a fresh segment, page faults included
    (the cost that makes float32 batches slower to hand over than uint16 ones).
    """

    def __init__(self, collate: Callable[[list[Any]], dict[str, Any]]) -> None:
        self.collate = collate

    def __call__(self, samples: list[Any]) -> dict[str, Any]:
        start = time.perf_counter_ns()
        batch = self.collate(samples)
        batch["collate_ns"] = time.perf_counter_ns() - start  # a plain int: no extra shared-memory segment
        return batch


def batch_collate(samples: list[Any]) -> Any:
    """torch's ``default_collate``, except that a :class:`CropBatch` (one tensor already, from
    ``CropDataset.__getitems__``) is passed on as ``default_collate`` would batch it, without stacking."""
    return samples.collated() if isinstance(samples, CropBatch) else default_collate(samples)


def collate_function(name: str) -> Callable[[list[Any]], Any]:
    if name not in COLLATES:
        raise ConfigError(f"collate={name!r} is not one of {', '.join(COLLATES)}")
    return stack_collate if name == "stack" else batch_collate


def build_loader(
    dataset: Dataset[Any],
    spec: LoaderSpec,
    sampler: Sampler[int],
    seed: int = 0,
    *,
    timed_collate: bool = False,
    pin_memory: bool | None = None,
) -> DataLoader[Any]:
    """A DataLoader with the spec's knobs, a seeded generator and seeded workers.

    ``pin_memory`` overrides ``spec.pin_memory`` (Track 3 resolves it against the device): pinning
    without an accelerator is skipped, so the value in force is the caller's to record. Over a
    dataset whose reader reads ahead (:meth:`CropDataset.read_ahead_batches`), the batches come from
    :class:`~cropbench.data.sampling.ReadAheadBatches` (``loader.batch_sampler.sampler`` is ``sampler``
    either way), so each process's reader knows the batches it reads next.
    """
    collate = collate_function(spec.collate)
    workers = spec.num_workers
    returns = SegmentReturns(workers, (spec.prefetch_factor or 2) + SPARE_SEGMENTS) if workers else None
    ahead = dataset.read_ahead_batches(spec.batch_size) if isinstance(dataset, CropDataset) else 0
    batching: dict[str, Any] = (
        {"batch_sampler": ReadAheadBatches(sampler, spec.batch_size, workers, ahead)}
        if ahead
        else {"batch_size": spec.batch_size, "sampler": sampler}
    )
    return WatchedLoader(
        dataset,
        **batching,
        num_workers=workers,
        collate_fn=TimedCollate(collate) if timed_collate else collate,
        pin_memory=spec.pin_memory if pin_memory is None else pin_memory,
        persistent_workers=spec.persistent_workers,
        prefetch_factor=spec.prefetch_factor,
        worker_init_fn=WorkerStart.now(None if returns is None else returns.table) if workers else None,
        generator=torch.Generator().manual_seed(seed),
        multiprocessing_context=spec.start_method if workers else None,
        timeout=spec.timeout_s if workers else 0,
        segment_returns=returns,
    )


class WatchedLoader(DataLoader[Any]):
    """A DataLoader whose every ``next()`` with workers ends within ``timeout + WATCHDOG_MARGIN_S``.

    A worker that is stopped or stuck while the main process fetches a batch's shared-memory
    descriptor from it blocks ``next()`` past torch's timeout; the watchdog then terminates the
    workers and ``next()`` raises one :class:`WorkerError` naming the worker. With ``segment_returns``
    (:func:`build_loader` gives one to a loader with workers), each ``next()`` first returns the batch
    segments the caller has let go of to their workers, then watches the batch it delivers.
    """

    def __init__(self, *args: Any, segment_returns: SegmentReturns | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.segment_returns = segment_returns

    def __iter__(self) -> Any:
        iterator: Any = super().__iter__()
        if self.num_workers == 0:
            return iterator
        if self.segment_returns is not None:
            iterator = _ReturningIterator(iterator, self.segment_returns)
        if not self.timeout:
            return iterator
        return _WatchedIterator(iterator, float(self.timeout) + WATCHDOG_MARGIN_S)


class _IteratorWrapper:
    """Passes ``len()`` and attributes (``_workers`` and the rest) on to the iterator it wraps."""

    _iterator: Any

    def __iter__(self) -> _IteratorWrapper:
        return self

    def __len__(self) -> int:
        return len(self._iterator)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._iterator, name)


class _ReturningIterator(_IteratorWrapper):
    """Wraps torch's multi-process iterator: returns let-go segments, watches each delivered batch."""

    def __init__(self, iterator: Any, returns: SegmentReturns) -> None:
        self._iterator = iterator
        self._returns = returns

    def __next__(self) -> Any:
        self._returns.collect()
        batch = next(self._iterator)
        self._returns.watch(batch)
        return batch


class _WatchedIterator(_IteratorWrapper):
    """Wraps torch's multi-process iterator; a daemon thread enforces the deadline of each ``next()``."""

    def __init__(self, iterator: Any, limit_s: float) -> None:
        self._iterator = iterator
        self._limit_s = limit_s
        self._deadline = math.inf
        self._stuck: list[str] = []
        self._done = threading.Event()
        threading.Thread(
            target=_watch,
            args=(weakref.ref(self), self._done, min(0.25, limit_s / 4)),
            name="cropbench-loader-watchdog",
            daemon=True,
        ).start()

    def __next__(self) -> Any:
        self._deadline = time.monotonic() + self._limit_s
        try:
            return next(self._iterator)
        except StopIteration:
            self._done.set()
            raise
        except Exception as error:
            if not self._stuck and self._stopped_workers():
                # torch's own timeout can end the wait first; a stopped worker left alive would then
                # hang the process's exit, which joins it.
                self._terminate()
            if not self._stuck:
                raise
            self._done.set()
            raise WorkerError(
                f"DataLoader worker {', '.join(self._stuck)} handed over no batch within "
                f"timeout_s={self._limit_s - WATCHDOG_MARGIN_S:g} s (+{WATCHDOG_MARGIN_S:g} s); the workers were "
                "terminated. Is a worker stopped, swapping, or stuck on storage?"
            ) from error
        finally:
            self._deadline = math.inf

    def _statuses(self) -> list[tuple[int, str]]:
        """(pid, status) of each worker psutil can still see."""
        statuses = []
        for worker in getattr(self._iterator, "_workers", []):
            if worker.pid is None:
                continue
            with contextlib.suppress(psutil.Error, OSError):
                statuses.append((worker.pid, psutil.Process(worker.pid).status()))
        return statuses

    def _stopped_workers(self) -> bool:
        """Whether any worker is stopped (SIGSTOP, a debugger)."""
        return any(status == psutil.STATUS_STOPPED for _, status in self._statuses())

    def _terminate(self) -> None:
        """Record which workers look stuck, then kill every worker so the blocked fetch fails."""
        for pid, status in self._statuses():
            if status == psutil.STATUS_STOPPED or not self._stuck:
                self._stuck.append(f"pid {pid} ({status})")
        self._stuck = self._stuck or ["(unknown)"]
        for worker in getattr(self._iterator, "_workers", []):
            if worker.pid is not None:
                with contextlib.suppress(OSError):
                    os.kill(worker.pid, signal.SIGKILL)

    def __del__(self) -> None:
        self._done.set()


def _watch(ref: weakref.ref[_WatchedIterator], done: threading.Event, poll_s: float) -> None:
    """Poll the iterator's deadline; terminate its workers once a ``next()`` outlives it."""
    while not done.wait(poll_s):
        watched = ref()
        if watched is None:
            return
        if time.monotonic() > watched._deadline:
            watched._terminate()
            return
        del watched


def worker_pids(iterator: Any) -> list[int]:
    """Process ids of a live multi-process loader iterator's workers (empty without workers)."""
    return [int(worker.pid) for worker in getattr(iterator, "_workers", []) if worker.pid is not None]


def memory_of(pids: Sequence[int]) -> dict[str, Any]:
    """RSS, USS and PSS (MiB) of the given processes and of this one.

    RSS of a forked worker counts pages it shares with the parent; USS (pages only it holds) is
    what each extra worker really costs, PSS the fair share summed over workers.
    """
    main = psutil.Process().memory_info().rss
    metrics: dict[str, Any] = {m.MAIN_RSS_MIB: main / MIB}
    rss, uss, pss = [], [], []
    for pid in pids:
        try:
            info = psutil.Process(pid).memory_full_info()
        except (psutil.Error, OSError):
            continue
        rss.append(info.rss)
        uss.append(getattr(info, "uss", 0))
        pss.append(getattr(info, "pss", 0))
    if rss:
        metrics.update(
            {
                m.WORKER_RSS_MIB: [round(v / MIB, 2) for v in rss],
                m.WORKER_RSS_MIB_MAX: max(rss) / MIB,
                m.WORKER_USS_MIB_MAX: max(uss) / MIB,
                m.WORKER_PSS_MIB_SUM: sum(pss) / MIB,
            }
        )
    return metrics


def pickled_size(obj: object) -> int:
    """Bytes a spawn/forkserver worker receives for ``obj`` (fork copies memory instead)."""
    return len(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


__all__ = [
    "COLLATES",
    "START_METHODS",
    "LoaderSpec",
    "SegmentReturns",
    "ScheduledSampler",
    "TimedCollate",
    "batch_collate",
    "build_loader",
    "WATCHDOG_MARGIN_S",
    "WatchedLoader",
    "collate_function",
    "memory_of",
    "pickled_size",
    "schedule",
    "seed_worker",
    "segment_of",
    "stack_collate",
    "worker_pids",
]
