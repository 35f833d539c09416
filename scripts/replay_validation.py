"""Validate the replay model against the emulated store, then predict what a real store would give.

Each reader reads one shuffled epoch from the emulated object store at several settings, in turns
(``--rounds`` times): the plate in place by the direct path at each ``--in-flight`` (requests open per
worker), and the plate converted to WebDataset at each ``--links-gbit`` (the node's link). The
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
The runs' requests are kept beside ``--out`` (``NAME-traces.json.gz``); ``--traces`` predicts again
from them without measuring.

    python scripts/replay_validation.py --plate data/full.zarr --out results/store-emulation/replay.json
    python scripts/replay_validation.py --traces results/store-emulation/replay-traces.json.gz
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import RandomSampler

from cropbench.config import CropConfig, StoreConfig
from cropbench.data.dataset import CropDataset
from cropbench.data.loader import LoaderSpec, build_loader
from cropbench.data.training import EpochSpec, S3Access, training_format
from cropbench.measure.endpoints import S3_ACCESS_KEY, S3_REGION, S3_SECRET_KEY, environment_variables, remote_plate
from cropbench.measure.environment import git_commit
from cropbench.measure.replay import Client, FittedCosts, Replay, Workload, fitted_compute, fitted_costs, predict
from cropbench.measure.store_emulation import (
    RequestTrace,
    StoreModel,
    emulated_plate,
    emulated_store,
    linked_root,
    unavailable,
)
from cropbench.tracks.formats import BUCKET

DIRECT, WEBDATASET = "ome-zarr/direct", "webdataset"
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
            row.get("machine_busy_share"),
        )

    def summary(self) -> dict[str, Any]:
        return {
            "reader": self.reader,
            "round": self.round,
            "in_flight": self.in_flight,
            "link_gbit_s": self.link_gbit_s,
            "crops": self.crops,
            "seconds": self.seconds,
            "read_ahead_steps": self.read_ahead_steps,
            "machine_busy_share": self.machine_busy_share,
            "crops_per_s": self.crops_per_s,
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
        raise RuntimeError(f"{reader}: the epoch made no request to the store")
    first = min(trace.start_s for trace in window.requests)
    return Run(
        reader, round_, in_flight, link, crops, last - first, window.requests, read_ahead, window.machine_busy_share
    )


def direct_runs(plate: Path, args: argparse.Namespace, model: StoreModel, round_: int) -> list[Run]:
    """The plate served by the emulated store and read in place by the direct path at each in-flight setting."""
    runs = []
    with emulated_plate(plate, model) as (store, url):
        for in_flight in args.in_flight:
            with (
                tempfile.TemporaryDirectory(prefix="cropbench-replay-") as scratch,
                remote_plate(url, _store(args, in_flight), Path(scratch) / "mirror") as mirror,
            ):
                dataset = CropDataset(mirror, CropConfig(crop_size=args.crop_size, dtype="uint16", tier="none"))
                link, ahead = model.link_gbit_s or 0, dataset.read_ahead_batches(args.batch_size)
                runs.append(measured(DIRECT, round_, in_flight, link, store, _loader(dataset, args), ahead))
                dataset.reader.close()
            print(_run_line(runs[-1]), flush=True)
    return runs


def _store(args: argparse.Namespace, in_flight: int) -> StoreConfig:
    return StoreConfig(in_flight=in_flight, coalesce_gap_bytes=args.coalesce_gap_kib * 1024)


def _loader(dataset: CropDataset, args: argparse.Namespace) -> Any:
    spec = LoaderSpec(num_workers=args.workers, batch_size=args.batch_size, start_method="forkserver")
    order = RandomSampler(dataset, generator=torch.Generator().manual_seed(args.seed))
    return build_loader(dataset, spec, order, args.seed)


def webdataset_runs(
    store_path: Path, plate_name: str, args: argparse.Namespace, model: StoreModel, round_: int
) -> list[Run]:
    """The WebDataset conversion served by the emulated store at each link rate, one epoch each into a fresh cache."""
    fmt = training_format(WEBDATASET)
    runs = []
    for link in args.links_gbit:
        with (
            tempfile.TemporaryDirectory(prefix="cropbench-replay-", dir=store_path.parent) as scratch,
            linked_root({f"{BUCKET}/{WEBDATASET}": store_path}) as root,
            emulated_store(root, dataclasses.replace(model, link_gbit_s=link)) as store,
        ):
            s3 = S3Access(store.endpoint, S3_ACCESS_KEY, S3_SECRET_KEY, S3_REGION)
            spec = EpochSpec(batch_size=args.batch_size, workers=args.workers, shuffle=True, seed=args.seed)
            with environment_variables(fmt.remote_environment(s3)):
                loader = fmt.remote_epoch_loader(
                    f"s3://{BUCKET}/{WEBDATASET}", Path(scratch) / "cache", s3, plate_name, spec
                )
                runs.append(measured(WEBDATASET, round_, SHARD_DOWNLOADS_IN_FLIGHT, link, store, loader))
        print(_run_line(runs[-1]), flush=True)
    return runs


def _run_line(run: Run) -> str:
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


def costs(sources: Sequence[Run], model: StoreModel, args: argparse.Namespace) -> FittedCosts:
    """The client's costs fitted to the traces of two settings (:func:`fitted_costs`), the first's
    requests replayed for both."""
    workload = sources[0].workload(args.batch_size)
    first, second = (_replay(model, run, args.workers) for run in sources)
    return fitted_costs(workload, first, sources[0].seconds, second, sources[1].seconds)


def _sources(runs: Sequence[Run], target: Run) -> list[Run]:
    """What predicts ``target``: two other settings of its reader and round (none if it has fewer), those
    whose epochs left cores free first (the model's one core per process held there)."""
    others = [run for run in runs if (run.reader, run.round) == (target.reader, target.round) and run is not target]
    chosen = sorted(others, key=lambda run: (_saturated(run), run.in_flight, -run.link_gbit_s))[:2]
    return sorted(chosen, key=lambda run: (run.in_flight, -run.link_gbit_s)) if len(others) >= 2 else []


def _saturated(run: Run) -> bool:
    return (run.machine_busy_share or 0.0) >= CORES_SATURATED


def validation(runs: Sequence[Run], model: StoreModel, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each run predicted from the traces of other runs of the same reader and round, never its own: from
    the two others (both costs fitted), and from the nearest other alone with its whole cost taken as
    compute (``compute_only``: the simpler model, for comparison)."""
    rows = []
    for target in runs:
        sources = _sources(runs, target)
        if not sources:
            continue
        fitted = costs(sources, model, args)
        compute, per_byte = fitted.compute_s_per_crop, fitted.client_s_per_byte
        workload = sources[0].workload(args.batch_size)
        predicted = predict(workload, _replay(model, target, args.workers, compute, per_byte)).crops_per_s
        ratio = predicted / target.crops_per_s
        nearest = min(sources, key=lambda run: (round(abs(math.log(_knob(run) / _knob(target))), 9), -_knob(run)))
        alone = fitted_compute(
            nearest.workload(args.batch_size), _replay(model, nearest, args.workers), nearest.seconds
        )
        alone_replay = _replay(model, target, args.workers, alone)
        alone_predicted = predict(nearest.workload(args.batch_size), alone_replay).crops_per_s
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


def real_store(runs: Sequence[Run], model: StoreModel, args: argparse.Namespace) -> list[dict[str, Any]]:
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
        fitted = costs(sources, model, args)
        compute, per_byte = fitted.compute_s_per_crop, fitted.client_s_per_byte
        workload = sources[0].workload(args.batch_size)
        for processes in (args.workers, 32):
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
                    replay = Replay(dataclasses.replace(model, link_gbit_s=link), client, repeats, args.seed)
                    prediction = predict(workload, replay)
                    rows.append(
                        {
                            "reader": reader,
                            "processes": processes,
                            "in_flight": in_flight,
                            "link_gbit_s": link,
                            "compute_ms_per_crop": compute * 1e3,
                            "client_ms_per_mb": per_byte * 1e9,
                            "split_visible": fitted.split_visible,
                            "crops_per_s": prediction.crops_per_s,
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
            f"| {row['reader']} | {row['round']} | {_setting(row)} | {row['crops_per_s']:,.0f} | {row['requests']:,} | "
            f"{row['body_bytes'] / 1e6:,.0f} | "
            f"{'-' if row['machine_busy_share'] is None else format(row['machine_busy_share'], '.0%')} |"
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
            f"{row['crops_per_s']:,.0f} | {row['requests_per_s']:,.0f} | {row['link_utilisation']:.0%} | "
            f"{row['cpu_share']:.0%} |"
            for row in real
        ),
    ]
    return "\n".join(lines)


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def measure(args: argparse.Namespace, argv: Sequence[str]) -> dict[str, Any]:
    """Every run of every round, with the machine's load before and after: what the traces file holds."""
    fmt = training_format(WEBDATASET)
    missing = fmt.available()
    started = {"uptime": _uptime(), "load_average": os.getloadavg()}
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="cropbench-replay-") as folder:
        converted = Path(folder) / WEBDATASET
        plate_name = ""
        if missing is None:
            source = CropDataset(args.plate, CropConfig(crop_size=args.crop_size, dtype="uint16", tier="none"))
            plate_name = fmt.write(source, converted, shard_bytes=args.shard_mib * 2**20).plate_name
            source.reader.close()
        else:
            print(f"replay_validation: webdataset skipped ({missing})", file=sys.stderr)
        for round_ in range(args.rounds):
            runs.extend(direct_runs(args.plate, args, _model(args), round_))
            if missing is None:
                runs.extend(webdataset_runs(converted, plate_name, args, _model(args), round_))
    return {
        "command": " ".join(["python", "scripts/replay_validation.py", *argv]),
        "commit": git_commit(),
        "machine": f"{os.cpu_count()}-core {platform.machine()}, {platform.platform()}",
        "settings": {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()},
        "started": started,
        "ended": {"uptime": _uptime(), "load_average": os.getloadavg()},
        "runs": [run.saved() for run in runs],
    }


def _model(args: argparse.Namespace) -> StoreModel:
    return StoreModel.at_median(args.median_ms)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--plate", type=Path, help="a local OME-Zarr plate: measure, then predict")
    what.add_argument("--traces", type=Path, help="a traces file this script wrote: predict again, measure nothing")
    parser.add_argument("--out", type=Path, help="write the validation and predictions here (JSON; traces beside it)")
    parser.add_argument("--in-flight", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument("--links-gbit", type=float, nargs="+", default=[10.0, 1.0, 0.5])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--crop-size", type=int, default=96)
    parser.add_argument("--median-ms", type=float, default=20.0)
    parser.add_argument("--shard-mib", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--coalesce-gap-kib",
        type=int,
        default=StoreConfig().coalesce_gap_bytes // 1024,
        help="the direct path's coalescing gap (bytes moved against requests made)",
    )
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.coalesce_gap_kib < 0:
        parser.error(f"--coalesce-gap-kib must be >= 0, got {args.coalesce_gap_kib}")
    if args.traces is not None:
        try:
            measurement = json.loads(gzip.decompress(args.traces.read_bytes()))
        except (OSError, ValueError) as error:
            print(f"replay_validation: --traces {args.traces} is not a traces file: {error}", file=sys.stderr)
            return 2
        for key in ("workers", "batch_size", "median_ms", "seed"):  # the settings the runs were measured with
            setattr(args, key, measurement["settings"][key])
    else:
        reason = unavailable()
        if reason is not None:
            print(f"replay_validation: {reason}", file=sys.stderr)
            return 2
        if not (args.plate / "zarr.json").is_file() and not (args.plate / ".zattrs").is_file():
            print(f"replay_validation: --plate {args.plate} is not an OME-Zarr plate folder", file=sys.stderr)
            return 2
        measurement = measure(args, argv)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            _traces_path(args.out).write_bytes(gzip.compress(json.dumps(measurement).encode(), mtime=0))
    runs = [Run.loaded(row) for row in measurement["runs"]]
    model = _model(args)
    checks = validation(runs, model, args)
    real = real_store(runs, model, args)
    print(tables(runs, checks, real))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        document = {
            **{key: value for key, value in measurement.items() if key != "runs"},
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
        args.out.write_text(json.dumps(document, indent=1) + "\n")
        args.out.with_suffix(".txt").write_text(tables(runs, checks, real) + "\n")
    return 0


def _traces_path(out: Path) -> Path:
    """Where the runs' requests are kept beside ``out`` (gzip: a few MB of JSON)."""
    return out.with_name(f"{out.stem}-traces.json.gz")


if __name__ == "__main__":
    sys.exit(main())
