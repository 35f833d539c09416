"""Peer loaders, measured beside cropbench's own decode paths on the same plate and the same crops.

Every peer is a torch ``Dataset`` over the same object indices and the same ``crop_size`` windows
as :class:`cropbench.data.dataset.CropDataset` (all channels, ``border="pad"``: pixels outside the
field are zero) and returns ``{"image": uint16 tensor (C, H, W), "index": i}``, so it collates
with torch's ``default_collate``. Peers read pixels their own way; they take only the windows
(field, y0, x0) from cropbench:

- ``zarr-open-per-crop`` / ``zarr-kept-open``: naive zarr-python slicing per crop, opening the
  field's array on every call, or keeping it open.
- ``dask-per-crop``: ``dask.array.from_zarr`` per field (built once), slice, ``compute`` per crop,
  as spatialdata does it. dask's default (threaded) scheduler in the main process; synchronous
  inside DataLoader workers, where the thread pool inherited through fork has no threads and
  ``compute`` would wait forever.
- ``spatialdata-tiles``: spatialdata's ``ImageTilesDataset`` itself over a ``SpatialData`` object
  built on the same zarr arrays (see :class:`SpatialDataTiles` for what the wrapper adds).
- ``arrow-crop-rows`` / ``arrow-field-rows``: the reference script's approach: a Parquet table
  with one row per crop (or per field) holding the pixels as nested list columns, read with
  ``.as_py()`` and ``np.array(...)``. The tables are written once into a work folder beside the
  plate (``PLATE.peers/``) and reused while they match the plate and windows.

A peer whose optional extra is missing (``.venv/bin/pip install -e '.[dask]'``; spatialdata needs
its own environment, ``bash scripts/setup_peers.sh``), or that does not
apply to the plate's layout, raises :class:`cropbench.errors.PeerUnavailableError`;
:class:`Peers` records it as a skipped row with the reason.

Rows (:class:`Peers`, ``cropbench run --peers``) are track ``"peers"``: one per loader, the
cropbench paths (``cropbench-zarr``, ``cropbench-direct``, ``cropbench-field``) first, then each
peer, all on one seeded random order of the same objects, in one process with the plate's files
read into the page cache first (each row records ``resident_after``), with each row's ``ratio_to_direct``
(its samples/s ÷ cropbench direct's) and ``direct_speedup`` (the inverse). Their own track keeps
Track 1's grid, figures and summaries unchanged; ``config.peer`` names the loader.

One module per peer library (``zarr_python``, ``tensorstores``, ``dask_arrays``, ``spatialdata_tiles``,
``arrow_rows``), the shared protocol in ``base``, and the track in ``track``.
"""

from __future__ import annotations

from cropbench.tracks.peers.arrow_rows import ArrowCropRows, ArrowFieldRows
from cropbench.tracks.peers.base import CropWindows, PeerDataset
from cropbench.tracks.peers.dask_arrays import DaskPerCrop, dask_scheduler
from cropbench.tracks.peers.spatialdata_tiles import SpatialDataTiles
from cropbench.tracks.peers.tensorstores import TensorStoreBatched, TensorStorePerCrop
from cropbench.tracks.peers.track import (
    CROPBENCH_DECODES,
    MIN_SAMPLES,
    PEERS,
    TRACK,
    PeerCase,
    PeerComparison,
    Peers,
    measure_loader,
    measure_peer,
    open_peer,
)
from cropbench.tracks.peers.zarr_python import ZarrKeptOpen, ZarrOpenPerCrop, ZarrsKeptOpen

__all__ = [
    "CROPBENCH_DECODES",
    "MIN_SAMPLES",
    "TRACK",
    "PEERS",
    "ArrowCropRows",
    "ArrowFieldRows",
    "CropWindows",
    "DaskPerCrop",
    "PeerComparison",
    "PeerDataset",
    "PeerCase",
    "Peers",
    "SpatialDataTiles",
    "TensorStoreBatched",
    "TensorStorePerCrop",
    "ZarrKeptOpen",
    "ZarrOpenPerCrop",
    "ZarrsKeptOpen",
    "dask_scheduler",
    "measure_loader",
    "measure_peer",
    "open_peer",
]
