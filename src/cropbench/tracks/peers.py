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
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import Dataset, get_worker_info

from cropbench import metrics as m
from cropbench.config import DEFAULT_CHUNK_CACHE_BYTES, CropConfig
from cropbench.data.dataset import CropDataset
from cropbench.data.sampling import access_order
from cropbench.errors import ConfigError, OutputError, PeerUnavailableError
from cropbench.formats import open_plate
from cropbench.measure.protocol import Stopwatch, load_into_page_cache, resident_fraction, steady_state, time_each
from cropbench.tracks.context import RunContext
from cropbench.tracks.runner import Row

TRACK = "peers"
#: cropbench's own decode paths, measured before the peers (direct first: the others' denominator).
CROPBENCH_DECODES = ("direct", "zarr", "field")
#: Fewest steady samples per loader, however slow it is (p50 is still meaningful).
MIN_SAMPLES = 20


@dataclass(frozen=True, eq=False)
class CropWindows:
    """The crops cropbench delivers, as plain arrays: which field, and the window's top-left corner.

    Built from a :class:`CropDataset` so every peer reads exactly the windows cropbench reads.
    """

    plate: Path
    array_paths: tuple[Path, ...]
    field_shape: tuple[int, int, int]
    dtype: str
    layout: str
    channel_names: tuple[str, ...]
    channel_axis: int | None
    size: int
    field_index: np.ndarray
    window_y0: np.ndarray
    window_x0: np.ndarray

    @classmethod
    def from_dataset(cls, dataset: CropDataset) -> CropWindows:
        metadata = dataset.reader.metadata
        if dataset.channel_indices != tuple(range(len(metadata.channel_names))):
            raise ConfigError(f"peers read all channels; the dataset selects {dataset.channel_names}")
        if dataset.config.border != "pad":
            raise ConfigError(f"peers cut border='pad' windows; the dataset uses border={dataset.config.border!r}")
        channel_axis = metadata.channel_axis
        return cls(
            plate=Path(metadata.path),
            array_paths=tuple(Path(metadata.path) / info.path for info in metadata.fields),
            field_shape=metadata.field_shape,
            dtype=metadata.dtype,
            layout=metadata.format,
            channel_names=metadata.channel_names,
            channel_axis=None if channel_axis is None else int(channel_axis),
            size=dataset.config.crop_size,
            field_index=dataset.field_index.copy(),
            window_y0=dataset.window_y0.copy(),
            window_x0=dataset.window_x0.copy(),
        )

    def __len__(self) -> int:
        return len(self.field_index)

    def window(self, index: int) -> tuple[int, int, int]:
        """(field, y0, x0) of object ``index``."""
        return int(self.field_index[index]), int(self.window_y0[index]), int(self.window_x0[index])

    def prefix(self, ndim: int) -> tuple[Any, ...]:
        """Selection of the (c, y, x) volume of a field array with ``ndim`` axes (leading t/z at 0)."""
        channel_axis = ndim - 3 if self.channel_axis is None else self.channel_axis
        selection: list[Any] = [0] * (ndim - 2)
        selection[channel_axis] = slice(None)
        return tuple(selection)

    def cut(self, read: Callable[[int, int, int, int], Any], y0: int, x0: int) -> np.ndarray:
        """The window at (y0, x0) through ``read(y0, y1, x0, x1)``; pixels outside the field are zero."""
        channels, height, width = self.field_shape
        size = self.size
        if y0 >= 0 and x0 >= 0 and y0 + size <= height and x0 + size <= width:
            return np.asarray(read(y0, y0 + size, x0, x0 + size))
        out = np.zeros((channels, size, size), dtype=self.dtype)
        cy0, cx0, cy1, cx1 = max(y0, 0), max(x0, 0), min(y0 + size, height), min(x0 + size, width)
        out[:, cy0 - y0 : cy1 - y0, cx0 - x0 : cx1 - x0] = read(cy0, cy1, cx0, cx1)
        return out

    def cut_array(self, field_pixels: np.ndarray, index: int) -> np.ndarray:
        """The window of object ``index`` cut from its field's (c, y, x) pixels already in memory."""
        _, y0, x0 = self.window(index)
        return self.cut(lambda a, b, c, d: field_pixels[:, a:b, c:d], y0, x0)

    def digest(self) -> str:
        """Identity of the plate and windows, so a table written for them can be reused safely."""
        hasher = hashlib.sha256(f"{self.plate.resolve()}|{self.size}|{self.field_shape}|{self.dtype}".encode())
        for array in (self.field_index, self.window_y0, self.window_x0):
            hasher.update(np.ascontiguousarray(array, dtype=np.int64).tobytes())
        return hasher.hexdigest()[:16]


