"""Records → figures. One function per figure; ``plot_results`` draws all that the records allow.

Every figure treats flagged rows (validity flags, see :mod:`cropbench.report.flags`) the same way:
grey and hatched, with a legend entry saying they are not measurements to quote. Bars lie on linear
axes from zero, so their lengths compare; log axes are kept for lines across decades (latency CDFs,
warm-up curves).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.container import BarContainer  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter  # noqa: E402

from cropbench import metrics as m  # noqa: E402
from cropbench.errors import CropbenchError, OutputError  # noqa: E402
from cropbench.records import Record  # noqa: E402
from cropbench.report.flags import row_flags  # noqa: E402

FigureMaker = Callable[[Sequence[Record], Path], Path | None]
#: The ten colours of matplotlib's default cycle.
#: Metrics each track's figures read (the smoke test checks the rows hold them).
FIGURE_METRICS: dict[str, tuple[str, ...]] = {
    "1": (
        m.P95_MS,
        m.SAMPLES_PER_S,
        m.VALIDITY_FLAGS,
        m.QUANTILES_MS,
        m.WARMUP_MS,
        m.P50_MS,
        m.FIRST_PASS_CURVE_MS,
        m.EVICTION_VERIFIED,
    ),
    "2": (m.CACHE_FRACTION_OF_PLATE, m.SAMPLES_PER_S, m.RUN_SAMPLES_PER_S, m.FIRST_BATCH_MS, m.EPOCH2_FIRST_BATCH_MS),
    "3": (
        m.STEP_P50_MS,
        m.COMPUTE_ONLY_STEP_P50_MS,
        m.DATA_WAIT_FRACTION,
        m.STALL_CROSSCHECK,
        m.TRIED_WORKERS,
        m.MIN_WORKERS,
        m.DATA_WAIT_FRACTION_BY_WORKERS,
        m.IMAGES_PER_S_BY_WORKERS,
        m.COMPUTE_ONLY_IMAGES_PER_S,
    ),
    "layouts": (*(m.access_crops_per_s_key(access) for access in m.ACCESS_PATTERNS), m.STORED_BYTES, m.RAW_BYTES),
    "peers": (m.SAMPLES_PER_S, m.SKIP_REASON, m.COUNT, m.DIRECT_SPEEDUP),
}
TAB10 = [plt.get_cmap("tab10")(number) for number in range(10)]


def _numbers(metrics: dict[str, Any], *names: str) -> bool:
    """Whether every named metric is a finite number (not missing, None, NaN, text or a bool)."""
    values = [metrics.get(name) for name in names]
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)


#: What a row must hold for its track's figures to draw it at all. A row without it (a failed or
#: interrupted case, a row written by another tool) is left out with a warning, never a traceback.
DRAWABLE: dict[str, Callable[[dict[str, Any]], bool]] = {
    "1": lambda metrics: _numbers(metrics, m.P95_MS, m.SAMPLES_PER_S),
    "2": lambda metrics: _numbers(metrics, m.SAMPLES_PER_S) or _numbers(metrics, m.FIRST_BATCH_MS),
    "3": lambda metrics: (
        _numbers(metrics, m.STEP_P50_MS)
        or all(
            metrics.get(name) for name in (m.TRIED_WORKERS, m.DATA_WAIT_FRACTION_BY_WORKERS, m.IMAGES_PER_S_BY_WORKERS)
        )
    ),
    "layouts": lambda metrics: any(_numbers(metrics, m.access_crops_per_s_key(access)) for access in m.ACCESS_PATTERNS),
    "peers": lambda metrics: _numbers(metrics, m.SAMPLES_PER_S) or bool(metrics.get(m.SKIP_REASON)),
}


def drawable(records: Sequence[Record]) -> list[Record]:
    """The rows the figures can draw; one warning per track names how many were left out and why."""
    kept: list[Record] = []
    left_out: list[Record] = []
    for record in records:
        (kept if DRAWABLE.get(record.track, lambda _: True)(record.metrics) else left_out).append(record)
    for track in dict.fromkeys(r.track for r in left_out):
        rows = [r for r in left_out if r.track == track]
        warnings.warn(
            f"{len(rows)} track {track} {'row lacks' if len(rows) == 1 else 'rows lack'} the metrics its "
            "figures draw: left out "
            f"(first: {_label(rows[0])})",
            stacklevel=2,
        )
    return kept


def _by_track(records: Sequence[Record], track: str) -> list[Record]:
    return [r for r in records if r.track == track]


def _label(record: Record) -> str:
    return record.case + (f" #{record.repeat}" if record.repeat else "")


def runs_in(records: Sequence[Record]) -> list[str]:
    """Run ids in the order their first row was written."""
    return list(dict.fromkeys(r.run_id for r in records))


def latest_runs(records: Sequence[Record]) -> list[Record]:
    """Per track, the rows of the last run that wrote that track: figures never mix runs unasked.

    A track whose every row has its own run id (rows written before one id named a whole
    invocation) cannot be split into runs and is kept whole.
    """
    latest = {r.track: r.run_id for r in records}
    per_row = {
        track
        for track in latest
        if len({r.run_id for r in records if r.track == track}) == sum(r.track == track for r in records)
    }
    return [r for r in records if r.track in per_row or latest[r.track] == r.run_id]


def label_runs(records: Sequence[Record]) -> list[Record]:
    """Each row's label and config name its run, so overlaid runs are told apart and never pooled."""
    if len(runs_in(records)) < 2:
        return list(records)
    return [
        dataclasses.replace(r, case=f"{r.case} [run {r.run_id}]", config={**r.config, "run": r.run_id}) for r in records
    ]


