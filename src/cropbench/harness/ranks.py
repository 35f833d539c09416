"""Many ranks, a mode of the harness: every case of Tracks 2 and 3 across the ranks of a ``torchrun`` job,
a row per rank and one for the whole job.

``cropbench run`` started by ``torchrun`` (or any launcher that sets ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``) joins the job's process group (nccl with CUDA,
else gloo) and runs each track through :class:`DistributedTrack`, which plugs into the one runner:
the cases are the track's own for the preset (the run's overrides applied to them by the runner, as
to any case; a case the track cannot split across ranks, a worker search say, is left out and said
so), every rank plans the same cases, starts each together at a barrier, measures its own share of the
epoch (a sampler of :mod:`cropbench.data.distributed`), and sends what it measured to rank 0, which
alone yields the rows (and so alone writes ``results.jsonl``): one per rank, then the aggregate —
total samples/s, per-rank min/median/max, the straggler ratio (slowest rank's data wait over the
median) and the read amplification across ranks (bytes decoded by all ranks over bytes delivered).

Track 3 trains under ``DistributedDataParallel``, so its steps include the gradient all-reduce.

A rank that dies or hangs: every collective waits at most ``timeout_s``; barriers are gloo's
monitored barriers, whose error names the ranks that did not arrive. Rank 0 has written each
finished case's rows before the next case starts, so they are kept.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import socket
import statistics
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast, runtime_checkable

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from cropbench import metrics as m
from cropbench.data.dataset import CropDataset
from cropbench.data.distributed import BALANCES, RANK_SAMPLERS, SamplerFactory, balance_extra, rank_sampler
from cropbench.data.sampling import EpochSampler, continued_order
from cropbench.errors import ConfigError, DistributedError
from cropbench.harness.context import RunContext
from cropbench.harness.loader_case import LoaderCase
from cropbench.harness.runner import Row, Track, seeded

#: Environment a launcher sets for every rank (torchrun sets all of them).
LAUNCH_ENVIRONMENT = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
#: Seconds a rank waits for the others at a barrier or a collective (a whole case must fit in it).
DEFAULT_TIMEOUT_S = 600.0
#: The longest wait accepted (a week): torch keeps timeouts in milliseconds, and a rank that hangs
#: longer than this is not going to come back.
MAX_TIMEOUT_S = 7 * 24 * 3600.0

T = TypeVar("T")


def launched() -> bool:
    """Whether this process is one rank of a launched job (torchrun's environment is set)."""
    return all(name in os.environ for name in LAUNCH_ENVIRONMENT)


def launch_rank() -> int:
    """This process's rank as the launcher set it (0 outside a launched job)."""
    return _launch_number("RANK", 0) if "RANK" in os.environ else 0


def _launch_number(name: str, minimum: int) -> int:
    """A whole number the launcher sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``), checked."""
    value = os.environ.get(name, "")
    try:
        number = int(value)
    except ValueError:
        number = minimum - 1
    if number < minimum:
        raise DistributedError(
            f"{name}={value!r} is not a whole number >= {minimum}: it is set by the launcher (torchrun), not by hand"
        )
    return number


def check_timeout(seconds: float) -> float:
    """``seconds`` as a rank timeout: a finite number of seconds in (0, :data:`MAX_TIMEOUT_S`]."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise ConfigError(f"--rank-timeout (timeout_s) must be a number of seconds, got {seconds!r}")
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_TIMEOUT_S):
        raise ConfigError(
            f"--rank-timeout (timeout_s) must be more than 0 and at most {MAX_TIMEOUT_S:g} seconds (a week), "
            f"got {seconds!r}"
        )
    return float(seconds)


class Cluster:
    """This rank's membership of the job: rank, world size, backend, and collectives bounded in time.

    Objects travel and barriers run over a gloo group (the default group itself under gloo), so a
    monitored barrier (gloo only) can name a missing rank under nccl too.
    """

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.timeout_s = check_timeout(timeout_s)
        if not launched():
            missing = [name for name in LAUNCH_ENVIRONMENT if name not in os.environ]
            raise DistributedError(f"not started by torchrun: {', '.join(missing)} unset (see README, 'Many ranks')")
        self.world_size = _launch_number("WORLD_SIZE", 1)
        self.rank = _launch_number("RANK", 0)
        self.local_rank = _launch_number("LOCAL_RANK", 0)
        if self.rank >= self.world_size:
            raise DistributedError(
                f"RANK={os.environ['RANK']!r} is not below WORLD_SIZE={os.environ['WORLD_SIZE']!r}: "
                "the launcher (torchrun) sets both"
            )
        self.host = socket.gethostname()
        self.backend = "nccl" if torch.cuda.is_available() else "gloo"
        timeout = datetime.timedelta(seconds=self.timeout_s)
        if self.backend == "nccl":
            torch.cuda.set_device(self.local_rank)
        try:
            dist.init_process_group(self.backend, timeout=timeout)
            control = dist.new_group(backend="gloo", timeout=timeout) if self.backend != "gloo" else None
            self.control = cast(dist.ProcessGroup | None, control)
        except (RuntimeError, ValueError) as error:
            raise DistributedError(
                f"rank {self.rank} could not join the job at {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} "
                f"within {self.timeout_s:g} s: {_first_line(error)}"
            ) from error

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _failed(self, what: str, error: BaseException) -> DistributedError:
        return DistributedError(
            f"rank {self.rank} of {self.world_size}: {what} failed, a rank died or did not arrive within "
            f"timeout_s={self.timeout_s:g} (--rank-timeout): {_first_line(error)}"
        )

    def barrier(self, what: str) -> None:
        """Wait for every rank (at most ``timeout_s``); the error names the ranks that did not come."""
        try:
            dist.monitored_barrier(
                self.control, timeout=datetime.timedelta(seconds=self.timeout_s), wait_all_ranks=True
            )
        except RuntimeError as error:
            raise self._failed(what, error) from error

    def gather(self, value: T, what: str) -> list[T] | None:
        """Every rank's ``value`` on rank 0 (None elsewhere), after a barrier."""
        self.barrier(what)
        gathered: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
        try:
            dist.gather_object(value, gathered, dst=0, group=self.control)
        except RuntimeError as error:
            raise self._failed(what, error) from error
        return gathered

    def broadcast(self, value: T, what: str) -> T:
        """Rank 0's ``value`` on every rank."""
        box = [value]
        try:
            dist.broadcast_object_list(box, src=0, group=self.control)
        except RuntimeError as error:
            raise self._failed(what, error) from error
        return box[0]

    def first(self, action: Callable[[], T], what: str) -> T:
        """Rank 0 runs ``action`` before the others do (say, a conversion the others then reuse)."""
        if self.rank == 0:
            result = action()
            self.barrier(what)
            return result
        self.barrier(what)
        return action()

    def ddp(self, model: torch.nn.Module) -> torch.nn.Module:
        """``model`` under ``DistributedDataParallel`` on this rank's device."""
        devices = [self.local_rank] if self.backend == "nccl" else None
        return DistributedDataParallel(model, device_ids=devices)


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


@dataclass(frozen=True)
class DistributedCase:
    """A case of a track that runs across ranks (:class:`RankedTrack`), run on ``ranks`` ranks, each over
    its share of the epoch.

    ``case.samples`` (Track 2) is the samples of one epoch over all ranks: each rank gets its share,
    ``ceil`` or ``floor`` of samples / ranks (``balance``). Track 3 runs ``case.steps`` steps on
    every rank (a global batch of ranks × batch). Ranks beyond ``ranks`` wait (Track 2 only), so one
    job can also measure fewer ranks on the same plate for the speed-up. The runner's overrides reach
    ``case`` (:func:`cropbench.harness.runner.with_overrides`).
    """

    case: Any
    sampler: str = "distributed"
    balance: str = "pad"
    ranks: int = 1

    def __post_init__(self) -> None:
        if self.sampler not in RANK_SAMPLERS:
            raise ConfigError(f"sampler={self.sampler!r} is not one of {', '.join(RANK_SAMPLERS)}")
        if self.balance not in BALANCES:
            raise ConfigError(f"balance={self.balance!r} is not one of {', '.join(BALANCES)}")
        if self.ranks < 1:
            raise ConfigError(f"ranks must be >= 1, got {self.ranks}")

    @property
    def label(self) -> str:
        inner = self.case.label
        if isinstance(self.case, LoaderCase):  # the sampler replaces the access pattern
            inner = inner.replace(f"/{self.case.access}/", "/", 1)
        return f"{inner}/{self.sampler}/{self.balance}/ranks{self.ranks}"


@dataclass(frozen=True)
class RankCase:
    """One rank's part of a distributed case: the label and identity of its row."""

    case: DistributedCase
    rank: int

    @property
    def label(self) -> str:
        return f"{self.case.label}/rank{self.rank}"


@dataclass
class RankReport:
    """What one rank measured, as it travels to rank 0."""

    rank: int
    host: str
    config: dict[str, Any]
    metrics: dict[str, Any]
    samples: int
    seconds: float
    data_wait_seconds: float
    bytes_decoded: int | None
    bytes_delivered: int | None
    #: The objects of the rank's first epoch that the loop consumed.
    indices: np.ndarray
    #: Whether the loop consumed the rank's whole share of that epoch.
    full_epoch: bool


class _Shard:
    """Builds a rank's sampler and keeps it and its dataset, to read coverage and decode counters after."""

    def __init__(self, case: DistributedCase, rank: int, seed: int) -> None:
        self.case, self.rank, self.seed = case, rank, seed
        self.built: list[tuple[CropDataset, EpochSampler]] = []

    def __call__(self, dataset: CropDataset) -> EpochSampler:
        sampler = rank_sampler(dataset, self.case.sampler, self.rank, self.case.ranks, self.seed, self.case.balance)
        self.built.append((dataset, sampler))
        return sampler

    def report(self, consumed: int, workers: int) -> dict[str, Any]:
        """Coverage of the loop that used the last sampler built, and its reader's decode counters."""
        dataset, sampler = self.built[-1]
        share = len(sampler)
        stats = dataset.reader.stats
        # With worker processes the counters are each worker's copy: the main process's stay at 0.
        counted = workers == 0
        return {
            "indices": continued_order(sampler, min(consumed, share)),
            "full_epoch": consumed >= share,
            "bytes_decoded": stats.bytes_decoded if counted else None,
            "bytes_delivered": stats.bytes_delivered if counted else None,
        }


@dataclass(frozen=True)
class RankShare:
    """What one rank measured of its share of a case, as its track hands it over."""

    #: The case as it ran on this rank (its share of the samples, the repeat's seed).
    ran: Any
    metrics: dict[str, Any]
    samples: int
    seconds: float
    data_wait_seconds: float
    #: Samples the loop drew from the rank's sampler (warm-up included).
    consumed: int
    workers: int


@runtime_checkable
class RankedTrack(Protocol):
    """A track whose cases run across ranks: which of its cases split, and one rank's share measured."""

    name: str

    def cases(self, preset: str, context: RunContext) -> Sequence[Any]: ...

    def on_ranks(self, case: Any) -> Any | None:
        """``case`` as it runs across ranks, or None where it does not split (a search, say)."""
        ...

    def measure_share(
        self,
        case: Any,
        ranks: int,
        balance: str,
        context: RunContext,
        shard: SamplerFactory,
        wrap: Callable[[torch.nn.Module], torch.nn.Module],
    ) -> RankShare:
        """Measure this rank's share of ``case`` over ``ranks`` ranks: its sampler from ``shard``, a model
        wrapped by ``wrap`` (``DistributedDataParallel``) where the case trains one."""
        ...


def _measure_rank(
    track: RankedTrack, case: DistributedCase, repeat: int, context: RunContext, cluster: Cluster
) -> RankReport:
    inner = seeded(case.case, repeat)
    shard = _Shard(case, cluster.rank, inner.seed)
    share = track.measure_share(inner, case.ranks, case.balance, context, shard, cluster.ddp)
    extra = shard.report(share.consumed, share.workers)
    return RankReport(
        rank=cluster.rank,
        host=cluster.host,
        config=dataclasses.asdict(share.ran),
        metrics=share.metrics,
        samples=share.samples,
        seconds=share.seconds,
        data_wait_seconds=share.data_wait_seconds,
        **extra,
    )


def rank_metrics(report: RankReport) -> dict[str, Any]:
    """A rank's row: what its track measured, with its data wait and decode counters."""
    counters = {m.BYTES_DECODED: report.bytes_decoded, m.BYTES_DELIVERED: report.bytes_delivered}
    return {**report.metrics, m.DATA_WAIT_SECONDS: report.data_wait_seconds, **counters}


def aggregate(reports: Sequence[RankReport], objects: int, balance: str) -> dict[str, Any]:
    """The whole job's row from every rank's report.

    Total samples/s is all samples over the slowest rank's loop (the job moves on when it finishes);
    the straggler ratio is the slowest rank's data wait over the median rank's; read amplification
    is the bytes all ranks decoded over the bytes they delivered (None when workers decoded).
    Coverage counts the objects of the first epoch across ranks: exactly once means every object
    came and none twice (None when the loops did not consume a whole epoch). The row carries every
    flag of its ranks' rows: a job's rate is no better founded than its ranks'.
    """
    rates = [r.samples / r.seconds for r in reports]
    waits = [r.data_wait_seconds for r in reports]
    median_wait = statistics.median(waits)
    indices = np.concatenate([r.indices for r in reports])
    covered = int(np.unique(indices).size)
    whole = all(r.full_epoch for r in reports)
    decoded = [r.bytes_decoded for r in reports]
    delivered = [r.bytes_delivered for r in reports]
    counted = all(v is not None for v in (*decoded, *delivered))
    total_decoded = sum(v for v in decoded if v is not None)
    total_delivered = sum(v for v in delivered if v is not None)
    total = sum(r.samples for r in reports) / max(r.seconds for r in reports)
    return {
        m.TOTAL_SAMPLES_PER_S: total,
        m.RANK_SAMPLES_PER_S: rates,
        "rank_samples_per_s_min": min(rates),
        "rank_samples_per_s_median": statistics.median(rates),
        "rank_samples_per_s_max": max(rates),
        m.RANK_DATA_WAIT_SECONDS: waits,
        m.STRAGGLER_RATIO: max(waits) / median_wait if median_wait > 0 else None,
        m.BYTES_DECODED: total_decoded if counted else None,
        m.BYTES_DELIVERED: total_delivered if counted else None,
        m.READ_AMPLIFICATION: total_decoded / total_delivered if counted and total_delivered else None,
        m.OBJECTS: objects,
        m.COVERED_OBJECTS: covered,
        m.DUPLICATE_SAMPLES: int(indices.size) - covered,
        m.EXACTLY_ONCE: (covered == objects and indices.size == objects) if whole else None,
        **(balance_extra(objects, len(reports), balance) if whole else {}),
        m.VALIDITY_FLAGS: _flags_of([r.metrics for r in reports]),
    }


def _flags_of(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Every validity flag of ``rows``, each once, in the order they first appear."""
    return list(dict.fromkeys(flag for row in rows for flag in row.get(m.VALIDITY_FLAGS) or []))


def _rate_key(case: DistributedCase) -> str:
    return m.SAMPLES_PER_S if isinstance(case.case, LoaderCase) else m.IMAGES_PER_S


class DistributedTrack:
    """A track's cases across the job's ranks, for the one runner; rows come out of rank 0 only."""

    def __init__(self, inner: Track[RunContext], cluster: Cluster) -> None:
        if not isinstance(inner, RankedTrack):
            raise ConfigError(f"track {inner.name!r} does not run across ranks; run tracks 2 and 3 under torchrun")
        self.name = inner.name
        self.inner: RankedTrack = inner
        self.cluster = cluster
        #: Aggregate rows of this run by (label, repeat): a case on all ranks is compared with its one-rank twin.
        self.aggregates: dict[tuple[str, int], dict[str, Any]] = {}

    def cases(self, preset: str, context: RunContext) -> list[DistributedCase]:
        """The track's own cases for ``preset`` that split across ranks, each with every sampler."""
        planned: list[DistributedCase] = []
        for preset_case in self.inner.cases(preset, context):
            case = self.inner.on_ranks(preset_case)
            if case is None:
                context.progress(f"track {self.name} {preset_case.label}: does not run across ranks (left out)")
                continue
            planned += distributed_cases(case, self.cluster.world_size)
        return planned

    def decode(self, case: DistributedCase) -> str:
        return str(case.case.crop.decode)

    def measure(self, case: DistributedCase, repeat: int, context: RunContext) -> Iterator[Row]:
        cluster = self.cluster
        if case.ranks > cluster.world_size:
            raise ConfigError(f"case {case.label} needs {case.ranks} ranks, the job has {cluster.world_size}")
        cluster.barrier(f"start of {case.label}")
        mine = _measure_rank(self.inner, case, repeat, context, cluster) if cluster.rank < case.ranks else None
        gathered = cluster.gather(mine, f"end of {case.label}")
        if gathered is None:
            return
        reports = [r for r in gathered if r is not None]
        place = {"world_size": case.ranks, "job_world_size": cluster.world_size, "backend": cluster.backend}
        seed = reports[0].config["seed"]
        for report in reports:
            config = {**report.config, **place, "sampler": case.sampler, "balance": case.balance}
            config.update(rank=report.rank, host=report.host)
            yield Row(RankCase(case, report.rank), config, rank_metrics(report), seed)
        objects = len(context.dataset(case.case.crop))
        metrics = aggregate(reports, objects, case.balance)
        metrics[_rate_key(case)] = metrics[m.TOTAL_SAMPLES_PER_S]
        if m.DATA_WAIT_FRACTION in reports[0].metrics:  # a training loop's share of time spent waiting
            metrics[m.DATA_WAIT_FRACTION] = sum(r.data_wait_seconds for r in reports) / sum(r.seconds for r in reports)
        self.aggregates[(case.label, repeat)] = metrics
        one = self.aggregates.get((dataclasses.replace(case, ranks=1).label, repeat))
        if case.ranks > 1 and one is not None:
            metrics[m.VALIDITY_FLAGS] = _flags_of([metrics, one])  # the speed-up rests on the one-rank row too
            metrics[m.SPEEDUP_OVER_ONE_RANK] = metrics[m.TOTAL_SAMPLES_PER_S] / one[m.TOTAL_SAMPLES_PER_S]
            if metrics[m.BYTES_DECODED] is not None and one[m.BYTES_DECODED]:
                metrics[m.DECODED_OVER_ONE_RANK] = metrics[m.BYTES_DECODED] / one[m.BYTES_DECODED]
        config = {
            **reports[0].config,
            **place,
            "sampler": case.sampler,
            "balance": case.balance,
            "hosts": sorted({r.host for r in reports}),
        }
        yield Row(case, config, metrics, seed)


def distributed_cases(case: Any, world: int) -> list[DistributedCase]:
    """``case`` across a job of ``world`` ranks, with each sampler.

    A Track 2 case runs on one rank first, then on all, for the speed-up in the same job; a case that
    trains a model (Track 3, under DDP) runs on all ranks.
    """
    counts = ([1, world] if world > 1 else [1]) if isinstance(case, LoaderCase) else [world]
    return [DistributedCase(case, sampler, "pad", ranks) for sampler in RANK_SAMPLERS for ranks in counts]


def launch_local(ranks: int, argv: Sequence[str]) -> None:
    """Run ``python -m cropbench ARGV`` as ``ranks`` ranks on this machine through torch's elastic
    launcher (what ``torchrun --standalone --nproc-per-node RANKS`` does: a free rendezvous port, no
    restarts); a rank that fails fails the launch with the launcher's summary of which and why."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if ranks < 1:
        raise ConfigError(f"--ranks must be >= 1, got {ranks}")
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=ranks,
        run_id=f"cropbench-{os.getpid()}",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
    )
    try:
        elastic_launch(config, sys.executable)("-m", "cropbench", *argv)
    except ChildFailedError as error:
        failures = "; ".join(f"rank {rank}: exit code {failure.exitcode}" for rank, failure in error.failures.items())
        raise DistributedError(
            f"{ranks} local ranks failed ({failures}); the failing rank's error is printed above"
        ) from error


def distribute(tracks: Sequence[Track[RunContext]], cluster: Cluster) -> list[Track[RunContext]]:
    """Each of ``tracks`` across the job's ranks."""
    return [DistributedTrack(track, cluster) for track in tracks]


__all__ = [
    "DEFAULT_TIMEOUT_S",
    "LAUNCH_ENVIRONMENT",
    "Cluster",
    "DistributedCase",
    "DistributedTrack",
    "RankCase",
    "RankReport",
    "RankShare",
    "RankedTrack",
    "aggregate",
    "check_timeout",
    "distribute",
    "distributed_cases",
    "launch_local",
    "launch_rank",
    "launched",
    "rank_metrics",
]
