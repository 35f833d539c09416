"""Records → figures. One function per figure; ``plot_results`` draws all that the records allow."""

from __future__ import annotations

import re
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
        measured = {name: [r for r in rows if r.metrics.get("samples_per_s")] for name, rows in loaders.items()}
        medians = np.array([np.median([r.metrics["samples_per_s"] for r in measured[name]]) if measured[name]
                            else np.nan for name in names])
        colors = ["tab:blue" if loaders[name][0].config.get("kind") == "cropbench" else "tab:orange" for name in names]
        axis.barh(positions, np.nan_to_num(medians, nan=0.0), color=colors)
        for position, name in zip(positions, names, strict=True):
            rates = [r.metrics["samples_per_s"] for r in measured[name]]
            if len(rates) > 1:
                axis.scatter(rates, [position] * len(rates), color="black", s=10, zorder=3)
        axis.set_xscale("log")
        finite = medians[np.isfinite(medians)]
        low, high = (finite.min(), finite.max()) if finite.size else (1.0, 10.0)
        axis.set_xlim(low / 3, high * 12)
        for position, name, rate in zip(positions, names, medians, strict=True):
            rows = measured[name]
            if not rows:
                reason = str(loaders[name][-1].metrics.get("skip_reason", ""))
                axis.text(low / 2.8, position, f"skipped: {reason[:120]}", va="center", fontsize=7, color="gray")
                continue
            note = (f"{rate:,.0f}/s" if rate >= 10 else f"{rate:,.1f}/s") + f" (n={rows[-1].metrics.get('count', '?')}"
            note += f", {len(rows)} runs)" if len(rows) > 1 else ")"
            speedups = [r.metrics["direct_speedup"] for r in rows if r.metrics.get("direct_speedup")]
            if speedups and name != "cropbench-direct":
                speedup = float(np.median(speedups))
                note += f"  direct {speedup:,.1f}× faster" if speedup >= 1 else f"  {1 / speedup:,.2f}× direct"
            axis.text(max(rate, *(r.metrics["samples_per_s"] for r in rows)) * 1.2, position, note, va="center",
                      fontsize=8)
        if "cropbench-direct" in names and np.isfinite(medians[names.index("cropbench-direct")]):
            direct = medians[names.index("cropbench-direct")]
            axis.axvline(direct, color="tab:blue", linestyle=":", linewidth=1)
            axis.axvline(direct / 100, color="gray", linestyle="--", linewidth=1)
            axis.text(direct / 100 * 1.05, len(names) - 0.55, "direct ÷ 100", fontsize=7, color="gray")
        axis.set_yticks(positions, names, fontsize=8)
        axis.invert_yaxis()
        axis.grid(axis="x", alpha=0.3)
        size = loaders[names[0]][0].config.get("crop_size", "?")
        axis.set_title(f"{plate} — {size}px crops, all channels, random order (higher is better)", fontsize=9)
        axis.set_xlabel("samples/s, one process, warm page cache (log; bar: median, dots: repeats); blue: cropbench, "
                        "orange: peers; dotted: cropbench direct; dashed: direct ÷ 100", fontsize=8)
    figure.suptitle("Peer loaders vs cropbench on the same plate and crops", fontsize=11)
    return _save(figure, out_dir / "peers_comparison.png")


def _sweep_key(case: str) -> str:
    """A case label without its ``w<N>`` and ``b<N>`` parts: the rows of one worker × batch sweep."""
    return "/".join(part for part in case.split("/") if not re.fullmatch(r"[wb]\d+", part))


def _median(rows: Sequence[Record], metric: str) -> float:
    """Median of a metric over repeats of one configuration."""
    return float(np.median([r.metrics.get(metric, np.nan) for r in rows]))


def track2_scaling(records: Sequence[Record], out_dir: Path) -> Path | None:
    """Samples/s against num_workers, one line per batch size, one panel per swept configuration."""
    sweeps: dict[str, dict[int, dict[int, list[Record]]]] = {}
    for record in _by_track(records, "2"):
        loader = record.config.get("loader", {})
        if "num_workers" not in loader or "samples_per_s" not in record.metrics:
            continue
        by_batch = sweeps.setdefault(_sweep_key(record.case), {}).setdefault(int(loader["batch_size"]), {})
        by_batch.setdefault(int(loader["num_workers"]), []).append(record)
    panels = {key: lines for key, lines in sweeps.items() if any(len(points) >= 2 for points in lines.values())}
    if not panels:
        return None
    columns = min(2, len(panels))
    rows = -(-len(panels) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(7 * columns, 4.6 * rows), squeeze=False)
    for axis, (key, lines) in zip(axes.flat, panels.items(), strict=False):
        for color, (batch, points) in zip(plt.cm.tab10.colors, sorted(lines.items()), strict=False):
            workers = sorted(points)
            axis.plot(workers, [_median(points[w], "samples_per_s") for w in workers], marker="o", color=color,
                      label=f"batch {batch}, steady")
            axis.plot(workers, [_median(points[w], "run_samples_per_s") for w in workers], marker=".",
                      linestyle="--", color=color, alpha=0.7, label=f"batch {batch}, whole run")
        axis.set_xticks(sorted({w for points in lines.values() for w in points}))
        axis.set_xlabel("num_workers (0 = loading in the main process)")
        axis.set_ylabel("samples/s")
        axis.set_ylim(bottom=0)
        axis.set_title(f"Track 2 samples/s vs num_workers (higher is better)\n{key}", fontsize=9)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    for axis in list(axes.flat)[len(panels):]:
        axis.set_visible(False)
    return _save(figure, out_dir / "track2_workers_scaling.png")


