"""Metric names: one constant each, so a rename fails loudly instead of leaving a "-" cell or a NaN bar.

Tracks write these keys into ``Record.metrics``; ``report``, asv, scripts and tests read them. A key
spelled once here and imported on both sides cannot drift. A family of keys that share a stem (the
latency summary of a timed loop, say) is built with :func:`prefixed` from a named prefix (``IO``,
``COLD``, ``BATCH``...) and the stem's constant, never spelled as an f-string at the site.
Each track's entry in ``report.tracks.REPORTS`` lists what its summary table and figures read; a test
runs the smoke preset and checks the rows hold every one of them (``CONDITIONAL`` ones only appear
when their condition holds, e.g. a skipped peer or a verified eviction).
"""

from __future__ import annotations


def prefixed(prefix: str, name: str) -> str:
    """``name`` of a family of keys (``prefixed(IO, SAMPLES_PER_S)`` is ``io_samples_per_s``)."""
    return prefix + name


# Prefixes of key families.
COLD = "cold_"
FIRST_PASS = "first_pass_"
IO = "io_"
BATCH = "batch_"
STEP = "step_"
WAIT = "wait_"
COMPUTE_ONLY = "compute_only_"
EPOCH2 = "epoch2_"
STAGE = "stage_"

# A latency summary (``measure.protocol.summarise_ms``): each under a family's prefix.
COUNT = "count"
P50_MS = "p50_ms"
P95_MS = "p95_ms"
P99_MS = "p99_ms"
MEAN_MS = "mean_ms"
MAX_MS = "max_ms"
P95_RELIABLE = "p95_reliable"
P99_RELIABLE = "p99_reliable"
QUANTILES_MS = "quantiles_ms"
# A steady state (``measure.protocol.steady_state``): the summary and these.
#: Samples over the wall seconds of the timed fetches that delivered them, under every prefix and in
#: every track: ``measure.protocol.samples_per_s`` is its one definition.
SAMPLES_PER_S = "samples_per_s"
LOOP_SECONDS = "loop_seconds"
TIMED_LOOP_SECONDS = "timed_loop_seconds"
HARNESS_OVERHEAD = "harness_overhead"
# Page-cache eviction (``measure.protocol.Eviction``).
EVICTED_FILES = "evicted_files"
EVICTED_BYTES = "evicted_bytes"
RESIDENT_BEFORE = "resident_before"
RESIDENT_AFTER = "resident_after"
EVICTION_VERIFIED = "eviction_verified"
# Read amplification per crop (the reader's ``ReadStats.per_region``).
CHUNKS_TOUCHED_PER_CROP = "chunks_touched_per_crop"
CHUNKS_DECODED_PER_CROP = "chunks_decoded_per_crop"
READS_PER_CROP = "reads_per_crop"
BYTES_FETCHED_PER_CROP = "bytes_fetched_per_crop"
BYTES_DECODED_PER_CROP = "bytes_decoded_per_crop"
FETCH_AMPLIFICATION = "fetch_amplification"
DECODE_AMPLIFICATION = "decode_amplification"
#: The share of crops read from the plate's crop atlas (one stored chunk each) rather than cut from its fields.
CROPS_FROM_ATLAS = "crops_from_atlas"
# Process memory (``data.loader.memory_of``).
MAIN_RSS_MIB = "main_rss_mib"
WORKER_RSS_MIB = "worker_rss_mib"
WORKER_RSS_MIB_MAX = "worker_rss_mib_max"
WORKER_USS_MIB_MAX = "worker_uss_mib_max"
WORKER_PSS_MIB_SUM = "worker_pss_mib_sum"

# The device a row ran on (``measure.accelerator``).
DEVICE = "device"
GPU_NAME = "gpu_name"
GPU_CAPABILITY = "gpu_capability"
GPU_MULTIPROCESSORS = "gpu_multiprocessors"
NVML = "nvml"
NVML_SAMPLES = "nvml_samples"
GPU_UTIL_MEAN = "gpu_util_mean"
GPU_UTIL_P50 = "gpu_util_p50"
GPU_MEM_USED_MIB_MAX = "gpu_mem_used_mib_max"
CUDA_MAX_ALLOCATED_MIB = "cuda_max_allocated_mib"

