"""Commands that measure reading from object stores on this machine: ``store-calibration`` (the emulated store
against its model), ``prefetch-bench`` (read-ahead over it), ``replay-validation`` (the replay model against
it) and ``remote-bench`` (tracks remote and store-layouts on a plate served on loopback).

Every option, the plate and the output paths are checked before a store starts, and what is measured
is written as it is measured: an interrupt, or an error in a later setting, keeps every finished row.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cropbench import metrics as m
from cropbench.cli.options import (
    Commands,
    Distinct,
    add_crop_size,
    check_output_file,
    check_results_file,
    finite_number,
    in_flight,
    latency_ms,
    seed,
    whole_number,
    writes_tracks,
)
from cropbench.config import (
    LAYOUTS,
    MAX_LINK_GBIT_S,
    MAX_RESPONSE_KIB,
    MAX_ROUNDS,
    MAX_SHARD_MIB,
    MAX_TIMEOUT_S,
    MAX_WORKERS,
    StoreConfig,
    layout_by_name,
)
from cropbench.errors import ConfigError
from cropbench.records import RESULTS_NAME, Record, RecordWriter, replacing

#: Layouts a plate in a store can be read in.
STORE_LAYOUT_NAMES = sorted(name for name in LAYOUTS if layout_by_name(name).format == "ome-zarr")
#: Servers remote-bench can put the plate in.
SERVERS = ("emulated", "s3", "http")
BUCKET = "bench"

_workers = whole_number(0, MAX_WORKERS)
_positive_whole = whole_number(1)


def _emulation_reason() -> str | None:
    """Why the emulated store cannot run here (None: it can); imported late, as measuring is."""
    from cropbench.measure.store_emulation import unavailable

    return unavailable()


def _need_emulation() -> None:
    """The emulated store runs here (what a killed earlier run left is swept when the command starts)."""
    reason = _emulation_reason()
    if reason is not None:
        raise ConfigError(f"the emulated object store cannot run here: {reason}")


def _check_plate(path: Path) -> None:
    """``--plate`` is a local OME-Zarr plate folder."""
    if not path.is_dir():
        raise ConfigError(f"--plate {path} {'is not a folder' if path.exists() else 'does not exist'}")
    if not (path / "zarr.json").is_file() and not (path / ".zattrs").is_file():
        raise ConfigError(f"--plate {path} is not an OME-Zarr plate folder")


def _write_json(path: Path, content: dict[str, Any]) -> None:
    """``content`` as the whole of ``path`` (folders made), replaced at once: an interrupt leaves the last one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path) as handle:
        json.dump(content, handle, indent=1)
        handle.write("\n")


def cmd_store_calibration(args: argparse.Namespace) -> int:
    from cropbench.measure.store_calibration import Calibration, document, is_calibration_file, run_calibration, table
    from cropbench.measure.store_emulation import StoreModel

    if args.p99_ms < args.median_ms:
        raise ConfigError(f"--p99-ms {args.p99_ms:g} is below --median-ms {args.median_ms:g}: a tail is not shorter")
    model = StoreModel(median_latency_ms=args.median_ms, p99_latency_ms=args.p99_ms)
    calibration = Calibration(tuple(args.in_flight), tuple(args.sizes_kib), args.seconds, model)
    out: Path | None = args.out
    if out is not None:
        check_output_file(out, "--out", "a calibration file", is_calibration_file)
    _need_emulation()
    load = os.getloadavg()
    rows: list[dict[str, Any]] = []

    def measured(row: dict[str, Any]) -> None:
        rows.append(row)
        print(table(rows[-1:]).splitlines()[-1], flush=True)
        if out is not None:
            _write_json(out, document(model, load, rows))

    run_calibration(calibration, measured)
    print(table(rows))
    return 0


