"""Validate the replay model against the emulated store, then predict what a real store would give.

Each reader reads one shuffled epoch from the emulated object store at several settings, in turns
(``rounds`` times): the plate in place by the direct path at each ``in_flight`` (requests open per
worker), and the plate converted to WebDataset at each ``links_gbit`` (the node's link). The
server's log of each epoch is its trace. Every setting is then predicted from the traces of the two
OTHER settings of the same reader and round (:mod:`cropbench.measure.replay`: the client's compute per
crop and handling per response byte fitted to their wall times, then the target's store and client
simulated), never from its own, and set beside what the target measured. The measured rate is the
epoch's crops over the seconds from the server's first request to the last batch delivered (worker
start-up before the first request left out, as the model has none). Last, the first round's traces
(direct: the two most requests in flight whose epochs left the cores free; WebDataset: 10 and 1 Gbit/s)
predict a real store: 2 and 32 worker processes, 16/64/256 requests in flight per process, 1/10/25
Gbit/s. An epoch that kept the machine's cores busy (:data:`CORES_SATURATED`) broke the model's one
core per process: predictions from or of it are marked, and sources are taken from other epochs first.
The runs' requests are kept in a traces file (:func:`traces_path`), from which the predictions can be
made again without measuring (:func:`load_traces`).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import os
import platform
import statistics
import subprocess
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import RandomSampler, Sampler

from cropbench import metrics as m
from cropbench.config import (
    DEFAULT_CROP_SIZE,
    MAX_IN_FLIGHT,
    MAX_LATENCY_MS,
    MAX_LINK_GBIT_S,
    MAX_ROUNDS,
    MAX_SEED,
    MAX_SHARD_MIB,
    CropConfig,
    StoreConfig,
    check_workers,
)
from cropbench.data.dataset import CropDataset
from cropbench.data.loader import LoaderSpec, build_loader
from cropbench.data.sampling import ShuffledRuns
from cropbench.data.training import EpochSpec, S3Access, training_format
from cropbench.errors import ConfigError, StoreError
from cropbench.measure.endpoints import S3_ACCESS_KEY, S3_REGION, S3_SECRET_KEY, environment_variables, remote_plate
from cropbench.measure.environment import git_commit
from cropbench.measure.replay import Client, FittedCosts, Replay, Workload, fitted_compute, fitted_costs, predict
from cropbench.measure.store_emulation import (
    RequestTrace,
    StoreModel,
    emulated_plate,
    emulated_store,
)
from cropbench.scratch import scratch_folder

DIRECT, WEBDATASET = m.REFERENCE, "webdataset"
#: WebDataset downloads one shard at a time per worker.
SHARD_DOWNLOADS_IN_FLIGHT = 1
#: The validation's bounds on prediction / measured (within 20 %, either way).
AGREEMENT = (0.8, 1.25)
OUTSIDE = f" (outside {AGREEMENT[0]}-{AGREEMENT[1]})"
#: Share of the machine's cores busy over an epoch from which its readers and server competed for cores:
#: the model gives each process a core of its own, so a prediction involving such an epoch is marked.
CORES_SATURATED = 0.9
SATURATED = " (cores saturated)"
#: Marks fitted costs that the two settings did not tell apart (both bound by the link, say).
NOT_APART = " (not told apart)"
#: Steps each process replays at least in a real-store prediction (a steady state, not start-up).
STEPS_PER_PROCESS = 50


#: The bucket the WebDataset conversion is served under.
BUCKET = "crops"
#: The settings a traces file must hold: those its predictions are made with.
PREDICTION_SETTINGS = ("workers", "batch_size", "median_ms", "seed")


def _whole(name: str, value: Any, low: int, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        span = f"from {low} to {high}" if high is not None else f"of at least {low}"
        raise ConfigError(f"{name} must be a whole number {span}, got {value!r}")


def _finite(name: str, value: Any, low: float, high: float, above_low: bool = False) -> None:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and (value > low if above_low else value >= low) and value <= high):
        lowest = f"above {low:g}" if above_low else f"at least {low:g}"
        raise ConfigError(f"{name} must be a finite number {lowest} and at most {high:g}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class ReplaySettings:
    """How the epochs are measured and the predictions made: every value checked before anything runs."""

    in_flight: tuple[int, ...] = (4, 16, 64)
    links_gbit: tuple[float, ...] = (10.0, 1.0, 0.5)
    rounds: int = 3
    workers: int = 2
    batch_size: int = 64
    crop_size: int = DEFAULT_CROP_SIZE
    median_ms: float = 20.0
    shard_mib: int = 64
    seed: int = 0
    coalesce_gap_kib: int = StoreConfig().coalesce_gap_bytes // 1024
    #: The direct path's epochs shuffled in runs of this many consecutive objects (one request a run on a
    #: plate with a crop atlas: :class:`~cropbench.data.sampling.ShuffledRuns`); 1: each object on its own.
    in_place_run: int = 1

    def __post_init__(self) -> None:
        if not self.in_flight or not self.links_gbit:
            raise ConfigError("in_flight and links_gbit each need at least one value")
        for value in self.in_flight:
            _whole("in_flight", value, 1, MAX_IN_FLIGHT)
        for link in self.links_gbit:
            _finite("links_gbit", link, 0, MAX_LINK_GBIT_S, above_low=True)
        _whole("rounds", self.rounds, 1, MAX_ROUNDS)
        check_workers(self.workers, least=1)
        _whole("batch_size", self.batch_size, 1)
        _whole("crop_size", self.crop_size, 1)
        _finite("median_ms", self.median_ms, 0, MAX_LATENCY_MS)
        _whole("shard_mib", self.shard_mib, 1, MAX_SHARD_MIB)
        _whole("seed", self.seed, 0, MAX_SEED)
        _whole("coalesce_gap_kib", self.coalesce_gap_kib, 0)
        _whole("in_place_run", self.in_place_run, 1)

    @classmethod
    def saved(cls, settings: Any) -> ReplaySettings:
        """The settings a traces file holds (those of :data:`PREDICTION_SETTINGS` at least; others as
        saved, else the defaults), checked as any: ConfigError naming what is missing or wrong."""
        if not isinstance(settings, dict):
            raise ConfigError(f"its settings are not an object (got {type(settings).__name__})")
        missing = [name for name in PREDICTION_SETTINGS if name not in settings]
        if missing:
            raise ConfigError(f"its settings lack {', '.join(missing)}")
        known = {field.name for field in dataclasses.fields(cls)}
        values = {key: value for key, value in settings.items() if key in known}
        for key in ("in_flight", "links_gbit"):
            if key in values:
                if not isinstance(values[key], list):
                    raise ConfigError(f"{key} must be a list, got {values[key]!r}")
                values[key] = tuple(values[key])
        return cls(**values)

    def model(self) -> StoreModel:
        """The emulated store's model: the default at ``median_ms``."""
        return StoreModel.at_median(self.median_ms)


