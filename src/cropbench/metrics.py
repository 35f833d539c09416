"""Metric names that tables, figures, asv and tests read: one constant each, so a rename fails loudly.

Tracks write these keys into ``Record.metrics``; ``report`` reads them. A key spelled once here and
imported on both sides cannot drift into a "-" cell or a NaN bar. ``SUMMARY_METRICS`` and
``FIGURE_METRICS`` list, per track, what the summary table and the figures read; a test runs the
smoke preset and checks the rows hold every one of them (``CONDITIONAL`` ones only appear when
their condition holds, e.g. a skipped peer or a verified eviction).
"""

from __future__ import annotations

# Shared by several tracks.
SAMPLES_PER_S = "samples_per_s"
P50_MS = "p50_ms"
P95_MS = "p95_ms"
P99_MS = "p99_ms"
COUNT = "count"
OBJECTS = "objects"
VALIDITY_FLAGS = "validity_flags"
# Track 1.
COLD_P50_MS = "cold_p50_ms"
QUANTILES_MS = "quantiles_ms"
WARMUP_MS = "warmup_ms"
FIRST_PASS_CURVE_MS = "first_pass_curve_ms"
EVICTION_VERIFIED = "eviction_verified"
# Track 2.
RUN_SAMPLES_PER_S = "run_samples_per_s"
FIRST_BATCH_MS = "first_batch_ms"
BATCH_P50_MS = "batch_p50_ms"
BATCH_P95_MS = "batch_p95_ms"
EPOCH2_FIRST_BATCH_MS = "epoch2_first_batch_ms"
PERSISTENT_EPOCH2_GAIN = "persistent_epoch2_gain"
COLLATE_MS_MEAN = "collate_ms_mean"
WORKER_USS_MIB_MAX = "worker_uss_mib_max"
CROSSCHECK_RATIO = "crosscheck_ratio"
CACHE_FRACTION_OF_PLATE = "cache_fraction_of_plate"
# Track 3.
IMAGES_PER_S = "images_per_s"
STEP_P50_MS = "step_p50_ms"
STEP_P95_MS = "step_p95_ms"
COMPUTE_ONLY_STEP_P50_MS = "compute_only_step_p50_ms"
DATA_WAIT_FRACTION = "data_wait_fraction"
STALL_CROSSCHECK = "stall_crosscheck"
LOSS_LAST = "loss_last"
MIN_WORKERS_ANSWER = "min_workers_answer"
MIN_WORKERS = "min_workers"
TRIED_WORKERS = "tried_workers"
DATA_WAIT_FRACTION_BY_WORKERS = "data_wait_fraction_by_workers"
IMAGES_PER_S_BY_WORKERS = "images_per_s_by_workers"
COMPUTE_ONLY_IMAGES_PER_S = "compute_only_images_per_s"
# Layouts: per access pattern (``ACCESS_PATTERNS``), ``crops_per_s(access)`` and friends.
ACCESS_PATTERNS = ("random", "grouped")
STORED_BYTES = "stored_bytes"
STORED_MIB = "stored_mib"
RAW_BYTES = "raw_bytes"
COMPRESSION_RATIO = "compression_ratio"
WRITE_SECONDS = "write_seconds"
# Peers.
RATIO_TO_DIRECT = "ratio_to_direct"
DIRECT_SPEEDUP = "direct_speedup"
SKIP_REASON = "skip_reason"


def crops_per_s(access: str) -> str:
    """Median crops/s of one access pattern in a layouts row."""
    return f"{access}_crops_per_s"


def ratio_to_memmap(access: str) -> str:
    """That throughput divided by the memory-mapped ceiling's."""
    return f"{access}_ratio_to_memmap"


def per_crop(access: str, stat: str) -> str:
    """A read-amplification statistic per crop (``decode_amplification``, ``chunks_touched_per_crop``)."""
    return f"{access}_{stat}"


#: Metrics a row holds only when their condition holds (skipped peer, verified eviction, a worker
#: search, a sweep over workers, a reader cache, a model step): the smoke test does not require them.
CONDITIONAL = frozenset(
    {
        COLD_P50_MS,
        SKIP_REASON,
        VALIDITY_FLAGS,
        EVICTION_VERIFIED,
        FIRST_PASS_CURVE_MS,
        CACHE_FRACTION_OF_PLATE,
        MIN_WORKERS,
        MIN_WORKERS_ANSWER,
        TRIED_WORKERS,
        DATA_WAIT_FRACTION_BY_WORKERS,
        IMAGES_PER_S_BY_WORKERS,
        COMPUTE_ONLY_IMAGES_PER_S,
        PERSISTENT_EPOCH2_GAIN,
        WORKER_USS_MIB_MAX,
        RAW_BYTES,
    }
)
