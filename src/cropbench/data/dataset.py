"""Torch Datasets of single-cell crops: one item per object of the plate's object table.

The sample index (field, window origin) is computed once, vectorised, in ``__init__``;
``__getitem__`` only reads through the injected reader and applies the transform tier.

Border policy for cells whose crop window leaves the field:
- ``pad`` (default): the window stays centred on the cell; pixels outside the field are zero.
- ``shift``: the window is moved inside the field (the cell is then off-centre).
- ``drop``: such objects are left out of the dataset.

The window of a ``size``-pixel crop starts at ``floor(c - (size - 1) / 2 + 1 / 2)`` on each axis
(``c`` the centroid, pixel centres at integer coordinates, as CellProfiler measures them): its centre,
``start + (size - 1) / 2``, is within half a pixel of the centroid, the closest a pixel grid allows.

``labels=[...]`` adds ``item["labels"]``, a dict of per-object label columns of the object table:
numbers as numbers, strings as integer class ids (``dataset.label_classes`` maps them back).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from cropbench.config import CropConfig
from cropbench.data.transforms import TransformPlan
from cropbench.errors import ConfigError, ObjectTableError
from cropbench.formats import PlateReader, open_plate, plate_objects
from cropbench.objects import ObjectTable, label_columns, read_label_classes

GROUPINGS = ("field", "well", "chunk")


class CropDataset(Dataset[dict[str, Any]]):
    """Single-cell crops (C × H × W) with their plate, well, field and object id."""

    def __init__(
        self, plate: str | Path, config: CropConfig | None = None,
        objects: ObjectTable | str | Path | None = None, reader: PlateReader | None = None,
        labels: Sequence[str] = (),
    ) -> None:
        self.config = config or CropConfig()
        self.label_names = tuple(labels)
        self.reader = reader or open_plate(
            plate, self.config.decode, self.config.chunk_cache_bytes, self.config.field_cache_fields,
        )
        metadata = self.reader.metadata
        only_field = (metadata.fields[0].well, metadata.fields[0].field) if len(metadata.fields) == 1 else None
        table = objects if isinstance(objects, ObjectTable) else plate_objects(objects or plate, only_field)
        self.channel_indices = resolve_channels(self.config.channels, metadata.channel_names)
        self.channel_names = tuple(metadata.channel_names[i] for i in self.channel_indices)
        self._channels_arg = None if self.channel_indices == tuple(range(len(metadata.channel_names))) else np.array(
            self.channel_indices
        )
        self._index_objects(table, read_label_classes(plate) if Path(plate).is_dir() else {})
        windows = metadata.extra.get("windows") or []
        window_pairs = [
            (float(w.get("start", 0.0)), float(w.get("end", 65535.0))) if w else (0.0, 65535.0) for w in windows
        ] or [(0.0, 65535.0)] * len(metadata.channel_names)
        if len(window_pairs) != len(metadata.channel_names):
            window_pairs = [(0.0, 65535.0)] * len(metadata.channel_names)
        self.plan = TransformPlan.for_windows(
            self.config.tier, self.config.dtype, [window_pairs[i] for i in self.channel_indices],
            self.config.output_size, self.config.seed,
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
        outside = (table.centroid_y < 0) | (table.centroid_y >= height) | (table.centroid_x < 0) | (
            table.centroid_x >= width
        )
        if outside.any():
            first = int(np.flatnonzero(outside)[0])
            raise ObjectTableError(
                f"{int(outside.sum())} centroids lie outside the {height}x{width} field, first object_id="
                f"{int(table.object_id[first])} at (y={table.centroid_y[first]}, x={table.centroid_x[first]})"
            )
        y0 = np.floor(table.centroid_y - (size - 1) / 2 + 0.5).astype(np.int64)
        x0 = np.floor(table.centroid_x - (size - 1) / 2 + 0.5).astype(np.int64)
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
        self.reader.read_region(
            field, cy0, cy1, cx0, cx1, self._channels_arg, out=out[:, cy0 - y0:cy1 - y0, cx0 - x0:cx1 - x0],
        )
        return out

    def metadata_of(self, index: int) -> dict[str, Any]:
        return {
            "object_id": int(self.object_id[index]), "plate": self.plate_name, "well": str(self.wells[index]),
            "field": int(self.sites[index]), "field_index": int(self.field_index[index]),
            "centroid_y": float(self.centroid_y[index]), "centroid_x": float(self.centroid_x[index]),
            "crop_y0": int(self.window_y0[index]), "crop_x0": int(self.window_x0[index]), "index": int(index),
            **({"labels": {name: column[index].item() for name, column in self.label_values.items()}}
               if self.label_values else {}),
        }

    def __getitem__(self, index: int) -> dict[str, Any]:
        index = int(index)
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} outside a dataset of {len(self)} objects")
        index %= len(self)
        raw = torch.from_numpy(self.read_raw(index))
        return {"image": self.plan.apply(raw, index, self.epoch), **self.metadata_of(index)}

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
            "view1": plan.apply(raw, index, epoch, view=0), "view2": plan.apply(raw, index, epoch, view=1),
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
