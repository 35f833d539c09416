"""zarr-python's crop path split into stages (:mod:`cropbench.measure.zarr_stages`, wrappers, not a profiler).

``ZarrStages`` splits ``track1.Fetch.track_relative_cost``'s ``zarr`` case into the store's reads, the
codec pipeline outside them and the rest (indexing, assembly, the event loop), in the same units,
adding up to the whole; ``ZarrCounts`` counts store reads, bytes and chunks decoded per crop (in the
zarr gate, scripts/library_gate.py).
"""

from __future__ import annotations

from typing import Any

from .common import Benchmark, older_commit, plate_for, skip

OLDER_COMMIT: str | None = None
try:
    from cropbench.config import CropConfig
    from cropbench.harness.crop_path import RELATIVE_BLOCKS, CropPath, cache_knobs
    from cropbench.measure import zarr_stages as stages
    from cropbench.measure.protocol import configure_threads
except ImportError as error:
    OLDER_COMMIT = older_commit(error)

#: Crops behind one ``ZarrCounts`` value (counts do not need many).
COUNTED_CROPS = 256


class _ZarrCrops(Benchmark):
    """The zarr path's crops of the default grid (``Fetch``'s ``zarr`` case); no benchmarks."""

    params = (["random", "grouped-field"],)
    param_names = ("access",)

    def setup(self, plates: dict[str, str], access: str) -> None:
        skip(OLDER_COMMIT)
        configure_threads(1)
        crop = CropConfig(decode="zarr", **cache_knobs("bounded"))
        self.path = CropPath(plate_for(plates, "default"), crop, access, blocks=RELATIVE_BLOCKS)


class ZarrStages(_ZarrCrops):
    """``Fetch.track_relative_cost`` of the ``zarr`` path split into zarr's stages, in the same units."""

    unit = "x in-memory copy"

    def track_store(self, *params: Any) -> float:
        return self.path.zarr_stage_cost(stages.STORE)

    def track_codec(self, *params: Any) -> float:
        return self.path.zarr_stage_cost(stages.CODEC)

    def track_index_assemble(self, *params: Any) -> float:
        return self.path.zarr_stage_cost(stages.INDEX_ASSEMBLE)


class ZarrCounts(_ZarrCrops):
    """zarr-python's work per crop: store reads, bytes from the store, chunks through the codec pipeline."""

    def track_store_reads_per_crop(self, *params: Any) -> float:
        return self.path.zarr_count(stages.STORE_READS_PER_CROP, COUNTED_CROPS)

    track_store_reads_per_crop.unit = "reads/crop"  # type: ignore[attr-defined]

    def track_store_bytes_per_crop(self, *params: Any) -> float:
        return self.path.zarr_count(stages.STORE_BYTES_PER_CROP, COUNTED_CROPS)

    track_store_bytes_per_crop.unit = "bytes/crop"  # type: ignore[attr-defined]

    def track_chunks_decoded_per_crop(self, *params: Any) -> float:
        return self.path.zarr_count(stages.CHUNKS_DECODED_PER_CROP, COUNTED_CROPS)

    track_chunks_decoded_per_crop.unit = "chunks/crop"  # type: ignore[attr-defined]