#: A reader cache at least this large relative to the decoded plate holds all of it.
FULLY_CACHED = 1.0


def fully_cached(record: Record) -> bool | None:
    """Whether the row's reader cache held the whole decoded plate; None when it cannot be told."""
    fraction = record.metrics.get(m.CACHE_FRACTION_OF_PLATE)
    if fraction is not None:
        return bool(fraction >= FULLY_CACHED)
    crop, plate = record.config.get("crop", {}), record.config.get("plate")
    if crop.get("decode") != "direct" or not plate:
        return None
    from cropbench.formats import read_plate_metadata

    try:
        metadata = read_plate_metadata(plate)
    except (CropbenchError, OSError):
        return None
    decoded = int(np.prod(metadata.field_shape)) * np.dtype(metadata.dtype).itemsize * len(metadata.fields)
    return bool(crop.get("chunk_cache_bytes", 0) >= FULLY_CACHED * decoded)


#: How every figure draws a flagged row: grey, hatched, with this legend entry.
FLAGGED_COLOR = "lightgray"
FLAGGED_EDGE = "gray"
FLAGGED_HATCH = "///"
FLAGGED_NOTE = "grey, hatched: flagged (see the summary), not a measurement to quote"
#: Hatches drawn in a series' colour need a wider line than matplotlib's default to be seen.
plt.rcParams["hatch.linewidth"] = 1.2


def flagged(record: Record) -> bool:
    """Whether the row carries a validity flag (as every report reads them)."""
    return bool(row_flags(record))


def flagged_handle() -> Patch:
    """The legend entry of flagged rows, the same in every figure."""
    return Patch(facecolor=FLAGGED_COLOR, edgecolor=FLAGGED_EDGE, hatch=FLAGGED_HATCH, label=FLAGGED_NOTE)


def _barh(
    axis: plt.Axes, positions: Any, values: Sequence[float], color: str, marked: Sequence[bool], **kwargs: Any
) -> BarContainer:
    """Horizontal bars in ``color``; the ``marked`` (flagged) ones grey, hatched in ``color`` (so two
    series stay told apart)."""
    bars = axis.barh(positions, values, color=[FLAGGED_COLOR if mark else color for mark in marked], **kwargs)
    for bar, mark in zip(bars.patches, marked, strict=True):
        if mark:
            bar.set_hatch(FLAGGED_HATCH)
            bar.set_edgecolor(color)
            bar.set_linewidth(0.5)
    return bars


def _from_zero(axis: plt.Axes, values: Sequence[float], room: float = 1.08) -> None:
    """A linear x axis from zero to a little past the largest finite value, in plain numbers."""
    axis.set_xscale("linear")
    finite = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    axis.set_xlim(0.0, max(max(finite, default=1.0), 1e-9) * room)
    formatter = ScalarFormatter(useOffset=False)
    formatter.set_scientific(False)
    axis.xaxis.set_major_formatter(formatter)


def _log_x(axis: plt.Axes) -> None:
    """A log x axis ticked at 1, 2 and 5 per decade in plain numbers (0.5, 1, 2, 5, 10, ...)."""
    axis.set_xscale("log")
    axis.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.xaxis.set_major_formatter(ScalarFormatter())
    axis.xaxis.set_minor_formatter(NullFormatter())


def _per_call(record: Record) -> str:
    """A note for rows whose latencies are per call of several items (the batch access mode)."""
    calls = int(record.metrics.get(m.ITEMS_PER_CALL) or 1)
    return f" [latency per call of {calls}]" if calls > 1 else ""


def _save(figure: plt.Figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=110, bbox_inches="tight")  # legends placed beside or under the axes included
    plt.close(figure)
    return path