def _reader_name(text: str) -> str:
    from cropbench.tracks.prefetch import store_reader

    try:
        store_reader(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def cmd_prefetch_bench(args: argparse.Namespace) -> int:
    from cropbench.tracks.prefetch import DEFAULT_READERS, TRACK, PrefetchBench, check_plate, run_prefetch, summary

    bench = PrefetchBench(
        readers=tuple(args.readers or DEFAULT_READERS),
        in_flight=tuple(args.in_flight),
        coalesce_gap_kib=tuple(args.coalesce_gap_kib),
        latency_ms=args.latency_ms,
        batch_size=args.batch_size,
        workers=tuple(args.workers),
        batches=args.batches,
        rounds=args.rounds,
        chunk_cache_mib=args.chunk_cache_mib,
    )
    plate, out = Path(args.plate), Path(args.out)
    check_results_file(out, "--out", {TRACK})
    _check_plate(plate)
    check_plate(plate, bench)
    _need_emulation()

    with RecordWriter(out) as writer:

        def emit(record: Record) -> None:
            writer.write(record)
            print(
                f"round {record.repeat}: {record.case}: {record.metrics[m.SAMPLES_PER_S]:,.0f} crops/s",
                flush=True,
            )

        records = run_prefetch(plate, bench, emit)
    print(summary(bench, records))
    print(f"\nrows (one per reader, worker count and round) in {out}")
    return 0


def cmd_replay_validation(args: argparse.Namespace) -> int:
    from cropbench.measure.replay_validation import (
        ReplaySettings,
        Run,
        document,
        is_tables_file,
        is_traces_file,
        is_validation_file,
        load_traces,
        measure,
        run_line,
        traces_bytes,
        traces_path,
    )

    out: Path | None = args.out
    if args.traces is not None:
        settings, runs, traces = load_traces(args.traces)
    else:
        settings = ReplaySettings(
            in_flight=tuple(args.in_flight),
            links_gbit=tuple(args.links_gbit),
            rounds=args.rounds,
            workers=args.workers,
            batch_size=args.batch_size,
            crop_size=args.crop_size,
            median_ms=args.median_ms,
            shard_mib=args.shard_mib,
            seed=args.seed,
            coalesce_gap_kib=args.coalesce_gap_kib,
            in_place_run=args.in_place_run,
        )
    if out is not None:
        if out.suffix == ".txt":
            raise ConfigError(f"--out {out}: the tables are written beside it as .txt; name a .json file")
        check_output_file(out, "--out", "a validation file", is_validation_file)
        check_output_file(out.with_suffix(".txt"), "--out", "a validation table", is_tables_file)
        if args.traces is None:
            check_output_file(traces_path(out), "--out", "a traces file", is_traces_file)
    if args.traces is None:
        _check_plate(args.plate)
        _need_emulation()

        def measured(run: Run, so_far: dict[str, Any]) -> None:
            print(run_line(run), flush=True)
            if out is not None:  # every finished epoch kept: --traces predicts from them without measuring
                out.parent.mkdir(parents=True, exist_ok=True)
                with replacing(traces_path(out), binary=True) as handle:
                    handle.write(traces_bytes(so_far))

        traces = measure(args.plate, settings, shlex.join(["cropbench", *args.argv]), measured)
        runs = [Run.loaded(row) for row in traces["runs"]]
    content, text = document(traces, runs, settings)
    print(text)
    if out is not None:
        _write_json(out, content)
        with replacing(out.with_suffix(".txt")) as handle:
            handle.write(text + "\n")
    return 0


@contextlib.contextmanager
def _served(server: str, plate: Path, latency: float) -> Iterator[tuple[str, Any]]:
    """The plate in a loopback store; yields its URL and the emulated store (None for the others)."""
    from cropbench.formats.sources import upload_plate
    from cropbench.measure import endpoints
    from cropbench.measure.store_emulation import StoreModel, emulated_plate

    if server == "emulated":
        with emulated_plate(plate, StoreModel.at_median(latency)) as (store, url):
            yield url, store
        return
    if server == "s3":
        with endpoints.loopback_s3(BUCKET):
            url = f"s3://{BUCKET}/{plate.name}"
            upload_plate(plate, url)
            yield url, None
        return
    with endpoints.http_plate(plate) as url:
        yield url, None


def cmd_remote_bench(args: argparse.Namespace) -> int:
    from cropbench import api
    from cropbench.report.tables import layouts_table, remote_table
    from cropbench.tracks.remote import Remote
    from cropbench.tracks.store_layouts import StoreLayoutComparison

    plate, out = Path(args.plate), Path(args.out)
    _check_plate(plate)
    # the emulated store injects the latency itself; the others get it from the delay proxy
    settings = (
        StoreLayoutComparison(
            latency_ms=args.latency_ms,
            in_flight=max(args.in_flight),
            crops=args.crops,
            batch_size=args.batch_size,
            crop_size=args.crop_size,
        )
        if args.layouts
        else None
    )
    track = Remote(args.workers, args.batch_size, args.crop_size)
    check_results_file(out / RESULTS_NAME, "--out", {"store-layouts" if args.layouts else track.name})
    reason = _emulation_reason()
    if args.server == "emulated" and reason is not None:
        raise ConfigError(f"--server emulated: the emulated object store cannot run here: {reason}")
    server = args.server or ("emulated" if reason is None else "s3")
    proxy_ms = 0.0 if server == "emulated" else args.latency_ms
    stores = [StoreConfig(in_flight=n, latency_ms=proxy_ms) for n in args.in_flight]
    stores.append(StoreConfig(in_flight=max(args.in_flight), latency_ms=proxy_ms, zarr_client="obstore"))
    if args.server is None and reason is not None:
        print(f"cropbench: moto behind the delay proxy, not the emulated store: {reason}", file=sys.stderr)
    with _served(server, plate, args.latency_ms) as (url, emulated):
        if settings is not None:
            print(layouts_table(api.compare_layouts_in_store(url, args.layouts, settings, out)))
            return 0
        records: list[Record] = []
        busy: dict[int, tuple[float, bool]] = {}
        for store in stores:
            window = emulated.window() if emulated is not None else contextlib.nullcontext()
            with window as stretch:
                measured = api.run(url, [track], out_dir=out, samples=args.crops, store=store, local_plate=plate)
            if stretch is not None:  # the stretch holds local reads too: the share is a lower bound
                busy.update(
                    {len(records) + i: (stretch.server_busy_share, stretch.server_bound) for i in range(len(measured))}
                )
            records += measured
    print(remote_table(records, busy))
    return 0


def add_store_commands(commands: Commands) -> None:
    """Register ``store-calibration``, ``prefetch-bench``, ``replay-validation`` and ``remote-bench``."""
    defaults = StoreConfig()
    calibration = commands.add_parser(
        "store-calibration",
        help="the emulated object store against its model: requests/s per size and requests in flight",
        description="For each response size and number of requests in flight, keep-alive connections ask the "
        "emulated store for one byte range for --seconds: requests/s and MB/s beside the model's prediction, "
        "the server's and the client's CPU, and nginx's latency per request. Needs root and nginx's Lua module.",
    )
    calibration.add_argument(
        "--out", type=Path, help="write the rows, the model and the machine's load here (JSON, after each row)"
    )
    calibration.add_argument(
        "--in-flight", type=in_flight, nargs="+", action=Distinct, default=[1, 16, 64, 256], help="requests in flight"
    )
    calibration.add_argument(
        "--sizes-kib",
        type=whole_number(1, MAX_RESPONSE_KIB),
        nargs="+",
        action=Distinct,
        default=[40, 1024],
        help="response sizes in KiB (default: %(default)s)",
    )
    calibration.add_argument(
        "--seconds",
        type=finite_number(0, MAX_TIMEOUT_S, above_low=True),
        default=4.0,
        help="measured seconds per row (default: %(default)s)",
    )
    calibration.add_argument("--median-ms", type=latency_ms, default=20.0, help="median first-byte latency")
    calibration.add_argument("--p99-ms", type=latency_ms, default=100.0, help="p99 first-byte latency")
    calibration.set_defaults(handler=cmd_store_calibration)

    prefetch = commands.add_parser(
        "prefetch-bench",
        help="read-ahead over the emulated object store: random crops/s beside the local plate",
        description="Each round, one epoch of a seeded random order read through the local plate and every "
        "reader over the emulated store in turn, each through cropbench's DataLoader with its chunk cache "
        "emptied first. One record per reader, worker count and round (track 'prefetch'), appended to --out "
        "as each round is measured; the medians over the rounds on stdout. Needs root and nginx's Lua module.",
    )
    prefetch.add_argument("--plate", required=True, help="local OME-Zarr plate to serve and measure")
    prefetch.add_argument("--out", required=True, type=Path, help="results file the rows are appended to (JSONL)")
    prefetch.add_argument(
        "--latency-ms", type=latency_ms, default=20.0, help="the store's median first-byte latency (default: 20)"
    )
    prefetch.add_argument(
        "--in-flight",
        type=in_flight,
        nargs="+",
        action=Distinct,
        default=[defaults.in_flight],
        help="requests each process keeps open: every reader is measured at each (interleaved in each round)",
    )
    prefetch.add_argument(
        "--coalesce-gap-kib",
        type=whole_number(0),
        nargs="+",
        action=Distinct,
        default=[defaults.coalesce_gap_bytes // 1024],
        help="the store's coalescing gaps, each read exactly (whatever the plate's layout names): every reader is "
        "measured at each (interleaved in each round)",
    )
    prefetch.add_argument("--batch-size", type=_positive_whole, default=64, help="crops per batch (default: 64)")
    prefetch.add_argument(
        "--workers", type=_workers, nargs="+", action=Distinct, default=[0, 2], help="DataLoader worker counts"
    )
    prefetch.add_argument(
        "--readers",
        type=_reader_name,
        nargs="+",
        action=Distinct,
        help="the store's readers: 'store' (no read-ahead) or 'store+ahead<batches>/<MiB>MiB[/<n>threads]' "
        "(default: store, and reading 1 to 4 batches ahead with 16 or 64 MiB in flight)",
    )
    prefetch.add_argument(
        "--batches", type=_positive_whole, default=None, help="batches per round (default: a whole epoch)"
    )
    prefetch.add_argument(
        "--rounds", type=whole_number(1, MAX_ROUNDS), default=3, help="rounds, each a new epoch (default: 3)"
    )
    prefetch.add_argument(
        "--chunk-cache-mib",
        type=_positive_whole,
        default=128,
        help="every reader's chunk cache in MiB, holding the batches it reads ahead and one more (default: 128)",
    )
    prefetch.set_defaults(handler=cmd_prefetch_bench)
    writes_tracks(prefetch, "prefetch")

    replay = commands.add_parser(
        "replay-validation",
        help="the replay model against the emulated object store, then a real store predicted",
        description="Each reader (the direct path at each --in-flight, WebDataset at each --links-gbit) reads one "
        "shuffled epoch from the emulated store per setting and round; each setting is predicted from the traces "
        "of two others and set beside what it measured, then the first round's traces predict a real store. The "
        "traces are kept beside --out (NAME-traces.json.gz, after each epoch); --traces predicts again from them.",
    )
    what = replay.add_mutually_exclusive_group(required=True)
    what.add_argument("--plate", type=Path, help="a local OME-Zarr plate: measure, then predict")
    what.add_argument("--traces", type=Path, help="a traces file this command wrote: predict again, measure nothing")
    replay.add_argument(
        "--out", type=Path, help="write the validation and predictions here (JSON; tables and traces beside it)"
    )
    replay.add_argument(
        "--in-flight", type=in_flight, nargs="+", action=Distinct, default=[4, 16, 64], help="direct path settings"
    )
    replay.add_argument(
        "--links-gbit",
        type=finite_number(0, MAX_LINK_GBIT_S, above_low=True),
        nargs="+",
        action=Distinct,
        default=[10.0, 1.0, 0.5],
        help="WebDataset's link settings in Gbit/s",
    )
    replay.add_argument("--rounds", type=whole_number(1, MAX_ROUNDS), default=3, help="rounds (default: 3)")
    replay.add_argument("--workers", type=whole_number(1, MAX_WORKERS), default=2, help="DataLoader workers")
    replay.add_argument("--batch-size", type=_positive_whole, default=64, help="crops per batch (default: 64)")
    add_crop_size(replay)
    replay.add_argument("--median-ms", type=latency_ms, default=20.0, help="the store's median first-byte latency")
    replay.add_argument(
        "--shard-mib", type=whole_number(1, MAX_SHARD_MIB), default=64, help="WebDataset shard size (default: 64)"
    )
    replay.add_argument("--seed", type=seed, default=0, help="shuffling seed")
    replay.add_argument(
        "--coalesce-gap-kib",
        type=whole_number(0),
        default=defaults.coalesce_gap_bytes // 1024,
        help="the direct path's coalescing gap, read exactly whatever the plate's layout names (bytes moved against "
        "requests made)",
    )
    replay.add_argument(
        "--in-place-run",
        type=whole_number(1),
        default=1,
        help="the direct path's epochs shuffle runs of this many consecutive objects (one request each on a plate "
        "with a crop atlas); 1: every object on its own (default: %(default)s)",
    )
    replay.set_defaults(handler=cmd_replay_validation)

    remote = commands.add_parser(
        "remote-bench",
        help="tracks remote and store-layouts on a plate served on loopback",
        description="Start a loopback store, put the plate in it, run track 'remote' on its URL at each store "
        "setting (or, with --layouts, track 'store-layouts'), stop everything. Rows in OUT/results.jsonl, a "
        "table on stdout.",
    )
    remote.add_argument("--plate", required=True, help="local plate (OME-Zarr, any layout) to serve and measure")
    remote.add_argument(
        "--server",
        choices=SERVERS,
        default=None,
        help="the emulated store (default where it runs here), or moto's S3 server or nginx behind the delay proxy",
    )
    remote.add_argument("--latency-ms", type=latency_ms, default=20.0, help="median first-byte latency")
    remote.add_argument(
        "--workers", type=_workers, nargs="+", action=Distinct, default=[0, 2, 8], help="DataLoader worker counts"
    )
    remote.add_argument(
        "--in-flight", type=in_flight, nargs="+", action=Distinct, default=[1, 4, 16], help="requests in flight"
    )
    remote.add_argument("--crops", type=_positive_whole, default=256, help="timed crops per rate (default: 256)")
    remote.add_argument("--batch-size", type=_positive_whole, default=32, help="crops per batch (default: 32)")
    add_crop_size(remote)
    remote.add_argument("--out", default="out/remote", help="results folder (default: %(default)s)")
    remote.add_argument(
        "--layouts",
        nargs="+",
        action=Distinct,
        choices=STORE_LAYOUT_NAMES,
        metavar="NAME",
        help="instead: each named OME-Zarr layout in the store next to on disk",
    )
    remote.set_defaults(handler=cmd_remote_bench)
    writes_tracks(remote, "remote", "store-layouts")