class PeerDataset(Dataset[dict[str, Any]], ABC):
    """One peer loader over the windows of a :class:`CropWindows`; item ``i`` is cropbench's item ``i``."""

    name: ClassVar[str]
    description: ClassVar[str]
    #: The pip extra that installs what the peer imports (None: cropbench's own dependencies).
    extra: ClassVar[str | None] = None
    #: A command that installs it, run from the repository root.
    install_hint: ClassVar[str] = "bash scripts/setup.sh"
    modules: ClassVar[tuple[str, ...]] = ()
    #: Layouts (storage formats) the peer reads; None means any.
    formats: ClassVar[tuple[str, ...] | None] = ("ome-zarr",)

    def __init__(self, windows: CropWindows, work_dir: Path | None = None) -> None:
        self.check_available(windows)
        self.windows = windows
        self.work_dir = work_dir

    @classmethod
    def check_available(cls, windows: CropWindows) -> None:
        """Raise :class:`PeerUnavailableError` with the reason when the peer cannot run here."""
        if cls.formats is not None and windows.layout not in cls.formats:
            raise PeerUnavailableError(
                f"{cls.name} reads {', '.join(cls.formats)} plates; {windows.plate} is {windows.layout}"
            )
        for module in cls.modules:
            try:
                importlib.import_module(module)
            except ImportError as error:
                raise PeerUnavailableError(f"{module} cannot be imported ({error}); {cls.install_hint}") from error

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        index = int(index)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} outside a peer of {len(self)} objects")
        return {"image": torch.from_numpy(self.read_crop(index)), "index": index}

    @abstractmethod
    def read_crop(self, index: int) -> np.ndarray:
        """The (C, size, size) crop of object ``index`` as the peer reads it."""

    def info(self) -> dict[str, Any]:
        """Extra metrics of the peer for its row (what it did besides delivering crops)."""
        return {}

    def _work_file(self, name: str) -> Path:
        folder = self.work_dir or Path(f"{self.windows.plate}.peers")
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise OutputError(f"cannot create the peers work folder {folder}: {error.strerror or error}") from error
        return folder / name


def _open_zarr(path: Path) -> Any:
    import zarr

    return zarr.open_array(str(path), mode="r")


class ZarrOpenPerCrop(PeerDataset):
    """What a first Dataset often does: open the field's zarr array in ``__getitem__``, slice it."""

    name = "zarr-open-per-crop"
    description = "zarr-python, open the field array on every call, slice"
    modules = ("zarr",)

    def read_crop(self, index: int) -> np.ndarray:
        field, y0, x0 = self.windows.window(index)
        array = _open_zarr(self.windows.array_paths[field])
        prefix = self.windows.prefix(array.ndim)
        return self.windows.cut(lambda a, b, c, d: array[(*prefix, slice(a, b), slice(c, d))], y0, x0)