def track1_bars(records: Sequence[Record], out_dir: Path) -> Path | None:
    """p95 latency (lower is better) and samples/s (higher is better) per configuration."""
    rows = _by_track(records, "1")
    if not rows:
        return None
    labels = [_label(r) + _per_call(r) for r in rows]
    height = max(3.0, 0.32 * len(rows) + 1.8)
    figure, (left, right) = plt.subplots(1, 2, figsize=(14, height), sharey=True)
    positions = np.arange(len(rows))
    marked = [flagged(r) for r in rows]
    p95 = [r.metrics.get(m.P95_MS, np.nan) for r in rows]
    _barh(left, positions, p95, "tab:red", marked)
    left.set_yticks(positions, labels, fontsize=8)
    left.invert_yaxis()
    left.set_xlabel("p95 __getitem__ latency (ms)")
    left.set_title("Track 1 p95 latency (lower is better)")
    rates = [r.metrics.get(m.SAMPLES_PER_S, np.nan) for r in rows]
    _barh(right, positions, rates, "tab:blue", marked)
    right.set_xlabel("samples/s, one process")
    right.set_title("Track 1 throughput (higher is better)")
    top = np.nanmax(np.asarray(rates, dtype=float)) if any(math.isfinite(float(v)) for v in rates) else 1.0
    for position, record, rate in zip(positions, rows, rates, strict=True):
        flags = row_flags(record)
        if flags and math.isfinite(float(rate)):
            right.text(
                rate + 0.02 * top, position, "flags: " + ", ".join(flags), va="center", fontsize=7, color="dimgray"
            )
    if any(marked):  # under the figure, clear of the bars and their notes
        figure.legend(handles=[flagged_handle()], fontsize=8, loc="upper center", bbox_to_anchor=(0.5, 0.0))
    _from_zero(left, p95)
    _from_zero(right, rates, room=1.7 if any(marked) else 1.08)
    for axis in (left, right):
        axis.grid(axis="x", alpha=0.3)
    return _save(figure, out_dir / "track1_latency_throughput.png")


def track1_cdf(records: Sequence[Record], out_dir: Path) -> Path | None:
    """Steady-state latency CDF per configuration (left and steep is better).

    A batch-mode row's latencies are per call of several items, not per item: its curve is dashed
    and its label says so, rather than being drawn as if it were one crop's latency.
    """
    rows = [r for r in _by_track(records, "1") if r.metrics.get(m.QUANTILES_MS)]
    if not rows:
        return None
    figure, axis = plt.subplots(figsize=(10, 6))
    for color, record in zip(itertools.cycle(TAB10), rows, strict=False):
        quantiles = record.metrics[m.QUANTILES_MS]
        per_call = _per_call(record)
        axis.plot(
            quantiles,
            np.linspace(0, 1, len(quantiles)),
            linestyle="--" if per_call else "-",
            color=FLAGGED_EDGE if flagged(record) else color,
            alpha=0.6 if flagged(record) else 1.0,
            label=_label(record) + per_call + (" [flagged]" if flagged(record) else ""),
        )
    _log_x(axis)
    axis.set_xlabel("latency per call: one item, or a batch where dashed (ms, log scale)")
    axis.set_ylabel("fraction of samples")
    axis.set_title("Track 1 latency CDF, steady state (left is better)")
    axis.grid(alpha=0.3)
    handles, names = axis.get_legend_handles_labels()
    if any(flagged(r) for r in rows):
        handles, names = [*handles, flagged_handle()], [*names, "grey: [flagged] row, not a measurement to quote"]
    axis.legend(handles, names, fontsize=7, loc="lower right")
    return _save(figure, out_dir / "track1_latency_cdf.png")


#: Items in the warm-up curve's rolling median.
ROLLING_ITEMS = 5
#: The warm-up is over at the first item from which the rolling median stays within this factor of the steady p50.
STEADY_BAND = 1.5


def rolling_median(values: Sequence[float], window: int = ROLLING_ITEMS) -> np.ndarray:
    """Median of each item and the ``window - 1`` before it (fewer at the start)."""
    data = np.asarray(values, dtype=np.float64)
    return np.array([np.median(data[max(0, i - window + 1) : i + 1]) for i in range(len(data))])


def steady_from(curve: Sequence[float], steady_p50: float, band: float = STEADY_BAND) -> int | None:
    """First item (1-based) from which the rolling median stays within ``band`` × the steady p50; None if never."""
    inside = rolling_median(curve) <= band * steady_p50
    for start in range(len(inside)):
        if inside[start:].all():
            return start + 1
    return None


