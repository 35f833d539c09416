"""Commands that measure: ``run`` (tracks on a plate, or as ranks), ``smoke`` (the main job) and ``env``."""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

from cropbench.cli.options import (
    Commands,
    add_crop_size,
    add_store_knobs,
    layout_names_help,
    left_behind,
    store_config,
    whole_number,
    writes_tracks,
)
from cropbench.cli.progress import ProgressBar
from cropbench.cli.results import draw_figures, echo, write_report_page
from cropbench.config import (
    DECODE_PATHS,
    DEFAULT_CHUNK_CACHE_BYTES,
    LAYOUTS,
    OUTPUT_DTYPES,
    TRANSFORM_TIERS,
    CropOverrides,
)
from cropbench.errors import ConfigError
from cropbench.records import CSV_NAME, RESULTS_NAME, read_records
from cropbench.tracks import TRACKS

#: A plate given as a URL (``s3://``, ``https://``): checked by the store it names, not here.
URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def check_run_paths(args: argparse.Namespace) -> None:
    """The local paths ``run`` reads must be there, checked before torch is imported (seconds) to measure."""
    named = {"--plate": args.plate, "--objects": args.objects, "--local-plate": args.local_plate}
    for option, path in named.items():
        if path is not None and not URL_SCHEME.match(path) and not os.path.exists(path):
            raise ConfigError(f"{option} {path} does not exist")


def cmd_run(args: argparse.Namespace) -> int:
    check_run_paths(args)
    from cropbench import api
    from cropbench.harness.ranks import check_timeout, launch_rank
    from cropbench.report.summary import summary_table
    from cropbench.tracks.peers.base import peers_folder

    if args.rank_timeout is not None:
        check_timeout(args.rank_timeout)  # before any rank starts or anything is measured
    if args.ranks is not None:
        from cropbench.harness.ranks import launch_local

        launch_local(args.ranks, _without_ranks(args.argv))
        return 0
    out_dir = Path(args.out)
    tracks = [*(args.track or ([] if args.peers else ["dataset"])), *(["peers"] if args.peers else [])]
    leader = launch_rank() == 0  # under torchrun only rank 0 reports (and writes)
    bar = ProgressBar(not args.no_progress and leader, "cases")
    try:
        records = api.run(
            args.plate,
            tracks,
            args.preset,
            out_dir,
            samples=args.samples,
            repeats=args.repeats,
            resume=args.resume,
            torch_threads=args.torch_threads,
            layout=args.layout,
            layout_dir=args.layout_dir,
            store=store_config(args),
            local_plate=args.local_plate,
            objects=args.objects,
            overrides=_crop_overrides(args),
            progress=bar,
            **({"rank_timeout_s": args.rank_timeout} if args.rank_timeout is not None else {}),
        )
    finally:
        bar.close()
    if not leader:
        return 0
    echo(summary_table(records))
    kept = left_behind(peers_folder(args.plate), "peer loaders' copies of the plate kept in") if args.peers else None
    if kept:
        print(f"\n{kept} (reused by the next run; remove it to free the space)")
    if args.repeats > 1:
        from cropbench.report.stability import format_repeat_summary, summarise_repeats

        echo("\n" + format_repeat_summary(summarise_repeats(records)))
    echo(f"\n{len(records)} rows appended to {out_dir / RESULTS_NAME}; CSV at {out_dir / CSV_NAME}")
    # The verdict judges every row of the file: a resumed run's rows and those written before it alike.
    every = read_records(out_dir / RESULTS_NAME) if (out_dir / RESULTS_NAME).is_file() else records
    if args.plot:
        answer = write_report_page(every, out_dir, draw_figures(out_dir / RESULTS_NAME, out_dir / "plots"), args.preset)
    else:
        from cropbench.report.verdict import verdict

        answer = verdict(every, args.preset).text()
    echo(f"\n{answer}")
    return 0


