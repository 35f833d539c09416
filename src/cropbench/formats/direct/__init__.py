"""The direct decode path for OME-Zarr: a reader composed of stages, each a module with one job.

- :mod:`.keys`: a chunk's (and a shard's) key, one int packed from its field and grid position.
- :mod:`.codecs`: the store codecs (blosc, zstd, gzip/zlib, crc32c), one module per family behind
  one interface.
- :mod:`.layout`: how an array stores its chunks (:class:`ChunkLayout`) and which codecs decode
  them, each field's layout read once (:class:`FieldLayouts`).
- :mod:`.shards`: shard indexes, read once per process into one table.
- :mod:`.records`: the records passed between stages and to C (a piece, a native read, a native
  chunk: NumPy structured dtypes; the channel groups), defined once.
- :mod:`.planning`: regions -> (crop, chunk) pieces, grouped by chunk.
- :mod:`.reads`: missing chunks -> byte reads, coalesced within a shard, dealt to decode threads.
- :mod:`.loads`: reads -> decoded chunks, natively or in Python.
- :mod:`.copies`: pieces -> the output batch.
- :mod:`.cache`: the LRU of decoded chunks, recycled chunk arrays, counts of what was loaded.
- :mod:`.scheduling`: a batch's loads and copies over the decode threads.
- :mod:`.native`: the C boundary (what each function of the extension takes), in one place.
- :mod:`.reader`: :class:`DirectChunkReader`, the stages composed; :mod:`.timed`: the same with stage clocks.
"""

from __future__ import annotations

from cropbench.formats.direct.copies import copy_pieces
from cropbench.formats.direct.layout import ChunkLayout, read_chunk_layout
from cropbench.formats.direct.reader import DirectChunkReader
from cropbench.formats.direct.records import PIECE, ChannelGroup, Channels
from cropbench.formats.direct.timed import StageTimedChunkReader

__all__ = [
    "PIECE",
    "ChannelGroup",
    "Channels",
    "ChunkLayout",
    "DirectChunkReader",
    "StageTimedChunkReader",
    "copy_pieces",
    "read_chunk_layout",
]