def track1_warmup(records: Sequence[Record], out_dir: Path) -> Path | None:
    """How many items until steady state: one panel per case, from its first item after eviction.

    Thin: each item's latency (first pass, then warm-up); thick: the rolling median; dotted: the
    steady-state p50; shaded: the first (cold) pass; dashed line: where steady state starts.
    """
    rows = [r for r in _by_track(records, "1") if r.metrics.get(m.WARMUP_MS) and r.metrics.get(m.P50_MS)]
    if not rows:
        return None
    columns = min(2, len(rows))
    lines = -(-len(rows) // columns)
    figure, axes = plt.subplots(lines, columns, figsize=(7 * columns, 2.6 * lines + 1.2), squeeze=False, sharey=True)
    for axis, record in zip(axes.flat, rows, strict=False):
        first = list(record.metrics.get(m.FIRST_PASS_CURVE_MS) or [])
        curve, steady = first + list(record.metrics[m.WARMUP_MS]), record.metrics[m.P50_MS]
        items = np.arange(1, len(curve) + 1)
        settles = steady_from(curve, steady)
        if first:
            cold = "cold pass" if record.metrics.get(m.EVICTION_VERIFIED) else "first pass (eviction not verified)"
            axis.axvspan(0.5, len(first) + 0.5, color="tab:blue", alpha=0.08, label=cold)
        axis.plot(items, curve, color="gray", alpha=0.5, linewidth=0.8, label="each item")
        axis.plot(
            items, rolling_median(curve), color="tab:red", linewidth=2, label=f"rolling median of {ROLLING_ITEMS}"
        )
        axis.axhline(steady, color="black", linestyle=":", linewidth=1, label="steady-state p50")
        calls = int(record.metrics.get(m.ITEMS_PER_CALL) or 1)
        unit = "item" if calls == 1 else "call"
        if settles:
            axis.axvline(
                settles, color="tab:green", linestyle="--", linewidth=1.5, label=f"steady from {unit} {settles}"
            )
        verdict = f"steady from {unit} {settles}" if settles else f"not steady within {len(curve)} {unit}s"
        flags = row_flags(record)
        if flags:
            axis.set_facecolor("#f0f0f0")
            verdict += f" [flagged: {', '.join(flags)}]"
        axis.set_title(f"{_label(record)}{_per_call(record)}: {verdict}", fontsize=8)
        axis.set_yscale("log")
        axis.grid(alpha=0.3, which="both")
        axis.set_xlabel(
            "item number after the page cache was emptied"
            if calls == 1
            else f"call number after the page cache was emptied ({calls} items a call)",
            fontsize=8,
        )
        axis.set_ylabel("latency (ms, log)", fontsize=8)
    for axis in list(axes.flat)[len(rows) :]:
        axis.set_visible(False)
    handles, names = axes.flat[0].get_legend_handles_labels()
    names = ["steady state starts" if name.startswith("steady from") else name for name in names]
    if any(flagged(r) for r in rows):
        handles, names = [*handles, flagged_handle()], [*names, "grey panel: flagged row, not a measurement to quote"]
    axes.flat[0].legend(handles, names, loc="upper right", fontsize=6)
    figure.suptitle(
        f"Track 1 warm-up: items until the rolling median stays within {STEADY_BAND}x the steady p50 "
        "(lower and earlier is better)",
        fontsize=10,
    )
    return _save(figure, out_dir / "track1_warmup.png")


def layouts_comparison(records: Sequence[Record], out_dir: Path) -> Path | None:
    """Per layout: random and grouped crops/s beside the memmap layout (the comparison's reference, read
    through the same dataset: not a ceiling, batched readers pass it), and size on disk."""
    rows = _by_track(records, "layouts")
    if not rows:
        return None
    from cropbench.tracks.layouts import CEILING as MEMMAP_LAYOUT  # here: figures of other tracks need no torch

    labels = [_label(r) for r in rows]
    positions = np.arange(len(rows))
    figure, (left, right) = plt.subplots(1, 2, figsize=(14, max(3.0, 0.34 * len(rows) + 1.5)), sharey=True)
    marked = [flagged(r) for r in rows]
    rates: list[float] = []
    for offset, (access, color) in enumerate((("random", "tab:blue"), ("grouped", "tab:orange"))):
        values = [r.metrics.get(m.access_crops_per_s_key(access), np.nan) for r in rows]
        rates += values
        _barh(left, positions + (offset - 0.5) * 0.4, values, color, marked, height=0.4, label=f"{access} crops/s")
        reference = [
            r.metrics.get(m.access_crops_per_s_key(access))
            for r in rows
            if r.config.get("layout_name") == MEMMAP_LAYOUT
        ]
        if reference and reference[0]:
            left.axvline(reference[0], color=color, linestyle=":", linewidth=1)
    left.set_yticks(positions, labels, fontsize=8)
    left.invert_yaxis()
    left.set_xlabel("crops/s, one process, warm page cache; dotted: memmap, the comparison's reference")
    left.set_title("Crop throughput per layout (higher is better)")
    handles, _ = left.get_legend_handles_labels()
    left.legend(handles=[*handles, *([flagged_handle()] if any(marked) else [])], fontsize=8, loc="lower right")
    sizes = [r.metrics.get(m.STORED_BYTES, np.nan) / 2**20 for r in rows]
    _barh(right, positions, sizes, "tab:green", marked)
    raw = [float(r.metrics[m.RAW_BYTES]) for r in rows if r.metrics.get(m.RAW_BYTES)]
    if raw:
        right.axvline(raw[0] / 2**20, color="black", linestyle=":", linewidth=1, label="raw pixels")
        right.legend(fontsize=8, loc="lower right")
    right.set_xlabel("MiB on disk")
    right.set_title("Size on disk (lower is better)")
    _from_zero(left, rates)
    _from_zero(right, [*sizes, *(value / 2**20 for value in raw)])
    for axis in (left, right):
        axis.grid(axis="x", alpha=0.3)
    return _save(figure, out_dir / "layouts_comparison.png")


def peers_comparison(records: Sequence[Record], out_dir: Path) -> Path | None:
    """Peers next to cropbench's decode paths: samples/s on the same crops, one panel per plate.

    Bars are the median over repeats (dots: each repeat); "direct N× faster" is the median of the
    ratios measured within each run. Skipped peers are listed with the reason.
    """
    plates: dict[str, dict[str, list[Record]]] = {}
    for record in _by_track(records, "peers"):
        plate = f"{record.config.get('layout', '?')}: {Path(str(record.config.get('plate', '?'))).name}"
        plates.setdefault(plate, {}).setdefault(str(record.config.get("peer", record.case)), []).append(record)
    if not plates:
        return None
    height = sum(0.42 * len(loaders) + 1.2 for loaders in plates.values()) + 0.5
    figure, axes = plt.subplots(len(plates), 1, figsize=(12, max(3.5, height)), squeeze=False)
    for axis, (plate, loaders) in zip(axes[:, 0], plates.items(), strict=True):
        names = list(loaders)
        positions = np.arange(len(names))
        measured = {name: [r for r in rows if r.metrics.get(m.SAMPLES_PER_S)] for name, rows in loaders.items()}
        medians = np.array(
            [
                np.median([r.metrics[m.SAMPLES_PER_S] for r in measured[name]]) if measured[name] else np.nan
                for name in names
            ]
        )
        marked = [any(flagged(r) for r in loaders[name]) for name in names]
        colors = ["tab:blue" if loaders[name][0].config.get("kind") == "cropbench" else "tab:orange" for name in names]
        bars = _barh(axis, positions, np.nan_to_num(medians, nan=0.0), "tab:orange", marked)
        for bar, color, mark in zip(bars.patches, colors, marked, strict=True):
            if not mark:
                bar.set_facecolor(color)
        every = [r.metrics[m.SAMPLES_PER_S] for name in names for r in measured[name]]
        high = max(every, default=1.0)
        for position, name in zip(positions, names, strict=True):
            rates = [r.metrics[m.SAMPLES_PER_S] for r in measured[name]]
            if len(rates) > 1:
                axis.scatter(rates, [position] * len(rates), color="black", s=10, zorder=3)
        for position, name, rate in zip(positions, names, medians, strict=True):
            rows = measured[name]
            if not rows:
                reason = str(loaders[name][-1].metrics.get(m.SKIP_REASON, ""))
                axis.text(0.01 * high, position, f"skipped: {reason[:120]}", va="center", fontsize=7, color="gray")
                continue
            note = (f"{rate:,.0f}/s" if rate >= 10 else f"{rate:,.1f}/s") + f" (n={rows[-1].metrics.get(m.COUNT, '?')}"
            note += f", {len(rows)} runs)" if len(rows) > 1 else ")"
            speedups = [r.metrics[m.DIRECT_SPEEDUP] for r in rows if r.metrics.get(m.DIRECT_SPEEDUP)]
            if speedups and name != "cropbench-direct":
                speedup = float(np.median(speedups))
                note += f"  direct {speedup:,.1f}× faster" if speedup >= 1 else f"  {1 / speedup:,.2f}× direct"
            axis.text(
                max(rate, *(r.metrics[m.SAMPLES_PER_S] for r in rows)) + 0.01 * high,
                position,
                note,
                va="center",
                fontsize=8,
            )
        if "cropbench-direct" in names and np.isfinite(medians[names.index("cropbench-direct")]):
            axis.axvline(medians[names.index("cropbench-direct")], color="tab:blue", linestyle=":", linewidth=1)
        _from_zero(axis, every, room=1.6)
        if any(marked):
            axis.legend(handles=[flagged_handle()], fontsize=7, loc="lower right")
        axis.set_yticks(positions, names, fontsize=8)
        axis.invert_yaxis()
        axis.grid(axis="x", alpha=0.3)
        size = loaders[names[0]][0].config.get("crop_size", "?")
        axis.set_title(f"{plate} — {size}px crops, all channels, random order (higher is better)", fontsize=9)
        axis.set_xlabel(
            "samples/s, one process, warm page cache (bar: median, dots: repeats); blue: cropbench, "
            "orange: peers; dotted: cropbench direct",
            fontsize=8,
        )
    figure.suptitle("Peer loaders vs cropbench on the same plate and crops", fontsize=11)
    return _save(figure, out_dir / "peers_comparison.png")


#: Loader knobs a sweep varies: rows equal in every other config field are one sweep.
SWEPT_LOADER_KNOBS = ("num_workers", "batch_size")
#: Loader knobs named in a panel's title when they differ from these defaults.
LOADER_DEFAULTS: dict[str, Any] = {
    "pin_memory": False,
    "persistent_workers": False,
    "prefetch_factor": None,
    "collate": "default",
    "start_method": "fork",
}


def sweep_key(config: dict[str, Any]) -> str:
    """The config without the swept loader knobs and the repeat's seed: the key of one worker × batch sweep."""
    rest = {key: value for key, value in config.items() if key != "seed"}
    rest["loader"] = {k: v for k, v in config.get("loader", {}).items() if k not in SWEPT_LOADER_KNOBS}
    return json.dumps(rest, sort_keys=True, default=str)


def describe_loading(config: dict[str, Any]) -> str:
    """A title from config fields: source, access, decode, tier, dtype, and loader knobs off their default."""
    crop, loader = config.get("crop", {}), config.get("loader", {})
    parts = [str(config[key]) for key in ("model", "workload", "source", "access") if key in config]
    parts += [str(crop[key]) for key in ("decode", "tier", "dtype") if key in crop]
    parts += [f"amp-{config['amp']}"] if "amp" in config else []
    parts += [f"{key}={loader[key]}" for key, default in LOADER_DEFAULTS.items() if loader.get(key, default) != default]
    return "/".join(parts)


def _median(rows: Sequence[Record], metric: str) -> float:
    """Median of a metric over repeats of one configuration."""
    return float(np.median([r.metrics.get(metric, np.nan) for r in rows]))


def _mark_flagged(axis: plt.Axes, workers: Sequence[int], points: dict[int, list[Record]], color: Any) -> None:
    """Flagged points of a steady samples/s line, drawn over it grey and hatched in the line's colour."""
    if workers:
        axis.scatter(
            workers,
            [_median(points[w], m.SAMPLES_PER_S) for w in workers],
            s=90,
            facecolor=FLAGGED_COLOR,
            edgecolor=color,
            hatch=FLAGGED_HATCH,
            zorder=3,
        )


def track2_scaling(records: Sequence[Record], out_dir: Path) -> Path | None:
    """Samples/s against num_workers, one line per batch size, one panel per swept configuration."""
    sweeps: dict[str, dict[int, dict[int, list[Record]]]] = {}
    for record in _by_track(records, "2"):
        loader = record.config.get("loader", {})
        if "num_workers" not in loader or m.SAMPLES_PER_S not in record.metrics:
            continue
        by_batch = sweeps.setdefault(sweep_key(record.config), {}).setdefault(int(loader["batch_size"]), {})
        by_batch.setdefault(int(loader["num_workers"]), []).append(record)
    panels = {key: lines for key, lines in sweeps.items() if any(len(points) >= 2 for points in lines.values())}
    if not panels:
        return None
    columns = min(2, len(panels))
    rows = -(-len(panels) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(7 * columns, 4.6 * rows), squeeze=False)
    for axis, (key, lines) in zip(axes.flat, panels.items(), strict=False):
        for color, (batch, points) in zip(TAB10, sorted(lines.items()), strict=False):
            workers = sorted(points)
            axis.plot(
                workers,
                [_median(points[w], m.SAMPLES_PER_S) for w in workers],
                marker="o",
                color=color,
                label=f"batch {batch}, steady",
            )
            _mark_flagged(axis, [w for w in workers if any(flagged(r) for r in points[w])], points, color)
            axis.plot(
                workers,
                [_median(points[w], m.RUN_SAMPLES_PER_S) for w in workers],
                marker=".",
                linestyle="--",
                color=color,
                alpha=0.7,
                label=f"batch {batch}, whole run",
            )
        axis.set_xticks(sorted({w for points in lines.values() for w in points}))
        axis.set_xlabel("num_workers (0 = loading in the main process)")
        axis.set_ylabel("samples/s")
        axis.set_ylim(bottom=0)
        title = describe_loading(json.loads(key))
        axis.set_title(f"Track 2 samples/s vs num_workers (higher is better)\n{title}", fontsize=9)
        axis.grid(alpha=0.3)
        panel_rows = [r for points in lines.values() for rows_at in points.values() for r in rows_at]
        runs = sorted({str(r.config["run"]) for r in panel_rows if "run" in r.config})
        if runs:
            axis.set_title(f"{axis.get_title()} [run {', '.join(runs)}]", fontsize=9)
        if any(fully_cached(r) for r in panel_rows):
            axis.text(
                0.02,
                0.03,
                "the reader's cache holds the whole plate: each read is a cache hit, so\n"
                "handing batches between processes, not reading, sets the pace",
                transform=axis.transAxes,
                fontsize=7,
                color="dimgray",
                va="bottom",
            )
        handles, _ = axis.get_legend_handles_labels()
        axis.legend(
            handles=[*handles, *([flagged_handle()] if any(flagged(r) for r in panel_rows) else [])], fontsize=7
        )
    for axis in list(axes.flat)[len(panels) :]:
        axis.set_visible(False)
    return _save(figure, out_dir / "track2_workers_scaling.png")


def track2_first_batch(records: Sequence[Record], out_dir: Path) -> Path | None:
    """First-batch latency per case: epoch 1 (workers start) and epoch 2 (persistent workers reuse)."""
    rows = [r for r in _by_track(records, "2") if m.FIRST_BATCH_MS in r.metrics]
    if not rows:
        return None
    positions = np.arange(len(rows))
    figure, axis = plt.subplots(figsize=(12, max(3.0, 0.36 * len(rows) + 1.5)))
    marked = [flagged(r) for r in rows]
    first = [r.metrics[m.FIRST_BATCH_MS] for r in rows]
    second = [r.metrics.get(m.EPOCH2_FIRST_BATCH_MS, np.nan) for r in rows]
    _barh(axis, positions - 0.2, first, "tab:red", marked, height=0.4, label="epoch 1")
    _barh(axis, positions + 0.2, second, "tab:orange", marked, height=0.4, label="epoch 2")
    axis.set_yticks(positions, [_label(r) for r in rows], fontsize=8)
    axis.invert_yaxis()
    _from_zero(axis, [*first, *second])
    axis.set_xlabel("ms from iter(loader) to the first batch in hand (worker start-up included)")
    axis.set_title("Track 2 first-batch latency (lower is better)")
    axis.grid(axis="x", alpha=0.3)
    handles = [
        Patch(color="tab:red", label="epoch 1"),
        Patch(color="tab:orange", label="epoch 2"),
        *([flagged_handle()] if any(marked) else []),
    ]
    axis.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(figure, out_dir / "track2_first_batch.png")


def track3_bars(records: Sequence[Record], out_dir: Path) -> Path | None:
    """Step-time p50 against the compute-only baseline, and the data-wait fraction, per case."""
    rows = [r for r in _by_track(records, "3") if m.STEP_P50_MS in r.metrics]
    if not rows:
        return None
    positions = np.arange(len(rows))
    height = max(3.0, 0.36 * len(rows) + 1.8)
    below = (0.5, -0.75 / max(height - 1.2, 1.0))  # legends under the x labels, clear of the bars
    figure, (left, right) = plt.subplots(1, 2, figsize=(15, height), sharey=True)
    marked = [flagged(r) for r in rows]
    steps = [r.metrics[m.STEP_P50_MS] for r in rows]
    compute = [r.metrics.get(m.COMPUTE_ONLY_STEP_P50_MS, np.nan) for r in rows]
    _barh(left, positions, steps, "tab:purple", marked)
    ink = [FLAGGED_EDGE if mark else "black" for mark in marked]
    left.scatter(compute, positions, marker="|", s=250, c=ink, zorder=3)
    baseline = Line2D([], [], marker="|", markersize=14, color="black", linestyle="none", label="compute-only p50")
    left.set_yticks(positions, [_label(r) for r in rows], fontsize=8)
    left.invert_yaxis()
    _from_zero(left, [*steps, *compute])
    left.set_xlabel("ms per step")
    left.set_title("Track 3 step time p50 (lower is better)")
    left.legend(
        handles=[
            Patch(color="tab:purple", label="step p50"),
            baseline,
            *([flagged_handle()] if any(marked) else []),
        ],
        fontsize=8,
        loc="upper center",
        bbox_to_anchor=below,
        ncol=1,
    )
    wait = [100 * r.metrics.get(m.DATA_WAIT_FRACTION, np.nan) for r in rows]
    stall = [100 * r.metrics.get(m.STALL_CROSSCHECK, np.nan) for r in rows]
    for fed in (True, False):
        chosen = [index for index, w in enumerate(wait) if (w < 10) == fed]
        _barh(
            right,
            positions[chosen],
            [wait[i] for i in chosen],
            "tab:green" if fed else "tab:red",
            [marked[i] for i in chosen],
        )
    right.scatter(stall, positions, marker="x", c=ink, zorder=3)
    crosscheck = Line2D([], [], marker="x", color="black", linestyle="none", label="(step − compute-only) / step")
    threshold = right.axvline(10, color="gray", linestyle=":", label="10%: the model's device >= 90% busy")
    right.set_xlabel("% of step time blocked on data (next() + copy to the model's device, if any)")
    right.set_title("Track 3 data-wait fraction (lower is better)")
    right.legend(
        handles=[
            Patch(color="tab:green", label="data wait < 10%: fed"),
            Patch(color="tab:red", label="data wait >= 10%: waits on data"),
            crosscheck,
            threshold,
            *([flagged_handle()] if any(marked) else []),
        ],
        fontsize=8,
        loc="upper center",
        bbox_to_anchor=below,
        ncol=1,
    )
    _from_zero(right, [*wait, *stall, 10.0])
    for axis in (left, right):
        axis.grid(axis="x", alpha=0.3)
    return _save(figure, out_dir / "track3_step_and_wait.png")


def _search_key(case: dict[str, Any]) -> str:
    """A worker search's case without what differs between its points: workers, step counts, run label."""
    rest = {key: value for key, value in case.items() if key not in {"steps", "warmup_steps", "run"}}
    rest["loader"] = {key: value for key, value in case.get("loader", {}).items() if key != "num_workers"}
    return json.dumps(rest, sort_keys=True, default=str)


def flagged_workers(search: Record, records: Sequence[Record]) -> set[int]:
    """The worker counts of a search whose own rows (same run, same case but for the workers) are flagged.

    A search's row holds its case under ``case``; what the run adds to every row (plate, layout,
    threads) sits beside it, and in each point's row beside the case's own fields.
    """
    case = search.config.get("case", {})

    def as_point(row: Record) -> dict[str, Any]:
        added = {name: search.config.get(name) for name in row.config if name not in case}
        return {**added, **case}

    return {
        int(r.config["loader"]["num_workers"])
        for r in records
        if r.track == "3"
        and r is not search
        and r.run_id == search.run_id
        and "num_workers" in r.config.get("loader", {})
        and _search_key(r.config) == _search_key(as_point(r))
        and flagged(r)
    }


def track3_workers(records: Sequence[Record], out_dir: Path) -> Path | None:
    """Worker searches: data-wait fraction and images/s against num_workers, one line per search."""
    searches = [r for r in _by_track(records, "3") if r.metrics.get(m.TRIED_WORKERS)]
    if not searches:
        return None
    figure, (left, right) = plt.subplots(1, 2, figsize=(15, 5.5))
    any_flagged = False
    for color, record in zip(TAB10, searches, strict=False):
        workers = record.metrics[m.TRIED_WORKERS]
        answer = record.metrics.get(m.MIN_WORKERS)
        search = describe_loading(record.config.get("case", {}))
        name = f"{search} → min workers: {answer if answer is not None else 'not reached'}"
        left.plot(
            workers,
            [100 * v for v in record.metrics[m.DATA_WAIT_FRACTION_BY_WORKERS]],
            marker="o",
            color=color,
            label=name,
        )
        right.plot(workers, record.metrics[m.IMAGES_PER_S_BY_WORKERS], marker="o", color=color, label=name)
        marked = flagged_workers(record, records)
        for axis, values in (
            (left, [100 * v for v in record.metrics[m.DATA_WAIT_FRACTION_BY_WORKERS]]),
            (right, record.metrics[m.IMAGES_PER_S_BY_WORKERS]),
        ):
            points = [(w, v) for w, v in zip(workers, values, strict=False) if w in marked]
            if points:
                axis.scatter(
                    *zip(*points, strict=True),
                    s=90,
                    facecolor=FLAGGED_COLOR,
                    edgecolor=color,
                    hatch=FLAGGED_HATCH,
                    zorder=3,
                )
        any_flagged = any_flagged or bool(marked)
        ceiling = record.metrics.get(m.COMPUTE_ONLY_IMAGES_PER_S)
        if ceiling:
            right.axhline(ceiling, color=color, linestyle=":", linewidth=1)
            right.set_ylim(top=max(right.get_ylim()[1], ceiling * 1.1))
    left.axhline(10, color="gray", linestyle=":", label="10%: the model's device >= 90% busy")
    left.set_ylabel("% of step time blocked on data")
    left.set_title("Track 3 data wait vs num_workers (lower is better)")
    right.set_ylabel("images/s; dotted: compute-only ceiling")
    right.set_title("Track 3 images/s vs num_workers (higher is better)")
    tried = sorted({w for record in searches for w in record.metrics[m.TRIED_WORKERS]})
    for axis in (left, right):
        axis.set_xlabel("num_workers")
        axis.set_xticks(tried)
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
    handles, _ = left.get_legend_handles_labels()
    left.legend(handles=[*handles, *([flagged_handle()] if any_flagged else [])], fontsize=7)
    return _save(figure, out_dir / "track3_workers.png")


#: Every figure maker; tracks 2 and 3 add theirs here.
FIGURES: list[FigureMaker] = [
    track1_bars,
    track1_cdf,
    track1_warmup,
    layouts_comparison,
    peers_comparison,
    track2_scaling,
    track2_first_batch,
    track3_bars,
    track3_workers,
]


def plot_results(records: Sequence[Record], out_dir: str | Path, all_runs: bool = False) -> list[Path]:
    """Draw every figure the records allow into ``out_dir``; returns the files written.

    By default each track's figures show its latest run only; ``all_runs`` overlays every run,
    each row labelled with its run id (never averaged across runs).
    """
    destination = Path(out_dir)
    try:
        destination.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OutputError(f"cannot create plot directory {destination}: {error.strerror or error}") from error
    if not records:
        raise OutputError("no records to plot")
    chosen = drawable(label_runs(records) if all_runs else latest_runs(records))
    if not chosen:
        raise OutputError(f"none of the {len(records)} records holds the metrics a figure draws")
    return [path for maker in FIGURES if (path := maker(chosen, destination)) is not None]
