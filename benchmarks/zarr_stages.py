"""zarr-python's crop path split into stages, so a regression's stage shows on the zarr site.

``track1.Fetch.track_relative_cost`` with ``decode='zarr'`` times zarr-python's whole crop; here
the same crops (the smoke plate written by the installed zarr, 96 px, every channel, random and
grouped access) are split by :mod:`cropbench.measure.zarr_stages`, which wraps zarr's own store
reads and codec pipeline while the crops are read (wrappers, not a profiler):

- ``ZarrStages``: the relative cost (crop over in-memory copy, block by block in one call) split
  into the store's reads, the codec pipeline outside them, and the rest (zarr's indexing and
  assembly, its event loop, the dataset's own work), in the same units, adding up to the whole;
- ``ZarrCounts``: store reads, bytes returned by the store and chunks decoded, per crop: counts,
  so the same zarr gives the same values (they are in the zarr gate, scripts/library_gate.py).
"""

from __future__ import annotations

from typing import Any

from .common import (
    BLOCK,
    RELATIVE_BLOCKS,
    Suite,
    access_order,
    cache_knobs,
    crop_config,
    crop_dataset,
    getter,
    memory_reference,
    one_thread,
    plate_for,
    sampled,
    skips_older_commits,
)

#: Crops behind one ``ZarrCounts`` value (counts do not need many).
COUNTED_CROPS = 256


class _ZarrCrops(Suite):
    """The zarr path's crops of the default grid (no benchmarks; ``Fetch``'s ``zarr`` case)."""

    params = (["random", "grouped-field"],)
    param_names = ("access",)
    version = "1"

    @skips_older_commits()
    def setup(self, plates: dict[str, str], access: str) -> None:
        from cropbench.harness.memory_reference import MemoryReference  # noqa: F401 - the bodies' reference, checked here
        from cropbench.measure import zarr_stages

        self.stages = zarr_stages
        one_thread()
        crop = crop_config(decode="zarr", **cache_knobs("bounded"))
        self.dataset = crop_dataset(plate_for(plates, "default"), crop)
        self.access = access
        self.indices = access_order(self.dataset, access, BLOCK * RELATIVE_BLOCKS)
        get = getter(self.dataset, access)
        for index in self.indices[: len(self.dataset)]:  # every field's array opened: no metadata reads later
            get(index)

    def _get(self) -> Any:
        return sampled(getter(self.dataset, self.access), self.dataset, self.access)


class ZarrStages(_ZarrCrops):
    """``Fetch.track_relative_cost`` of the ``zarr`` path split into zarr's stages, in the same units."""

    def _stage(self, stage: str) -> float:
        measured = self.stages.measure_stages(
            self._get(), self.indices, reference=memory_reference(self.dataset), block=BLOCK
        )
        return float(measured.relative_stages()[stage])

    def track_store(self, *params: Any) -> float:
        return self._stage(self.stages.STORE)

    def track_codec(self, *params: Any) -> float:
        return self._stage(self.stages.CODEC)

    def track_index_assemble(self, *params: Any) -> float:
        return self._stage(self.stages.INDEX_ASSEMBLE)

    track_store.unit = track_codec.unit = track_index_assemble.unit = "x in-memory copy"  # type: ignore[attr-defined]


class ZarrCounts(_ZarrCrops):
    """zarr-python's work per crop: store reads, bytes from the store, chunks through the codec pipeline."""

    def _count(self, name: str) -> float:
        counts = self.stages.measure_stages(self._get(), self.indices[:COUNTED_CROPS]).counts()
        return float(counts[name])

    def track_store_reads_per_crop(self, *params: Any) -> float:
        return self._count(self.stages.STORE_READS_PER_CROP)

    track_store_reads_per_crop.unit = "reads/crop"  # type: ignore[attr-defined]

    def track_store_bytes_per_crop(self, *params: Any) -> float:
        return self._count(self.stages.STORE_BYTES_PER_CROP)

    track_store_bytes_per_crop.unit = "bytes/crop"  # type: ignore[attr-defined]

    def track_chunks_decoded_per_crop(self, *params: Any) -> float:
        return self._count(self.stages.CHUNKS_DECODED_PER_CROP)

    track_chunks_decoded_per_crop.unit = "chunks/crop"  # type: ignore[attr-defined]
