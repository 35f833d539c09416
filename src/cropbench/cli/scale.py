"""``cropbench scale``: plates at experiment scale, the growth sweep, and layouts out of memory.

The command line's part of :mod:`cropbench.plates.scale`, :mod:`cropbench.tracks.scale` and
:mod:`cropbench.tracks.out_of_memory`: parse, call, print, and write each row to
``OUT/results.jsonl`` as it is measured (with the table as Markdown beside it).
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
from pathlib import Path
from typing import Any

import psutil

from cropbench.cli.options import add_crop_size, seed, whole_number, writes_tracks
from cropbench.config import CELL_PAINTING_CHANNELS, LAYOUTS, MAX_FIELD_SIZE, MAX_WORKERS, layout_by_name
from cropbench.errors import ConfigError
from cropbench.plates.scale import MAX_OBJECTS, ScaleSpec, check_fits_in_memory
from cropbench.records import RESULTS_NAME, Record, read_records

_OBJECTS = whole_number(1, MAX_OBJECTS)

#: Files beside the rows: the growth table and the out-of-memory table, as Markdown.
GROWTH_TABLE_NAME = "growth.md"
OUT_OF_MEMORY_TABLE_NAME = "out_of_memory.md"


def count(text: str) -> int:
    """A whole number of objects, written 1000, 1_000 or 1e3."""
    try:
        return _OBJECTS(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected a whole number of objects from 1 to {MAX_OBJECTS:,} such as 1000 or 1e6, got {text!r}"
        ) from None


def add_scale_commands(commands: Any) -> None:
    """Register ``scale generate``, ``scale sweep`` and ``scale out-of-memory`` on the CLI's subparsers."""
    scale = commands.add_parser(
        "scale",
        help="plates at experiment scale: generate, growth sweep, layouts out of memory",
        description="Plates of up to a million objects, how costs grow with them, and plates larger than memory.",
    )
    actions = scale.add_subparsers(dest="scale_command", required=True, metavar="ACTION")

    generate = actions.add_parser("generate", help="write a scale plate of N objects (streamed, with progress)")
    generate.add_argument("--out", required=True, help="plate directory to write")
    generate.add_argument("--objects", type=count, required=True, help="objects in the plate (up to 2e6)")
    generate.add_argument("--layout", default="default", choices=sorted(LAYOUTS), metavar="NAME", help="named layout")
    generate.add_argument("--force", action="store_true", help="replace a plate cropbench wrote there")
    _add_field_knobs(generate)
    generate.set_defaults(handler=cmd_scale_generate)

    sweep = actions.add_parser("sweep", help="the growth table: each cost against the object count")
    sweep.add_argument("--out", required=True, help="results directory (OUT/results.jsonl, OUT/growth.md)")
    sweep.add_argument("--work", required=True, help="where the plates are written (removed unless --keep)")
    sweep.add_argument("--objects", type=count, nargs="+", default=[10**3, 10**4, 10**5, 10**6], help="object counts")
    sweep.add_argument("--layout", default="default", choices=sorted(LAYOUTS), metavar="NAME", help="named layout")
    add_crop_size(sweep)
    sweep.add_argument("--samples", type=whole_number(1), default=1000, help="Track 1 steady-state samples per access")
    sweep.add_argument(
        "--workers", type=whole_number(0, MAX_WORKERS), default=2, help="DataLoader workers of the Track 2 first batch"
    )
    sweep.add_argument("--keep", action="store_true", help="keep the plates in --work (and reuse them next time)")
    sweep.add_argument("--resume", action="store_true", help="skip the counts OUT/results.jsonl already holds")
    _add_field_knobs(sweep)
    sweep.set_defaults(handler=cmd_scale_sweep)
    writes_tracks(sweep, "scale")

    limited = actions.add_parser("out-of-memory", help="layouts side by side on plates larger than a memory limit")
    limited.add_argument("--out", required=True, help="results directory (OUT/results.jsonl, OUT/out_of_memory.md)")
    limited.add_argument("--work", required=True, help="where the plates are written (removed unless --keep)")
    limited.add_argument(
        "--layouts", nargs="+", default=["default", "tiles", "planes"], metavar="NAME", help="named layouts"
    )
    limited.add_argument(
        "--limit-mib", type=whole_number(1), default=1024, help="memory limit of the reading process, MiB"
    )
    limited.add_argument("--plate-multiple", type=float, default=4.0, help="plate size over the limit (2-8)")
    add_crop_size(limited)
    limited.add_argument("--samples", type=whole_number(1), default=2000, help="random crops timed per layout")
    limited.add_argument("--no-cached", action="store_true", help="skip the same crops with the plate in memory")
    limited.add_argument(
        "--require-cgroup", action="store_true", help="fail instead of falling back to eviction without a cgroup"
    )
    limited.add_argument("--keep", action="store_true", help="keep the plates in --work")
    limited.add_argument("--resume", action="store_true", help="skip the layouts OUT/results.jsonl already holds")
    _add_field_knobs(limited)
    limited.set_defaults(handler=cmd_scale_out_of_memory)
    writes_tracks(limited, "out-of-memory")


def _add_field_knobs(parser: argparse.ArgumentParser) -> None:
    fields = parser.add_argument_group("fields")
    fields.add_argument(
        "--field-size",
        type=whole_number(64, MAX_FIELD_SIZE),
        default=1080,
        help="field edge in pixels (default: %(default)s)",
    )
    fields.add_argument(
        "--channels",
        type=whole_number(1, len(CELL_PAINTING_CHANNELS)),
        default=5,
        help="channels per field (default: %(default)s)",
    )
    fields.add_argument(
        "--distinct-fields",
        type=whole_number(0),
        default=8,
        help="fields rendered and then written in turn (0 = render every field; default: %(default)s)",
    )
    fields.add_argument("--seed", type=seed, default=0, help="generator seed")
    fields.add_argument("--no-progress", action="store_true", help="no progress bar")