class ZarrKeptOpen(PeerDataset):
    """Naive zarr-python slicing with each field's array opened once per process and kept."""

    name = "zarr-kept-open"
    description = "zarr-python, field arrays kept open, slice"
    modules: ClassVar[tuple[str, ...]] = ("zarr",)

    def __init__(self, windows: CropWindows, work_dir: Path | None = None) -> None:
        super().__init__(windows, work_dir)
        self._arrays: dict[int, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_arrays": {}}

    def read_crop(self, index: int) -> np.ndarray:
        field, y0, x0 = self.windows.window(index)
        array = self._arrays.get(field)
        if array is None:
            array = self._arrays[field] = _open_zarr(self.windows.array_paths[field])
        prefix = self.windows.prefix(array.ndim)
        return self.windows.cut(lambda a, b, c, d: array[(*prefix, slice(a, b), slice(c, d))], y0, x0)


class ZarrsKeptOpen(ZarrKeptOpen):
    """zarr-python slicing with the zarrs codec pipeline (Rust decode; arrays opened under it, kept)."""

    name = "zarr-zarrs"
    description = "zarr-python with the zarrs codec pipeline, field arrays kept open, slice"
    extra = "zarrs"
    install_hint = ".venv/bin/pip install -e '.[zarrs]'"
    modules = ("zarr", "zarrs")

    def read_crop(self, index: int) -> np.ndarray:
        field = int(self.windows.field_index[index])
        if field not in self._arrays:
            import zarr

            with zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"}):
                self._arrays[field] = _open_zarr(self.windows.array_paths[field])
        return super().read_crop(index)


class TensorStorePerCrop(PeerDataset):
    """tensorstore's ``zarr3`` driver, one read per crop, every field sharing one cache pool of
    ``cache_bytes`` (cropbench's default decoded-chunk budget unless given)."""

    name = "tensorstore-per-crop"
    description = "tensorstore zarr3, cache pool = the decoded-chunk budget, one read per crop"
    extra = "tensorstore"
    install_hint = ".venv/bin/pip install -e '.[tensorstore]'"
    modules = ("tensorstore",)

    def __init__(self, windows: CropWindows, work_dir: Path | None = None, cache_bytes: int | None = None) -> None:
        super().__init__(windows, work_dir)
        self.cache_bytes = DEFAULT_CHUNK_CACHE_BYTES if cache_bytes is None else cache_bytes
        self._arrays: dict[int, Any] = {}
        self._context: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_arrays": {}, "_context": None}

    def _array(self, field: int) -> Any:
        array = self._arrays.get(field)
        if array is None:
            import tensorstore as ts

            if self._context is None:
                self._context = ts.Context({"cache_pool": {"total_bytes_limit": self.cache_bytes}})
            spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(self.windows.array_paths[field])}}
            array = ts.open(spec, context=self._context, read=True).result()
            array = self._arrays[field] = array[self.windows.prefix(array.ndim)]
        return array

    def read_crop(self, index: int) -> np.ndarray:
        field, y0, x0 = self.windows.window(index)
        array = self._array(field)
        return self.windows.cut(lambda a, b, c, d: array[:, a:b, c:d].read().result(), y0, x0)

    def info(self) -> dict[str, Any]:
        return {m.CACHE_POOL_BYTES: self.cache_bytes}


class TensorStoreBatched(TensorStorePerCrop):
    """tensorstore with a whole batch of reads in flight (``ts.Batch``), then gathered into one
    (B, C, H, W) array: its best batched configuration."""

    name = "tensorstore-batched"
    description = "tensorstore zarr3, cache pool = the decoded-chunk budget, a batch of reads in one ts.Batch"
    #: Indices per call when a side-by-side run measures it (``__getitems__``).
    batch_size: ClassVar[int] = 64

    def __getitems__(self, indices: Sequence[int]) -> dict[str, Any]:
        import tensorstore as ts

        channels, height, width = self.windows.field_shape
        size = self.windows.size
        out = np.zeros((len(indices), channels, size, size), dtype=self.windows.dtype)
        pending = []
        with ts.Batch() as batch:
            for slot, index in enumerate(indices):
                field, y0, x0 = self.windows.window(int(index))
                cy0, cx0, cy1, cx1 = max(y0, 0), max(x0, 0), min(y0 + size, height), min(x0 + size, width)
                future = self._array(field)[:, cy0:cy1, cx0:cx1].read(batch=batch)
                pending.append((slot, cy0 - y0, cy1 - y0, cx0 - x0, cx1 - x0, future))
        for slot, top, bottom, left, right, future in pending:
            out[slot, :, top:bottom, left:right] = future.result()
        return {"image": torch.from_numpy(out), "index": torch.as_tensor(np.asarray(indices, dtype=np.int64))}


def dask_scheduler(default: str | None = None) -> str | None:
    """dask's scheduler for this process: synchronous inside DataLoader workers, else ``default``.

    A forked worker inherits dask's thread pool without its threads; a threaded ``compute`` there
    waits forever (the deadlock spatialdata users meet with ``num_workers > 0``).
    """
    return "synchronous" if get_worker_info() is not None else default