# Shared by several tracks.
OBJECTS = "objects"
VALIDITY_FLAGS = "validity_flags"
#: Why a row is flagged impossible: one short sentence per contradiction (``harness.validity.contradictions``).
IMPOSSIBLE_REASONS = "impossible_reasons"
ITEMS_PER_CALL = "items_per_call"
FIRST_BATCH_MS = "first_batch_ms"
ITER_CREATE_MS = "iter_create_ms"
PIN_MEMORY_EFFECTIVE = "pin_memory_effective"
WARMUP_MEAN_MS = "warmup_mean_ms"
# Track 1.
CACHE = "cache"
ITEMS_DRAWN = "items_drawn"
COLD_P50_MS = prefixed(COLD, P50_MS)
WARMUP_MS = "warmup_ms"
FIRST_PASS_CURVE_MS = "first_pass_curve_ms"
#: Chunks touched in the steady state that the store lacks (read as the fill value); None where not counted.
MISSING_CHUNKS = "missing_chunks"
STEADY_EVICTIONS = "steady_evictions"
STEADY_EVICTIONS_VERIFIED = "steady_evictions_verified"
CLOCK_OVERHEAD_FRACTION = "clock_overhead_fraction"
WARMUP_OVER_STEADY = "warmup_over_steady"
FIDELITY_ITEMS = "fidelity_items"
FIDELITY_SHA256 = "fidelity_sha256"
RSS_START_BYTES = "rss_start_bytes"
RSS_END_BYTES = "rss_end_bytes"
DECODED_PLATE_BYTES = "decoded_plate_bytes"
CHUNK_CACHE_FRACTION_OF_PLATE = "chunk_cache_fraction_of_plate"
CACHE_FRACTION_OF_PLATE = "cache_fraction_of_plate"
#: The chunk cache the reader held, in bytes: the configured one, or more where reading ahead grew it.
READER_CACHE_BYTES = "reader_cache_bytes"
RATE_OVER_INVERSE_MEAN = "rate_over_inverse_mean"
TRANSFORM_ONLY_MEAN_MS = "transform_only_mean_ms"
TRANSFORM_SHARE = "transform_share"
STAGE_ITEMS = "stage_items"
#: Stages of the stage split, each ``prefixed(STAGE, name + "_ms")``: see :func:`stage_ms`.
STAGES = ("index", "fetch", "decode", "assemble", "transform", "collate")
STAGE_SUM_MS = "stage_sum_ms"
STAGE_TOTAL_MS = "stage_total_ms"
# Track 2.
RUN_SAMPLES_PER_S = "run_samples_per_s"
BATCH_P50_MS = prefixed(BATCH, P50_MS)
BATCH_P95_MS = prefixed(BATCH, P95_MS)
BATCH_P99_MS = prefixed(BATCH, P99_MS)
STEADY_BATCHES = "steady_batches"
EPOCH_SECONDS = "epoch_seconds"
EPOCH_SAMPLES_PER_S = "epoch_samples_per_s"
SHUTDOWN_MS = "shutdown_ms"
BATCH_MIB = "batch_mib"
STEADY_MIB_PER_S = "steady_mib_per_s"
DELIVERED_SAMPLES = "delivered_samples"
EXPECTED_SAMPLES = "expected_samples"
INDEPENDENT_SAMPLES_PER_S = "independent_samples_per_s"
CROSSCHECK_RATIO = "crosscheck_ratio"
CROSSCHECK_OK = "crosscheck_ok"
COLLATE_MS_MEAN = "collate_ms_mean"
COLLATE_SHARE = "collate_share"
EPOCH2_FIRST_BATCH_MS = prefixed(EPOCH2, FIRST_BATCH_MS)
EPOCH2_ITER_CREATE_MS = prefixed(EPOCH2, ITER_CREATE_MS)
EPOCH2_SPEEDUP = "epoch2_speedup"
PERSISTENT_EPOCH2_GAIN = "persistent_epoch2_gain"
PERSISTENT_FIRST_BATCH_SAVING_MS = "persistent_first_batch_saving_ms"
DATASET_PICKLE_BYTES = "dataset_pickle_bytes"
WARMUP_BATCHES = "warmup_batches"
BATCHES_PER_EPOCH = "batches_per_epoch"
# Where the tier ran and the image bytes per sample crossing each boundary (``data.device_pipeline``).
TRANSFORM_DEVICE = "transform_device"
BYTES_WORKER_TO_MAIN_PER_SAMPLE = "bytes_worker_to_main_per_sample"
BYTES_HOST_TO_DEVICE_PER_SAMPLE = "bytes_host_to_device_per_sample"
# Track 2 loader overhead: uint16 batches/s through the DataLoader over Track 1's batched rate at the
# same thread count, interleaved (paired per block as ``RATIO_*``).
LOADER_BATCHES_PER_S = "loader_batches_per_s"
BATCHED_BATCHES_PER_S = "batched_batches_per_s"
LOADER_OVER_BATCHED = "loader_over_batched"
READER_THREADS = "reader_threads"
# Track 3: a loop's metrics (``_loop_metrics``), also under ``COMPUTE_ONLY`` for the baseline.
IMAGES_PER_S = "images_per_s"
DATA_WAIT_FRACTION = "data_wait_fraction"
COMPUTE_P50_MS = "compute_p50_ms"
ACCELERATOR_BUSY_FRACTION = "accelerator_busy_fraction"
STEP_P50_MS = prefixed(STEP, P50_MS)
STEP_P95_MS = prefixed(STEP, P95_MS)
STEP_MEAN_MS = prefixed(STEP, MEAN_MS)
STEP_COUNT = prefixed(STEP, COUNT)
COMPUTE_ONLY_STEP_COUNT = prefixed(COMPUTE_ONLY, STEP_COUNT)
COMPUTE_ONLY_STEP_P50_MS = prefixed(COMPUTE_ONLY, STEP_P50_MS)
COMPUTE_ONLY_STEP_MEAN_MS = prefixed(COMPUTE_ONLY, STEP_MEAN_MS)
COMPUTE_ONLY_IMAGES_PER_S = prefixed(COMPUTE_ONLY, IMAGES_PER_S)
STALL_CROSSCHECK = "stall_crosscheck"
CROSSCHECK_GAP = "crosscheck_gap"
MEETS_AU_THRESHOLD = "meets_au_threshold"
NON_BLOCKING = "non_blocking"
LOSS_FIRST = "loss_first"
LOSS_LAST = "loss_last"
# Track 3: the same loader alone (no model) beside the model's compute-only demand.
SUPPLY = "supply_"
SUPPLY_SAMPLES_PER_S = prefixed(SUPPLY, SAMPLES_PER_S)
SUPPLY_OVER_DEMAND = "supply_over_demand"
# Track 3 worker searches.
MIN_WORKERS = "min_workers"
REACHED = "reached"
THRESHOLD = "threshold"
MIN_WORKERS_ANSWER = "min_workers_answer"
TRIED_WORKERS = "tried_workers"
#: Candidates whose rows carry a validity flag: measured, but no answer rests on them.
FLAGGED_WORKERS = "flagged_workers"
DATA_WAIT_FRACTION_BY_WORKERS = "data_wait_fraction_by_workers"
IMAGES_PER_S_BY_WORKERS = "images_per_s_by_workers"
# Track 3 thread splits: one core count as workers x decode threads.
CORES = "cores"
SPLITS = "splits"
BEST_SPLIT = "best_split"
FLAGGED_SPLITS = "flagged_splits"
IMAGES_PER_S_BY_SPLIT = "images_per_s_by_split"
DATA_WAIT_FRACTION_BY_SPLIT = "data_wait_fraction_by_split"
SUPPLY_OVER_DEMAND_BY_SPLIT = "supply_over_demand_by_split"
# Layouts: per access pattern (``ACCESS_PATTERNS``), ``access_crops_per_s_key(access)`` and friends.
ACCESS_PATTERNS = ("random", "grouped")
DECODE = "decode"
STORED_BYTES = "stored_bytes"
STORED_MIB = "stored_mib"
RAW_BYTES = "raw_bytes"
COMPRESSION_RATIO = "compression_ratio"
WRITE_SECONDS = "write_seconds"
WRITE_MIB_PER_S = "write_mib_per_s"
FIELDS = "fields"
SIZE_RATIO_TO_MEMMAP = "size_ratio_to_memmap"
AS_PY_RANDOM_CROPS_PER_S = "as_py_random_crops_per_s"
# Peers.
SKIPPED = "skipped"
SKIP_REASON = "skip_reason"
SETUP_SECONDS = "setup_seconds"
WARMUP_ITEMS = "warmup_items"
SAMPLES_REQUESTED = "samples_requested"
BUDGET_CAPPED = "budget_capped"
RATIO_TO_DIRECT = "ratio_to_direct"
DIRECT_SPEEDUP = "direct_speedup"
# What a peer did besides delivering crops (its ``info()``).
CACHE_POOL_BYTES = "cache_pool_bytes"
DASK_SCHEDULER = "dask_scheduler"
DASK_SCHEDULER_IN_WORKERS = "dask_scheduler_in_workers"
SPATIALDATA_VERSION = "spatialdata_version"
TILES_READ = "tiles_read"
CLIPPED_TILES = "clipped_tiles"
CLIPPED_FRACTION = "clipped_fraction"
# The fetch targets (``tracks.targets``): each reader's crops/s over all rounds and the rounds' spread;
# a reader over a reference (the ceiling at the same threads, or a peer) as the median of per-block
# paired ratios with quartiles and extremes; the ceiling's thread count; the run's load average.
CROPS_PER_S = "crops_per_s"
ROUND_MEDIAN = "median"
ROUND_MIN = "min"
ROUND_MAX = "max"
RATIO_MEDIAN = "ratio_median"
RATIO_Q1 = "ratio_q1"
RATIO_Q3 = "ratio_q3"
RATIO_MIN = "ratio_min"
RATIO_MAX = "ratio_max"
PAIRED_BLOCKS = "paired_blocks"
CEILING_THREADS = "ceiling_threads"
LOADAVG_START = "loadavg_start"
LOADAVG_END = "loadavg_end"
SKIPPED_PEERS = "skipped_peers"
#: Whether a reader's crops of a batch are byte for byte the direct reader's.
IDENTICAL_TO_DIRECT = "identical_to_direct"
# Plates in an object store (``harness.runner.store_metrics``): what crossed the wire per crop (the
# reader's requests and bytes), the row's store settings, the rate beside the same plate read locally
# in the same run, and the server's own ceiling (requests/s with a trivial client).
REQUESTS_PER_CROP = "requests_per_crop"
BYTES_TRANSFERRED_PER_CROP = "bytes_transferred_per_crop"
BYTES_TRANSFERRED_PER_DELIVERED_BYTE = "bytes_transferred_per_delivered_byte"
IN_FLIGHT = "in_flight"
INJECTED_LATENCY_MS = "injected_latency_ms"
RATIO_TO_LOCAL = "ratio_to_local"
SERVER_REQUESTS_PER_S = "server_requests_per_s"
# The emulated object store (``measure.store_emulation.ServerWindow.metrics``): the requests the server
# answered over a measured stretch, and the share of the stretch its processes used a core (CPU) or
# were busy (running or ready to run): ``server_bound`` from half a stretch on; the share of the
# machine's cores busy with anything (reader, server, kernel) over the same stretch.
SERVER_REQUESTS = "server_requests"
SERVER_CORE_SHARE = "server_core_share"
SERVER_BUSY_SHARE = "server_busy_share"
SERVER_BOUND = "server_bound"
MACHINE_BUSY_SHARE = "machine_busy_share"
STORE_MODEL = "store_model"
# The first crops of a count (``measure.remote.requests_per_crop``): each shard index fetched once.
WARMUP_REQUESTS_PER_CROP = "warmup_requests_per_crop"
WARMUP_BYTES_PER_CROP = "warmup_bytes_per_crop"
# Layouts over a store (``tracks.store_layouts.layout_over_store``): one row per layout, each read path's
# numbers under its prefix, with the same layout's rate on local disk beside the store's.
LAYOUT = "layout"
#: Why a layout over a store was read behind the Python delay proxy instead of the emulated store.
STORE_EMULATION_SKIP_REASON = "store_emulation_skip_reason"
LOCAL_SAMPLES_PER_S = "local_samples_per_s"
#: The same layout on local disk over the whole pass, first batch included (``RUN_SAMPLES_PER_S``'s pair).
LOCAL_RUN_SAMPLES_PER_S = "local_run_samples_per_s"
DIRECT_ = "direct_"
ZARR_ = "zarr_"


