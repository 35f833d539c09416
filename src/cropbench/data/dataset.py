"""Torch Datasets of single-cell crops: one item per object of the plate's object table.

:class:`CropDataset` is the dataset; :class:`CropBatch` is what its ``__getitems__`` hands a
DataLoader for a whole batch, and :class:`SegmentPool` the shared memory that batch lives in inside a
worker. :class:`PairedViews` wraps a dataset for contrastive training.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, default_collate, get_worker_info

from cropbench.config import CropConfig
from cropbench.data.transforms import TORCH_DTYPES, TransformPlan
from cropbench.errors import ConfigError, ObjectTableError
from cropbench.formats import DirectChunkReader, PlateReader, Regions, open_plate, plate_objects
from cropbench.objects import ObjectTable, crop_origins, label_columns, read_label_classes

GROUPINGS = ("field", "well", "chunk")


class CropDataset(Dataset[dict[str, Any]]):
    """Single-cell crops (C × H × W) with their plate, well, field and object id.

    One sample per object (cell) of the plate's object table: the crop of ``config.crop_size`` pixels
    centred on the object's centroid, every channel asked for, through the transform tier. The sample
    index (field, window origin) is computed once, vectorised, here; ``__getitem__`` only reads
    through the reader and applies the transforms. ``__getitems__`` (which torch's DataLoader calls
    for a whole batch) hands the batch's windows to the reader at once, so it can plan the batch's
    chunks together, and cuts every crop into one (B, C, H, W) buffer: a :class:`CropBatch`, which
    cropbench's collates pass on without stacking. The dataset pickles, so DataLoader workers can
    each hold a copy.

    A sample is a dict:

    - ``image``: a (C, H, W) tensor of ``config.dtype``. With tier ``none`` it holds the stored
      counts, only cast (H = W = ``config.crop_size``); tiers ``light`` and ``typical`` normalise
      each channel to [0, 1] by the plate's display ranges and resize to ``config.output_size``
      when set (``typical`` then augments).
    - ``object_id``, ``plate``, ``well``, ``field`` (the site within the well), ``field_index`` (the
      field's position in the plate), ``centroid_y``, ``centroid_x``, ``crop_y0``, ``crop_x0`` (the
      window's top-left corner in the field, negative where it leaves the field) and ``index``.
    - ``labels``: only with ``labels=[...]``, a dict of the named object-table columns; numbers
      stay numbers, strings become integer class ids (:attr:`label_classes` maps them back).

    The window of a ``size``-pixel crop starts at ``floor(c - (size - 1) / 2 + 1 / 2)`` on each axis
    (``c`` the centroid, pixel centres at integer coordinates, as CellProfiler measures them): its
    centre is within half a pixel of the centroid, the closest a pixel grid allows. Where it leaves
    the field, ``config.border`` decides: ``pad`` (default) keeps it centred and fills the outside
    with zeros, ``shift`` moves it inside the field (the cell is then off-centre), ``drop`` leaves
    such objects out of the dataset.

    Args:
        plate: The plate: an OME-Zarr plate folder or any layout cropbench reads (see
            :func:`cropbench.formats.open_plate`). Its bundled object table is used unless
            ``objects`` is given.
        config: How to cut, decode and transform each crop: crop size, channels, output dtype,
            read path (``decode``), transform tier, border policy, chunk cache. Defaults to
            ``CropConfig()``.
        objects: The object table: an :class:`~cropbench.objects.ObjectTable`, or the path of a
            table file. Defaults to the table the plate carries.
        reader: A reader already open on ``plate`` (for instance one shared by several datasets,
            or a test double); by default one is opened from ``config``'s read path and caches.
        labels: Object-table columns to return as ``item["labels"]``.

    Raises:
        ConfigError: A channel of ``config.channels`` is not on the plate or is named twice, or
            ``config.crop_size`` is larger than the field.
        ObjectTableError: The object table is empty, names a (well, field) the plate lacks, has a
            centroid outside the field, or no object is left after ``border="drop"``.
        StoreError: The plate cannot be opened or its metadata is inconsistent.

    Example:
        ```python
        from torch.utils.data import DataLoader
        from cropbench import CropConfig, CropDataset

        dataset = CropDataset("plate.zarr", CropConfig(crop_size=96, channels=("DNA", "RNA")))
        sample = dataset[0]
        sample["image"].shape  # torch.Size([2, 96, 96])
        sample["well"], sample["object_id"]
        loader = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=2)
        ```
    """

    def __init__(
        self,
        plate: str | Path,
        config: CropConfig | None = None,
        objects: ObjectTable | str | Path | None = None,
        reader: PlateReader | None = None,
        labels: Sequence[str] = (),
    ) -> None:
        self.config = config or CropConfig()
        self.label_names = tuple(labels)
        self.reader = reader or open_plate(
            plate,
            self.config.decode,
            self.config.chunk_cache_bytes,
            self.config.field_cache_fields,
            decode_threads=self.config.decode_threads,
        )
        metadata = self.reader.metadata
        only_field = (metadata.fields[0].well, metadata.fields[0].field) if len(metadata.fields) == 1 else None
        table = objects if isinstance(objects, ObjectTable) else plate_objects(objects or plate, only_field)
        if not len(table):
            named = "given as objects=" if isinstance(objects, ObjectTable) else str(objects or plate)
            raise ObjectTableError(f"the object table {named} is empty (0 rows): there are no cells to crop")
        self.channel_indices = resolve_channels(self.config.channels, metadata.channel_names)
        self.channel_names = tuple(metadata.channel_names[i] for i in self.channel_indices)
        self._channels_arg = (
            None
            if self.channel_indices == tuple(range(len(metadata.channel_names)))
            else np.array(self.channel_indices)
        )
        self._index_objects(table, read_label_classes(plate) if Path(plate).is_dir() else {})
        self.plan = TransformPlan.for_windows(
            self.config.tier,
            self.config.dtype,
            [metadata.display_ranges[i] for i in self.channel_indices],
            self.config.output_size,
            self.config.seed,
        )
        self.epoch = 0

    def _index_objects(self, table: ObjectTable, stored_classes: dict[str, tuple[str, ...]]) -> None:
        metadata = self.reader.metadata
        _, height, width = metadata.field_shape
        size = self.config.crop_size
        if size > height or size > width:
            raise ConfigError(f"crop_size={size} is larger than the field ({height}x{width})")
        lookup = {(info.well, info.field): info.index for info in metadata.fields}
        keys = list(zip(table.well.tolist(), table.field.tolist(), strict=True))
        missing = sorted({key for key in keys if key not in lookup})
        if missing:
            raise ObjectTableError(
                f"{len(missing)} (well, field) pairs of the object table are not in plate {metadata.path}, "
                f"first {missing[0]}"
            )
        field_index = np.fromiter((lookup[key] for key in keys), dtype=np.int64, count=len(keys))
        outside = (
            (table.centroid_y < 0) | (table.centroid_y >= height) | (table.centroid_x < 0) | (table.centroid_x >= width)
        )
        if outside.any():
            first = int(np.flatnonzero(outside)[0])
            raise ObjectTableError(
                f"{int(outside.sum())} centroids lie outside the {height}x{width} field, first object_id="
                f"{int(table.object_id[first])} at (y={table.centroid_y[first]}, x={table.centroid_x[first]})"
            )
        y0, x0 = crop_origins(table.centroid_y, table.centroid_x, size)
        keep = np.ones(len(table), dtype=bool)
        if self.config.border == "shift":
            y0, x0 = np.clip(y0, 0, height - size), np.clip(x0, 0, width - size)
        elif self.config.border == "drop":
            keep = (y0 >= 0) & (x0 >= 0) & (y0 + size <= height) & (x0 + size <= width)
        if not keep.any():
            raise ObjectTableError(f"no object of {metadata.path} is left after border={self.config.border!r}")
        self.object_id = table.object_id[keep]
        self.field_index = field_index[keep]
        self.window_y0, self.window_x0 = y0[keep], x0[keep]
        self.centroid_y, self.centroid_x = table.centroid_y[keep], table.centroid_x[keep]
        self.wells = table.well[keep]
        self.sites = table.field[keep]
        values, self.label_classes = label_columns(table, self.label_names, stored_classes)
        self.label_values = {name: column[keep] for name, column in values.items()}
        self.plate_name = metadata.name

    def __len__(self) -> int:
        return len(self.object_id)

    def set_epoch(self, epoch: int) -> None:
        """Seed the ``typical`` tier's random choices with ``epoch`` (call it before each epoch)."""
        self.epoch = epoch

    def read_raw(self, index: int) -> np.ndarray:
        """The raw uint16 crop (C, H, W) of object ``index``, with the border policy applied."""
        size = self.config.crop_size
        field, y0, x0 = int(self.field_index[index]), int(self.window_y0[index]), int(self.window_x0[index])
        _, height, width = self.reader.metadata.field_shape
        if y0 >= 0 and x0 >= 0 and y0 + size <= height and x0 + size <= width:
            return self.reader.read_region(field, y0, y0 + size, x0, x0 + size, self._channels_arg)
        out = np.zeros((len(self.channel_indices), size, size), dtype=self.reader.metadata.dtype)
        cy0, cx0, cy1, cx1 = max(y0, 0), max(x0, 0), min(y0 + size, height), min(x0 + size, width)
        inside = out[:, cy0 - y0 : cy1 - y0, cx0 - x0 : cx1 - x0]
        # the crop's window reaches the reader too: a crop atlas may hold the whole crop
        self.reader.read_region(field, cy0, cy1, cx0, cx1, self._channels_arg, out=inside, window=(y0, x0))
        return out

    def metadata_of(self, index: int) -> dict[str, Any]:
        """Everything sample ``index`` carries besides its image (its plate, well, field, object id...)."""
        return {
            "object_id": int(self.object_id[index]),
            "plate": self.plate_name,
            "well": str(self.wells[index]),
            "field": int(self.sites[index]),
            "field_index": int(self.field_index[index]),
            "centroid_y": float(self.centroid_y[index]),
            "centroid_x": float(self.centroid_x[index]),
            "crop_y0": int(self.window_y0[index]),
            "crop_x0": int(self.window_x0[index]),
            "index": int(index),
            **(
                {"labels": {name: column[index].item() for name, column in self.label_values.items()}}
                if self.label_values
                else {}
            ),
        }

    def __getitem__(self, index: int) -> dict[str, Any]:
        index = int(index)
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} outside a dataset of {len(self)} objects")
        index %= len(self)
        raw = torch.from_numpy(self.read_raw(index))
        return {"image": self.plan.apply(raw, index, self.epoch), **self.metadata_of(index)}

    def __getitems__(self, indices: Sequence[int]) -> CropBatch:
        """The items of a whole batch, byte-identical to ``[self[i] for i in indices]`` but read at once.

        Torch's DataLoader calls this for each batch. Inside a worker the batch tensor is allocated
        in shared memory, so handing it to the main process copies nothing more. A batch that says
        which batches this process reads next (an :class:`UpcomingBatch`) has their chunks read ahead.
        """
        positions = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(positions) == 0:
            raise IndexError("a batch needs at least one index")
        outside = (positions < -len(self)) | (positions >= len(self))
        if outside.any():
            raise IndexError(f"index {int(positions[outside][0])} outside a dataset of {len(self)} objects")
        positions %= len(self)
        plan, size = self.plan, self.config.crop_size
        shape = (len(positions), len(self.channel_indices), size, size)
        raw = (
            batch_tensor(shape, torch.uint16)
            if plan.tier == "none" and plan.dtype == "uint16"
            else torch.empty(
                shape,
                dtype=torch.uint16,
            )
        )
        columns: dict[str, Any] = {}
        self.read_raw_batch(
            positions,
            raw.numpy(),
            meanwhile=lambda: columns.update(self.metadata_columns(positions)),
            upcoming=getattr(indices, "upcoming", ()),
        )
        if plan.tier == "none":
            image = raw if plan.dtype == "uint16" else batch_tensor(shape, TORCH_DTYPES[plan.dtype]).copy_(raw)
        else:
            views = [plan.apply(raw[slot], index, self.epoch) for slot, index in enumerate(positions.tolist())]
            image = torch.stack(views, out=batch_tensor((len(views), *views[0].shape), views[0].dtype))
        return CropBatch(image, columns)

    def read_raw_batch(
        self,
        indices: np.ndarray,
        out: np.ndarray | None = None,
        meanwhile: Callable[[], Any] | None = None,
        upcoming: Sequence[Sequence[int]] = (),
    ) -> np.ndarray:
        """The raw crops (B, C, H, W) of objects ``indices`` in one reader call, border policy applied;
        ``meanwhile`` runs while the direct reader's decode threads read
        (:meth:`~cropbench.formats.direct.DirectChunkReader.read_regions`), after the reads otherwise.
        ``upcoming``: the batches this process reads next, nearest first, for a reader that reads ahead."""
        size = self.config.crop_size
        if out is None:
            out = np.empty((len(indices), len(self.channel_indices), size, size), dtype=self.reader.metadata.dtype)
        regions = self.regions_of(indices)
        top, left = regions.out_y0, regions.out_x0
        bottom, right = top + (regions.y1 - regions.y0), left + (regions.x1 - regions.x0)
        padded = np.flatnonzero((top != 0) | (left != 0) | (bottom != size) | (right != size))

        def pad_then_meanwhile() -> None:  # the padding lies outside every region: no read writes there
            zero_outside(out, padded, top, bottom, left, right)
            if meanwhile is not None:
                meanwhile()

        if isinstance(self.reader, DirectChunkReader):
            if upcoming and self.reader.prefetch_batches:
                hinted = upcoming[: self.reader.prefetch_batches]
                self.reader.prefetch(
                    [self.regions_of(np.asarray(batch) % len(self)) for batch in hinted], self._channels_arg
                )
            return self.reader.read_regions(regions, out, self._channels_arg, pad_then_meanwhile)
        self.reader.read_regions(regions, out, self._channels_arg)
        pad_then_meanwhile()
        return out

    def regions_of(self, indices: np.ndarray) -> Regions:
        """The windows of objects ``indices`` clipped to their fields, each landing where its crop
        starts inside the field (the rest of the crop is padding)."""
        return Regions.of_windows(
            self.field_index[indices],
            self.window_y0[indices],
            self.window_x0[indices],
            self.config.crop_size,
            self.reader.metadata.field_shape,
        )

    def read_ahead_batches(self, batch_size: int) -> int:
        """Batches of ``batch_size`` crops the reader reads ahead of the one asked for, once the order
        is known (0: none), with its chunk cache able to hold them and the batch being read
        (:meth:`~cropbench.formats.direct.DirectChunkReader.hold_read_ahead`, from the most chunk bytes
        one crop may touch)."""
        if not isinstance(self.reader, DirectChunkReader) or not self.reader.prefetch_batches:
            return 0
        size = self.config.crop_size
        return self.reader.hold_read_ahead(batch_size * self.reader.region_chunk_bytes(size, size, self._channels_arg))

    def metadata_columns(self, indices: np.ndarray) -> dict[str, Any]:
        """:meth:`metadata_of` of many objects, batched as ``default_collate`` batches it
        (numbers as int64/float64 tensors, strings as lists), with array arithmetic."""
        columns: dict[str, Any] = {
            "object_id": self.object_id[indices],
            "plate": [self.plate_name] * len(indices),
            "well": [str(well) for well in self.wells[indices].tolist()],
            "field": self.sites[indices],
            "field_index": self.field_index[indices],
            "centroid_y": self.centroid_y[indices],
            "centroid_x": self.centroid_x[indices],
            "crop_y0": self.window_y0[indices],
            "crop_x0": self.window_x0[indices],
            "index": indices,
        }
        for name, values in columns.items():
            if isinstance(values, np.ndarray):
                kind = np.float64 if values.dtype.kind == "f" else np.int64
                columns[name] = torch.from_numpy(np.ascontiguousarray(values, dtype=kind))
        if getattr(self, "label_values", None):
            columns["labels"] = default_collate([self.metadata_of(i)["labels"] for i in indices.tolist()])
        return columns

    def group_keys(self, by: str, scale: int = 1) -> np.ndarray:
        """Integer group of each object: its field, its well, or the decode unit its centre is in.

        ``scale`` widens chunk groups to ``scale`` × ``scale`` decode units (shuffle granularity).
        """
        if by == "field":
            return self.field_index.copy()
        if by == "well":
            _, inverse = np.unique(self.wells.astype(str), return_inverse=True)
            return inverse.astype(np.int64)
        if by == "chunk":
            grain_y, grain_x = (g * max(scale, 1) for g in self.reader.grain())
            _, height, width = self.reader.metadata.field_shape
            centre_y = np.clip(self.window_y0 + self.config.crop_size // 2, 0, height - 1)
            centre_x = np.clip(self.window_x0 + self.config.crop_size // 2, 0, width - 1)
            per_row = -(-width // grain_x)
            per_field = per_row * -(-height // grain_y)
            return self.field_index * per_field + (centre_y // grain_y) * per_row + centre_x // grain_x
        raise ConfigError(f"group_keys(by={by!r}) must be one of {', '.join(GROUPINGS)}")


def zero_outside(
    out: np.ndarray, slots: np.ndarray, top: np.ndarray, bottom: np.ndarray, left: np.ndarray, right: np.ndarray
) -> None:
    """Zero the pixels of each crop ``out[slot]`` (C, H, W) outside its rows ``top:bottom`` and columns
    ``left:right`` (``top`` etc. indexed by slot): the padding of crops over a field's border."""
    for slot, y0, y1, x0, x1 in zip(
        slots.tolist(),
        top[slots].tolist(),
        bottom[slots].tolist(),
        left[slots].tolist(),
        right[slots].tolist(),
        strict=True,
    ):
        crop = out[slot]
        crop[:, :y0] = 0
        crop[:, y1:] = 0
        crop[:, y0:y1, :x0] = 0
        crop[:, y0:y1, x1:] = 0


def batch_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An empty tensor for a whole batch; in shared memory inside a DataLoader worker, so handing
    it to the main process costs no further copy (what ``default_collate`` does for its stack).

    In a worker that cropbench's loader started (:func:`use_segments`), the memory is one of the
    worker's :class:`SegmentPool` segments, used again once the main process has let go of it.
    """
    if get_worker_info() is None:
        return torch.empty(shape, dtype=dtype)
    if _worker_segments:
        return _worker_segments[0].tensor(shape, dtype)
    return _shared_tensor(shape, dtype)


def _shared_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    storage = torch.UntypedStorage._new_shared(_nbytes(shape, dtype))
    return torch.empty(0, dtype=dtype).set_(storage).view(shape)


def _nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * torch.empty(0, dtype=dtype).element_size()


#: The tail of a pooled segment: four int64 after the batch (padded to 8 bytes): this marker, the
#: worker's index, the segment's slot and its hand-out ticket. The main process reads it to return
#: the segment (:class:`cropbench.data.loader.SegmentReturns`).
SEGMENT_MARKER = 0x63726F7062656E63
SEGMENT_TAIL_BYTES = 32


class SegmentPool:
    """A DataLoader worker's shared-memory batch segments, each used again once it is returned.

    Handing a batch to the main process needs it in shared memory; a fresh segment per batch costs
    a page fault and a zeroed page for every 4 KiB written, and freeing them afterwards: about half
    of what reading a 64 × 5 × 96 × 96 uint16 batch costs. A segment whose pages are already there
    costs none of that. The main process says which segments it no longer holds by writing their
    ticket into ``returns[worker, slot]`` (a tensor in shared memory); a segment is written again only
    then. With no returned segment of the right size at hand, the batch gets a fresh, unpooled one.
    """

    def __init__(self, returns: torch.Tensor, worker: int) -> None:
        self.returns = returns.numpy()[worker]
        self.worker = worker
        self.storages: list[torch.UntypedStorage] = []
        self.tails: list[np.ndarray] = []
        self.tickets: list[int] = []
        # Tickets of one worker process never repeat those of an earlier one in the same slot.
        self._next_ticket = int.from_bytes(os.urandom(6), "little") << 14

    @property
    def slots(self) -> int:
        return len(self.returns)

    def tensor(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised batch tensor in a pooled segment, or in a fresh one when none is free."""
        nbytes = -(-_nbytes(shape, dtype) // 8) * 8 + SEGMENT_TAIL_BYTES
        slot = self._free_slot(nbytes)
        if slot is None:
            return _shared_tensor(shape, dtype)
        self._next_ticket += 1
        self.tickets[slot] = self._next_ticket
        self.tails[slot][:] = (SEGMENT_MARKER, self.worker, slot, self._next_ticket)
        return torch.empty(0, dtype=dtype).set_(self.storages[slot], 0, shape, contiguous_strides(shape))

    def _free_slot(self, nbytes: int) -> int | None:
        free = [slot for slot, ticket in enumerate(self.tickets) if self.returns[slot] == ticket]
        for slot in free:
            if self.storages[slot].nbytes() == nbytes:
                return slot
        if len(self.storages) < self.slots:
            self.storages.append(torch.UntypedStorage._new_shared(nbytes))
            self.tails.append(np.empty(0))
            self.tickets.append(0)
            slot = len(self.storages) - 1
        elif free:  # a free segment of another size (the last, shorter batch): replace it
            slot = free[0]
            self.storages[slot] = torch.UntypedStorage._new_shared(nbytes)
        else:
            return None
        tail = torch.empty(0, dtype=torch.int64).set_(
            self.storages[slot], (nbytes - SEGMENT_TAIL_BYTES) // 8, (4,), (1,)
        )
        self.tails[slot] = tail.numpy()
        return slot


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Element strides of a C-contiguous tensor of ``shape``."""
    strides = [1] * len(shape)
    for axis in range(len(shape) - 2, -1, -1):
        strides[axis] = strides[axis + 1] * shape[axis + 1]
    return tuple(strides)


#: The pool of this process, set only inside a DataLoader worker that cropbench's loader started.
_worker_segments: list[SegmentPool] = []


def use_segments(pool: SegmentPool | None) -> None:
    """Make :func:`batch_tensor` take its shared memory from ``pool`` (None: fresh segments) in this
    process; cropbench's loader calls it in each worker it starts."""
    _worker_segments[:] = [] if pool is None else [pool]


class UpcomingBatch(list[int]):
    """A batch's indices, with the batches the process that reads it reads next (nearest first):
    :meth:`CropDataset.__getitems__` has their chunks read ahead. A batch sampler makes them
    (:class:`cropbench.data.sampling.ReadAheadBatches`); they pickle with the batch to a DataLoader worker."""

    def __init__(self, indices: Sequence[int], upcoming: Sequence[Sequence[int]] = ()) -> None:
        super().__init__(indices)
        self.upcoming = tuple(upcoming)


class CropBatch(Sequence[dict[str, Any]]):
    """The items of one batch as :meth:`CropDataset.__getitems__` cuts them: one (B, C, H, W) tensor
    plus batched metadata columns.

    It is a sequence of per-item dicts (views into the batch tensor), so any collate accepts it;
    cropbench's collates (:mod:`cropbench.data.loader`) recognise it and pass :meth:`collated` on
    as it is, so the images are never stacked a second time.
    """

    def __init__(self, image: torch.Tensor, columns: dict[str, Any]) -> None:
        self.image = image
        self.columns = columns

    def __len__(self) -> int:
        return int(self.image.shape[0])

    def __getitem__(self, position: int) -> dict[str, Any]:  # type: ignore[override]
        if not 0 <= position < len(self):
            raise IndexError(f"position {position} outside a batch of {len(self)}")
        items = {name: _item(values, position) for name, values in self.columns.items()}
        return {"image": self.image[position], **items}

    def collated(self) -> dict[str, Any]:
        """What ``default_collate`` makes of the items, without copying the images again."""
        return {"image": self.image, **self.columns}


def _item(values: Any, position: int) -> Any:
    if isinstance(values, torch.Tensor):
        return values[position].item()
    if isinstance(values, dict):
        return {name: _item(column, position) for name, column in values.items()}
    return values[position]


class PairedViews(Dataset[dict[str, Any]]):
    """Two independently augmented views of the same object (contrastive training), one read."""

    def __init__(self, dataset: CropDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    def __getitem__(self, index: int) -> dict[str, Any]:
        index = int(index) % len(self.dataset)
        raw = torch.from_numpy(self.dataset.read_raw(index))
        plan, epoch = self.dataset.plan, self.dataset.epoch
        return {
            "view1": plan.apply(raw, index, epoch, view=0),
            "view2": plan.apply(raw, index, epoch, view=1),
            **self.dataset.metadata_of(index),
        }


def resolve_channels(requested: tuple[str, ...] | None, available: tuple[str, ...]) -> tuple[int, ...]:
    """Channel names (or decimal indices as strings) to indices, with a clear error otherwise."""
    if requested is None:
        return tuple(range(len(available)))
    indices = []
    for channel in requested:
        name = str(channel)
        if name in available:
            indices.append(available.index(name))
        elif name.isdigit() and int(name) < len(available):
            indices.append(int(name))
        else:
            raise ConfigError(f"unknown channel {name!r}; the plate has {', '.join(available)}")
    if len(set(indices)) != len(indices):
        raise ConfigError(f"channels {requested} name the same channel twice")
    return tuple(indices)