@dataclasses.dataclass(frozen=True)
class Run:
    """One measured epoch: the reader, its setting, what the server saw and what the loader delivered."""

    reader: str
    round: int
    in_flight: int
    link_gbit_s: float
    crops: int
    seconds: float
    requests: list[RequestTrace]
    #: Batches each worker's reader asked for ahead of the one it decoded (a file without it: 0).
    read_ahead_steps: int = 0
    #: The share of the machine's cores busy over the epoch (None: not recorded).
    machine_busy_share: float | None = None

    def __post_init__(self) -> None:
        if self.reader not in (DIRECT, WEBDATASET):
            raise ConfigError(f"reader must be {DIRECT} or {WEBDATASET}, got {self.reader!r}")
        _whole("round", self.round, 0)
        _whole("in_flight", self.in_flight, 1, MAX_IN_FLIGHT)
        _finite("link_gbit_s", self.link_gbit_s, 0, MAX_LINK_GBIT_S, above_low=self.reader == WEBDATASET)
        _whole("crops", self.crops, 1)
        _finite("seconds", self.seconds, 0, math.inf, above_low=True)
        _whole("read_ahead_steps", self.read_ahead_steps, 0)
        if self.machine_busy_share is not None:
            _finite(m.MACHINE_BUSY_SHARE, self.machine_busy_share, 0, math.inf)

    @property
    def crops_per_s(self) -> float:
        return self.crops / self.seconds

    def workload(self, batch_size: int) -> Workload:
        if self.reader == DIRECT:
            return Workload.batched(self.requests, self.crops, batch_size)
        return Workload.streamed(self.requests, self.crops)

    def saved(self) -> dict[str, Any]:
        """The run with its requests (method, key, range, status, bytes, start, end) for :func:`loaded`."""
        return {**self.summary(), "trace": [dataclasses.astuple(trace) for trace in self.requests]}

    @classmethod
    def loaded(cls, row: dict[str, Any]) -> Run:
        """A run as :meth:`saved` wrote it (KeyError, TypeError or ConfigError where it is not one)."""
        requests = [RequestTrace(*fields) for fields in row["trace"]]
        return cls(
            row["reader"],
            row["round"],
            row["in_flight"],
            row["link_gbit_s"],
            row["crops"],
            row["seconds"],
            requests,
            row.get("read_ahead_steps", 0),
            row.get(m.MACHINE_BUSY_SHARE),
        )

    def summary(self) -> dict[str, Any]:
        return {
            m.READER: self.reader,
            "round": self.round,
            m.IN_FLIGHT: self.in_flight,
            "link_gbit_s": self.link_gbit_s,
            "crops": self.crops,
            "seconds": self.seconds,
            "read_ahead_steps": self.read_ahead_steps,
            m.MACHINE_BUSY_SHARE: self.machine_busy_share,
            m.CROPS_PER_S: self.crops_per_s,
            "requests": len(self.requests),
            "body_bytes": sum(trace.body_bytes for trace in self.requests),
            "statuses": sorted({trace.status for trace in self.requests}),
        }