def catalogued(key: str) -> bool:
    """Whether ``key`` is named here: a constant, a constant under a family's prefix (or two), or a
    layouts key of an access pattern. A test checks every key the tracks write."""
    names = {value for name, value in globals().items() if name.isupper() and isinstance(value, str)}
    prefixes = {value for value in names if value.endswith("_")}
    stems = names - prefixes
    for access in ACCESS_PATTERNS:
        if key.startswith(f"{access}_"):
            rest = key.removeprefix(f"{access}_")
            if rest in stems or key in (ratio_to_memmap(access), *access_crops_per_s_spread_keys(access)):
                return True
    if key in {stage_ms(stage) for stage in STAGES}:
        return True
    while key not in stems:
        prefix = next((p for p in prefixes if key.startswith(p)), None)
        if prefix is None:
            return False
        key = key.removeprefix(prefix)
    return True


def stage_ms(stage: str) -> str:
    """Per-item milliseconds of one stage of Track 1's stage split (one of :data:`STAGES`)."""
    if stage not in STAGES:
        raise KeyError(f"stage {stage!r} is not one of {', '.join(STAGES)}")
    return prefixed(STAGE, f"{stage}_ms")


def access_crops_per_s_key(access: str) -> str:
    """The key of the median crops/s of one access pattern in a layouts row."""
    return f"{access}_{CROPS_PER_S}"


