"""Options several commands share: the layout names' help line, how a plate in an object store is read,
the types of whole-number options (seeds, sizes, counts) that refuse what is out of range at once, and the
line naming what a command left on disk."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeAlias

from cropbench.config import (
    DEFAULT_COALESCE_GAP_BYTES,
    FORMAT_CODECS,
    LAYOUTS,
    MAX_COALESCE_GAP_BYTES,
    MAX_IN_FLIGHT,
    MAX_RETRIES,
    MAX_SEED,
    ZARR_CLIENTS,
    StoreConfig,
)

#: The subparsers each command group registers its commands on (argparse does not name the type publicly).
Commands: TypeAlias = "argparse._SubParsersAction[Any]"


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


#: ``--seed``: what every generator accepts.
seed = whole_number(0, MAX_SEED)


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


def add_store_knobs(parser: argparse.ArgumentParser) -> None:
    """How a plate in an object store is read (ignored for a local plate); defaults as StoreConfig's."""
    defaults = StoreConfig()
    group = parser.add_argument_group(
        "plates in an object store (s3:// with AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...; http(s)://)"
    )
    group.add_argument(
        "--in-flight",
        type=whole_number(1, MAX_IN_FLIGHT),
        default=defaults.in_flight,
        help="requests kept open at once (%(default)s)",
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
        "--timeout", type=float, default=defaults.timeout_s, help="seconds per request (default: %(default)s)"
    )
    group.add_argument(
        "--connect-timeout",
        type=float,
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