def timed_epoch(loader: Iterable[dict[str, Any]]) -> tuple[int, float]:
    """Crops of one epoch and the epoch-clock time its last batch arrived."""
    crops = 0
    for batch in loader:
        crops += int(batch["image"].shape[0])
    return crops, time.time()


def measured(
    reader: str, round_: int, in_flight: int, link: float, store: Any, loader: Iterable[Any], read_ahead: int = 0
) -> Run:
    """One epoch of ``loader`` in a window of ``store``: seconds from the first request to the last batch."""
    with store.window() as window:
        crops, last = timed_epoch(loader)
    if not window.requests:
        raise StoreError(f"{reader}: the epoch made no request to the emulated store")
    first = min(trace.start_s for trace in window.requests)
    return Run(
        reader, round_, in_flight, link, crops, last - first, window.requests, read_ahead, window.machine_busy_share
    )


def direct_runs(
    plate: Path, settings: ReplaySettings, model: StoreModel, round_: int, on_run: Callable[[Run], None]
) -> None:
    """The plate served by the emulated store and read in place by the direct path at each in-flight setting,
    each run handed to ``on_run`` as it is measured."""
    with emulated_plate(plate, model) as (store, url):
        for in_flight in settings.in_flight:
            with (
                scratch_folder("replay") as scratch,
                remote_plate(url, _store(settings, in_flight), scratch / "mirror") as mirror,
            ):
                dataset = CropDataset(mirror, CropConfig(crop_size=settings.crop_size, dtype="uint16", tier="none"))
                link, ahead = model.link_gbit_s or 0, dataset.read_ahead_batches(settings.batch_size)
                try:
                    run = measured(DIRECT, round_, in_flight, link, store, _loader(dataset, settings), ahead)
                finally:
                    dataset.reader.close()
            on_run(run)


def _store(settings: ReplaySettings, in_flight: int) -> StoreConfig:
    # Exactly the gap named, whatever the plate's layout names: the replay is validated at it.
    return StoreConfig(in_flight=in_flight, coalesce_gap_bytes=settings.coalesce_gap_kib * 1024, layout_gap=False)


def _loader(dataset: CropDataset, settings: ReplaySettings) -> Any:
    spec = LoaderSpec(num_workers=settings.workers, batch_size=settings.batch_size, start_method="forkserver")
    order: Sampler[int] = (
        RandomSampler(dataset, generator=torch.Generator().manual_seed(settings.seed))
        if settings.in_place_run == 1
        else ShuffledRuns(len(dataset), settings.in_place_run, settings.seed)
    )
    return build_loader(dataset, spec, order, settings.seed)