class DaskPerCrop(PeerDataset):
    """``dask.array.from_zarr`` per field (once), then slice and ``compute`` per crop, as spatialdata does."""

    name = "dask-per-crop"
    description = "dask.array.from_zarr per field, slice + compute per crop"
    extra = "dask"
    install_hint = ".venv/bin/pip install -e '.[dask]'"
    modules = ("dask", "dask.array", "zarr")

    def __init__(self, windows: CropWindows, work_dir: Path | None = None, scheduler: str | None = None) -> None:
        super().__init__(windows, work_dir)
        self.scheduler = scheduler
        self._arrays: dict[int, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_arrays": {}}

    def _array(self, field: int) -> Any:
        array = self._arrays.get(field)
        if array is None:
            import dask.array as da

            array = da.from_zarr(str(self.windows.array_paths[field]))
            array = self._arrays[field] = array[self.windows.prefix(array.ndim)]
        return array

    def read_crop(self, index: int) -> np.ndarray:
        field, y0, x0 = self.windows.window(index)
        array = self._array(field)
        scheduler = dask_scheduler(self.scheduler)
        return self.windows.cut(lambda a, b, c, d: array[:, a:b, c:d].compute(scheduler=scheduler), y0, x0)

    def info(self) -> dict[str, Any]:
        return {
            m.DASK_SCHEDULER: self.scheduler or "dask default (threads)",
            m.DASK_SCHEDULER_IN_WORKERS: "synchronous",
        }


class SpatialDataTiles(PeerDataset):
    """spatialdata's ``ImageTilesDataset``, wrapped so it collates and runs in forked workers.

    The ``SpatialData`` object holds one image element per field (``Image2DModel`` over
    ``dask.array.from_zarr`` of the plate's own array: the same store), one shapes element of
    circles per field with the cells, and one table per field annotating them (``object_index``,
    returned with each tile). There is one ``ImageTilesDataset`` per field: in 0.7.3 a single
    table annotating several regions fails in ``ImageTilesDataset.__init__`` ("Regions in the
    AnnData object and `region` do not match": it validates each region's subset of the table
    against the full region list). Each circle
    sits at the centre of cropbench's window (``y0 + size/2``, ``x0 + size/2``); with
    ``tile_dim_in_units=size`` and ``rasterize=False``, spatialdata's bounding-box query then
    selects exactly the pixels of cropbench's window (pixel centres at ``i + 0.5``, inclusive bounds).

    What the wrapper adds, and why:

    - ``ImageTilesDataset`` returns ``(xarray.DataArray, numpy annotations)``; torch's
      ``default_collate`` rejects the ``DataArray``. The wrapper computes the tile's dask array
      and returns a uint16 tensor in a dict.
    - Tiles of cells near the field's edge come back clipped to the field (a smaller array, not
      zero-padded), so a batch would not stack. The wrapper places the clipped tile where its
      transformation (the translation the query records) says, inside a zeroed ``size`` × ``size``
      window, the same as cropbench's
      ``border="pad"``; :meth:`raw_tile` gives the tile as spatialdata returns it, and
      ``clipped_tiles`` counts them.
    - dask ``compute`` runs synchronously inside DataLoader workers (see :func:`dask_scheduler`):
      with fork, the threaded scheduler inherited from the parent deadlocks.
    - Building the object raises spatialdata/anndata warnings about index types; they are
      silenced during construction only.
    """

    name = "spatialdata-tiles"
    description = "spatialdata 0.7.3 ImageTilesDataset (bounding-box query, dask per tile), wrapped"
    extra = "spatialdata"
    install_hint = (
        "spatialdata cannot share .venv (its pins conflict with the dev extra): "
        "bash scripts/setup_peers.sh, then .venv-peers/bin/python -m cropbench run --plate PLATE --peers"
    )
    modules = ("spatialdata", "spatialdata.dataloader", "dask", "geopandas", "anndata")

    def __init__(self, windows: CropWindows, work_dir: Path | None = None, scheduler: str | None = None) -> None:
        super().__init__(windows, work_dir)
        self.scheduler = scheduler
        self.tiles_read = self.clipped_tiles = 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.tiles, self._dataset_of, self._tile_row = self._build()

    def _build(self) -> tuple[list[Any], np.ndarray, np.ndarray]:
        import anndata
        import dask.array as da
        import geopandas
        import pandas as pd
        from spatialdata import SpatialData
        from spatialdata.dataloader import ImageTilesDataset
        from spatialdata.models import Image2DModel, ShapesModel, TableModel

        windows, half = self.windows, self.windows.size / 2
        fields = np.unique(windows.field_index).tolist()
        images: dict[str, Any] = {}
        shapes: dict[str, Any] = {}
        tables: dict[str, Any] = {}
        for field in fields:
            array = da.from_zarr(str(windows.array_paths[field]))
            images[f"field_{field}"] = Image2DModel.parse(
                array[windows.prefix(array.ndim)],
                dims=("c", "y", "x"),
                c_coords=list(windows.channel_names),
            )
            members = np.flatnonzero(windows.field_index == field)
            centres = geopandas.points_from_xy(windows.window_x0[members] + half, windows.window_y0[members] + half)
            frame = geopandas.GeoDataFrame({"radius": np.full(len(members), half)}, geometry=centres, index=members)
            shapes[f"cells_{field}"] = ShapesModel.parse(frame)
            obs = pd.DataFrame(
                {
                    "region": pd.Categorical([f"cells_{field}"] * len(members)),
                    "instance_id": members,
                    "object_index": members,
                },
                index=members.astype(str),
            )
            tables[f"table_{field}"] = TableModel.parse(
                anndata.AnnData(obs=obs),
                region=f"cells_{field}",
                region_key="region",
                instance_key="instance_id",
            )
        sdata = SpatialData(images=images, shapes=shapes, tables=tables)
        tiles = [
            ImageTilesDataset(
                sdata,
                regions_to_images={f"cells_{field}": f"field_{field}"},
                regions_to_coordinate_systems={f"cells_{field}": "global"},
                tile_dim_in_units=float(windows.size),
                rasterize=False,
                return_annotations="object_index",
                table_name=f"table_{field}",
            )
            for field in fields
        ]
        dataset_of = np.full(len(windows), -1, dtype=np.int64)
        tile_row = np.full(len(windows), -1, dtype=np.int64)
        for position, dataset in enumerate(tiles):
            instances = dataset.dataset_index[ImageTilesDataset.INSTANCE_KEY].to_numpy(dtype=np.int64)
            dataset_of[instances], tile_row[instances] = position, np.arange(len(dataset))
        return tiles, dataset_of, tile_row

    def raw_tile(self, index: int) -> tuple[np.ndarray, int, int]:
        """The tile as ``ImageTilesDataset`` returns it (clipped at the field's edge) and its (y0, x0)."""
        tile, annotation = self.tiles[int(self._dataset_of[index])][int(self._tile_row[index])]
        if int(np.asarray(annotation).ravel()[0]) != index:
            raise RuntimeError(f"ImageTilesDataset returned object {annotation} for index {index}")
        from spatialdata.transformations import get_transformation

        pixels = np.asarray(tile.data.compute(scheduler=dask_scheduler(self.scheduler)))
        # The query resets the tile's pixel coordinates and records where it lies as a translation.
        matrix = get_transformation(tile, to_coordinate_system="global").to_affine_matrix(
            input_axes=("y", "x"),
            output_axes=("y", "x"),
        )
        return pixels, int(round(matrix[0, 2])), int(round(matrix[1, 2]))

    def read_crop(self, index: int) -> np.ndarray:
        pixels, tile_y0, tile_x0 = self.raw_tile(index)
        size = self.windows.size
        self.tiles_read += 1
        if pixels.shape[1:] == (size, size):
            return pixels
        self.clipped_tiles += 1
        _, y0, x0 = self.windows.window(index)
        out = np.zeros((pixels.shape[0], size, size), dtype=pixels.dtype)
        top, left = tile_y0 - y0, tile_x0 - x0
        out[:, top : top + pixels.shape[1], left : left + pixels.shape[2]] = pixels
        return out

    def info(self) -> dict[str, Any]:
        import spatialdata

        return {
            m.SPATIALDATA_VERSION: spatialdata.__version__,
            m.TILES_READ: self.tiles_read,
            m.CLIPPED_TILES: self.clipped_tiles,
            m.CLIPPED_FRACTION: self.clipped_tiles / max(self.tiles_read, 1),
            m.DASK_SCHEDULER: self.scheduler or "dask default (threads)",
            m.DASK_SCHEDULER_IN_WORKERS: "synchronous",
        }


def _nested_lists(values: np.ndarray) -> pa.Array:
    """An (n, c, h, w) array as a list<list<list<value>>> column of n rows (no Python objects)."""
    array: pa.Array = pa.array(values.reshape(-1))
    for axis in range(values.ndim - 1, 0, -1):
        step = values.shape[axis]
        count = len(array) // step
        offsets = pa.array(np.arange(count + 1, dtype=np.int64) * step, type=pa.int32())
        array = pa.ListArray.from_arrays(offsets, array)
    return array


class _ArrowRows(PeerDataset):
    """Pixels as nested list columns of a Parquet table, read into memory once, rows via ``.as_py()``."""

    formats = None
    kind: ClassVar[str]
    row_group_size: ClassVar[int]

    def __init__(self, windows: CropWindows, work_dir: Path | None = None) -> None:
        super().__init__(windows, work_dir)
        self.path = self._work_file(f"{self.kind}-{windows.size}px.parquet")
        self.built = self._ensure_table()
        self._pixels: pa.ChunkedArray | None = None
        self.pixels  # noqa: B018 - the reference script reads the table once, before the loop

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pixels": None}

    @property
    def pixels(self) -> pa.ChunkedArray:
        if self._pixels is None:
            self._pixels = pq.read_table(str(self.path), columns=["pixels"], memory_map=True).column("pixels")
        return self._pixels

    def _ensure_table(self) -> bool:
        key = json.dumps({"kind": self.kind, "digest": self.windows.digest()})
        if self.path.is_file():
            try:
                if (pq.read_schema(str(self.path)).metadata or {}).get(b"cropbench_peer") == key.encode():
                    return False
            except (pa.ArrowInvalid, OSError):
                pass
        table = self._build_table().replace_schema_metadata({"cropbench_peer": key})
        partial = self.path.with_suffix(".partial")
        pq.write_table(table, str(partial), row_group_size=self.row_group_size)
        partial.replace(self.path)
        return True

    def _fields(self) -> Iterator[tuple[int, np.ndarray]]:
        """Each field's pixels (c, y, x), read once with cropbench's field path to build the table."""
        reader = open_plate(self.windows.plate, decode="field", field_cache_fields=1)
        try:
            for field in range(len(self.windows.array_paths)):
                yield field, reader.read_field(field)
        finally:
            reader.close()

    @abstractmethod
    def _build_table(self) -> pa.Table: ...


class ArrowCropRows(_ArrowRows):
    """The reference script's crop table: one row per crop, pixels as a (c, y, x) nested list."""

    name = "arrow-crop-rows"
    description = "Parquet, one row per crop, pixels as nested lists, .as_py() + np.array"
    kind = "crops"
    row_group_size = 512

    def _build_table(self) -> pa.Table:
        windows = self.windows
        channels, _, _ = windows.field_shape
        crops = np.zeros((len(windows), channels, windows.size, windows.size), dtype=windows.dtype)
        for field, pixels in self._fields():
            for index in np.flatnonzero(windows.field_index == field).tolist():
                crops[index] = windows.cut_array(pixels, index)
        return pa.table(
            {
                "index": np.arange(len(windows), dtype=np.int64),
                "field_index": windows.field_index,
                "pixels": _nested_lists(crops),
            }
        )

    def read_crop(self, index: int) -> np.ndarray:
        return np.array(self.pixels[index].as_py(), dtype=self.windows.dtype)


class ArrowFieldRows(_ArrowRows):
    """The reference script's field table: one row per field; a crop converts the whole field row."""

    name = "arrow-field-rows"
    description = "Parquet, one row per field, pixels as nested lists, .as_py() + np.array, then crop"
    kind = "fields"
    row_group_size = 1

    def _build_table(self) -> pa.Table:
        fields = np.stack([pixels for _, pixels in self._fields()])
        return pa.table({"field_index": np.arange(len(fields), dtype=np.int64), "pixels": _nested_lists(fields)})

    def read_crop(self, index: int) -> np.ndarray:
        pixels = np.array(self.pixels[int(self.windows.field_index[index])].as_py(), dtype=self.windows.dtype)
        return self.windows.cut_array(pixels, index)


#: Every peer, in the order rows are written.
PEERS: dict[str, type[PeerDataset]] = {
    peer.name: peer
    for peer in (
        ZarrOpenPerCrop,
        ZarrKeptOpen,
        ZarrsKeptOpen,
        TensorStorePerCrop,
        TensorStoreBatched,
        DaskPerCrop,
        SpatialDataTiles,
        ArrowCropRows,
        ArrowFieldRows,
    )
}


def open_peer(name: str, windows: CropWindows, work_dir: Path | None = None) -> PeerDataset:
    """The peer called ``name`` over ``windows``; raises PeerUnavailableError when it cannot run here."""
    if name not in PEERS:
        raise ConfigError(f"peer={name!r} is not one of {', '.join(PEERS)}")
    return PEERS[name](windows, work_dir)


@dataclass(frozen=True)
class PeerComparison:
    """One side-by-side run: cropbench's decode paths and the peers on one random order of objects.

    ``seconds`` bounds each loader's steady state (tight loop plus timed loop); slow peers then
    measure a prefix of the same order (at least ``MIN_SAMPLES``), and each row records how many.
    """

    samples: int = 1000
    warmup: int = 50
    seconds: float = 10.0
    crop_size: int = 96
    seed: int = 0
    peers: tuple[str, ...] = tuple(PEERS)

    def __post_init__(self) -> None:
        if self.samples < MIN_SAMPLES:
            raise ConfigError(f"samples must be >= {MIN_SAMPLES}, got {self.samples}")
        if self.warmup < 1:
            raise ConfigError(f"warmup must be >= 1, got {self.warmup}")
        if self.seconds <= 0:
            raise ConfigError(f"seconds must be positive, got {self.seconds}")
        unknown = [name for name in self.peers if name not in PEERS]
        if unknown:
            raise ConfigError(f"peer {unknown[0]!r} is not one of {', '.join(PEERS)}")

    @classmethod
    def for_preset(cls, preset: str, samples: int | None = None) -> PeerComparison:
        presets = {"smoke": cls(samples=300, warmup=20, seconds=3.0), "full": cls(samples=1000, warmup=50)}
        if preset not in presets:
            raise ConfigError(f"preset={preset!r} is not one of {', '.join(presets)}")
        return dataclasses.replace(presets[preset], samples=samples) if samples else presets[preset]


def measure_loader(
    get: Callable[[Any], Any],
    indices: Sequence[Any],
    comparison: PeerComparison,
    before_steady: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Warm up, then Track 1's steady state (tight loop + timed loop) within the time budget.

    ``before_steady`` runs between the two (a reader resets its read-amplification counters there).
    """
    warm, steady = list(indices[: comparison.warmup]), list(indices[comparison.warmup :])
    # Medians, so a one-off first-call cost does not shrink the sample count of a fast loader.
    first = time_each(get, warm[:3])
    typical_s = max(float(np.median(first)) / 1e9, 1e-7)
    rest = warm[3 : 3 + int(comparison.seconds / 4 / typical_s)]
    warmup_latencies = np.concatenate([first, time_each(get, rest)])
    typical_s = max(float(np.median(warmup_latencies)) / 1e9, 1e-7)
    count = min(len(steady), max(MIN_SAMPLES, int(comparison.seconds / 2 / typical_s)))
    if before_steady is not None:
        before_steady()
    return {
        **steady_state(get, steady[:count]),
        m.WARMUP_ITEMS: len(warmup_latencies),
        m.WARMUP_MEAN_MS: float(warmup_latencies.mean() / 1e6),
        m.SAMPLES_REQUESTED: len(steady),
        m.BUDGET_CAPPED: count < len(steady),
    }


def measure_peer(peer: PeerDataset, indices: Sequence[int], comparison: PeerComparison) -> dict[str, Any]:
    """:func:`measure_loader` on a peer: one crop per call, or up to ``batch_size`` per call for a
    batched peer (rates then count crops, latencies are per call), as many as still leave
    ``MIN_SAMPLES`` steady calls."""
    steady = max(len(indices) - comparison.warmup, 1)
    batch_size = max(1, min(int(getattr(peer, "batch_size", 1)), steady // MIN_SAMPLES))
    if not hasattr(peer, "__getitems__"):
        return measure_loader(peer.__getitem__, indices, comparison)
    calls = [list(indices[start : start + batch_size]) for start in range(0, len(indices), batch_size)]
    batched = dataclasses.replace(comparison, warmup=max(-(-comparison.warmup // batch_size), 1))
    metrics = measure_loader(peer.__getitems__, calls, batched)
    metrics[m.SAMPLES_PER_S] *= batch_size
    return {**metrics, m.ITEMS_PER_CALL: batch_size}


@dataclass(frozen=True)
class PeerCase:
    """One loader of a side-by-side run: ``cropbench-<decode>`` or a peer's name."""

    loader: str
    comparison: PeerComparison

    @property
    def label(self) -> str:
        return f"{self.loader}/{self.comparison.crop_size}px/all"


@dataclass
class _Repeat:
    """What every loader of one repeat shares: the objects' windows, one order, the files read warm."""

    reference: CropDataset
    windows: CropWindows
    indices: list[int]
    files: list[Path]
    config: dict[str, Any]
    direct_samples_per_s: float | None = None


class Peers:
    """Track ``peers`` for the runner: cropbench's decode paths, then every peer, on the same objects.

    Every loader gets a row (a peer that cannot run here gets one saying why), with its ratio to
    cropbench direct of the same repeat.
    """

    name = TRACK

    def __init__(self, comparison: PeerComparison | None = None, work_dir: Path | None = None) -> None:
        self.comparison = comparison
        self.work_dir = work_dir
        self.repeats: dict[tuple[PeerComparison, int], _Repeat] = {}

    def cases(self, preset: str, context: RunContext) -> list[PeerCase]:
        comparison = self.comparison or PeerComparison.for_preset(preset, context.samples)
        loaders = [f"cropbench-{decode}" for decode in CROPBENCH_DECODES] + list(comparison.peers)
        return [PeerCase(loader, comparison) for loader in loaders]

    def decode(self, case: PeerCase) -> None:
        return None  # a loader that does not apply still gets a row saying why

    def _repeat(self, comparison: PeerComparison, repeat: int, context: RunContext) -> _Repeat:
        key = (comparison, repeat)
        if key not in self.repeats:
            seed = comparison.seed + repeat
            reference = context.dataset(CropConfig(crop_size=comparison.crop_size, dtype="uint16"))
            files = reference.reader.files()
            load_into_page_cache(files)
            config = {
                "crop_size": comparison.crop_size,
                "channels": "all",
                "access": "random",
                "dtype": "uint16",
                "tier": "none",
                "samples": comparison.samples,
                "warmup": comparison.warmup,
                "seconds": comparison.seconds,
                "seed": seed,
            }
            self.repeats[key] = _Repeat(
                reference,
                CropWindows.from_dataset(reference),
                access_order(reference, "random", comparison.warmup + comparison.samples, seed),
                files,
                config,
            )
        return self.repeats[key]

    def measure(self, case: PeerCase, repeat: int, context: RunContext) -> Iterator[Row]:
        comparison, name = case.comparison, case.loader
        shared = self._repeat(comparison, repeat, context)
        metrics: dict[str, Any]
        config: dict[str, Any]
        if name.startswith("cropbench-"):
            decode = name.removeprefix("cropbench-")
            kind, config = "cropbench", {"decode": decode}
            if decode not in context.decodes:
                metrics = {m.SKIPPED: True, m.SKIP_REASON: f"decode {decode} does not apply to {context.layout}"}
            else:
                with Stopwatch() as setup:
                    dataset = context.dataset(shared.reference.config.replace(decode=decode))
                metrics = measure_loader(dataset.__getitem__, shared.indices, comparison, dataset.reader.stats.reset)
                metrics = {**metrics, **dataset.reader.stats.per_region(), m.SETUP_SECONDS: setup.seconds}
        else:
            kind, config = "peer", {"extra": PEERS[name].extra, "description": PEERS[name].description}
            setup = Stopwatch()
            try:
                with setup:
                    peer = open_peer(name, shared.windows, self.work_dir)
            except PeerUnavailableError as error:
                metrics = {m.SKIPPED: True, m.SKIP_REASON: str(error)}
            else:
                metrics = {
                    **measure_peer(peer, shared.indices, comparison),
                    **peer.info(),
                    m.SETUP_SECONDS: setup.seconds,
                }
        rate = metrics.get(m.SAMPLES_PER_S)
        if not metrics.get(m.SKIPPED):
            metrics[m.RESIDENT_AFTER] = resident_fraction(shared.files)
        if name == "cropbench-direct" and rate:
            shared.direct_samples_per_s = rate
        direct = shared.direct_samples_per_s
        if rate and direct:
            metrics[m.RATIO_TO_DIRECT] = rate / direct
            metrics[m.DIRECT_SPEEDUP] = direct / rate
        yield Row(case, {**shared.config, "peer": name, "kind": kind, **config}, metrics, shared.config["seed"])


__all__ = [
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
