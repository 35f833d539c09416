"""What each track shows in a report, in one place: the columns of its summary table, its figures, the
metrics they read and when a row of it can be drawn, how the verdict judges it and the plain reasons its
flags give there.

One :class:`TrackReport` per track, by its name in :data:`cropbench.tracks.TRACKS` (the model is
zarr-python's one place where codecs are registered). The summary table, the HTML page, the figures and
the verdict read it; nothing else keys a report on a track. The rules themselves are in
:mod:`cropbench.report.rules`, the figure makers in :mod:`cropbench.report.plots`. A track's validity
rules lie in the harness, which writes the flags as rows are measured
(:data:`cropbench.harness.validity.TRACK_VALIDITY`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cropbench import metrics as m
from cropbench.harness.validity import IMPOSSIBLE
from cropbench.records import DATASET_TRACK, LOADER_TRACK, TRAINING_TRACK
from cropbench.report import rules
from cropbench.report.rules import Rule

#: A summary column: (header, metric key, format).
Column = tuple[str, str, str]


def finite(value: Any) -> bool:
    """Whether ``value`` is a finite number (not None, NaN, text or a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def finite_numbers(metrics: Mapping[str, Any], *names: str) -> bool:
    """Whether every named metric is a finite number (not missing, None, NaN, text or a bool)."""
    return all(finite(metrics.get(name)) for name in names)


@dataclass(frozen=True)
class TrackReport:
    """What one track shows in a report.

    ``columns``: its summary table's columns after the case and run. ``figure_metrics``: the metrics its
    figures read (the smoke test checks its rows hold them). ``drawable``: what a row must hold for its
    figures to draw it at all (None: every row; a row without it, a failed or interrupted case or a row
    written by another tool, is left out with a warning, never a traceback). ``reasons``: flag → the plain
    reason the verdict gives, where the track gives the flag a meaning of its own. ``rule``: how the
    verdict judges it (by default: best on samples/s, no ceiling). ``figures``: the names of its figure
    makers in :mod:`cropbench.report.plots`, in the order their files are drawn (names, not the makers,
    so that reading this table loads no plotting library and the figure modules may read it).
    """

    columns: tuple[Column, ...] = ()
    figure_metrics: tuple[str, ...] = ()
    drawable: Callable[[dict[str, Any]], bool] | None = None
    reasons: Mapping[str, str] = field(default_factory=dict)
    rule: Rule = rules.SAMPLES_RULE
    figures: tuple[str, ...] = ()


#: Every track's report, by its name (a track without an entry shows its case, run and nothing more).
REPORTS: dict[str, TrackReport] = {
    DATASET_TRACK: TrackReport(
        columns=(
            ("samples/s", m.SAMPLES_PER_S, "{:,.0f}"),
            ("p50 ms", m.P50_MS, "{:.3f}"),
            ("p95 ms", m.P95_MS, "{:.3f}"),
            ("p99 ms", m.P99_MS, "{:.3f}"),
            ("cold p50 ms", m.COLD_P50_MS, "{:.3f}"),
            ("n", m.COUNT, "{}"),
            ("objects", m.OBJECTS, "{:,}"),
            ("flags", m.VALIDITY_FLAGS, "{}"),
        ),
        figure_metrics=(
            m.P95_MS,
            m.SAMPLES_PER_S,
            m.VALIDITY_FLAGS,
            m.QUANTILES_MS,
            m.WARMUP_MS,
            m.P50_MS,
            m.FIRST_PASS_CURVE_MS,
            m.EVICTION_VERIFIED,
        ),
        drawable=lambda metrics: finite_numbers(metrics, m.P95_MS, m.SAMPLES_PER_S),
        figures=("track1_bars", "track1_cdf", "track1_warmup"),
    ),
    LOADER_TRACK: TrackReport(
        columns=(
            ("samples/s", m.SAMPLES_PER_S, "{:,.0f}"),
            ("run/s", m.RUN_SAMPLES_PER_S, "{:,.0f}"),
            ("first ms", m.FIRST_BATCH_MS, "{:.1f}"),
            ("batch p50 ms", m.BATCH_P50_MS, "{:.2f}"),
            ("batch p95 ms", m.BATCH_P95_MS, "{:.2f}"),
            ("epoch2 first ms", m.EPOCH2_FIRST_BATCH_MS, "{:.1f}"),
            ("persist gain", m.PERSISTENT_EPOCH2_GAIN, "{:+.0%}"),
            ("collate ms", m.COLLATE_MS_MEAN, "{:.2f}"),
            ("worker USS MiB", m.WORKER_USS_MIB_MAX, "{:.0f}"),
            ("xcheck", m.CROSSCHECK_RATIO, "{:.3f}"),
            ("flags", m.VALIDITY_FLAGS, "{}"),
        ),
        figure_metrics=(
            m.CACHE_FRACTION_OF_PLATE,
            m.SAMPLES_PER_S,
            m.RUN_SAMPLES_PER_S,
            m.FIRST_BATCH_MS,
            m.EPOCH2_FIRST_BATCH_MS,
        ),
        drawable=lambda metrics: finite_numbers(metrics, m.SAMPLES_PER_S) or finite_numbers(metrics, m.FIRST_BATCH_MS),
        reasons={"few-samples": "its rate rests on too few timed batches: run more samples per epoch (--samples)"},
        rule=rules.LOADER_RULE,
        figures=("track2_scaling", "track2_first_batch"),
    ),
    TRAINING_TRACK: TrackReport(
        columns=(
            ("images/s", m.IMAGES_PER_S, "{:,.0f}"),
            ("step p50 ms", m.STEP_P50_MS, "{:.1f}"),
            ("step p95 ms", m.STEP_P95_MS, "{:.1f}"),
            ("compute-only p50", m.COMPUTE_ONLY_STEP_P50_MS, "{:.1f}"),
            ("data wait", m.DATA_WAIT_FRACTION, "{:.1%}"),
            ("stall xcheck", m.STALL_CROSSCHECK, "{:.1%}"),
            ("loss", m.LOSS_LAST, "{:.3f}"),
            ("min workers", m.MIN_WORKERS_ANSWER, "{}"),
            ("flags", m.VALIDITY_FLAGS, "{}"),
        ),
        figure_metrics=(
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
        drawable=lambda metrics: (
            finite_numbers(metrics, m.STEP_P50_MS)
            or all(
                metrics.get(name)
                for name in (m.TRIED_WORKERS, m.DATA_WAIT_FRACTION_BY_WORKERS, m.IMAGES_PER_S_BY_WORKERS)
            )
        ),
        reasons={
            "few-samples": "its rate rests on too few timed steps: run more steps (--samples)",
            IMPOSSIBLE: "its numbers contradict each other (a step faster than its compute alone, a data wait "
            "its cross-check does not confirm, or images/s above the compute-only rate): the machine's speed changed "
            "during the run; run again on an idle machine",
        },
        rule=rules.TRAINING_RULE,
        figures=("track3_bars", "track3_workers"),
    ),
    "peers": TrackReport(
        columns=(
            ("samples/s", m.SAMPLES_PER_S, "{:,.1f}"),
            ("× direct", m.RATIO_TO_DIRECT, "{:.4f}"),
            ("direct ÷", m.DIRECT_SPEEDUP, "{:,.1f}"),
            ("p50 ms", m.P50_MS, "{:.3f}"),
            ("p95 ms", m.P95_MS, "{:.3f}"),
            ("n", m.COUNT, "{}"),
            ("flags", m.VALIDITY_FLAGS, "{}"),
            ("skipped", m.SKIPPED, "{}"),
        ),
        figure_metrics=(m.SAMPLES_PER_S, m.SKIP_REASON, m.COUNT, m.DIRECT_SPEEDUP),
        drawable=lambda metrics: finite_numbers(metrics, m.SAMPLES_PER_S) or bool(metrics.get(m.SKIP_REASON)),
        rule=rules.PEERS_RULE,
        figures=("peers_comparison",),
    ),
    "remote": TrackReport(
        columns=(
            ("samples/s", m.SAMPLES_PER_S, "{:,.1f}"),
            ("× local", m.RATIO_TO_LOCAL, "{:.3f}"),
            ("req/crop", m.REQUESTS_PER_CROP, "{:.2f}"),
            ("bytes/crop", m.BYTES_TRANSFERRED_PER_CROP, "{:,.0f}"),
            ("latency ms", m.INJECTED_LATENCY_MS, "{:g}"),
            ("in flight", m.IN_FLIGHT, "{}"),
        ),
        rule=rules.REMOTE_RULE,
    ),
    "targets": TrackReport(
        columns=(
            ("crops/s", m.CROPS_PER_S, "{:,.0f}"),
            ("ratio", m.RATIO_MEDIAN, "{:.3f}"),
            ("q1", m.RATIO_Q1, "{:.3f}"),
            ("q3", m.RATIO_Q3, "{:.3f}"),
            ("blocks", m.PAIRED_BLOCKS, "{}"),
            ("ceiling threads", m.CEILING_THREADS, "{}"),
            ("same bytes", m.IDENTICAL_TO_DIRECT, "{}"),
            ("flags", m.VALIDITY_FLAGS, "{}"),
        ),
        reasons={
            IMPOSSIBLE: "the reader beat the copy ceiling, which no reader of the same crops can pass: the ceiling "
            "or the timing is wrong; run again on an idle machine",
        },
        rule=rules.TARGETS_RULE,
    ),
    "layouts": TrackReport(
        columns=(
            ("random/s", m.access_crops_per_s_key("random"), "{:,.0f}"),
            ("× memmap", m.ratio_to_memmap("random"), "{:.2f}"),
            ("grouped/s", m.access_crops_per_s_key("grouped"), "{:,.0f}"),
            ("× memmap", m.ratio_to_memmap("grouped"), "{:.2f}"),
            ("MiB", m.STORED_MIB, "{:,.1f}"),
            ("ratio", m.COMPRESSION_RATIO, "{:.2f}"),
            ("write s", m.WRITE_SECONDS, "{:.2f}"),
            ("decode amp", m.per_crop("random", m.DECODE_AMPLIFICATION), "{:.1f}"),
            ("chunks/crop", m.per_crop("random", m.CHUNKS_TOUCHED_PER_CROP), "{:.1f}"),
        ),
        figure_metrics=(
            *(m.access_crops_per_s_key(access) for access in m.ACCESS_PATTERNS),
            m.STORED_BYTES,
            m.RAW_BYTES,
        ),
        drawable=lambda metrics: any(
            finite_numbers(metrics, m.access_crops_per_s_key(access)) for access in m.ACCESS_PATTERNS
        ),
        rule=rules.LAYOUTS_RULE,
        figures=("layouts_comparison",),
    ),
    "store-layouts": TrackReport(
        columns=(
            ("MiB", m.STORED_MIB, "{:,.1f}"),
            *(
                column
                for path, prefix in (("direct", m.DIRECT_), ("zarr", m.ZARR_))
                for column in (
                    (f"{path} req/crop", m.prefixed(prefix, m.REQUESTS_PER_CROP), "{:.2f}"),
                    (f"{path}/s", m.prefixed(prefix, m.SAMPLES_PER_S), "{:,.1f}"),
                    (f"{path} local/s", m.prefixed(prefix, m.LOCAL_SAMPLES_PER_S), "{:,.1f}"),
                )
            ),
            ("latency ms", m.INJECTED_LATENCY_MS, "{:g}"),
        ),
        rule=rules.STORE_LAYOUTS_RULE,
    ),
    "formats": TrackReport(rule=rules.FORMATS_RULE),
}
#: The report of a track without an entry (or a row of a track this cropbench does not know).
NO_REPORT = TrackReport()


def report_of(track: str) -> TrackReport:
    """The report of ``track`` (a row's ``Record.track``)."""
    return REPORTS.get(track, NO_REPORT)


__all__ = ["NO_REPORT", "REPORTS", "Column", "TrackReport", "finite", "finite_numbers", "report_of"]