def webdataset_runs(
    store_path: Path,
    plate_name: str,
    settings: ReplaySettings,
    model: StoreModel,
    round_: int,
    on_run: Callable[[Run], None],
) -> None:
    """The WebDataset conversion served by the emulated store at each link rate, one epoch each into a fresh
    cache, each run handed to ``on_run`` as it is measured."""
    fmt = training_format(WEBDATASET)
    for link in settings.links_gbit:
        with (
            scratch_folder("replay", dir=store_path.parent) as scratch,
            emulated_store(
                {f"{BUCKET}/{WEBDATASET}": store_path}, dataclasses.replace(model, link_gbit_s=link)
            ) as store,
        ):
            s3 = S3Access(store.endpoint, S3_ACCESS_KEY, S3_SECRET_KEY, S3_REGION)
            spec = EpochSpec(batch_size=settings.batch_size, workers=settings.workers, shuffle=True, seed=settings.seed)
            with environment_variables(fmt.remote_environment(s3)):
                loader = fmt.remote_epoch_loader(f"s3://{BUCKET}/{WEBDATASET}", scratch / "cache", s3, plate_name, spec)
                run = measured(WEBDATASET, round_, SHARD_DOWNLOADS_IN_FLIGHT, link, store, loader)
        on_run(run)


def run_line(run: Run) -> str:
    """One measured epoch in a line (what the command prints as each is measured)."""
    return (
        f"{run.reader} round {run.round}: {run.in_flight} in flight, {run.link_gbit_s:g} Gbit/s: "
        f"{run.crops} crops in {run.seconds:.2f} s = {run.crops_per_s:,.0f}/s, {len(run.requests)} requests"
    )


def _replay(model: StoreModel, run: Run, processes: int, compute: float = 0.0, per_byte: float = 0.0) -> Replay:
    """The setting of ``run`` (its link, requests in flight and read-ahead) with these client costs."""
    client = Client(
        processes,
        run.in_flight,
        compute_s_per_crop=compute,
        client_s_per_byte=per_byte,
        read_ahead_steps=run.read_ahead_steps,
    )
    return Replay(dataclasses.replace(model, link_gbit_s=run.link_gbit_s or None), client)


def costs(sources: Sequence[Run], model: StoreModel, settings: ReplaySettings) -> FittedCosts:
    """The client's costs fitted to the traces of two settings (:func:`fitted_costs`), the first's
    requests replayed for both."""
    workload = sources[0].workload(settings.batch_size)
    first, second = (_replay(model, run, settings.workers) for run in sources)
    return fitted_costs(workload, first, sources[0].seconds, second, sources[1].seconds)


def _sources(runs: Sequence[Run], target: Run) -> list[Run]:
    """What predicts ``target``: two other settings of its reader and round (none if it has fewer), those
    whose epochs left cores free first (the model's one core per process held there)."""
    others = [run for run in runs if (run.reader, run.round) == (target.reader, target.round) and run is not target]
    chosen = sorted(others, key=lambda run: (_saturated(run), run.in_flight, -run.link_gbit_s))[:2]
    return sorted(chosen, key=lambda run: (run.in_flight, -run.link_gbit_s)) if len(others) >= 2 else []


def _saturated(run: Run) -> bool:
    return (run.machine_busy_share or 0.0) >= CORES_SATURATED


