"""Command line: parse, then delegate. User errors print one line and exit with code 2."""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from tqdm import tqdm

from cropbench.config import (
    DECODE_PATHS,
    DEFAULT_CHUNK_CACHE_BYTES,
    FORMAT_CODECS,
    LAYOUTS,
    OUTPUT_DTYPES,
    TRANSFORM_TIERS,
    ZARR_CLIENTS,
    CropOverrides,
    LayoutSpec,
    PlateSpec,
    StoreConfig,
    layout_by_name,
    plate_preset,
)
from cropbench.errors import ConfigError, CropbenchError
from cropbench.metrics import SAMPLES_PER_S
from cropbench.plates.generate import GeneratedPlate
from cropbench.records import CSV_NAME, RESULTS_NAME, Record, read_records, write_csv
from cropbench.scale_commands import add_scale_commands

EXIT_USER_ERROR = 2


def _add_plate_knobs(parser: argparse.ArgumentParser) -> None:
    _add_size_knobs(parser)
    _add_layout_knobs(parser)


def _add_size_knobs(parser: argparse.ArgumentParser) -> None:
    size = parser.add_argument_group("plate size (override the preset)")
    size.add_argument("--rows", type=int, help="well rows (A, B, ...)")
    size.add_argument("--columns", type=int, help="well columns (1, 2, ...)")
    size.add_argument("--fields", type=int, dest="fields_per_well", help="fields (sites) per well")
    size.add_argument("--channels", type=int, help="channels per field (5 = Cell Painting, up to 8)")
    size.add_argument("--height", type=int, dest="field_height", help="field height in pixels")
    size.add_argument("--width", type=int, dest="field_width", help="field width in pixels")
    size.add_argument("--cells", type=int, dest="cells_per_field", help="cells per field (about)")
    size.add_argument("--seed", type=int, help="generator seed")
    size.add_argument("--name", help="plate name")
    size.add_argument(
        "--ram-fraction",
        type=float,
        help="grow fields per well until the raw plate is this fraction of RAM (e.g. 1.5 for cold runs)",
    )


def layout_names_help() -> str:
    """The layout names in one short line: families with a codec suffix are written once."""
    codecs = FORMAT_CODECS["ome-zarr"]
    families = sorted(n for n in LAYOUTS if all(f"{n}-{c}" in LAYOUTS for c in codecs))
    others = [n for n in sorted(LAYOUTS) if n not in families and not any(n.startswith(f"{f}-") for f in families)]
    return f"{', '.join(others)}, or {{{','.join(families)}}}[-{'|-'.join(codecs)}]"


def _add_layout_knobs(parser: argparse.ArgumentParser) -> None:
    layout = parser.add_argument_group("layout on disk")
    layout.add_argument(
        "--layout",
        default="default",
        choices=sorted(LAYOUTS),
        metavar="NAME",
        help=f"named layout (default: %(default)s): {layout_names_help()}",
    )
    layout.add_argument("--chunk", type=int, dest="chunk_yx", help="chunk edge in y and x (0 = whole plane)")
    layout.add_argument("--channels-per-chunk", type=int, help="channels per chunk (0 = all)")
    layout.add_argument(
        "--codec",
        choices=sorted({c for codecs in FORMAT_CODECS.values() for c in codecs}),
        help="codec (ome-zarr: none, blosc-lz4, blosc-zstd, zstd; tiff: none, zlib)",
    )
    layout.add_argument("--clevel", type=int, help="compression level 1-9")
    layout.add_argument(
        "--shard", type=int, dest="shard_yx", help="zarr v3 shard edge (-1 = one shard per field, 0 = off)"
    )


def _plate_spec(args: argparse.Namespace) -> PlateSpec:
    from cropbench.plates.generate import spec_for_ram_fraction

    knobs = (
        "rows",
        "columns",
        "fields_per_well",
        "channels",
        "field_height",
        "field_width",
        "cells_per_field",
        "seed",
        "name",
    )
    overrides = {k: getattr(args, k) for k in knobs if getattr(args, k) is not None}
    spec = dataclasses.replace(plate_preset(args.preset), **overrides)
    return spec_for_ram_fraction(spec, args.ram_fraction) if args.ram_fraction is not None else spec


