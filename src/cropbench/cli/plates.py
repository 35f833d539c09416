"""Commands that make or move plates: ``generate``, ``import``, ``upload`` and ``realism``."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from cropbench.cli.options import Commands, add_store_knobs, layout_names_help, seed, store_config
from cropbench.config import FORMAT_CODECS, LAYOUTS, LayoutSpec, PlateSpec, layout_by_name, plate_preset
from cropbench.plates.generate import GeneratedPlate


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
    size.add_argument("--seed", type=seed, help="generator seed")
    size.add_argument("--name", help="plate name")
    size.add_argument(
        "--ram-fraction",
        type=float,
        help="grow fields per well until the raw plate is this fraction of RAM (e.g. 1.5 for cold runs)",
    )


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


def cmd_upload(args: argparse.Namespace) -> int:
    from cropbench.formats.sources import upload_plate

    total = upload_plate(Path(args.plate), args.url, store_config(args))
    print(f"uploaded {args.plate} to {args.url} ({total / 2**20:.1f} MiB)")
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


def add_plate_commands(commands: Commands) -> None:
    """Register ``generate``, ``import``, ``upload`` and ``realism``."""
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

    upload = commands.add_parser(
        "upload",
        help="put a plate (any layout folder) into an S3 bucket",
        description="Upload every file of PLATE under URL (s3://bucket/prefix/plate.zarr), with a key index "
        "last; endpoint and credentials from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY.",
    )
    upload.add_argument("plate", help="local plate folder")
    upload.add_argument("url", help="s3://bucket/prefix/plate.zarr")
    add_store_knobs(upload)
    upload.set_defaults(handler=cmd_upload)

    realism = commands.add_parser("realism", help="compare synthetic fields with real TIFFs (compressibility)")
    realism.add_argument("tiffs", nargs="*", help="folders of real single-channel TIFF fields")
    realism.add_argument("--preset", default="full", choices=("smoke", "full"), help="synthetic field preset")
    realism.add_argument("--fields", type=int, default=3, help="synthetic fields to render")
    realism.set_defaults(handler=cmd_realism)