def validation(runs: Sequence[Run], model: StoreModel, settings: ReplaySettings) -> list[dict[str, Any]]:
    """Each run predicted from the traces of other runs of the same reader and round, never its own: from
    the two others (both costs fitted), and from the nearest other alone with its whole cost taken as
    compute (``compute_only``: the simpler model, for comparison)."""
    rows = []
    for target in runs:
        sources = _sources(runs, target)
        if not sources:
            continue
        fitted = costs(sources, model, settings)
        compute, per_byte = fitted.compute_s_per_crop, fitted.client_s_per_byte
        workload = sources[0].workload(settings.batch_size)
        predicted = predict(workload, _replay(model, target, settings.workers, compute, per_byte)).crops_per_s
        ratio = predicted / target.crops_per_s
        nearest = min(sources, key=lambda run: (round(abs(math.log(_knob(run) / _knob(target))), 9), -_knob(run)))
        alone = fitted_compute(
            nearest.workload(settings.batch_size), _replay(model, nearest, settings.workers), nearest.seconds
        )
        alone_replay = _replay(model, target, settings.workers, alone)
        alone_predicted = predict(nearest.workload(settings.batch_size), alone_replay).crops_per_s
        rows.append(
            {
                "reader": target.reader,
                "round": target.round,
                "target": {"in_flight": target.in_flight, "link_gbit_s": target.link_gbit_s},
                "sources": [{"in_flight": run.in_flight, "link_gbit_s": run.link_gbit_s} for run in sources],
                "compute_ms_per_crop": compute * 1e3,
                "client_ms_per_mb": per_byte * 1e9,
                "split_visible": fitted.split_visible,
                "measured_crops_per_s": target.crops_per_s,
                "predicted_crops_per_s": predicted,
                "ratio": ratio,
                "within": AGREEMENT[0] <= ratio <= AGREEMENT[1],
                "cores_saturated": any(_saturated(run) for run in (target, *sources)),
                "compute_only": {
                    "source": {"in_flight": nearest.in_flight, "link_gbit_s": nearest.link_gbit_s},
                    "compute_ms_per_crop": alone * 1e3,
                    "predicted_crops_per_s": alone_predicted,
                    "ratio": alone_predicted / target.crops_per_s,
                },
            }
        )
    return rows


def _within_cores_free(checks: Sequence[dict[str, Any]]) -> dict[str, list[int]]:
    """Per reader, its predictions whose epochs left the cores free (the model's one core per process
    held): how many were within :data:`AGREEMENT`, and how many there were."""
    counts = {reader: [0, 0] for reader in sorted({row["reader"] for row in checks})}
    for row in checks:
        if not row["cores_saturated"]:
            counts[row["reader"]][0] += row["within"]
            counts[row["reader"]][1] += 1
    return counts


def _knob(run: Run) -> float:
    """What a reader's settings vary: requests in flight (direct) or the link (WebDataset)."""
    return run.in_flight if run.reader == DIRECT else run.link_gbit_s


def real_store(runs: Sequence[Run], model: StoreModel, settings: ReplaySettings) -> list[dict[str, Any]]:
    """From the first round's traces (direct: the two most requests in flight whose epochs left cores free;
    WebDataset: 10 and 1 Gbit/s), a real store
    at 2 and 32 worker processes, 16/64/256 requests in flight per process (WebDataset: one shard
    download), 1/10/25 Gbit/s."""
    first = [run for run in runs if run.round == 0]
    # The two most requests in flight among the epochs that left cores free (where the model's one
    # core per process held), else among all.
    direct = sorted((run for run in first if run.reader == DIRECT), key=lambda run: (_saturated(run), -run.in_flight))
    chosen = {
        DIRECT: sorted(direct[:2], key=lambda run: run.in_flight),
        WEBDATASET: [run for link in (10, 1) for run in first if run.reader == WEBDATASET and run.link_gbit_s == link],
    }
    rows = []
    for reader, in_flights in ((DIRECT, (16, 64, 256)), (WEBDATASET, (SHARD_DOWNLOADS_IN_FLIGHT,))):
        sources = chosen[reader]
        if len(sources) != 2:
            continue
        fitted = costs(sources, model, settings)
        compute, per_byte = fitted.compute_s_per_crop, fitted.client_s_per_byte
        workload = sources[0].workload(settings.batch_size)
        for processes in (settings.workers, 32):
            repeats = math.ceil(STEPS_PER_PROCESS * processes / len(workload.steps))
            for in_flight in in_flights:
                for link in (1.0, 10.0, 25.0):
                    client = Client(
                        processes,
                        in_flight,
                        compute_s_per_crop=compute,
                        client_s_per_byte=per_byte,
                        read_ahead_steps=sources[0].read_ahead_steps,
                    )
                    replay = Replay(dataclasses.replace(model, link_gbit_s=link), client, repeats, settings.seed)
                    prediction = predict(workload, replay)
                    rows.append(
                        {
                            m.READER: reader,
                            "processes": processes,
                            m.IN_FLIGHT: in_flight,
                            "link_gbit_s": link,
                            "compute_ms_per_crop": compute * 1e3,
                            "client_ms_per_mb": per_byte * 1e9,
                            "split_visible": fitted.split_visible,
                            m.CROPS_PER_S: prediction.crops_per_s,
                            "requests_per_s": prediction.requests_per_s,
                            "link_utilisation": prediction.link_utilisation,
                            "cpu_share": prediction.cpu_share,
                        }
                    )
    return rows