def _plate(args: argparse.Namespace, objects: int = 1) -> ScaleSpec:
    """The ScaleSpec of the field knobs (``--field-size``, ``--channels``, ``--distinct-fields``, ``--seed``)."""
    return ScaleSpec(
        objects=objects,
        field_size=args.field_size,
        channels=args.channels,
        distinct_fields=args.distinct_fields,
        seed=args.seed,
    )


def cmd_scale_generate(args: argparse.Namespace) -> int:
    from cropbench.plates.scale import generate_scale_plate

    spec = _plate(args, args.objects)
    layout = layout_by_name(args.layout)
    written = generate_scale_plate(args.out, spec, layout, overwrite=args.force, progress=not args.no_progress)
    print(
        f"wrote {written.path}: {written.fields:,} fields, {written.objects:,} objects, layout {layout.label}, "
        f"{written.raw_bytes / 2**30:.2f} GiB raw -> {written.stored_bytes / 2**30:.2f} GiB on disk "
        f"in {written.write_seconds:.0f} s"
    )
    return 0


def _with_earlier_rows(records: list[Record], out: Path, resume: bool, track: str) -> list[Record]:
    """The rows a table is drawn from: this run's, and after ``--resume`` the rows of ``track`` it skipped,
    read back from ``OUT/results.jsonl`` (the latest row of each case)."""
    if not resume or not (out / RESULTS_NAME).exists():
        return records
    latest = {record.case: record for record in read_records(out / RESULTS_NAME) if record.track == track}
    return list(latest.values())


def _say(message: str, record: Record | None) -> None:
    """Progress on stdout: what is being done, then each row as it is written."""
    print(f"{record.track} {record.case}: row written" if record is not None else message)


def cmd_scale_sweep(args: argparse.Namespace) -> int:
    from cropbench import api
    from cropbench.report.growth import growth_table
    from cropbench.tracks.scale import TRACK, ScaleSweep

    sweep = ScaleSweep(
        objects=tuple(args.objects),
        plate=_plate(args),
        layout=args.layout,
        crop_size=args.crop_size,
        samples=args.samples,
        workers=args.workers,
        seed=args.seed,
    )
    check_fits_in_memory(sweep.spec(max(sweep.objects)))
    out = Path(args.out)
    records = api.sweep_scale(
        sweep, out, args.work, keep=args.keep, bars=not args.no_progress, resume=args.resume, progress=_say
    )
    table = growth_table([record.metrics for record in _with_earlier_rows(records, out, args.resume, TRACK)])
    (out / GROWTH_TABLE_NAME).write_text(table + "\n")
    print(f"\n{table}\n\nrows in {out / RESULTS_NAME}; table in {out / GROWTH_TABLE_NAME}")
    return 0


def _check_machine_holds(limit_bytes: int, plate_bytes: int, work: Path) -> None:
    """Before any plate is written: the limit must be below this machine's memory and the plates
    (``plate_bytes`` in all) must fit on the disk of ``--work``."""
    total = psutil.virtual_memory().total
    if limit_bytes >= total:
        raise ConfigError(
            f"--limit-mib {limit_bytes // 2**20} is not below this machine's memory ({total // 2**20} MiB): "
            "nothing would be out of memory; lower it"
        )
    existing = next(folder for folder in (work.absolute(), *work.absolute().parents) if folder.exists())
    free = shutil.disk_usage(existing).free
    if plate_bytes > free:
        raise ConfigError(
            f"plates of {plate_bytes / 2**30:.1f} GiB (--limit-mib × --plate-multiple) do not fit in the "
            f"{free / 2**30:.1f} GiB free under --work {work}; lower either or choose another --work"
        )


def cmd_scale_out_of_memory(args: argparse.Namespace) -> int:
    from cropbench import api
    from cropbench.report.tables import out_of_memory_table
    from cropbench.tracks.out_of_memory import TRACK, OutOfMemoryComparison

    comparison = OutOfMemoryComparison(
        layouts=tuple(args.layouts),
        limit_bytes=args.limit_mib * 2**20,
        plate_multiple=args.plate_multiple,
        plate=_plate(args),
        crop_size=args.crop_size,
        samples=args.samples,
        seed=args.seed,
        cached=not args.no_cached,
    )
    kept = len(comparison.layouts) if args.keep else 1  # without --keep each plate goes before the next
    _check_machine_holds(comparison.limit_bytes, kept * comparison.target_bytes, Path(args.work))
    check_fits_in_memory(dataclasses.replace(comparison.plate, objects=MAX_OBJECTS))
    out = Path(args.out)
    records = api.compare_out_of_memory(
        comparison,
        out,
        args.work,
        keep=args.keep,
        require_cgroup=args.require_cgroup,
        bars=not args.no_progress,
        resume=args.resume,
        progress=_say,
    )
    rows = _with_earlier_rows(records, out, args.resume, TRACK)
    table = out_of_memory_table([(record.case, record.metrics) for record in rows])
    (out / OUT_OF_MEMORY_TABLE_NAME).write_text(table + "\n")
    print(f"\n{table}\n\nrows in {out / RESULTS_NAME}; table in {out / OUT_OF_MEMORY_TABLE_NAME}")
    return 0


__all__ = ["add_scale_commands", "count"]