def access_crops_per_s_spread_keys(access: str) -> tuple[str, str]:
    """The keys of the lowest and highest crops/s of that access pattern's timed passes."""
    return f"{access_crops_per_s_key(access)}_min", f"{access_crops_per_s_key(access)}_max"


def ratio_to_memmap(access: str) -> str:
    """That throughput divided by the memory-mapped layout's (a reference layout, not the copy ceiling)."""
    return f"{access}_ratio_to_memmap"


def per_crop(access: str, stat: str) -> str:
    """A read-amplification statistic per crop (``DECODE_AMPLIFICATION``, ``CHUNKS_TOUCHED_PER_CROP``)."""
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
        READER_CACHE_BYTES,
        MIN_WORKERS,
        MIN_WORKERS_ANSWER,
        TRIED_WORKERS,
        DATA_WAIT_FRACTION_BY_WORKERS,
        IMAGES_PER_S_BY_WORKERS,
        COMPUTE_ONLY_IMAGES_PER_S,
        PERSISTENT_EPOCH2_GAIN,
        WORKER_USS_MIB_MAX,
        RAW_BYTES,
        # Only over a plate in a store (and the ratio only beside --local-plate): a plate on local disk
        # makes no requests, so its rows count none (not zero).
        IN_FLIGHT,
        INJECTED_LATENCY_MS,
        RATIO_TO_LOCAL,
        REQUESTS_PER_CROP,
        BYTES_TRANSFERRED_PER_CROP,
    }
)