def _setting(row: dict[str, Any]) -> str:
    return f"{row['in_flight']} in flight, {row['link_gbit_s']:g} Gbit/s"


def _sources_text(row: dict[str, Any]) -> str:
    return " and ".join(_setting(source) for source in row["sources"])


def tables(runs: Sequence[Run], checks: Sequence[dict[str, Any]], real: Sequence[dict[str, Any]]) -> str:
    """The measured epochs, the validation and the real-store predictions as Markdown tables."""
    lines = [
        "| reader | round | setting | crops/s | requests | MB | cores busy |",
        "|---|---:|---|---:|---:|---:|---:|",
        *(
            f"| {row['reader']} | {row['round']} | {_setting(row)} | {row[m.CROPS_PER_S]:,.0f} | {row['requests']:,} | "
            f"{row['body_bytes'] / 1e6:,.0f} | "
            f"{'-' if row[m.MACHINE_BUSY_SHARE] is None else format(row[m.MACHINE_BUSY_SHARE], '.0%')} |"
            for row in (run.summary() for run in runs)
        ),
        "",
        "| reader | round | predicted setting | from the traces of | fitted ms/crop | fitted ms/MB | measured crops/s "
        "| predicted | predicted / measured | compute only: from | predicted / measured |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---|---:|",
        *(
            f"| {row['reader']} | {row['round']} | {_setting(row['target'])} | {_sources_text(row)} | "
            f"{row['compute_ms_per_crop']:.3f} | {row['client_ms_per_mb']:.2f}"
            f"{'' if row['split_visible'] else NOT_APART} | {row['measured_crops_per_s']:,.0f} | "
            f"{row['predicted_crops_per_s']:,.0f} | {row['ratio']:.2f}{'' if row['within'] else OUTSIDE}"
            f"{SATURATED if row['cores_saturated'] else ''} | "
            f"{_setting(row['compute_only']['source'])} | {row['compute_only']['ratio']:.2f} |"
            for row in checks
        ),
        "",
        "| reader | processes | in flight per process | link Gbit/s | crops/s | requests/s | link used | CPU busy |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {row['reader']} | {row['processes']} | {row['in_flight']} | {row['link_gbit_s']:g} | "
            f"{row[m.CROPS_PER_S]:,.0f} | {row['requests_per_s']:,.0f} | {row['link_utilisation']:.0%} | "
            f"{row['cpu_share']:.0%} |"
            for row in real
        ),
    ]
    return "\n".join(lines)


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def measure(
    plate: Path, settings: ReplaySettings, command: str, on_run: Callable[[Run, dict[str, Any]], None]
) -> dict[str, Any]:
    """Every run of every round, with the machine's load before and after: what the traces file holds. After
    each run, ``on_run`` gets it and the traces so far (to keep them: an interrupt loses no finished epoch)."""
    fmt = training_format(WEBDATASET)
    missing = fmt.available()
    runs: list[Run] = []
    traces: dict[str, Any] = {
        "command": command,
        "commit": git_commit(),
        "machine": f"{os.cpu_count()}-core {platform.machine()}, {platform.platform()}",
        "settings": {"plate": str(plate), **dataclasses.asdict(settings)},
        "started": {"uptime": _uptime(), "load_average": os.getloadavg()},
    }

    def measured_run(run: Run) -> None:
        runs.append(run)
        traces.update(ended={"uptime": _uptime(), "load_average": os.getloadavg()}, runs=[r.saved() for r in runs])
        on_run(run, traces)

    with scratch_folder("replay") as folder:
        converted = folder / WEBDATASET
        plate_name = ""
        if missing is None:
            source = CropDataset(plate, CropConfig(crop_size=settings.crop_size, dtype="uint16", tier="none"))
            try:
                plate_name = fmt.write(source, converted, shard_bytes=settings.shard_mib * 2**20).plate_name
            finally:
                source.reader.close()
        else:
            warnings.warn(f"webdataset is not measured: {missing}", RuntimeWarning, stacklevel=2)
        for round_ in range(settings.rounds):
            direct_runs(plate, settings, settings.model(), round_, measured_run)
            if missing is None:
                webdataset_runs(converted, plate_name, settings, settings.model(), round_, measured_run)
    return traces