def track2_first_batch(records: Sequence[Record], out_dir: Path) -> Path | None:
    """First-batch latency per case: epoch 1 (workers start) and epoch 2 (persistent workers reuse)."""
    rows = [r for r in _by_track(records, "2") if "first_batch_ms" in r.metrics]
    if not rows:
        return None
    positions = np.arange(len(rows))
    figure, axis = plt.subplots(figsize=(12, max(3.0, 0.36 * len(rows) + 1.5)))
    axis.barh(positions - 0.2, [r.metrics["first_batch_ms"] for r in rows], height=0.4, color="tab:red",
              label="epoch 1")
    axis.barh(positions + 0.2, [r.metrics.get("epoch2_first_batch_ms", np.nan) for r in rows], height=0.4,
              color="tab:orange", label="epoch 2")
    axis.set_yticks(positions, [_label(r) for r in rows], fontsize=8)
    axis.invert_yaxis()
    axis.set_xlabel("ms from iter(loader) to the first batch in hand (worker start-up included)")
    axis.set_title("Track 2 first-batch latency (lower is better)")
    axis.grid(axis="x", alpha=0.3)
    axis.legend(fontsize=8, loc="lower right")
    return _save(figure, out_dir / "track2_first_batch.png")


def track3_bars(records: Sequence[Record], out_dir: Path) -> Path | None:
    """Step-time p50 against the compute-only baseline, and the data-wait fraction, per case."""
    rows = [r for r in _by_track(records, "3") if "step_p50_ms" in r.metrics]
    if not rows:
        return None
    positions = np.arange(len(rows))
    height = max(3.0, 0.36 * len(rows) + 1.8)
    below = (0.5, -0.75 / max(height - 1.2, 1.0))  # legends under the x labels, clear of the bars
    figure, (left, right) = plt.subplots(1, 2, figsize=(15, height), sharey=True)
    left.barh(positions, [r.metrics["step_p50_ms"] for r in rows], color="tab:purple", label="step p50")
    left.scatter([r.metrics.get("compute_only_step_p50_ms", np.nan) for r in rows], positions, marker="|", s=250,
                 color="black", zorder=3, label="compute-only p50")
    left.set_yticks(positions, [_label(r) for r in rows], fontsize=8)
    left.invert_yaxis()
    left.set_xlabel("ms per step")
    left.set_title("Track 3 step time p50 (lower is better)")
    left.legend(fontsize=8, loc="upper center", bbox_to_anchor=below, ncol=2)
    wait = [100 * r.metrics.get("data_wait_fraction", np.nan) for r in rows]
    right.barh(positions, wait, color=["tab:green" if w < 10 else "tab:red" for w in wait], label="data wait")
    right.scatter([100 * r.metrics.get("stall_crosscheck", np.nan) for r in rows], positions, marker="x",
                  color="black", zorder=3, label="(step − compute-only) / step")
    right.axvline(10, color="gray", linestyle=":", label="10%: accelerator >= 90% busy")
    right.set_xlabel("% of step time blocked on data (next() + host-to-device copy)")
    right.set_title("Track 3 data-wait fraction (lower is better)")
    right.legend(fontsize=8, loc="upper center", bbox_to_anchor=below, ncol=3)
    for axis in (left, right):
        axis.grid(axis="x", alpha=0.3)
    return _save(figure, out_dir / "track3_step_and_wait.png")


def track3_workers(records: Sequence[Record], out_dir: Path) -> Path | None:
    """Worker searches: data-wait fraction and images/s against num_workers, one line per search."""
    searches = [r for r in _by_track(records, "3") if r.metrics.get("tried_workers")]
    if not searches:
        return None
    figure, (left, right) = plt.subplots(1, 2, figsize=(15, 5.5))
    for color, record in zip(plt.cm.tab10.colors, searches, strict=False):
        workers = record.metrics["tried_workers"]
        answer = record.metrics.get("min_workers")
        search = _sweep_key(_label(record)).replace("/w*", "").removesuffix("/min-workers")
        name = f"{search} → min workers: {answer if answer is not None else 'not reached'}"
        left.plot(workers, [100 * v for v in record.metrics["data_wait_fraction_by_workers"]], marker="o",
                  color=color, label=name)
        right.plot(workers, record.metrics["images_per_s_by_workers"], marker="o", color=color, label=name)
        ceiling = record.metrics.get("compute_only_images_per_s")
        if ceiling:
            right.axhline(ceiling, color=color, linestyle=":", linewidth=1)
            right.set_ylim(top=max(right.get_ylim()[1], ceiling * 1.1))
    left.axhline(10, color="gray", linestyle=":", label="10% threshold")
    left.set_ylabel("% of step time blocked on data")
    left.set_title("Track 3 data wait vs num_workers (lower is better)")
    right.set_ylabel("images/s; dotted: compute-only ceiling")
    right.set_title("Track 3 images/s vs num_workers (higher is better)")
    tried = sorted({w for record in searches for w in record.metrics["tried_workers"]})
    for axis in (left, right):
        axis.set_xlabel("num_workers")
        axis.set_xticks(tried)
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
    left.legend(fontsize=7)
    return _save(figure, out_dir / "track3_workers.png")


#: Every figure maker; tracks 2 and 3 add theirs here.
FIGURES: list[FigureMaker] = [track1_bars, track1_cdf, track1_warmup, layouts_comparison, peers_comparison,
                              track2_scaling, track2_first_batch, track3_bars, track3_workers]


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