# Distributed runs (``cropbench.harness.ranks``): the aggregate row of a case over its ranks.
RANK = "rank"
WORLD_SIZE = "world_size"
TOTAL_SAMPLES_PER_S = "total_samples_per_s"
RANK_SAMPLES_PER_S = "rank_samples_per_s"
RANK_DATA_WAIT_SECONDS = "rank_data_wait_seconds"
DATA_WAIT_SECONDS = "data_wait_seconds"
STRAGGLER_RATIO = "straggler_ratio"
BYTES_DECODED = "bytes_decoded"
BYTES_DELIVERED = "bytes_delivered"
READ_AMPLIFICATION = "read_amplification"
COVERED_OBJECTS = "covered_objects"
DUPLICATE_SAMPLES = "duplicate_samples"
EXACTLY_ONCE = "exactly_once"
SPEEDUP_OVER_ONE_RANK = "speedup_over_one_rank"
DECODED_OVER_ONE_RANK = "decoded_over_one_rank"

# Track formats (``cropbench.tracks.formats``): the plate read in place (the rows' ``reader`` values, the
# first the reference of every converted row), prefixes of its two protocols, then the conversion's names.
#: Readers of the plate in place, by decode path; the first is every converted row's reference.
IN_PLACE = {"ome-zarr/direct": "direct", "ome-zarr/zarr": "zarr"}
REFERENCE = "ome-zarr/direct"
#: The reader name of the plate re-chunked into a layout and read in place by the direct path.
RECHUNKED_PREFIX = "ome-zarr/"
RANDOM = "random_"
SHUFFLED = "shuffled_"
READER = "reader"
FORMAT_LIBRARY_VERSION = "library_version"
CONVERSION_SECONDS = "conversion_seconds"
CONVERSION_CROPS_PER_S = "conversion_crops_per_s"
CONVERSION_PEAK_RSS_BYTES = "conversion_peak_rss_bytes"
CONVERSION_START_RSS_BYTES = "conversion_start_rss_bytes"
#: The peak less the resident bytes when the conversion started: what converting itself held.
CONVERSION_PEAK_RSS_GROWTH_BYTES = "conversion_peak_rss_growth_bytes"
#: False where the kernel would not reset the peak: the peak is then the process's since it started.
CONVERSION_PEAK_RSS_RESET = "conversion_peak_rss_reset"
PLATE_STORED_BYTES = "plate_stored_bytes"
SIZE_RATIO_TO_PLATE = "size_ratio_to_plate"
RANDOM_RATIO_TO_IN_PLACE = "random_ratio_to_in_place"
#: Crops per second over whole epochs: every crop delivered over the seconds of ``iter()`` and every
#: blocking ``next()``, each epoch's first batch (worker start-up) included (prefixed ``shuffled_``, ``remote_``).
EPOCH_SAMPLES_PER_S = "epoch_samples_per_s"
#: Seconds of one whole shuffled epoch (the objects over ``shuffled_epoch_samples_per_s``): what break-even reads.
SECONDS_PER_EPOCH = "seconds_per_epoch"
BREAK_EVEN_EPOCHS = "break_even_epochs"
CONVERTING_PAYS_OFF = "converting_pays_off"
IDENTICAL_TO_PLATE = "identical_to_plate"
#: Median seconds of a whole epoch of the converted store and of the plate in place (direct), read in
#: turns; the converted store's epoch rate over the plate's (in-place seconds / converted seconds: above
#: 1 the converted store is faster, as ``random_ratio_to_in_place`` reads); and break-even from them
#: (``interleaved_`` + the break-even names).
INTERLEAVED = "interleaved_"
INTERLEAVED_EPOCH_SECONDS = "interleaved_epoch_seconds"
INTERLEAVED_IN_PLACE_EPOCH_SECONDS = "interleaved_in_place_epoch_seconds"
EPOCH_RATIO_TO_IN_PLACE = "epoch_ratio_to_in_place"
#: Prefix of the shuffled epochs read over the loopback store; why a format was not read there.
REMOTE = "remote_"
REMOTE_SKIP_REASON = "remote_skip_reason"
#: Requests the loopback server received during the remote epochs.
REMOTE_REQUESTS = "remote_requests"
#: Bytes the library left in its local cache after the remote epochs.
REMOTE_CACHE_BYTES = "remote_cache_bytes"
#: Bytes in the library's local cache after the first remote epoch: what the later epochs could read
#: from local disk instead of the store (the row is flagged ``library-cache`` where they could).
LOCAL_CACHE_BYTES = "local_cache_bytes"

