"""The in-memory reference: a dataset's crops cut from its plate's fields already held in memory.

Three measurements set cropbench's crop path beside the same crops taken from memory, and all three
cut them here, so the crops they compare with are the dataset's own (same fields, same windows,
padding zeroed where a window leaves its field):

- the relative cost (asv's ``track_relative_cost``): per crop, cut and cast to the dataset's dtype
  in Python (:meth:`MemoryReference.__call__`), no decoding, no chunk lookup, no cache bookkeeping, so
  a slowdown anywhere in cropbench's crop path raises the ratio and a slowdown of the whole machine
  raises both sides and cancels (a reference, not a ceiling: it works per crop, in Python);
- Track 2's ``memory`` source, the crops cut once and served by a DataLoader
  (:class:`cropbench.harness.loader_case.MemoryCrops`);
- the fetch ceiling of track ``targets``, a whole batch cut by the C piece copy
  (:meth:`MemoryReference.batch_pieces` and :meth:`MemoryReference.copy`, split over threads by
  ``cropbench.tracks.targets.CopyCeiling``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from cropbench.data.dataset import CropDataset
from cropbench.data.transforms import TORCH_DTYPES
from cropbench.errors import ConfigError
from cropbench.formats.direct import PIECE, Channels, copy_pieces
from cropbench.harness.windows import CropWindows

#: Every channel of a field in memory to the same channel of the crop (the fields hold the dataset's channels).
EVERY_CHANNEL = Channels.every()


class MemoryReference:
    """The crops of objects (``field_index``, window corners ``window_y0``, ``window_x0``, ``size``
    pixels square) cut from ``fields`` (field index -> (C, H, W) pixels in memory), cast to ``dtype``.

    Each object's rectangle inside its field and inside its crop is worked out once, up front, as the
    direct reader's pieces (:data:`~cropbench.formats.direct.PIECE`, the field as the "chunk"), so
    cutting a crop does no more arithmetic than slicing.
    """

    def __init__(
        self,
        fields: Mapping[int, np.ndarray],
        field_index: np.ndarray,
        window_y0: np.ndarray,
        window_x0: np.ndarray,
        size: int,
        dtype: torch.dtype = torch.uint16,
    ) -> None:
        if not fields:
            raise ConfigError("a memory reference needs at least one field in memory, got none")
        self.fields = dict(fields)
        first = next(iter(self.fields.values()))
        channels, height, width = first.shape
        self.crop_shape = (channels, size, size)
        self.pixel_dtype = first.dtype
        self.dtype = dtype
        y0, x0 = np.asarray(window_y0, dtype=np.int64), np.asarray(window_x0, dtype=np.int64)
        inside_y0, inside_x0 = np.maximum(y0, 0), np.maximum(x0, 0)
        inside_y1, inside_x1 = np.minimum(y0 + size, height), np.minimum(x0 + size, width)
        #: Per object, its one piece (slot 0, every channel): where the crop lies in its field and in the crop.
        self.rectangles = np.zeros(len(y0), dtype=PIECE)
        columns = {
            "key": np.asarray(field_index, dtype=np.int64),
            "sy0": inside_y0,
            "sy1": inside_y1,
            "sx0": inside_x0,
            "sx1": inside_x1,
            "dy0": inside_y0 - y0,
            "dy1": inside_y1 - y0,
            "dx0": inside_x0 - x0,
            "dx1": inside_x1 - x0,
        }
        for name, column in columns.items():
            self.rectangles[name] = column
        #: Per object, whether part of its crop lies outside its field (that part is zero).
        self.padded = ((inside_y1 - inside_y0) < size) | ((inside_x1 - inside_x0) < size)

    @classmethod
    def of_dataset(cls, dataset: CropDataset, indices: Sequence[int] | None = None) -> MemoryReference:
        """The crops of ``dataset``, cast to its dtype, from its fields
        (the dataset's channels) read once through its reader: every field, or those of ``indices``."""
        reader = dataset.reader
        channels = list(dataset.channel_indices)
        if indices is None:
            needed = np.arange(len(reader.metadata.fields))
        else:
            needed = np.unique(dataset.field_index[np.asarray(indices, dtype=np.int64)])
        fields = {index: reader.read_field(index)[channels] for index in needed.tolist()}
        return cls(
            fields,
            dataset.field_index,
            dataset.window_y0,
            dataset.window_x0,
            dataset.config.crop_size,
            TORCH_DTYPES[dataset.config.dtype],
        )

    @classmethod
    def of_windows(cls, fields: Mapping[int, np.ndarray], windows: CropWindows) -> MemoryReference:
        """The raw crops of ``windows`` (every channel, ``border="pad"``) from ``fields`` in memory."""
        return cls(fields, windows.field_index, windows.window_y0, windows.window_x0, windows.size)

    def __len__(self) -> int:
        return len(self.rectangles)

    def cut(self, index: int) -> np.ndarray:
        """The raw (C, H, W) crop of object ``index``, a fresh array."""
        field, _, _, sy0, sy1, sx0, sx1, dy0, dy1, dx0, dx1 = self.rectangles[index].item()
        window = self.fields[field][:, sy0:sy1, sx0:sx1]
        if not self.padded[index]:
            return np.ascontiguousarray(window)
        crop = np.zeros(self.crop_shape, dtype=self.pixel_dtype)
        crop[:, dy0:dy1, dx0:dx1] = window
        return crop

    def __call__(self, index: int) -> torch.Tensor:
        """The crop of object ``index`` cast as the dataset casts it (the relative cost's reference)."""
        return torch.from_numpy(self.cut(index)).to(self.dtype)

    def batch_pieces(self, indices: Sequence[int], out: np.ndarray) -> np.ndarray:
        """One piece per crop of ``indices``, its slot its position, as :meth:`copy` reads them; the slots of
        ``out`` (B, C, H, W) whose crop is padded are zeroed first, since the copy writes only inside the field."""
        positions = np.asarray(indices)
        pieces = self.rectangles[positions]
        pieces["slot"] = np.arange(len(pieces))
        for slot in np.flatnonzero(self.padded[positions]).tolist():
            out[slot] = 0
        return pieces

    def copy(self, pieces: np.ndarray, out: np.ndarray) -> None:
        """Copy ``pieces`` into ``out`` by the direct reader's C piece copy (the GIL released for the whole copy)."""
        copy_pieces(pieces, EVERY_CHANNEL, self.fields, out)