def _layout_spec(args: argparse.Namespace) -> LayoutSpec:
    knobs = ("chunk_yx", "channels_per_chunk", "codec", "clevel", "shard_yx")
    overrides = {k: getattr(args, k) for k in knobs if getattr(args, k) is not None}
    return dataclasses.replace(layout_by_name(args.layout), **overrides)


def cmd_generate(args: argparse.Namespace) -> int:
    from cropbench.plates.generate import generate_plate

    spec, layout = _plate_spec(args), _layout_spec(args)
    plate = generate_plate(args.out, spec, layout, overwrite=args.force, progress=not args.no_progress)
    _print_written(plate, layout)
    return 0


def _print_written(plate: GeneratedPlate, layout: LayoutSpec) -> None:
    print(
        f"wrote {plate.path}: {plate.fields} fields, {plate.objects} objects, layout {layout.label}, "
        f"{plate.raw_bytes / 2**20:.1f} MiB raw -> {plate.stored_bytes / 2**20:.1f} MiB on disk "
        f"(ratio {plate.compression_ratio:.2f}) in {plate.write_seconds:.1f} s"
    )


def cmd_import(args: argparse.Namespace) -> int:
    from cropbench.plates.importing import ImportOptions, import_plate

    layout = _layout_spec(args)
    options = ImportOptions(
        channels=ImportOptions.parse_channels(args.channel),
        compartment=args.compartment,
        plate=args.plate_name,
        name=args.name,
        plane=args.plane,
        labels=tuple(args.label or ()),
        pixel_size_um=args.pixel_size,
    )
    plate = import_plate(
        args.table, args.images, args.out, layout, options, overwrite=args.force, progress=not args.no_progress
    )
    _print_written(plate, layout)
    return 0


_INTERRUPTED = threading.Event()


def _on_interrupt(signum: int, frame: object) -> None:
    """Ctrl-C raises KeyboardInterrupt as usual and is remembered: one that lands in a destructor or a
    callback (where Python reports and drops exceptions) still stops the run at the next case."""
    _INTERRUPTED.set()
    raise KeyboardInterrupt


class _ProgressBar:
    """The API's progress callback as a tqdm bar (messages as postfix, a tick per record), opened on first use
    so a request rejected before anything runs prints only its error."""

    def __init__(self, enabled: bool, desc: str, total: int | None = None) -> None:
        self.enabled, self.desc, self.total = enabled, desc, total
        self.bar: tqdm | None = None

    def __call__(self, message: str, record: Record | None) -> None:
        if _INTERRUPTED.is_set():
            raise KeyboardInterrupt
        if not self.enabled:
            return
        if self.bar is None:
            self.bar = tqdm(total=self.total, desc=self.desc, unit="case")
        if record is None:
            self.bar.set_postfix_str(message[:60])
        else:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def cmd_compare_layouts(args: argparse.Namespace) -> int:
    from cropbench import api
    from cropbench.formats.sources import is_url

    if is_url(args.plate):
        return _compare_layouts_in_store(args)
    from cropbench.report.summary import summary_table
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
    bar = _ProgressBar(not args.no_progress, "layouts", len(comparison.ordered()))
    try:
        records = api.compare_layouts(
            args.plate, comparison, out_dir, work_dir=args.work, keep=args.keep, objects=args.objects, progress=bar
        )
    finally:
        bar.close()
    print(summary_table(records))
    _plot(out_dir / RESULTS_NAME, out_dir / "plots")
    return 0


#: compare-layouts options that apply to a local plate only, with their defaults (the parser's too):
#: over a store, a value other than the default is an error rather than silently ignored.
COMPARE_LOCAL_DEFAULTS: dict[str, Any] = {"decode": "direct", "warmup": 200, "repeats": 3, "seed": 0, "objects": None}