# A run under a memory limit (``measure.memory_limit``): the limit, how it was applied, what was read.
MEMORY_LIMIT_BYTES = "memory_limit_bytes"
MEMORY_LIMIT_MECHANISM = "memory_limit_mechanism"
MEMORY_LIMIT_NOTE = "memory_limit_note"
CGROUP_PEAK_BYTES = "cgroup_peak_bytes"
DEVICE_READ_BYTES = "device_read_bytes"
DEVICE_READ_SOURCE = "device_read_source"
CGROUP_READ_BYTES = "cgroup_read_bytes"

# Track scale (``tracks.scale``): one row per object count, the costs the growth table follows.
PLATE_RAW_BYTES = "plate_raw_bytes"
GENERATE_SECONDS = "generate_seconds"
CONSTRUCTION_SECONDS = "construction_seconds"
CONSTRUCTION_RSS_BYTES = "construction_rss_bytes"
CONSTRUCTION_PEAK_RSS_BYTES = "construction_peak_rss_bytes"
BYTES_PER_OBJECT = "construction_bytes_per_object"
GROUP_KEYS_NS_PER_SAMPLE = "group_keys_ns_per_sample"
RANDOM_ORDER_NS_PER_SAMPLE = "random_order_ns_per_sample"
GROUPED_ORDER_NS_PER_SAMPLE = "grouped_order_ns_per_sample"
RESIDENT_FRACTION = "plate_resident_fraction"
TRACK1_RANDOM_SAMPLES_PER_S = "track1_random_samples_per_s"
TRACK1_GROUPED_SAMPLES_PER_S = "track1_grouped_samples_per_s"
TRACK2_FIRST_BATCH_MS = "track2_first_batch_ms"
TRACK2_PICKLE_BYTES = "track2_dataset_pickle_bytes"

