"""The spatialdata peer: spatialdata's own ``ImageTilesDataset`` over the same zarr arrays."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from cropbench import metrics as m
from cropbench.tracks.peers.base import CropWindows, PeerDataset
from cropbench.tracks.peers.dask_arrays import dask_scheduler


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