def _add_crop_knobs(parser: argparse.ArgumentParser) -> None:
    """Crop knobs fixed for every case of the run, over what the preset sets (``CropOverrides``)."""
    group = parser.add_argument_group("crop knobs (override the preset for every case)")
    add_crop_size(group, default=None)
    group.add_argument("--decode", choices=DECODE_PATHS, help="decode path")
    group.add_argument("--dtype", choices=OUTPUT_DTYPES, help="output dtype")
    group.add_argument("--tier", choices=TRANSFORM_TIERS, help="transform tier")
    group.add_argument(
        "--chunk-cache-bytes",
        type=whole_number(0),
        metavar="BYTES",
        help=f"decoded-chunk cache per reader (default: {DEFAULT_CHUNK_CACHE_BYTES}, unless the preset sets one)",
    )
    group.add_argument(
        "--decode-threads", type=whole_number(1), metavar="N", help="threads that read and decode chunks in one process"
    )


def _crop_overrides(args: argparse.Namespace) -> CropOverrides:
    knobs = ("crop_size", "decode", "dtype", "tier", "chunk_cache_bytes", "decode_threads")
    return CropOverrides(**{knob: getattr(args, knob) for knob in knobs})


def _without_ranks(argv: Sequence[str]) -> list[str]:
    """``argv`` less ``--ranks N`` / ``--ranks=N`` (each rank runs the rest)."""
    kept: list[str] = []
    skip = False
    for item in argv:
        if skip:
            skip = False
        elif item == "--ranks":
            skip = True
        elif not item.startswith("--ranks="):
            kept.append(item)
    return kept


def cmd_env(args: argparse.Namespace) -> int:
    from cropbench.measure import environment

    print(json.dumps(environment.collect(args.path), indent=2, default=str))
    return 0


def cmd_smoke(args: argparse.Namespace) -> int:
    """The main job: a small synthetic plate, every track's smoke preset, summary, CSV and plots."""
    from cropbench import api
    from cropbench.report.summary import summary_table

    out_dir = Path(args.out)
    bar = ProgressBar(not args.no_progress, "cases")
    try:
        done = api.smoke(out_dir, force=args.force, generation_progress=not args.no_progress, progress=bar)
    finally:
        bar.close()
    if done.generated is not None:
        generated = done.generated
        print(
            f"generated {done.plate} ({generated.objects} objects, compression ratio {generated.compression_ratio:.2f})"
        )
    echo(summary_table(done.records))
    figures = draw_figures(out_dir / RESULTS_NAME, out_dir / "plots")
    echo(f"\nrows in {out_dir / RESULTS_NAME} and {out_dir / CSV_NAME}")
    echo(f"\n{write_report_page(done.records, out_dir, figures, 'smoke')}")
    return 0


def _track_help() -> str:
    """``--track``'s help, from the table of tracks: each track ``run`` builds, by name or alias."""
    named = [
        f"{' or '.join((info.name, *info.aliases))} ({info.title})"
        for info in TRACKS.values()
        if info.runner_class is not None
    ]
    return f"track to run: {', '.join(named)} (repeatable; default dataset)"


