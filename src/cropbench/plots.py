"""Records → figures. One function per figure; ``plot_results`` draws all that the records allow."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from cropbench.errors import OutputError  # noqa: E402
from cropbench.records import Record  # noqa: E402

FigureMaker = Callable[[Sequence[Record], Path], Path | None]


def _by_track(records: Sequence[Record], track: str) -> list[Record]:
    return [r for r in records if r.track == track]


def _label(record: Record) -> str:
    return record.case + (f" #{record.repeat}" if record.repeat else "")


def _save(figure: plt.Figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def track1_bars(records: Sequence[Record], out_dir: Path) -> Path | None:
    """p95 latency (lower is better) and samples/s (higher is better) per configuration."""
    rows = _by_track(records, "1")
    if not rows:
        return None
    labels = [_label(r) for r in rows]
    height = max(3.0, 0.32 * len(rows) + 1.5)
    figure, (left, right) = plt.subplots(1, 2, figsize=(14, height), sharey=True)
    positions = np.arange(len(rows))
    left.barh(positions, [r.metrics.get("p95_ms", np.nan) for r in rows], color="tab:red")
    left.set_yticks(positions, labels, fontsize=8)
    left.invert_yaxis()
    left.set_xlabel("p95 __getitem__ latency (ms)")
    left.set_title("Track 1 p95 latency (lower is better)")
    right.barh(positions, [r.metrics.get("samples_per_s", np.nan) for r in rows], color="tab:blue")
    right.set_xlabel("samples/s, one process")
    right.set_title("Track 1 throughput (higher is better)")
    for axis in (left, right):
        axis.grid(axis="x", alpha=0.3)
    return _save(figure, out_dir / "track1_latency_throughput.png")


def track1_cdf(records: Sequence[Record], out_dir: Path) -> Path | None:
    """Steady-state latency CDF per configuration (left and steep is better)."""
    rows = [r for r in _by_track(records, "1") if r.metrics.get("quantiles_ms")]
    if not rows:
        return None
    figure, axis = plt.subplots(figsize=(10, 6))
    for record in rows:
        quantiles = record.metrics["quantiles_ms"]
        axis.plot(quantiles, np.linspace(0, 1, len(quantiles)), label=_label(record))
    axis.set_xscale("log")
    axis.set_xlabel("__getitem__ latency (ms, log scale)")
    axis.set_ylabel("fraction of samples")
    axis.set_title("Track 1 latency CDF, steady state (left is better)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7, loc="lower right")
    return _save(figure, out_dir / "track1_latency_cdf.png")


def track1_warmup(records: Sequence[Record], out_dir: Path) -> Path | None:
    """First-k latencies against the steady-state p50 (flat and low is better)."""
    rows = [r for r in _by_track(records, "1") if r.metrics.get("warmup_ms")]
    if not rows:
        return None
    figure, axis = plt.subplots(figsize=(10, 6))
    for record in rows:
        curve = record.metrics["warmup_ms"]
        line = axis.plot(np.arange(1, len(curve) + 1), curve, label=_label(record))[0]
        axis.axhline(record.metrics.get("p50_ms", np.nan), color=line.get_color(), linestyle=":", linewidth=1)
    axis.set_yscale("log")
    axis.set_xlabel("item number after the cold pass")
    axis.set_ylabel("latency (ms, log scale); dotted: steady p50")
    axis.set_title("Track 1 warm-up curve (lower is better)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7, loc="upper right")
    return _save(figure, out_dir / "track1_warmup.png")


def layouts_comparison(records: Sequence[Record], out_dir: Path) -> Path | None:
    """Per layout: random and grouped crops/s against the memmap ceiling, and size on disk."""
    rows = _by_track(records, "layouts")
    if not rows:
        return None
    labels = [_label(r) for r in rows]
    positions = np.arange(len(rows))
    figure, (left, right) = plt.subplots(1, 2, figsize=(14, max(3.0, 0.34 * len(rows) + 1.5)), sharey=True)
    for offset, (access, color) in enumerate((("random", "tab:blue"), ("grouped", "tab:orange"))):
        values = [r.metrics.get(f"{access}_crops_per_s", np.nan) for r in rows]
        left.barh(positions + (offset - 0.5) * 0.4, values, height=0.4, color=color, label=f"{access} crops/s")
        ceiling = [r.metrics.get(f"{access}_crops_per_s") for r in rows if r.case == "memmap"]
        if ceiling:
            left.axvline(ceiling[0], color=color, linestyle=":", linewidth=1)
    left.set_xscale("log")
    left.set_yticks(positions, labels, fontsize=8)
    left.invert_yaxis()
    left.set_xlabel("crops/s, one process, warm page cache (log); dotted: memmap ceiling")
    left.set_title("Crop throughput per layout (higher is better)")
    left.legend(fontsize=8, loc="lower right")
    right.barh(positions, [r.metrics.get("stored_bytes", np.nan) / 2**20 for r in rows], color="tab:green")
    raw = [r.metrics.get("raw_bytes") for r in rows if r.metrics.get("raw_bytes")]
    if raw:
        right.axvline(raw[0] / 2**20, color="black", linestyle=":", linewidth=1, label="raw pixels")
        right.legend(fontsize=8, loc="lower right")
    right.set_xlabel("MiB on disk")
    right.set_title("Size on disk (lower is better)")
    for axis in (left, right):
        axis.grid(axis="x", alpha=0.3)
    return _save(figure, out_dir / "layouts_comparison.png")


def peers_comparison(records: Sequence[Record], out_dir: Path) -> Path | None:
    """Peers next to cropbench's decode paths: samples/s on the same crops, one panel per plate.

    The latest row of each loader on each plate is drawn; skipped peers are listed with the reason.
    """
    latest: dict[str, dict[str, Record]] = {}
    for record in _by_track(records, "peers"):
        plate = f"{record.config.get('layout', '?')}: {Path(str(record.config.get('plate', '?'))).name}"
        latest.setdefault(plate, {})[_label(record)] = record
    if not latest:
        return None
    height = sum(0.42 * len(rows) + 1.2 for rows in latest.values()) + 0.5
    figure, axes = plt.subplots(len(latest), 1, figsize=(12, max(3.5, height)), squeeze=False)
    for axis, (plate, by_case) in zip(axes[:, 0], latest.items(), strict=True):
        rows = list(by_case.values())
        positions = np.arange(len(rows))
        rates = np.array([r.metrics.get("samples_per_s", np.nan) for r in rows], dtype=float)
        colors = ["tab:blue" if r.config.get("kind") == "cropbench" else "tab:orange" for r in rows]
        axis.barh(positions, np.nan_to_num(rates, nan=0.0), color=colors)
        axis.set_xscale("log")
        finite = rates[np.isfinite(rates) & (rates > 0)]
        low, high = (finite.min(), finite.max()) if finite.size else (1.0, 10.0)
        axis.set_xlim(low / 3, high * 12)
        for position, record, rate in zip(positions, rows, rates, strict=True):
            if record.metrics.get("skipped"):
                reason = str(record.metrics.get("skip_reason", ""))
                axis.text(low / 2.8, position, f"skipped: {reason[:120]}", va="center", fontsize=7, color="gray")
                continue
            speedup = record.metrics.get("direct_speedup")
            note = f"{rate:,.0f}/s" if rate >= 10 else f"{rate:,.1f}/s"
            if speedup and record.config.get("peer") != "cropbench-direct":
                note += f"  (direct {speedup:,.1f}× faster)" if speedup >= 1 else f"  ({1 / speedup:,.2f}× direct)"
            axis.text(rate * 1.08, position, note, va="center", fontsize=8)
        direct = [r.metrics.get("samples_per_s") for r in rows if r.config.get("peer") == "cropbench-direct"]
        if direct and direct[0]:
            axis.axvline(direct[0], color="tab:blue", linestyle=":", linewidth=1)
        axis.set_yticks(positions, [r.config.get("peer", r.case) for r in rows], fontsize=8)
        axis.invert_yaxis()
        axis.grid(axis="x", alpha=0.3)
        size = rows[0].config.get("crop_size", "?")
        axis.set_title(f"{plate} — {size}px crops, all channels, random order (higher is better)", fontsize=9)
        axis.set_xlabel("samples/s, one process, warm page cache (log); blue: cropbench, orange: peers; "
                        "dotted: cropbench direct", fontsize=8)
    figure.suptitle("Peer loaders vs cropbench on the same plate and crops", fontsize=11)
    return _save(figure, out_dir / "peers_comparison.png")


#: Every figure maker; tracks 2 and 3 add theirs here.
FIGURES: list[FigureMaker] = [track1_bars, track1_cdf, track1_warmup, layouts_comparison, peers_comparison]


def plot_results(records: Sequence[Record], out_dir: str | Path) -> list[Path]:
    """Draw every figure the records allow into ``out_dir``; returns the files written."""
    destination = Path(out_dir)
    try:
        destination.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OutputError(f"cannot create plot directory {destination}: {error.strerror or error}") from error
    if not records:
        raise OutputError("no records to plot")
    return [path for maker in FIGURES if (path := maker(records, destination)) is not None]
