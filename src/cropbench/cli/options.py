"""Options several commands share: the layout names' help line, how a plate in an object store is read,
the types of number options (seeds, sizes, counts, latencies) that refuse what is out of range at once, the
checks of an output path made before anything is measured, and the line naming what a command left on disk."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, TypeAlias

from cropbench.config import (
    DEFAULT_COALESCE_GAP_BYTES,
    DEFAULT_CROP_SIZE,
    FORMAT_CODECS,
    LAYOUTS,
    MAX_COALESCE_GAP_BYTES,
    MAX_CROP_SIZE,
    MAX_IN_FLIGHT,
    MAX_LATENCY_MS,
    MAX_RETRIES,
    MAX_SEED,
    MAX_TIMEOUT_S,
    ZARR_CLIENTS,
    StoreConfig,
)
from cropbench.errors import ConfigError, OutputError
from cropbench.records import iter_records

#: The subparsers each command group registers its commands on (argparse does not name the type publicly).
Commands: TypeAlias = "argparse._SubParsersAction[Any]"


def writes_tracks(parser: argparse.ArgumentParser, *names: str) -> None:
    """Declare the tracks whose rows ``parser``'s command writes (its ``tracks`` default), each a name in
    :data:`cropbench.tracks.TRACKS`: so the commands and the table of tracks are checked against each
    other (every track started by some command, every command's tracks in the table)."""
    from cropbench.tracks import TRACKS

    unknown = [name for name in names if name not in TRACKS]
    if unknown or not names:
        raise ConfigError(f"command {parser.prog!r} declares tracks {list(names)}, not names in TRACKS")
    parser.set_defaults(tracks=names)


def whole_number(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` to ``high`` (written 1000, 1_000 or 1e3), else a usage
    error naming the option and the range, before anything runs."""
    span = f"from {low:,} to {high:,}" if high is not None else f"of at least {low:,}"

    def parse(text: str) -> int:
        cleaned = text.strip().replace("_", "")
        try:
            number: int | None = int(cleaned)
        except ValueError:
            try:
                value = float(cleaned)
            except ValueError:
                value = math.nan
            number = int(value) if math.isfinite(value) and value.is_integer() else None
        if number is None or number < low or (high is not None and number > high):
            raise argparse.ArgumentTypeError(f"expected a whole number {span}, got {text!r}")
        return number

    parse.__name__ = "whole number"  # what argparse names the type in its own messages
    return parse


def finite_number(low: float, high: float | None = None, *, above_low: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number from ``low`` (or, ``above_low``, greater than it) to ``high``, else a
    usage error naming the option and the range, before anything runs (nan, inf and 1e308 included)."""
    lowest = f"greater than {low:g}" if above_low else f"of at least {low:g}"
    span = f"{lowest} and at most {high:g}" if high is not None else lowest

    def parse(text: str) -> float:
        try:
            value = float(text.strip().replace("_", ""))
        except ValueError:
            value = math.nan
        low_ok = value > low if above_low else value >= low
        if not (math.isfinite(value) and low_ok and (high is None or value <= high)):
            raise argparse.ArgumentTypeError(f"expected a finite number {span}, got {text!r}")
        return value

    parse.__name__ = "number"  # what argparse names the type in its own messages
    return parse


def add_crop_size(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, default: int | None = DEFAULT_CROP_SIZE
) -> None:
    """``--crop-size``, the one definition every command shares (None: each case keeps its own)."""
    said = f" (default: {default})" if default is not None else " (default: each case's own)"
    parser.add_argument(
        "--crop-size", type=whole_number(1, MAX_CROP_SIZE), default=default, help=f"crop edge in pixels{said}"
    )


#: ``--seed``: what every generator accepts.
seed = whole_number(0, MAX_SEED)
#: A store's first-byte latency in milliseconds: none to a minute (what the emulated store and the delay proxy take).
latency_ms = finite_number(0, MAX_LATENCY_MS)
#: Requests kept open at once: one to the most a reader holds (a connection and a thread each).
in_flight = whole_number(1, MAX_IN_FLIGHT)


class Distinct(argparse.Action):
    """Several values of one option, each measured once: a repeated value is a usage error naming the option."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: str | None = None
    ) -> None:
        if len(set(values)) < len(values):
            parser.error(f"argument {option}: expected distinct values, got {' '.join(map(str, values))}")
        setattr(namespace, self.dest, values)


def check_output_file(path: Path, option: str, kind: str = "", ours: Callable[[Path], bool] | None = None) -> None:
    """Before anything is measured: ``path`` can be written (not a folder; its nearest existing folder is a
    writable folder, the missing ones are made when it is written) and, where a file is there already, it is
    one this command wrote (``ours``, a ``kind``): someone else's file is refused, never appended to or replaced."""
    if path.is_dir():
        raise ConfigError(f"{option} {path} is a folder; name the file to write")
    if path.exists() or path.is_symlink():
        if not path.is_file():
            raise ConfigError(f"{option} {path} exists and is not a regular file")
        if ours is not None and not ours(path):
            raise ConfigError(
                f"{option} {path} exists and is not {kind} this command wrote (left as it is): choose another {option}"
            )
        return
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise ConfigError(f"{option} {path}: {folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"{option} {path}: cannot write in {folder}")


def check_results_file(path: Path, option: str, tracks: Collection[str]) -> None:
    """:func:`check_output_file` for a results file: where one is there, every row in it is a record of
    ``tracks`` (what this command writes); rows are appended to it."""
    found: set[str] = set()

    def ours(candidate: Path) -> bool:
        try:
            found.update(record.track for record in iter_records(candidate))
        except OutputError:
            return False
        return found <= set(tracks)

    check_output_file(path, option, f"a results file of track {' or '.join(sorted(tracks))}", ours)


def left_behind(path: Path, what: str) -> str | None:
    """One line saying where a command left data on disk and how large it is; None when nothing is there."""
    if not path.is_dir() or path.is_symlink():
        return None
    sizes = [p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink()]
    return f"{what}: {path} ({sum(sizes) / 2**20:.1f} MiB)" if sizes else None


def layout_names_help() -> str:
    """The layout names in one short line: families with a codec suffix are written once."""
    codecs = FORMAT_CODECS["ome-zarr"]
    families = sorted(n for n in LAYOUTS if all(f"{n}-{c}" in LAYOUTS for c in codecs))
    others = [n for n in sorted(LAYOUTS) if n not in families and not any(n.startswith(f"{f}-") for f in families)]
    return f"{', '.join(others)}, or {{{','.join(families)}}}[-{'|-'.join(codecs)}]"


#: A request's deadline in seconds: finite, so every request ends.
_seconds = finite_number(0, MAX_TIMEOUT_S, above_low=True)


def add_store_knobs(parser: argparse.ArgumentParser) -> None:
    """How a plate in an object store is read (ignored for a local plate); defaults as StoreConfig's."""
    defaults = StoreConfig()
    group = parser.add_argument_group(
        "plates in an object store (s3:// with AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...; http(s)://)"
    )
    group.add_argument(
        "--in-flight", type=in_flight, default=defaults.in_flight, help="requests kept open at once (%(default)s)"
    )
    group.add_argument(
        "--coalesce-gap",
        type=whole_number(0, MAX_COALESCE_GAP_BYTES),
        default=None,
        metavar="BYTES",
        help=(
            "byte ranges of a shard closer than this are one request (default: "
            f"{defaults.coalesce_gap_bytes}, or the smaller gap the plate's layout names)"
        ),
    )
    group.add_argument(
        "--timeout", type=_seconds, default=defaults.timeout_s, help="seconds per request (default: %(default)s)"
    )
    group.add_argument(
        "--connect-timeout",
        type=_seconds,
        default=defaults.connect_timeout_s,
        help="seconds to connect (default: %(default)s)",
    )
    group.add_argument(
        "--retries",
        type=whole_number(0, MAX_RETRIES),
        default=defaults.retries,
        help="retries of a failed request (default: %(default)s)",
    )
    group.add_argument(
        "--latency-ms",
        type=latency_ms,
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


def store_config(args: argparse.Namespace) -> StoreConfig:
    """The store settings the options of :func:`add_store_knobs` name."""
    gap = args.coalesce_gap  # given: read with exactly this gap, whatever the plate's layout names
    return StoreConfig(
        in_flight=args.in_flight,
        coalesce_gap_bytes=DEFAULT_COALESCE_GAP_BYTES if gap is None else gap,
        layout_gap=gap is None,
        timeout_s=args.timeout,
        connect_timeout_s=args.connect_timeout,
        retries=args.retries,
        latency_ms=args.latency_ms,
        zarr_client=args.zarr_client,
        anonymous=args.anonymous,
    )