def _compare_layouts_in_store(args: argparse.Namespace) -> int:
    """compare-layouts --plate URL: requests/crop and crops/s per layout, each served on loopback behind
    --latency-ms (rows of track 'store-layouts' in OUT/results.jsonl, a table on stdout)."""
    from cropbench import api
    from cropbench.tracks.stores import STORE_LAYOUTS, StoreLayouts, layouts_table

    ignored = [f"--{name}" for name, default in COMPARE_LOCAL_DEFAULTS.items() if getattr(args, name) != default]
    if ignored:
        raise ConfigError(
            f"compare-layouts --plate {args.plate}: {', '.join(ignored)} apply to a local plate only; "
            "over a store every layout is measured with direct and zarr (--samples, --crop-size, --layout, "
            "--latency-ms, --in-flight set the run)"
        )
    settings = StoreLayouts(
        latency_ms=args.latency_ms,
        in_flight=args.in_flight,
        count_crops=args.samples,
        crops=args.samples,
        zarr_crops=max(args.samples // 8, 1),  # zarr-python pays several round trips per crop
        crop_size=args.crop_size,
    )
    layouts = args.layout or STORE_LAYOUTS
    bar = _ProgressBar(not args.no_progress, "layouts", len(layouts))
    try:
        records = api.compare_layouts_in_store(
            args.plate,
            layouts,
            settings,
            args.out,
            work_dir=args.work,
            keep=args.keep,
            store=_store_config(args),
            progress=bar,
        )
    finally:
        bar.close()
    print(layouts_table(records))
    return 0


def cmd_compare_formats(args: argparse.Namespace) -> int:
    """compare-formats: the plate read in place beside its crops converted into each training format."""
    from cropbench import api
    from cropbench.report.formats_figure import write_formats_report
    from cropbench.tracks.conversion import FormatComparison, Formats, formats_table

    comparison = FormatComparison(
        formats=tuple(args.format or FormatComparison().formats),
        crop_size=args.crop_size,
        channels=tuple(args.channels.split(",")) if args.channels else None,
        samples=args.samples,
        workers=args.workers,
        batch_size=args.batch_size,
        epochs=args.epochs,
        shard_bytes=int(args.shard_mib * 2**20),
        remote_latency_ms=args.latency_ms,
    )
    out_dir = Path(args.out)
    track = Formats(comparison, Path(args.work) if args.work else out_dir / "crops", keep=args.keep)
    bar = _ProgressBar(not args.no_progress, "formats", len(comparison.readers()))
    try:
        records = api.run(args.plate, [track], out_dir=out_dir, objects=args.objects, progress=bar)
    finally:
        bar.close()
    print(formats_table(records))
    for path in write_formats_report(records, out_dir):
        print(f"wrote {path}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from cropbench import api
    from cropbench.report.summary import summary_table
    from cropbench.tracks.distributed import check_timeout, launch_rank

    if args.rank_timeout is not None:
        check_timeout(args.rank_timeout)  # before any rank starts or anything is measured
    if args.ranks is not None:
        from cropbench.tracks.distributed import launch_local

        launch_local(args.ranks, _without_ranks(args.argv))
        return 0
    out_dir = Path(args.out)
    tracks = [*(args.track or ([] if args.peers else ["1"])), *(["peers"] if args.peers else [])]
    leader = launch_rank() == 0  # under torchrun only rank 0 reports (and writes)
    bar = _ProgressBar(not args.no_progress and leader, "cases")
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
            store=_store_config(args),
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
    print(summary_table(records))
    if args.repeats > 1:
        from cropbench.report.stability import format_repeat_summary, summarise_repeats

        print("\n" + format_repeat_summary(summarise_repeats(records)))
    print(f"\n{len(records)} rows appended to {out_dir / RESULTS_NAME}; CSV at {out_dir / CSV_NAME}")
    if args.plot:
        answer = _report(records, out_dir, _plot(out_dir / RESULTS_NAME, out_dir / "plots"), args.preset)
    else:
        from cropbench.report.verdict import verdict

        answer = verdict(records, args.preset).text()
    print(f"\n{answer}")
    return 0


def _add_crop_knobs(parser: argparse.ArgumentParser) -> None:
    """Crop knobs fixed for every case of the run, over what the preset sets (``CropOverrides``)."""
    group = parser.add_argument_group("crop knobs (override the preset for every case)")
    group.add_argument("--crop-size", type=int, help="crop edge in pixels")
    group.add_argument("--decode", choices=DECODE_PATHS, help="decode path")
    group.add_argument("--dtype", choices=OUTPUT_DTYPES, help="output dtype")
    group.add_argument("--tier", choices=TRANSFORM_TIERS, help="transform tier")
    group.add_argument(
        "--chunk-cache-bytes",
        type=int,
        metavar="BYTES",
        help=f"decoded-chunk cache per reader (default: {DEFAULT_CHUNK_CACHE_BYTES}, unless the preset sets one)",
    )
    group.add_argument(
        "--decode-threads", type=int, metavar="N", help="threads that read and decode chunks in one process"
    )


def _crop_overrides(args: argparse.Namespace) -> CropOverrides:
    knobs = ("crop_size", "decode", "dtype", "tier", "chunk_cache_bytes", "decode_threads")
    return CropOverrides(**{knob: getattr(args, knob) for knob in knobs})


def _add_store_knobs(parser: argparse.ArgumentParser) -> None:
    """How a plate in an object store is read (ignored for a local plate); defaults as StoreConfig's."""
    defaults = StoreConfig()
    group = parser.add_argument_group(
        "plates in an object store (s3:// with AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...; http(s)://)"
    )
    group.add_argument(
        "--in-flight", type=int, default=defaults.in_flight, help="requests kept open at once (%(default)s)"
    )
    group.add_argument(
        "--coalesce-gap",
        type=int,
        default=defaults.coalesce_gap_bytes,
        metavar="BYTES",
        help="byte ranges of a shard closer than this are one request (default: %(default)s)",
    )
    group.add_argument(
        "--timeout", type=float, default=defaults.timeout_s, help="seconds per request (default: %(default)s)"
    )
    group.add_argument(
        "--connect-timeout",
        type=float,
        default=defaults.connect_timeout_s,
        help="seconds to connect (default: %(default)s)",
    )
    group.add_argument(
        "--retries", type=int, default=defaults.retries, help="retries of a failed request (default: %(default)s)"
    )
    group.add_argument(
        "--latency-ms",
        type=float,
        default=defaults.latency_ms,
        help="inject this delay per request with a loopback proxy (http:// endpoints; default: %(default)s)",
    )
    group.add_argument(
        "--zarr-client",
        choices=ZARR_CLIENTS,
        default=defaults.zarr_client,
        help="zarr-python's store for decode 'zarr' (default: %(default)s)",
    )
    group.add_argument("--anonymous", action="store_true", help="unsigned requests even with credentials set")


def _store_config(args: argparse.Namespace) -> StoreConfig:
    return StoreConfig(
        in_flight=args.in_flight,
        coalesce_gap_bytes=args.coalesce_gap,
        timeout_s=args.timeout,
        connect_timeout_s=args.connect_timeout,
        retries=args.retries,
        latency_ms=args.latency_ms,
        zarr_client=args.zarr_client,
        anonymous=args.anonymous,
    )


def cmd_upload(args: argparse.Namespace) -> int:
    from cropbench.formats.sources import upload_plate

    total = upload_plate(Path(args.plate), args.url, _store_config(args))
    print(f"uploaded {args.plate} to {args.url} ({total / 2**20:.1f} MiB)")
    return 0


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


def _plot(results: Path, out_dir: Path, all_runs: bool = False) -> list[Path]:
    from cropbench.report.plots import plot_results, runs_in

    records = read_records(results)
    figures = plot_results(records, out_dir, all_runs=all_runs)
    for path in figures:
        print(f"wrote {path}")
    runs = len(runs_in(records))
    if runs > 1 and not all_runs:
        print(f"figures show each track's latest run; {results} holds {runs} runs (plot --all-runs overlays them)")
    return figures


def _report(records: Sequence[Record], out_dir: Path, figures: Sequence[Path], preset: str | None) -> str:
    """Write OUT/report.html (verdict, figures, rows, environment); returns the verdict's text."""
    from cropbench.report.html import write_report
    from cropbench.report.verdict import verdict

    answer = verdict(records, preset)
    print(f"report (verdict, figures, rows, environment): {write_report(records, out_dir, figures, answer=answer)}")
    return answer.text()


def cmd_plot(args: argparse.Namespace) -> int:
    results = Path(args.results)
    _plot(results, Path(args.out) if args.out else results.parent / "plots", all_runs=args.all_runs)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Figures, OUT/report.html and the verdict for an existing results file."""
    from cropbench.report.html import write_report
    from cropbench.report.plots import latest_runs
    from cropbench.report.verdict import verdict

    results = Path(args.results)
    out_dir = Path(args.out) if args.out else results.parent
    records = read_records(results)
    if not records:
        raise ConfigError(f"{results} holds no rows: nothing to report (run 'cropbench run --out DIR' first)")
    figures = _plot(results, out_dir / "plots")
    answer = verdict(latest_runs(records))  # each track's latest run, as the figures show
    print(f"report (verdict, figures, rows, environment): {write_report(records, out_dir, figures, answer=answer)}")
    print(f"\n{answer.text()}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    path = write_csv(read_records(args.results), args.csv)
    print(f"wrote {path}")
    return 0


def cmd_summary(args: argparse.Namespace) -> int:
    from cropbench.report.plots import latest_runs
    from cropbench.report.stability import format_repeat_summary, numeric_metrics, summarise_repeats
    from cropbench.report.verdict import verdict

    records = read_records(args.results)
    known = numeric_metrics(records)
    if args.metric not in known:
        close = [m for m in known if args.metric[:6] in m][:8] or known[:8]
        raise ConfigError(
            f"--metric {args.metric!r} is in no row of {args.results}; "
            f"try {', '.join(close)} ({len(known)} numeric metrics in all)"
        )
    print(format_repeat_summary(summarise_repeats(records, args.metric)))
    print(f"\n{verdict(latest_runs(records)).text()}")
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    from cropbench.measure import environment

    print(json.dumps(environment.collect(args.path), indent=2, default=str))
    return 0


def cmd_smoke(args: argparse.Namespace) -> int:
    """The main job: a small synthetic plate, every track's smoke preset, summary, CSV and plots."""
    from cropbench import api
    from cropbench.report.summary import summary_table

    out_dir = Path(args.out)
    bar = _ProgressBar(not args.no_progress, "cases")
    try:
        done = api.smoke(out_dir, force=args.force, generation_progress=not args.no_progress, progress=bar)
    finally:
        bar.close()
    if done.generated is not None:
        generated = done.generated
        print(
            f"generated {done.plate} ({generated.objects} objects, compression ratio {generated.compression_ratio:.2f})"
        )
    print(summary_table(done.records))
    figures = _plot(out_dir / RESULTS_NAME, out_dir / "plots")
    print(f"\nrows in {out_dir / RESULTS_NAME} and {out_dir / CSV_NAME}")
    print(f"\n{_report(done.records, out_dir, figures, 'smoke')}")
    return 0


def cmd_realism(args: argparse.Namespace) -> int:
    from cropbench.plates.realism import synthetic_stats, tiff_stats

    rows = [synthetic_stats(plate_preset(args.preset), args.fields)]
    rows += [tiff_stats(folder) for folder in args.tiffs]
    for row in rows:
        print(
            f"{row.source}: {row.images} planes, zlib-1 ratio {row.zlib1_ratio_mean:.2f} "
            f"({row.zlib1_ratio_min:.2f}-{row.zlib1_ratio_max:.2f}), median {row.median_intensity:.0f}, "
            f"p99 {row.p99_intensity:.0f}, {row.distinct_values_per_image:.0f} distinct values per plane"
        )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="cropbench",
        description="Benchmark single-cell crop loading from OME-Zarr plates into PyTorch.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    generate = commands.add_parser(
        "generate",
        help="write a realistic synthetic OME-Zarr plate",
        description="Write a seeded synthetic Cell Painting plate (OME-Zarr HCS).",
    )
    generate.add_argument("--out", required=True, help="plate directory to write (e.g. data/plate.zarr)")
    generate.add_argument("--preset", default="smoke", choices=("smoke", "full"), help="plate size preset")
    generate.add_argument("--force", action="store_true", help="replace an existing plate")
    generate.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_plate_knobs(generate)
    generate.set_defaults(handler=cmd_generate)

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
        metavar="1|2|3|remote|targets",
        help="track to run: 1 Dataset, 2 DataLoader, 3 end-to-end, remote (requests/crop and loader crops/s of a "
        "plate in a store), targets (the direct reader over the fetch ceiling and the peers, interleaved) "
        "(repeatable; default 1)",
    )
    run.add_argument(
        "--preset",
        default="smoke",
        choices=("smoke", "full", "gpu", "gpu-demand", "overhead"),
        help="case grid (gpu: the GPU check, Track 2 supply at batch 256 and Track 3 worker searches "
        "on CUDA; gpu-demand: Track 3 only, compute-only images/s on CUDA; overhead: Track 2 only, "
        "uint16 batches/s through the DataLoader over Track 1's batched rate at the same threads)",
    )
    run.add_argument("--out", default="out", help="output directory (default: %(default)s)")
    run.add_argument("--samples", type=int, help="steady-state samples per case (overrides the preset)")
    run.add_argument("--repeats", type=int, default=1, help="repeat each case with seed+repeat")
    run.add_argument("--resume", action="store_true", help="skip cases already in OUT/results.jsonl")
    run.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads (0 = torch default)")
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
        type=int,
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
    _add_store_knobs(run)
    run.add_argument(
        "--local-plate",
        metavar="PATH",
        help="the same plate on local disk, beside a plate URL: Track 1 measures each case on it too and "
        "the store's rows carry ratio_to_local",
    )
    run.set_defaults(handler=cmd_run)

    importer = commands.add_parser(
        "import",
        help="turn a CellProfiler/CytoTable table and its TIFF fields into a plate",
        description="Import a CellProfiler or CytoTable single-cell table (Parquet or CSV) and the folder of "
        "per-channel TIFF fields into a plate (any layout) with cropbench's object table.",
    )
    importer.add_argument("--table", required=True, help="single-cell table, Parquet or CSV")
    importer.add_argument("--images", required=True, help="folder of the field images (TIFF)")
    importer.add_argument("--out", required=True, help="plate directory to write")
    importer.add_argument(
        "--channel",
        action="append",
        metavar="SOURCE[=NAME]",
        help="channel to import, optionally renamed (repeatable, in order; default: all)",
    )
    importer.add_argument(
        "--compartment",
        help="compartment of centroids and boxes (default: first of Nuclei, Cells, Cytoplasm in the table)",
    )
    importer.add_argument("--plate", dest="plate_name", help="plate to import when the table holds several")
    importer.add_argument("--name", help="plate name (default: the table's plate)")
    importer.add_argument("--plane", type=int, default=1, help="z plane of Phenix-style files (default: 1)")
    importer.add_argument(
        "--label",
        action="append",
        metavar="COLUMN",
        help="table column to keep in the object table as a training label (repeatable; e.g. "
        "Metadata_pert_iname; strings get class ids listed in cropbench_labels.json)",
    )
    importer.add_argument(
        "--pixel-size",
        type=float,
        metavar="MICROMETRES",
        help="micrometres per pixel (default: the table's Image_Metadata_ImageResolutionX/Y; else left unknown)",
    )
    importer.add_argument("--force", action="store_true", help="replace an existing plate")
    importer.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_layout_knobs(importer)
    importer.set_defaults(handler=cmd_import)

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
    compare.add_argument("--crop-size", type=int, default=96, help="crop edge in pixels (default: %(default)s)")
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
    compare.add_argument("--seed", type=int, default=COMPARE_LOCAL_DEFAULTS["seed"], help="sampling seed")
    compare.add_argument(
        "--objects",
        default=COMPARE_LOCAL_DEFAULTS["objects"],
        help="object table (Parquet/CSV) for plates without cropbench's table",
    )
    compare.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_store_knobs(compare)
    compare.set_defaults(handler=cmd_compare_layouts)

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
    formats.add_argument("--crop-size", type=int, default=96, help="crop edge in pixels (default: %(default)s)")
    formats.add_argument("--channels", help="comma-separated channel names (default: all)")
    formats.add_argument(
        "--samples", type=int, default=2000, help="random crops timed per reader (default: %(default)s)"
    )
    formats.add_argument(
        "--workers", type=int, default=2, help="DataLoader workers of the epochs (default: %(default)s)"
    )
    formats.add_argument("--batch-size", type=int, default=64, help="batch size of the epochs (default: %(default)s)")
    formats.add_argument("--epochs", type=int, default=2, help="shuffled epochs per reader (default: %(default)s)")
    formats.add_argument("--shard-mib", type=float, default=64, help="shard or chunk size (default: %(default)s)")
    formats.add_argument("--objects", help="object table (Parquet/CSV) for plates without cropbench's table")
    formats.add_argument(
        "--latency-ms",
        type=float,
        help="also read each store's epochs from a loopback S3 server (moto) adding this latency per request",
    )
    formats.add_argument("--no-progress", action="store_true", help="no progress bar")
    formats.set_defaults(handler=cmd_compare_formats)

    upload = commands.add_parser(
        "upload",
        help="put a plate (any layout folder) into an S3 bucket",
        description="Upload every file of PLATE under URL (s3://bucket/prefix/plate.zarr), with a key index "
        "last; endpoint and credentials from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY.",
    )
    upload.add_argument("plate", help="local plate folder")
    upload.add_argument("url", help="s3://bucket/prefix/plate.zarr")
    _add_store_knobs(upload)
    upload.set_defaults(handler=cmd_upload)

    plot = commands.add_parser("plot", help="draw figures from a results file")
    plot.add_argument("results", help="results.jsonl")
    plot.add_argument("--out", help="directory for PNGs (default: plots/ beside the results)")
    plot.add_argument(
        "--all-runs",
        action="store_true",
        help="overlay every run in the file, each labelled with its run id (default: each track's latest run)",
    )
    plot.set_defaults(handler=cmd_plot)

    report = commands.add_parser(
        "report",
        help="write report.html, figures and the verdict for a results file",
        description="Draw the figures of RESULTS into DIR/plots, write DIR/report.html (one page: verdict, figures, "
        "every row, environment) and print the verdict. The verdict and figures cover each track's latest run; "
        "the page lists every row.",
    )
    report.add_argument("results", help="results.jsonl")
    report.add_argument("--out", metavar="DIR", help="folder for report.html and plots/ (default: beside the results)")
    report.set_defaults(handler=cmd_report)

    export = commands.add_parser("export", help="export a results file as CSV")
    export.add_argument("results", help="results.jsonl")
    export.add_argument("--csv", required=True, help="CSV file to write")
    export.set_defaults(handler=cmd_export)

    summary = commands.add_parser(
        "summary", help="median, 95%% interval and stability warnings over repeats, then the verdict"
    )
    summary.add_argument("results", help="results.jsonl")
    summary.add_argument(
        "--metric",
        default=SAMPLES_PER_S,
        help="numeric metric to summarise, e.g. samples_per_s, p95_ms, images_per_s, "
        "data_wait_fraction (default: %(default)s)",
    )
    summary.set_defaults(handler=cmd_summary)

    env = commands.add_parser("env", help="print the environment metadata a record carries")
    env.add_argument("--path", help="also describe the storage holding this path")
    env.set_defaults(handler=cmd_env)

    realism = commands.add_parser("realism", help="compare synthetic fields with real TIFFs (compressibility)")
    realism.add_argument("tiffs", nargs="*", help="folders of real single-channel TIFF fields")
    realism.add_argument("--preset", default="full", choices=("smoke", "full"), help="synthetic field preset")
    realism.add_argument("--fields", type=int, default=3, help="synthetic fields to render")
    realism.set_defaults(handler=cmd_realism)

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
    add_scale_commands(commands)
    return parser


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line with a hint, like every other user error (its subcommands inherit it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USER_ERROR, f"cropbench: error: {message} (see '{self.prog} --help')\n")