# Track out-of-memory (``tracks.out_of_memory``): one row per layout, read under a memory limit; ``cached_``
# prefixes the same pass with the plate in the page cache.
PLATE_OVER_LIMIT = "plate_over_limit"
#: The plate came out smaller than ``plate_multiple`` × the limit (the probe misjudged its compression).
PLATE_BELOW_MULTIPLE = "plate_below_multiple"
DEVICE_BYTES_PER_CROP = "device_bytes_per_crop"
DEVICE_OVER_READER = "device_over_reader"
DEVICE_OVER_DELIVERED = "device_over_delivered"
LOADAVG_BEFORE = "loadavg_before"
LOADAVG_AFTER = "loadavg_after"
RESIDENT_BEFORE_PASS = "resident_before_pass"
CACHED_ = "cached_"
CACHED_SKIPPED = "cached_skipped"
LIMITED_OVER_CACHED = "limited_over_cached"

# cropbench advise (``tracks.training.advise``; the decisions in ``report.advice``): per question, a row per
# option read in whole epochs taking turns with the others, and a row per paired ratio that decides it.
#: The question a row answers, and the option it measured.
QUESTION = "question"
OPTION = "option"
#: Crops per whole epoch (each read once in it), and how many rounds (one epoch per option each) ran.
EPOCH_CROPS = "epoch_crops"
#: Whether the budget cut the epochs below what was asked (``epoch_crops`` then says how many a probe of a
#: few batches showed the question's share of the budget could read in its rounds).
EPOCH_CROPS_FITTED = "epoch_crops_fitted_to_budget"
ROUNDS = "rounds"
#: Wall seconds of each whole epoch, one per round: ``iter()``, every batch (the first included) and the
#: workers' start-up and shut-down; crops per epoch over the median of them.
WHOLE_EPOCH_SECONDS = "whole_epoch_seconds"
WHOLE_EPOCH_SAMPLES_PER_S = "whole_epoch_samples_per_s"
#: CPU seconds of each epoch in every process (main and workers), and their sum over the wall seconds:
#: the cores the epochs kept busy.
CPU_SECONDS = "cpu_seconds"
CORES_BUSY = "cores_busy"
#: Whether a paired ratio tells its options apart (its quartile spread below its distance from 1), and
#: whether the rounds stopped at the budget with it still open.
SETTLED = "settled"
BUDGET_ENDED = "budget_ended"
#: Crops/s the loader must deliver for the model to wait less than the data-wait threshold.
NEED_SAMPLES_PER_S = "need_samples_per_s"
#: The loop's images/s and data wait predicted from the loader's and the model's rates measured apart.
PREDICTED_IMAGES_PER_S = "predicted_images_per_s"
PREDICTED_DATA_WAIT_FRACTION = "predicted_data_wait_fraction"
