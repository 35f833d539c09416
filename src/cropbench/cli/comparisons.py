"""Commands that compare storage: ``compare-layouts`` (local or in a store) and ``compare-formats``."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from cropbench.cli.options import (
    Commands,
    add_crop_size,
    add_store_knobs,
    layout_names_help,
    left_behind,
    seed,
    store_config,
    whole_number,
    writes_tracks,
)
from cropbench.cli.progress import ProgressBar
from cropbench.cli.results import draw_figures
from cropbench.config import LAYOUTS, MAX_WORKERS
from cropbench.errors import ConfigError
from cropbench.records import RESULTS_NAME

#: The layouts a plate can be re-chunked into and still be read in place as OME-Zarr.
OME_ZARR_LAYOUTS = tuple(name for name, layout in LAYOUTS.items() if layout.format == "ome-zarr")


def cmd_compare_layouts(args: argparse.Namespace) -> int:
    from cropbench import api
    from cropbench.formats.sources import is_url

    if is_url(args.plate):
        return _compare_layouts_in_store(args)
    from cropbench.report.summary import summary_table
    from cropbench.report.verdict import verdict
    from cropbench.tracks.layouts import LayoutComparison, default_layouts

    out_dir = Path(args.out)
    comparison = LayoutComparison(
        layouts=tuple(args.layout or default_layouts()),
        crop_size=args.crop_size,
        decode=args.decode,
        samples=args.samples,
        warmup=args.warmup,
        repeats=args.repeats,
        seed=args.seed,
    )
    bar = ProgressBar(not args.no_progress, "layouts", len(comparison.ordered()))
    try:
        records = api.compare_layouts(
            args.plate, comparison, out_dir, work_dir=args.work, keep=args.keep, objects=args.objects, progress=bar
        )
    finally:
        bar.close()
    print(summary_table(records))
    draw_figures(out_dir / RESULTS_NAME, out_dir / "plots")
    print(f"\n{verdict(records).text()}")
    return 0


#: compare-layouts options that apply to a local plate only, with their defaults (the parser's too):
#: over a store, a value other than the default is an error rather than silently ignored.
COMPARE_LOCAL_DEFAULTS: dict[str, Any] = {"decode": "direct", "warmup": 200, "repeats": 3, "seed": 0, "objects": None}


def _compare_layouts_in_store(args: argparse.Namespace) -> int:
    """compare-layouts --plate URL: requests/crop and crops/s per layout, each served on loopback behind
    --latency-ms (rows of track 'store-layouts' in OUT/results.jsonl, a table on stdout)."""
    from cropbench import api
    from cropbench.report.tables import layouts_table
    from cropbench.report.verdict import verdict
    from cropbench.tracks.store_layouts import STORE_LAYOUTS, StoreLayoutComparison

    ignored = [f"--{name}" for name, default in COMPARE_LOCAL_DEFAULTS.items() if getattr(args, name) != default]
    if ignored:
        raise ConfigError(
            f"compare-layouts --plate {args.plate}: {', '.join(ignored)} apply to a local plate only; "
            "over a store every layout is measured with direct and zarr (--samples, --crop-size, --layout, "
            "--latency-ms, --in-flight set the run)"
        )
    settings = StoreLayoutComparison(
        latency_ms=args.latency_ms,
        in_flight=args.in_flight,
        count_crops=args.samples,
        crops=args.samples,
        zarr_crops=max(args.samples // 8, 1),  # zarr-python pays several round trips per crop
        crop_size=args.crop_size,
        store=store_config(args),
    )
    layouts = args.layout or STORE_LAYOUTS
    bar = ProgressBar(not args.no_progress, "layouts", len(layouts))
    try:
        records = api.compare_layouts_in_store(
            args.plate,
            layouts,
            settings,
            args.out,
            work_dir=args.work,
            keep=args.keep,
            store=store_config(args),
            progress=bar,
        )
    finally:
        bar.close()
    print(layouts_table(records))
    print(f"\n{verdict(records).text()}")
    return 0


def cmd_compare_formats(args: argparse.Namespace) -> int:
    """compare-formats: the plate read in place beside its crops converted into each training format."""
    from cropbench import api
    from cropbench.data.training import TRAINING_FORMATS, check_free_space
    from cropbench.report.formats_figure import write_formats_report
    from cropbench.report.tables import formats_table
    from cropbench.report.verdict import verdict
    from cropbench.tracks.formats import FormatComparison, Formats, check_plate

    comparison = FormatComparison(
        formats=tuple(args.format or FormatComparison().formats),
        crop_size=args.crop_size,
        channels=tuple(args.channels.split(",")) if args.channels else None,
        samples=args.samples,
        workers=args.workers,
        batch_size=args.batch_size,
        epochs=args.epochs,
        shard_bytes=_shard_bytes(args.shard_mib),
        remote_latency_ms=args.latency_ms,
        in_place_run=args.in_place_run,
        rechunk=tuple(name for name in (args.rechunk or FormatComparison().rechunk) if name != "none"),
    )
    if args.latency_ms is not None:
        from cropbench.measure.store_emulation import unavailable

        reason = unavailable()
        if reason is not None:  # asked for the store: a run without it would answer another question
            raise ConfigError(
                f"--latency-ms {args.latency_ms:g} reads over the emulated store, which cannot run here: {reason}"
            )
    store_bytes = check_plate(args.plate, comparison, args.objects, shard_chosen=args.shard_mib is not None)
    skipped = {name: TRAINING_FORMATS[name].available() for name in dict.fromkeys(comparison.formats)}
    for name, reason in skipped.items():
        if reason is not None:
            print(f"cropbench: skipping {name}: {reason}", file=sys.stderr)
    out_dir = Path(args.out)
    work = Path(args.work) if args.work else out_dir / "crops"
    written = sum(reason is None for reason in skipped.values())  # kept stores add up; others one at a time
    if written:
        check_free_space(work, store_bytes * (written if args.keep else 1), f"cannot write crop stores under {work}")
    track = Formats(comparison, work, keep=args.keep)
    bar = ProgressBar(not args.no_progress, "formats", len(comparison.readers()))
    try:
        records = api.run(args.plate, [track], out_dir=out_dir, objects=args.objects, progress=bar)
    finally:
        bar.close()
    print(formats_table(records))
    for path in write_formats_report(records, out_dir):
        print(f"wrote {path}")
    kept = left_behind(work, "crop stores kept in") if args.keep else None
    if kept:
        print(kept)
    if all(reason is not None for reason in skipped.values()):
        print(
            "no training format was measured: none of their libraries is installed here "
            "(scripts/setup_formats.sh installs them into .venv)"
        )
    print(f"\n{verdict(records).text()}")
    return 0


#: The shard size compare-formats writes unless --shard-mib says otherwise.
DEFAULT_SHARD_MIB = 64.0


def _shard_bytes(shard_mib: float | None) -> int:
    """--shard-mib as bytes: a finite size from one byte to the largest shard every format can index."""
    from cropbench.data.training import MAX_SHARD_BYTES

    mib = DEFAULT_SHARD_MIB if shard_mib is None else shard_mib
    if not (math.isfinite(mib) and 1 <= mib * 2**20 <= MAX_SHARD_BYTES):
        raise ConfigError(
            f"--shard-mib must be a finite number of MiB from {1 / 2**20:.2g} to {MAX_SHARD_BYTES / 2**20:.0f}, "
            f"got {mib:g}"
        )
    return int(mib * 2**20)


def add_comparison_commands(commands: Commands) -> None:
    """Register ``compare-layouts`` and ``compare-formats``."""
    compare = commands.add_parser(
        "compare-layouts",
        help="rewrite a plate in each layout and measure size, write time and crops/s",
        description="One record per layout (track 'layouts') in OUT/results.jsonl, a summary and a figure.",
    )
    compare.add_argument(
        "--plate",
        required=True,
        help="source plate (any layout), or a URL (s3://, http(s)://): each layout is then served on loopback "
        "behind --latency-ms and measured in requests/crop and crops/s (direct and zarr)",
    )
    compare.add_argument(
        "--layout",
        action="append",
        choices=sorted(LAYOUTS),
        metavar="NAME",
        help="layout to measure (repeatable; default: the full grid; memmap is always measured): "
        f"{layout_names_help()}",
    )
    compare.add_argument("--out", default="out/layouts", help="output directory (default: %(default)s)")
    compare.add_argument("--work", help="where converted plates are written (default: OUT/plates)")
    compare.add_argument("--keep", action="store_true", help="keep the converted plates")
    add_crop_size(compare)
    compare.add_argument(
        "--decode",
        default=COMPARE_LOCAL_DEFAULTS["decode"],
        choices=("zarr", "direct", "field"),
        help="decode path (default: %(default)s; layouts without it use field)",
    )
    compare.add_argument("--samples", type=int, default=2000, help="timed crops per pattern (default: %(default)s)")
    compare.add_argument(
        "--warmup",
        type=int,
        default=COMPARE_LOCAL_DEFAULTS["warmup"],
        help="untimed crops first (default: %(default)s)",
    )
    compare.add_argument(
        "--repeats",
        type=int,
        default=COMPARE_LOCAL_DEFAULTS["repeats"],
        help="timed passes, median kept (default: %(default)s)",
    )
    compare.add_argument("--seed", type=seed, default=COMPARE_LOCAL_DEFAULTS["seed"], help="sampling seed")
    compare.add_argument(
        "--objects",
        default=COMPARE_LOCAL_DEFAULTS["objects"],
        help="object table (Parquet/CSV) for plates without cropbench's table",
    )
    compare.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_store_knobs(compare)
    compare.set_defaults(handler=cmd_compare_layouts)
    writes_tracks(compare, "layouts", "store-layouts")

    formats = commands.add_parser(
        "compare-formats",
        help="convert or read in place: the plate beside its crops converted into training formats",
        description="One record per reader (track 'formats') in OUT/results.jsonl and a table: conversion cost, "
        "size against the plate, random and shuffled-epoch crops/s, break-even epochs.",
    )
    formats.add_argument("--plate", required=True, help="a local plate (any layout)")
    formats.add_argument(
        "--format", action="append", choices=("hdf5", "webdataset", "litdata", "mds"), help="repeatable (default: all)"
    )
    formats.add_argument("--out", default="out/formats", help="output directory (default: %(default)s)")
    formats.add_argument("--work", help="where the crop stores are written (default: OUT/crops)")
    formats.add_argument("--keep", action="store_true", help="keep the crop stores")
    add_crop_size(formats)
    formats.add_argument("--channels", help="comma-separated channel names (default: all)")
    formats.add_argument(
        "--samples", type=int, default=2000, help="random crops timed per reader (default: %(default)s)"
    )
    formats.add_argument(
        "--workers",
        type=whole_number(0, MAX_WORKERS),
        default=2,
        help="DataLoader workers of the epochs (default: %(default)s)",
    )
    formats.add_argument("--batch-size", type=int, default=64, help="batch size of the epochs (default: %(default)s)")
    formats.add_argument("--epochs", type=int, default=2, help="shuffled epochs per reader (default: %(default)s)")
    formats.add_argument(
        "--rechunk",
        action="append",
        metavar="LAYOUT",
        choices=[*OME_ZARR_LAYOUTS, "none"],
        help="also re-chunk the plate into this OME-Zarr layout (timed as a conversion) and read it in place; "
        "repeatable (default: atlas; none: no re-chunking)",
    )
    formats.add_argument(
        "--in-place-run",
        type=whole_number(1, 2**20),
        default=1,
        help="the in-place epochs shuffle runs of this many consecutive objects (one request each on a plate "
        "with a crop atlas); 1: every object on its own (default: %(default)s)",
    )
    formats.add_argument(
        "--shard-mib",
        type=float,
        help=f"shard or chunk size, at most the store's size (default: {DEFAULT_SHARD_MIB:g})",
    )
    formats.add_argument("--objects", help="object table (Parquet/CSV) for plates without cropbench's table")
    formats.add_argument(
        "--latency-ms",
        type=float,
        help="also read each store's epochs from the emulated object store at this median first-byte latency "
        "(nginx in a network namespace; needs root and nginx's Lua module)",
    )
    formats.add_argument("--no-progress", action="store_true", help="no progress bar")
    formats.set_defaults(handler=cmd_compare_formats)
    writes_tracks(formats, "formats")