def one_line(error: BaseException) -> str:
    """The cause in one line: a DataLoader worker's error is unwrapped from torch's traceback text."""
    text = str(error).strip()
    if "Original Traceback" in text:  # torch re-raises a worker's exception with its whole traceback
        last = text.splitlines()[-1]
        text = last.split(": ", 1)[1] if ": " in last and "Error" in last.split(": ", 1)[0] else last
    if isinstance(error, OSError) and error.strerror:
        names = [str(n) for n in (error.filename, error.filename2) if n]
        text = f"{error.strerror}: {' -> '.join(names)}" if names else error.strerror
    lines = text.splitlines()
    return lines[0] if lines else type(error).__name__


def _format_warning(message: Warning | str, category: type[Warning], *_: object, **__: object) -> str:
    return f"cropbench: warning: {message}\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what --ranks hands on to each rank
    warnings.formatwarning = _format_warning
    _INTERRUPTED.clear()
    on_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, _on_interrupt) if on_main_thread else None
    try:
        status = int(args.handler(args))
        if _INTERRUPTED.is_set():
            raise KeyboardInterrupt
        return status
    except (CropbenchError, OSError) as error:  # OSError: a user's path (missing, read-only, disk full)
        print(f"cropbench: error: {one_line(error)}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("cropbench: interrupted; every finished row is kept", file=sys.stderr)
        return 130
    finally:
        if on_main_thread:
            signal.signal(signal.SIGINT, previous)


__all__ = ["build_parser", "main"]
