"""Configuration as data: frozen, validated dataclasses for plates, layouts, crops and tracks.

Every object here is serialisable with :func:`dataclasses.asdict`, which is how each knob ends
up in the result record.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cropbench.errors import ConfigError

CELL_PAINTING_CHANNELS: tuple[str, ...] = ("DNA", "ER", "RNA", "AGP", "Mito", "Brightfield", "Extra1", "Extra2")
CODECS = ("none", "blosc-lz4", "blosc-zstd", "zstd")
#: Storage formats a layout can use, and the codecs each accepts (see formats/ for the readers).
FORMAT_CODECS: dict[str, tuple[str, ...]] = {
    "ome-zarr": CODECS,
    "tiff": ("none", "zlib"),
    "memmap": ("none",),
    "ome-arrow": ("none", "zstd"),
}
FORMATS = tuple(FORMAT_CODECS)
#: How the inner chunks of a shard follow each other in the shard file: as zarr-python writes them
#: (``zarr``: Morton order in zarr-python 3), or along a Hilbert curve over the chunk grid (``hilbert``:
#: neighbouring chunks neighbours on disk, so a crop's chunks lie in few byte ranges). Either way the
#: shard index says where each chunk lies, so every zarr v3 reader reads both.
CHUNK_ORDERS = ("zarr", "hilbert")
OUTPUT_DTYPES = ("uint16", "float32", "float16", "bfloat16")
TRANSFORM_TIERS = ("none", "light", "typical")
#: ``as-py`` is the OME-Arrow reference script's path (``.as_py()`` then numpy); other formats lack it.
DECODE_PATHS = ("zarr", "direct", "field", "as-py")
BORDER_POLICIES = ("pad", "shift", "drop")
ACCESS_PATTERNS = ("random", "grouped-field", "grouped-well", "chunk-aware", "paired")
CACHE_STATES = ("warm", "cold")
#: The decoded-chunk cache of a reader when nothing else is said: the one default of every read path.
DEFAULT_CHUNK_CACHE_BYTES = 32 * 2**20
#: The largest coalescing gap: 1 GiB, more than any shard's reads are apart (an offset past it overflows 64 bits).
MAX_COALESCE_GAP_BYTES = 1 << 30
#: The largest field edge in pixels (a 16k × 16k field of 8 channels is 4 GiB; cameras give 1-5k).
MAX_FIELD_SIZE = 16384
#: A crop's edge in pixels when nothing else is said: a cell with its neighbourhood at 20x.
DEFAULT_CROP_SIZE = 96
#: The largest seed: numpy's generators take no negative seed, its legacy global RNG none of 2**32 or more.
MAX_SEED = 2**32 - 1


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    _require(value in allowed, f"{name}={value!r} is not one of {', '.join(allowed)}")


def _positive(name: str, value: int) -> None:
    _require(isinstance(value, int) and value > 0, f"{name} must be a positive integer, got {value!r}")


def check_workers(value: int, name: str = "workers", least: int = 0) -> int:
    """``value`` if it is a count of DataLoader worker processes: a whole number from ``least`` to
    :data:`MAX_WORKERS` (each worker is a process forked from the main one). Every worker count is
    checked here."""
    _require(
        isinstance(value, int) and not isinstance(value, bool) and least <= value <= MAX_WORKERS,
        f"{name} must be a whole number from {least} to {MAX_WORKERS} (each worker is a process), got {value!r}",
    )
    return value


def check_seed(value: int, name: str = "seed") -> int:
    """``value`` if it is a seed every generator accepts (a whole number from 0 to :data:`MAX_SEED`)."""
    _require(
        isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_SEED,
        f"{name} must be a whole number from 0 to {MAX_SEED}, got {value!r}",
    )
    return value


@dataclass(frozen=True)
class PlateSpec:
    """What a synthetic plate holds: wells × fields, channels, field size and cell density."""

    name: str = "synthetic"
    rows: int = 1
    columns: int = 2
    fields_per_well: int = 2
    channels: int = 5
    field_height: int = 1080
    field_width: int = 1080
    cells_per_field: int = 300
    seed: int = 0

    def __post_init__(self) -> None:
        for knob in ("rows", "columns", "fields_per_well", "channels", "field_height", "field_width"):
            _positive(knob, getattr(self, knob))
        _require(self.rows <= 16 and self.columns <= 24, "rows must be <= 16 and columns <= 24 (a 384-well plate)")
        _require(self.channels <= len(CELL_PAINTING_CHANNELS), f"channels must be <= {len(CELL_PAINTING_CHANNELS)}")
        _require(
            64 <= self.field_height <= MAX_FIELD_SIZE and 64 <= self.field_width <= MAX_FIELD_SIZE,
            f"field_height and field_width must be 64 to {MAX_FIELD_SIZE}, got {self.field_height}×{self.field_width}",
        )
        _require(self.cells_per_field >= 1, f"cells_per_field must be >= 1, got {self.cells_per_field}")
        _require(self.name.isidentifier(), f"name must be a plain identifier, got {self.name!r}")
        check_seed(self.seed)

    @property
    def channel_names(self) -> tuple[str, ...]:
        return CELL_PAINTING_CHANNELS[: self.channels]

    @property
    def field_count(self) -> int:
        return self.rows * self.columns * self.fields_per_well

    @property
    def field_bytes(self) -> int:
        return self.channels * self.field_height * self.field_width * 2

    @property
    def total_bytes(self) -> int:
        return self.field_count * self.field_bytes


@dataclass(frozen=True)
class LayoutSpec:
    """How the pixels of each field are chunked, compressed and sharded on disk.

    ``channels_per_chunk=0`` puts all channels in one chunk; ``chunk_yx=0`` makes a chunk span the
    whole field plane. ``shard_yx=-1`` makes one shard per field (rounded up to a multiple of the
    chunk), ``0`` disables sharding. Chunk and shard knobs apply to ``format="ome-zarr"`` only:
    ``tiff`` writes one TIFF per field and channel (tifffile's default strips), ``memmap`` one raw
    array for the plate.

    ``chunk_order`` (:data:`CHUNK_ORDERS`) is the order of a shard's chunks on disk. A layout may name
    the ``coalesce_gap_bytes`` that suits it over an object store: the plate records it, and the direct
    reader reads no wider a gap on it than that (see :class:`StoreConfig`); None: the store's gap.

    ``crop_atlas`` > 0 also writes, beside the fields, every object's crop of that size (all channels,
    zero outside the field) as one chunk of an OME-Zarr image inside the plate
    (:mod:`cropbench.plates.atlas`): a crop the direct reader finds there costs one chunk, one range
    request over an object store, instead of the field chunks it overlaps. The fields stay as they are.
    """

    chunk_yx: int = 256
    channels_per_chunk: int = 0
    codec: str = "blosc-lz4"
    clevel: int = 5
    shard_yx: int = 0
    format: str = "ome-zarr"
    colocate_objects: bool = False
    chunk_order: str = "zarr"
    coalesce_gap_bytes: int | None = None
    crop_atlas: int = 0

    def __post_init__(self) -> None:
        _choice("format", self.format, FORMATS)
        _require(
            isinstance(self.crop_atlas, int) and 0 <= self.crop_atlas <= MAX_FIELD_SIZE,
            f"crop_atlas must be a crop size from 0 (none) to {MAX_FIELD_SIZE}, got {self.crop_atlas!r}",
        )
        _require(
            not self.crop_atlas or self.format == "ome-zarr",
            f"crop_atlas needs format 'ome-zarr' (an image inside the plate), got {self.format!r}",
        )
        _require(
            not self.colocate_objects or self.format == "ome-arrow",
            f"colocate_objects needs format 'ome-arrow' (the object table beside the images), got {self.format!r}",
        )
        _choice(f"codec (format {self.format})", self.codec, FORMAT_CODECS[self.format])
        _require(self.chunk_yx >= 0, f"chunk_yx must be >= 0, got {self.chunk_yx}")
        _require(self.channels_per_chunk >= 0, f"channels_per_chunk must be >= 0, got {self.channels_per_chunk}")
        _require(self.shard_yx >= -1, f"shard_yx must be >= -1, got {self.shard_yx}")
        if self.shard_yx > 0 and self.chunk_yx > 0:
            _require(
                self.shard_yx % self.chunk_yx == 0,
                f"shard_yx={self.shard_yx} must be a multiple of chunk_yx={self.chunk_yx}",
            )
        _require(1 <= self.clevel <= 9, f"clevel must be within 1..9, got {self.clevel}")
        _choice("chunk_order", self.chunk_order, CHUNK_ORDERS)
        _require(
            self.chunk_order == "zarr" or (self.format == "ome-zarr" and self.shard_yx != 0),
            f"chunk_order={self.chunk_order!r} orders the chunks inside shards: it needs format 'ome-zarr' "
            f"and shard_yx != 0, got format={self.format!r}, shard_yx={self.shard_yx}",
        )
        _require(
            self.coalesce_gap_bytes is None
            or (isinstance(self.coalesce_gap_bytes, int) and 0 <= self.coalesce_gap_bytes <= MAX_COALESCE_GAP_BYTES),
            f"coalesce_gap_bytes must be None or 0 to {MAX_COALESCE_GAP_BYTES:,}, got {self.coalesce_gap_bytes!r}",
        )

    def chunk_shape(self, channels: int, height: int, width: int) -> tuple[int, int, int]:
        c = channels if self.channels_per_chunk == 0 else min(self.channels_per_chunk, channels)
        if self.chunk_yx == 0:
            return (c, height, width)
        return (c, min(self.chunk_yx, height), min(self.chunk_yx, width))

    def shard_shape(self, channels: int, height: int, width: int) -> tuple[int, int, int] | None:
        if self.shard_yx == 0:
            return None
        chunk = self.chunk_shape(channels, height, width)
        if self.shard_yx == -1:
            return (channels, _round_up(height, chunk[1]), _round_up(width, chunk[2]))
        return (channels, self.shard_yx, self.shard_yx)

    @property
    def label(self) -> str:
        if self.format == "memmap":
            return "memmap"
        if self.format == "ome-arrow":
            codec = f"zstd{self.clevel}" if self.codec == "zstd" else self.codec
            return f"ome-arrow-{codec}-yx{self.chunk_yx or 'plane'}" + ("+objects" if self.colocate_objects else "")
        if self.format != "ome-zarr":
            return f"{self.format}-{self.codec}"
        chunk = "plane" if self.chunk_yx == 0 else str(self.chunk_yx)
        channels = "all" if self.channels_per_chunk == 0 else str(self.channels_per_chunk)
        shard = {0: "", -1: "-shard-field"}.get(self.shard_yx, f"-shard{self.shard_yx}")
        order = "" if self.chunk_order == "zarr" else f"-{self.chunk_order}"
        gap = "" if self.coalesce_gap_bytes is None else f"-gap{self.coalesce_gap_bytes}"
        atlas = f"-atlas{self.crop_atlas}" if self.crop_atlas else ""
        return f"c{channels}-yx{chunk}-{self.codec}{shard}{order}{gap}{atlas}"


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


#: Named layouts. ``default`` is the random-access default (see README, "Default layout"):
#: one zarr v3 shard per field holding 64 × 64 all-channel blosc-lz4 chunks.
LAYOUTS: dict[str, LayoutSpec] = {
    "default": LayoutSpec(chunk_yx=64, channels_per_chunk=0, codec="blosc-lz4", shard_yx=-1),
    "tiles": LayoutSpec(chunk_yx=256, channels_per_chunk=0, codec="blosc-lz4"),
    "channel-tiles": LayoutSpec(chunk_yx=256, channels_per_chunk=1, codec="blosc-lz4"),
    "planes": LayoutSpec(chunk_yx=0, channels_per_chunk=1, codec="blosc-lz4"),
    "sharded": LayoutSpec(chunk_yx=64, channels_per_chunk=0, codec="blosc-lz4", shard_yx=-1),
    # For crops read in place from an object store: 32 px chunks a crop touches fewer bytes of, in Hilbert
    # order so its chunks lie in a few byte ranges, read with a gap that joins those and not their
    # neighbours (see docs/how-to/choose-layout.md).
    "hilbert": LayoutSpec(
        chunk_yx=32,
        channels_per_chunk=0,
        codec="blosc-lz4",
        shard_yx=-1,
        chunk_order="hilbert",
        coalesce_gap_bytes=24576,
    ),
}
# For shuffled training epochs read in place: the ``default`` fields (what a grouped pass and other crop
# sizes read), and every object's crop of the default size once more as one chunk each, so such a crop is
# one read of its own bytes; no coalescing gap, so the cells of a batch's crops are read alone and a run of
# consecutive cells, which touch, as one.
LAYOUTS["atlas"] = dataclasses.replace(LAYOUTS["default"], crop_atlas=DEFAULT_CROP_SIZE, coalesce_gap_bytes=0)
#: The OME-Zarr structures compared side by side; each gets one named layout per codec.
_ZARR_STRUCTURES = ("planes", "tiles", "channel-tiles", "sharded")
LAYOUTS.update(
    {
        f"{structure}-{codec}": dataclasses.replace(LAYOUTS[structure], codec=codec)
        for structure in _ZARR_STRUCTURES
        for codec in CODECS
    }
)
LAYOUTS.update(
    {
        "tiff": LayoutSpec(format="tiff", codec="none"),
        "tiff-zlib": LayoutSpec(format="tiff", codec="zlib"),
        "memmap": LayoutSpec(format="memmap", codec="none"),
        # OME-Arrow (optional extra [arrow]): per-channel 256-px tiles (the format's "fast_crop_2d" choice),
        # chunk-level zstd-1 as its authors recommend, or uncompressed; one variant keeps the objects inline.
        "ome-arrow": LayoutSpec(format="ome-arrow", codec="none", chunk_yx=256, channels_per_chunk=1),
        "ome-arrow-zstd": LayoutSpec(format="ome-arrow", codec="zstd", clevel=1, chunk_yx=256, channels_per_chunk=1),
        "ome-arrow-zstd-objects": LayoutSpec(
            format="ome-arrow", codec="zstd", clevel=1, chunk_yx=256, channels_per_chunk=1, colocate_objects=True
        ),
    }
)
#: The layout a comparison of layouts measures the others against: raw pixels, read with no decode.
CEILING_LAYOUT = "memmap"
#: Layouts that need an optional extra; ``compare-layouts`` adds them when the extra is installed.
OPTIONAL_LAYOUTS: tuple[str, ...] = ("ome-arrow", "ome-arrow-zstd", "ome-arrow-zstd-objects")
#: The layouts ``cropbench compare-layouts`` measures by default: every OME-Zarr structure × codec,
#: TIFF per field and channel, and the raw memory-mapped reference (see tracks.layouts).
LAYOUT_GRID: tuple[str, ...] = (
    *(f"{structure}-{codec}" for structure in _ZARR_STRUCTURES for codec in CODECS),
    "tiff",
    "tiff-zlib",
    "memmap",
)


def layout_by_name(name: str) -> LayoutSpec:
    _choice("layout", name, tuple(LAYOUTS))
    return LAYOUTS[name]


#: Bytes the direct reader's prefetch keeps requested and not yet decoded into its cache, when nothing else is said:
#: about a batch's transfer (64 crops of 96 px read with a 1 MiB coalescing gap move ~33 MiB), or the
#: prefetch fetches a batch in several round trips one after another.
DEFAULT_PREFETCH_BYTES = 64 * 2**20
#: Batches the direct reader fetches ahead over an object store when nothing else is said (a local
#: plate reads a batch in less time than a prefetch saves: none there unless asked). A batch waits for
#: its slowest request; a shuffled epoch of one request a crop at 20 ms (100 ms at p99) fetched 2
#: batches ahead left the reader waiting on that tail with its cores 60 % idle, and ran 1.7x faster
#: 6 ahead (docs/results/object-stores.md).
DEFAULT_REMOTE_PREFETCH_BATCHES = 6


@dataclass(frozen=True)
class PrefetchConfig:
    """How far the direct reader reads ahead of the batch it is asked for, once it knows the order.

    ``batches`` upcoming batches have their chunks fetched and decoded into the reader's chunk cache
    on ``threads`` background threads while the current batch decodes (None: 6 over an object store,
    0 on a local plate; 0: off). Each thread fetches one batch at a time (None: a thread a batch read
    ahead, as each mostly waits on the network). At most ``bytes_in_flight`` bytes are requested and not yet in the
    cache at once (one read larger than that still goes, alone). The chunk cache must hold the
    chunks of ``batches + 1`` batches, or prefetched chunks are evicted before they are used:
    cropbench's loader refuses ``batches`` asked for that it cannot hold, and grows the cache for
    the default (:meth:`~cropbench.formats.direct.DirectChunkReader.hold_read_ahead`).
    """

    batches: int | None = None
    bytes_in_flight: int = DEFAULT_PREFETCH_BYTES
    threads: int | None = None

    def __post_init__(self) -> None:
        _require(
            self.batches is None or (isinstance(self.batches, int) and self.batches >= 0),
            f"prefetch batches must be None (by where the plate is) or an integer >= 0, got {self.batches!r}",
        )
        _positive("prefetch bytes_in_flight", self.bytes_in_flight)
        if self.threads is not None:
            _positive("prefetch threads", self.threads)

    def batches_for(self, remote: bool) -> int:
        """Batches read ahead on a plate in an object store (``remote``) or on a local one."""
        if self.batches is not None:
            return self.batches
        return DEFAULT_REMOTE_PREFETCH_BATCHES if remote else 0

    def threads_for(self, batches: int) -> int:
        """Prefetch threads when ``batches`` are read ahead."""
        return self.threads if self.threads is not None else max(batches, 1)


@dataclass(frozen=True)
class ReaderOptions:
    """The knobs of a format's own reader, as one object: every reader is built from it by the same
    call, and takes the knobs that apply to it (a memory map has nothing to cache or decode)."""

    chunk_cache_bytes: int = DEFAULT_CHUNK_CACHE_BYTES
    #: Threads that read, decode and copy chunks in one process (the OME-Zarr chunk reader's).
    decode_threads: int = 1
    #: Reading ahead of the batch asked for (the OME-Zarr chunk reader's), once the order is known.
    prefetch: PrefetchConfig = PrefetchConfig()

    def __post_init__(self) -> None:
        _require(self.chunk_cache_bytes >= 0, f"chunk_cache_bytes must be >= 0, got {self.chunk_cache_bytes}")
        _positive("decode_threads", self.decode_threads)
        _require(isinstance(self.prefetch, PrefetchConfig), f"prefetch must be a PrefetchConfig, got {self.prefetch!r}")


#: The largest crop edge: a crop is cut from one field (MAX_FIELD_SIZE).
MAX_CROP_SIZE = 16384


@dataclass(frozen=True)
class CropConfig:
    """How :class:`cropbench.data.dataset.CropDataset` cuts, decodes and transforms each crop."""

    crop_size: int = DEFAULT_CROP_SIZE
    channels: tuple[str, ...] | None = None
    dtype: str = "float32"
    decode: str = "direct"
    tier: str = "none"
    border: str = "pad"
    output_size: int | None = None
    chunk_cache_bytes: int = DEFAULT_CHUNK_CACHE_BYTES
    field_cache_fields: int = 2
    seed: int = 0
    #: Threads that read, decode and copy chunks inside one process (``direct`` on OME-Zarr): an
    #: alternative to DataLoader worker processes without the per-batch shared-memory hand-over.
    decode_threads: int = 1

    def __post_init__(self) -> None:
        _positive("crop_size", self.crop_size)
        _positive("decode_threads", self.decode_threads)
        _choice("dtype", self.dtype, OUTPUT_DTYPES)
        _choice("decode", self.decode, DECODE_PATHS)
        _choice("tier", self.tier, TRANSFORM_TIERS)
        _choice("border", self.border, BORDER_POLICIES)
        if self.output_size is not None:
            _positive("output_size", self.output_size)
        _require(self.chunk_cache_bytes >= 0, f"chunk_cache_bytes must be >= 0, got {self.chunk_cache_bytes}")
        _positive("field_cache_fields", self.field_cache_fields)
        check_seed(self.seed)
        if self.channels is not None:
            _require(len(self.channels) > 0, "channels must name at least one channel (or be None for all)")
            object.__setattr__(self, "channels", tuple(self.channels))
        _require(
            self.tier == "none" or self.dtype != "uint16",
            f"tier={self.tier!r} normalises to floats and needs a float dtype, got dtype='uint16'",
        )

    def replace(self, **changes: Any) -> CropConfig:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class CropOverrides:
    """Crop knobs fixed for every case of a run, over what each preset sets (None: the preset's value).

    The command line's ``--decode-threads``, ``--chunk-cache-bytes``, ``--crop-size``, ``--decode``,
    ``--dtype`` and ``--tier``; the runner applies them to each case's :class:`CropConfig`, so a row's
    config (and its identity) holds the values that ran.
    """

    crop_size: int | None = None
    decode: str | None = None
    dtype: str | None = None
    tier: str | None = None
    chunk_cache_bytes: int | None = None
    decode_threads: int | None = None

    def __post_init__(self) -> None:
        CropConfig().replace(**{key: value for key, value in self.changes().items() if key not in ("dtype", "tier")})
        if self.dtype is not None:
            _choice("dtype", self.dtype, OUTPUT_DTYPES)
        if self.tier is not None:
            _choice("tier", self.tier, TRANSFORM_TIERS)

    def changes(self) -> dict[str, Any]:
        """The knobs that are set, by CropConfig field name."""
        return {key: value for key, value in dataclasses.asdict(self).items() if value is not None}

    def apply(self, crop: CropConfig) -> CropConfig:
        """``crop`` with the set knobs; ConfigError when the result is not a valid crop (say uint16 and a tier)."""
        changes = self.changes()
        return crop.replace(**changes) if changes else crop


#: Synthetic plate presets: ``smoke`` writes in seconds; ``full`` is the realistic default plate.
PLATE_PRESETS: dict[str, PlateSpec] = {
    "smoke": PlateSpec(
        rows=1, columns=2, fields_per_well=2, channels=5, field_height=540, field_width=540, cells_per_field=80
    ),
    "full": PlateSpec(
        rows=2, columns=4, fields_per_well=2, channels=5, field_height=1080, field_width=1080, cells_per_field=320
    ),
}


def plate_preset(name: str) -> PlateSpec:
    _choice("preset", name, tuple(PLATE_PRESETS))
    return PLATE_PRESETS[name]


#: Clients zarr-python reads a remote plate with: its obstore-backed ``ObjectStore`` or ``FsspecStore`` (s3fs).
ZARR_CLIENTS = ("obstore", "fsspec")


#: The longest deadline a request to an object store may have (an hour): finite, so every request ends.
MAX_TIMEOUT_S = 3600.0
#: The most requests in flight (each holds a connection and a thread; real stores are measured at 256).
MAX_IN_FLIGHT = 1024
#: More DataLoader worker processes than this is a typo, not a plan: each one forks the main process.
MAX_WORKERS = 256
#: The coalescing gap over an object store when nothing else is said: a round trip costs more than reading 1 MiB.
DEFAULT_COALESCE_GAP_BYTES = 1 << 20
#: Requests the direct path keeps open per process by default: against a store with tens of ms to the
#: first byte, 64 read a shuffled epoch 1.4x faster than 16 (emulated store and replay model alike).
DEFAULT_IN_FLIGHT = 64
#: The most retries of a request: with a timeout each, more would let one bad range hold a run for days.
MAX_RETRIES = 20
#: Bounds of the object-store measurements' knobs, beyond which a run would not end or no machine hold it:
#: the longest first-byte latency a store injects (a minute), the largest response asked for, the fastest
#: link, the most rounds, the largest shard written (the most DataLoader workers: :data:`MAX_WORKERS`).
MAX_LATENCY_MS = 60_000.0
MAX_RESPONSE_KIB = 256 * 1024
MAX_LINK_GBIT_S = 10_000.0
MAX_ROUNDS = 1000
MAX_SHARD_MIB = 4096


@dataclass(frozen=True)
class StoreConfig:
    """How a plate in an object store (``s3://``, ``http(s)://``) is read; ignored for local plates.

    ``in_flight`` requests are kept open at once by the direct path; byte ranges of one shard closer
    than ``coalesce_gap_bytes`` are fetched in one request (the gap is read and dropped: a round
    trip costs more than a few hundred kB); on a plate whose layout names a smaller gap
    (:attr:`LayoutSpec.coalesce_gap_bytes`), that one, unless ``layout_gap`` is False
    (:func:`coalesce_gap`). ``timeout_s`` bounds each request, ``retries`` retries a
    failed one; ``latency_ms`` is the delay injected per request by a loopback proxy (0: none).
    ``endpoint`` overrides ``AWS_ENDPOINT_URL`` (S3) or the URL's scheme and host (HTTP); empty: as given.
    """

    in_flight: int = DEFAULT_IN_FLIGHT
    coalesce_gap_bytes: int = DEFAULT_COALESCE_GAP_BYTES
    timeout_s: float = 30.0
    connect_timeout_s: float = 5.0
    retries: int = 2
    latency_ms: float = 0.0
    zarr_client: str = "fsspec"
    anonymous: bool = False
    endpoint: str = ""
    layout_gap: bool = True

    def __post_init__(self) -> None:
        _positive("in_flight", self.in_flight)
        _require(
            self.in_flight <= MAX_IN_FLIGHT,
            f"in_flight must be at most {MAX_IN_FLIGHT} (a connection and a thread each), got {self.in_flight}",
        )
        _require(
            0 <= self.coalesce_gap_bytes <= MAX_COALESCE_GAP_BYTES,
            f"coalesce_gap_bytes must be 0 to {MAX_COALESCE_GAP_BYTES:,}, got {self.coalesce_gap_bytes}",
        )
        for name in ("timeout_s", "connect_timeout_s"):
            seconds = getattr(self, name)
            # An infinite deadline would never end a request: a dripping server could hold a run forever.
            _require(0 < seconds <= MAX_TIMEOUT_S, f"{name} must be > 0 and at most {MAX_TIMEOUT_S:g} s, got {seconds}")
        _require(
            isinstance(self.retries, int) and 0 <= self.retries <= MAX_RETRIES,
            f"retries must be 0 to {MAX_RETRIES} (each may wait a timeout), got {self.retries}",
        )
        _require(
            0 <= self.latency_ms <= MAX_TIMEOUT_S * 1000, f"latency_ms must be 0 to a timeout, got {self.latency_ms}"
        )
        _choice("zarr_client", self.zarr_client, ZARR_CLIENTS)
        _require(
            not self.endpoint or self.endpoint.startswith(("http://", "https://")),
            f"endpoint must be an http(s):// URL, got {self.endpoint!r}",
        )


def coalesce_gap(store: Mapping[str, Any], layout: Mapping[str, Any] | None) -> int:
    """The coalescing gap the direct reader reads a plate in a store with: the store's
    (``store``: a :class:`StoreConfig` as a dict, as a plate's mirror records it), no wider than the
    gap the plate's layout names (``layout``: its :class:`LayoutSpec` as the plate records it) unless
    the store says ``layout_gap=False``. A layout's gap suits its chunks' sizes and order (a wide gap
    reads the neighbours of a crop's chunks too); the store's default suits round trips."""
    gap = int(store.get("coalesce_gap_bytes", DEFAULT_COALESCE_GAP_BYTES))
    named = (layout or {}).get("coalesce_gap_bytes")
    if store.get("layout_gap", True) and isinstance(named, int) and not isinstance(named, bool) and named >= 0:
        return min(gap, named)
    return gap