def traces_path(out: Path) -> Path:
    """Where the runs' requests are kept beside ``out`` (gzip: a few MB of JSON)."""
    return out.with_name(f"{out.stem}-traces.json.gz")


def traces_bytes(traces: dict[str, Any]) -> bytes:
    """A traces file's content (what :func:`load_traces` reads)."""
    return gzip.compress(json.dumps(traces).encode(), mtime=0)


def load_traces(path: Path) -> tuple[ReplaySettings, list[Run], dict[str, Any]]:
    """The settings, runs and whole content of a traces file; ConfigError naming the file and what is wrong,
    before anything is predicted."""
    try:
        traces = json.loads(gzip.decompress(path.read_bytes()))
    except (OSError, EOFError, ValueError) as error:  # ValueError: not UTF-8, not JSON
        raise ConfigError(f"--traces {path} is not a traces file: {error}") from None
    try:
        if not isinstance(traces, dict):
            raise ConfigError(f"it holds a JSON {type(traces).__name__}, not an object")
        if "settings" not in traces or "runs" not in traces:
            raise ConfigError("it lacks settings or runs")
        settings = ReplaySettings.saved(traces["settings"])
        if not isinstance(traces["runs"], list):
            raise ConfigError("its runs are not a list")
        runs = []
        for index, row in enumerate(traces["runs"]):
            try:
                runs.append(Run.loaded(row))
            except (KeyError, TypeError, ValueError) as error:  # ConfigError is a ValueError
                raise ConfigError(f"run {index} is not a run ({type(error).__name__}: {error})") from None
    except ConfigError as error:
        raise ConfigError(f"--traces {path} is not a traces file: {error}") from None
    return settings, runs, traces


def is_traces_file(path: Path) -> bool:
    """Whether ``path`` is a traces file (what a measurement may replace)."""
    try:
        load_traces(path)
    except ConfigError:
        return False
    return True


def is_validation_file(path: Path) -> bool:
    """Whether ``path`` holds a validation :func:`document` (what a measurement may replace)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(data, dict) and {"validation", "real_store", "runs"} <= data.keys()


def is_tables_file(path: Path) -> bool:
    """Whether ``path`` holds the validation's :func:`tables` (what a measurement may replace)."""
    try:
        with path.open(encoding="utf-8") as handle:
            return handle.readline().startswith("| reader | round | setting |")
    except (OSError, UnicodeDecodeError):
        return False


def document(traces: dict[str, Any], runs: Sequence[Run], settings: ReplaySettings) -> tuple[dict[str, Any], str]:
    """The validation and the real-store predictions from ``runs`` (a validation file's content), and the
    tables beside them."""
    model = settings.model()
    checks = validation(runs, model, settings)
    real = real_store(runs, model, settings)
    content = {
        **{key: value for key, value in traces.items() if key != "runs"},
        "model": dataclasses.asdict(model),
        "runs": [run.summary() for run in runs],
        "validation": checks,
        "validation_ratio_median": {
            reader: statistics.median(row["ratio"] for row in checks if row["reader"] == reader)
            for reader in sorted({row["reader"] for row in checks})
        },
        "validation_within_cores_free": _within_cores_free(checks),
        "real_store": real,
    }
    return content, tables(runs, checks, real)


__all__ = [
    "AGREEMENT",
    "CORES_SATURATED",
    "DIRECT",
    "WEBDATASET",
    "ReplaySettings",
    "Run",
    "document",
    "is_tables_file",
    "is_traces_file",
    "is_validation_file",
    "load_traces",
    "measure",
    "real_store",
    "run_line",
    "tables",
    "traces_bytes",
    "traces_path",
    "validation",
]
