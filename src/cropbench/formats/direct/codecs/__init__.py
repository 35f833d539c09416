"""The store codecs the direct reader decodes, one module per codec family behind :class:`Codec`.

- :mod:`.codec`: the interface (a bounded decode, and the most bytes a codec may store);
- :mod:`.blosc`, :mod:`.zstd`, :mod:`.deflate` (gzip, zlib), :mod:`.crc32c`: the codecs.
"""

from __future__ import annotations

from cropbench.formats.direct.codecs.blosc import BLOSC
from cropbench.formats.direct.codecs.codec import Codec, Decoder
from cropbench.formats.direct.codecs.crc32c import CRC32C
from cropbench.formats.direct.codecs.deflate import GZIP, ZLIB
from cropbench.formats.direct.codecs.zstd import ZSTD

#: Each codec the direct path decodes, by its name in zarr metadata.
CODECS: dict[str, Codec] = {codec.name: codec for codec in (BLOSC, ZSTD, GZIP, ZLIB, CRC32C)}

__all__ = ["BLOSC", "CODECS", "CRC32C", "GZIP", "ZLIB", "ZSTD", "Codec", "Decoder"]
