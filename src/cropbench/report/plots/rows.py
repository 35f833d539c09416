"""Which rows the figures draw and how they name them: each track's required metrics, runs, labels."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from typing import Any

from cropbench import metrics as m
from cropbench.records import Record
from cropbench.report.text import FIGURE_LABEL_CHARS, figure_label
from cropbench.report.tracks import finite, report_of

#: Metrics the figures read as a list of finite numbers, as a flag, as text; every other metric they
#: read (a track's ``figure_metrics``, :mod:`cropbench.report.tracks`) is a finite number. Missing or
#: None is always allowed.
FIGURE_LISTS = frozenset(
    {
        m.QUANTILES_MS,
        m.WARMUP_MS,
        m.FIRST_PASS_CURVE_MS,
        m.TRIED_WORKERS,
        m.DATA_WAIT_FRACTION_BY_WORKERS,
        m.IMAGES_PER_S_BY_WORKERS,
    }
)
FIGURE_FLAGS = frozenset({m.EVICTION_VERIFIED})
FIGURE_TEXTS = frozenset({m.SKIP_REASON, m.VALIDITY_FLAGS})
#: Read by the figures beside each track's ``figure_metrics`` (the CDF's calls per item, the first-batch bars...).
FIGURE_EXTRAS = (m.ITEMS_PER_CALL, m.COUNT, m.P95_MS, m.P50_MS, m.STEP_P50_MS, m.IMAGES_PER_S, m.MIN_WORKERS)


def wrongly_typed(record: Record) -> str | None:
    """The first metric the row's figures read that holds the wrong kind of value (None when all fit):
    a row from elsewhere may hold text, NaN or a list where a figure needs a number."""
    metrics = record.metrics
    for name in (*report_of(record.track).figure_metrics, *FIGURE_EXTRAS):
        value = metrics.get(name)
        if value is None or name in FIGURE_TEXTS:
            continue
        if name in FIGURE_LISTS:
            fits = isinstance(value, list) and all(finite(item) for item in value)
        elif name in FIGURE_FLAGS:
            fits = isinstance(value, bool)
        else:
            fits = finite(value)
        if not fits:
            return name
    lists = [
        metrics.get(name) for name in (m.TRIED_WORKERS, m.DATA_WAIT_FRACTION_BY_WORKERS, m.IMAGES_PER_S_BY_WORKERS)
    ]
    if (
        all(isinstance(value, list) for value in lists)
        and len({len(value) for value in lists if value is not None}) > 1
    ):
        return m.TRIED_WORKERS
    return None


def drawable(records: Sequence[Record]) -> list[Record]:
    """The rows the figures can draw; one warning per track names how many were left out and why."""
    kept: list[Record] = []
    left_out: list[Record] = []
    mistyped: list[tuple[Record, str]] = []
    for record in records:
        wrong = wrongly_typed(record)
        if wrong is not None:
            mistyped.append((record, wrong))
            continue
        test = report_of(record.track).drawable
        (kept if test is None or test(record.metrics) else left_out).append(record)
    if mistyped:
        record, name = mistyped[0]
        warnings.warn(
            f"{len(mistyped)} {'row holds' if len(mistyped) == 1 else 'rows hold'} a value no figure can draw: "
            f"left out (first: {row_label(record)}, {name})",
            stacklevel=2,
        )
    for track in dict.fromkeys(r.track for r in left_out):
        rows = [r for r in left_out if r.track == track]
        warnings.warn(
            f"{len(rows)} track {track} {'row lacks' if len(rows) == 1 else 'rows lack'} the metrics its "
            "figures draw: left out "
            f"(first: {row_label(rows[0])})",
            stacklevel=2,
        )
    return kept


def rows_of(records: Sequence[Record], track: str) -> list[Record]:
    """The rows of one track, in their order."""
    return [r for r in records if r.track == track]


def row_label(record: Record) -> str:
    """The row's case, with its repeat number on repeats after the first, as a figure draws it."""
    return figure_label(record.case) + (f" #{record.repeat}" if record.repeat else "")


def runs_in(records: Sequence[Record]) -> list[str]:
    """Run ids in the order their first row was written."""
    return list(dict.fromkeys(r.run_id for r in records))


def latest_runs(records: Sequence[Record]) -> list[Record]:
    """The rows figures draw unasked: per configuration (track, case id, repeat), its latest row, so a run
    resumed after an interruption draws whole and a rerun replaces what it measured again; figures never
    mix two measurements of one configuration.

    Rows without a case id (written before it existed) go by run: per track, the rows of its last run;
    a track whose every such row has its own run id (rows written before one id named a whole
    invocation) cannot be split into runs and is kept whole.
    """
    newest = {r.key: index for index, r in enumerate(records) if r.case_id}
    unkeyed = [r for r in records if not r.case_id]
    latest = {r.track: r.run_id for r in unkeyed}
    per_row = {
        track
        for track in latest
        if len({r.run_id for r in unkeyed if r.track == track}) == sum(r.track == track for r in unkeyed)
    }
    return [
        r
        for index, r in enumerate(records)
        if (newest.get(r.key) == index if r.case_id else r.track in per_row or latest[r.track] == r.run_id)
    ]


def label_runs(records: Sequence[Record]) -> list[Record]:
    """Each row's label and config name its run, so overlaid runs are told apart and never pooled."""
    if len(runs_in(records)) < 2:
        return list(records)
    return [
        dataclasses.replace(r, case=f"{r.case} [run {r.run_id}]", config={**r.config, "run": r.run_id}) for r in records
    ]


#: Loader knobs named in a panel's title when they differ from these defaults.
LOADER_DEFAULTS: dict[str, Any] = {
    "pin_memory": False,
    "persistent_workers": False,
    "prefetch_factor": None,
    "collate": "default",
    "start_method": "fork",
}


def describe_loading(config: dict[str, Any]) -> str:
    """A title from config fields: source, access, decode, tier, dtype, and loader knobs off their default."""
    crop, loader = config.get("crop", {}), config.get("loader", {})
    parts = [str(config[key]) for key in ("model", "workload", "source", "access") if key in config]
    parts += [str(crop[key]) for key in ("decode", "tier", "dtype") if key in crop]
    parts += [f"amp-{config['amp']}"] if "amp" in config else []
    parts += [f"{key}={loader[key]}" for key, default in LOADER_DEFAULTS.items() if loader.get(key, default) != default]
    return figure_label("/".join(parts), 2 * FIGURE_LABEL_CHARS)