def add_run_commands(commands: Commands) -> None:
    """Register ``run``, ``smoke`` and ``env``."""
    run = commands.add_parser(
        "run",
        help="run benchmark tracks on a plate",
        description="Run tracks on a plate; rows are appended to OUT/results.jsonl.",
    )
    run.add_argument(
        "--plate",
        required=True,
        help="plate directory, or URL of a plate in a store (s3://bucket/prefix/plate.zarr, https://host/plate.zarr)",
    )
    run.add_argument(
        "--track",
        action="append",
        metavar="NAME",
        help=_track_help(),
    )
    run.add_argument(
        "--preset",
        default="smoke",
        choices=("smoke", "full", "grid", "gpu", "gpu-demand", "overhead"),
        help="case grid (smoke: proves the pipeline in minutes; full: the measurement, Tracks 1-3 in about "
        "7-10 minutes on 2 cores on the full plate, one knob at a time; grid: Track 1 only, the product of its "
        "knobs, 232 cases, hours; gpu: the GPU check, Track 2 supply at batch 256 and Track 3 worker searches "
        "on CUDA; gpu-demand: Track 3 only, compute-only images/s on CUDA; overhead: Track 2 only, "
        "uint16 batches/s through the DataLoader over Track 1's batched rate at the same threads)",
    )
    run.add_argument("--out", default="out", help="output directory (default: %(default)s)")
    run.add_argument("--samples", type=whole_number(1), help="steady-state samples per case (overrides the preset)")
    run.add_argument("--repeats", type=whole_number(1), default=1, help="repeat each case with seed+repeat")
    run.add_argument("--resume", action="store_true", help="skip cases already in OUT/results.jsonl")
    run.add_argument(
        "--torch-threads", type=whole_number(0), default=1, help="torch intra-op threads (0 = torch default)"
    )
    run.add_argument("--plot", action="store_true", help="draw figures into OUT/plots and write OUT/report.html")
    run.add_argument(
        "--layout",
        choices=sorted(LAYOUTS),
        metavar="NAME",
        help=f"run on the plate rewritten in this named layout (converted once, then reused): {layout_names_help()}",
    )
    run.add_argument("--layout-dir", help="where converted plates live (default: PLATE.layouts/ beside the plate)")
    run.add_argument(
        "--objects",
        help="object table (Parquet/CSV: centroid_y, centroid_x, and well, field unless "
        "the plate has one field) for plates without cropbench's table",
    )
    run.add_argument(
        "--peers",
        action="store_true",
        help="also measure peer loaders (naive zarr, dask, spatialdata, Arrow rows) beside cropbench's "
        "zarr/direct/field on the same crops (track 'peers'; only them unless --track is given)",
    )
    run.add_argument(
        "--ranks",
        type=whole_number(1),
        metavar="N",
        help="run as N ranks on this machine through torch's launcher (as torchrun --standalone "
        "--nproc-per-node N -m cropbench run ...; tracks 2 and 3)",
    )
    run.add_argument(
        "--rank-timeout",
        type=float,
        metavar="SECONDS",
        help="under torchrun: how long a rank waits for the others at a barrier; a rank that died or hung "
        "fails the run after this long (each case must fit in it; default: 600)",
    )
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_crop_knobs(run)
    add_store_knobs(run)
    run.add_argument(
        "--local-plate",
        metavar="PATH",
        help="the same plate on local disk, beside a plate URL: Track 1 measures each case on it too and "
        "the store's rows carry ratio_to_local",
    )
    run.set_defaults(handler=cmd_run)
    writes_tracks(run, *(info.name for info in TRACKS.values() if info.runner_class is not None))

    smoke = commands.add_parser(
        "smoke",
        help="the main job: smoke plate, every track, summary, plots, report and verdict",
        description="Generate a small synthetic plate (4 fields of 5 x 540 x 540) unless OUT has one, run every "
        "track's smoke preset on it, print the summary with each row's validity flags, write "
        "OUT/results.jsonl, OUT/results.csv, OUT/plots/*.png and OUT/report.html (one page: verdict, figures, "
        "rows, environment), and end with the verdict. About 1-2 minutes on 2 cores.",
    )
    smoke.add_argument("--out", default="out/smoke", help="output directory (default: %(default)s)")
    smoke.add_argument("--force", action="store_true", help="regenerate the smoke plate")
    smoke.add_argument("--no-progress", action="store_true", help="no progress bars")
    smoke.set_defaults(handler=cmd_smoke)

    env = commands.add_parser("env", help="print the environment metadata a record carries")
    env.add_argument("--path", help="also describe the storage holding this path")
    env.set_defaults(handler=cmd_env)
