"""The inner chunks of zarr v3 shards in a chosen order on disk: along a Hilbert curve over the chunk grid.

A shard's index says where each inner chunk lies, whatever order the chunks follow each other in
(zarr v3's sharding codec leaves the order free, and every reader goes by the index), so the order
can suit how the chunks are read. zarr-python writes them in Morton order, which jumps: the chunks a
crop touches lie in many byte ranges of the shard. Along a Hilbert curve every chunk's successor
on disk is its neighbour in the image, so a crop's chunks lie in fewer, longer ranges, and a reader
over an object store fetches them in fewer requests without reading much of the chunks around them.

:func:`reorder_shards` rewrites the shards of an array zarr-python has written, moving the stored
chunks as they are (not re-encoded) and rewriting the index (and its crc32c) to match.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from cropbench.errors import StoreError
from cropbench.formats.direct.codecs.crc32c import CHECKSUM_BYTES, crc32c
from cropbench.formats.direct.shards import EMPTY_ENTRY
from cropbench.formats.ngff import read_array_metadata

#: Bytes of one entry of a shard index: offset and size, two little-endian uint64.
ENTRY_BYTES = 16


def _sign(value: int) -> int:
    return (value > 0) - (value < 0)


def _walk(cells: list[tuple[int, int]], x: int, y: int, ax: int, ay: int, bx: int, by: int) -> None:
    """Append the cells of the rectangle at (x, y) spanned by the vectors (ax, ay) (the way along)
    and (bx, by) (across), along a Hilbert curve from (x, y) to the far end of (ax, ay)."""
    width, height = abs(ax + ay), abs(bx + by)
    step_ax, step_ay, step_bx, step_by = _sign(ax), _sign(ay), _sign(bx), _sign(by)
    if height == 1 or width == 1:  # one row or column: straight along it
        step_x, step_y, count = (step_ax, step_ay, width) if height == 1 else (step_bx, step_by, height)
        for _ in range(count):
            cells.append((x, y))
            x, y = x + step_x, y + step_y
        return
    half_ax, half_ay, half_bx, half_by = ax // 2, ay // 2, bx // 2, by // 2
    if 2 * width > 3 * height:  # long: two halves side by side (an even first half keeps steps unit)
        if abs(half_ax + half_ay) % 2 and width > 2:
            half_ax, half_ay = half_ax + step_ax, half_ay + step_ay
        _walk(cells, x, y, half_ax, half_ay, bx, by)
        _walk(cells, x + half_ax, y + half_ay, ax - half_ax, ay - half_ay, bx, by)
        return
    if abs(half_bx + half_by) % 2 and height > 2:  # up the near half, along the far one, down the rest
        half_bx, half_by = half_bx + step_bx, half_by + step_by
    _walk(cells, x, y, half_bx, half_by, half_ax, half_ay)
    _walk(cells, x + half_bx, y + half_by, ax, ay, bx - half_bx, by - half_by)
    _walk(
        cells,
        x + (ax - step_ax) + (half_bx - step_bx),
        y + (ay - step_ay) + (half_by - step_by),
        -half_bx,
        -half_by,
        -(ax - half_ax),
        -(ay - half_ay),
    )


@functools.lru_cache(maxsize=16)
def hilbert_curve(height: int, width: int) -> np.ndarray:
    """(y, x) of every cell of a ``height`` x ``width`` grid, in order along a Hilbert curve that
    steps from each cell to a neighbour, on a grid of any size (the generalized Hilbert curve of
    J. Červený's "gilbert" construction: a power-of-two curve cut to size would jump)."""
    if height < 1 or width < 1:
        raise ValueError(f"a grid needs at least one cell, got {height} x {width}")
    cells: list[tuple[int, int]] = []
    if width >= height:
        _walk(cells, 0, 0, width, 0, 0, height)
    else:
        _walk(cells, 0, 0, 0, height, width, 0)
    curve = np.array(cells, dtype=np.int64)[:, ::-1].copy()  # walked as (x, y)
    curve.flags.writeable = False
    return curve


def storage_order(per_shard: tuple[int, ...]) -> np.ndarray:
    """The C-order index of each inner chunk of a shard, in the order the chunks are written: along
    the Hilbert curve over the last two axes (y, x), and at each (y, x) every chunk of the leading axes
    (channels, t, z) together, in C order."""
    *leading, height, width = per_shard
    grid = np.arange(int(np.prod(per_shard)), dtype=np.int64).reshape(
        int(np.prod(leading, dtype=np.int64)), height, width
    )
    curve = hilbert_curve(height, width)
    return grid[:, curve[:, 0], curve[:, 1]].T.reshape(-1)


def reorder_shard(path: Path, order: np.ndarray, index_at_end: bool, checksum: bool) -> None:
    """Rewrite the shard file at ``path`` with its stored chunks in ``order`` (C-order indices of the
    inner chunks, as :func:`storage_order` gives them), each chunk's bytes unchanged, and its index (with
    its crc32c where it has one) pointing at where each chunk now lies."""
    data = path.read_bytes()
    index_bytes = len(order) * ENTRY_BYTES + (CHECKSUM_BYTES if checksum else 0)
    if len(data) < index_bytes:
        raise StoreError(f"shard {path} is truncated: its index needs {index_bytes} bytes, the file has {len(data)}")
    raw = data[-index_bytes:] if index_at_end else data[:index_bytes]
    if checksum:
        raw, stored = raw[:-CHECKSUM_BYTES], int.from_bytes(raw[-CHECKSUM_BYTES:], "little")
        if crc32c(raw) != stored:
            raise StoreError(f"shard {path} has a corrupt index (crc32c mismatch)")
    entries = np.frombuffer(raw, dtype="<u8").reshape(-1, 2)
    chunks: list[bytes] = []
    written = np.full_like(entries, EMPTY_ENTRY)
    offset = 0 if index_at_end else index_bytes
    for inner in order.tolist():
        start, size = (int(value) for value in entries[inner])
        if start == EMPTY_ENTRY and size == EMPTY_ENTRY:
            continue
        if start + size > len(data):
            raise StoreError(f"shard {path} has a corrupt index: chunk {inner} ends past the file's {len(data)} bytes")
        chunks.append(data[start : start + size])
        written[inner] = (offset, size)
        offset += size
    index = written.astype("<u8").tobytes()
    if checksum:
        index += crc32c(index).to_bytes(CHECKSUM_BYTES, "little")
    parts = [*chunks, index] if index_at_end else [index, *chunks]
    scratch = path.with_name(f".{path.name}.reordering")
    scratch.write_bytes(b"".join(parts))
    os.replace(scratch, path)


def reorder_shards(array_dir: Path, order: Callable[[tuple[int, ...]], np.ndarray] = storage_order) -> int:
    """Put the inner chunks of every shard of the zarr v3 array at ``array_dir`` in ``order`` (of the
    chunks per shard along each axis: the C-order indices in the order they are to lie; by default
    Hilbert order, :func:`storage_order`); returns the shards rewritten. An array without shards is
    left as it is."""
    metadata = read_array_metadata(array_dir)
    sharding = metadata.sharding
    if sharding is None:
        return 0
    per_shard = tuple(shard // inner for shard, inner in zip(metadata.chunk, sharding.chunk, strict=True))
    chunk_order = order(per_shard)
    root = array_dir / "c" if metadata.v3_prefix else array_dir
    shards = [path for path in sorted(root.rglob("*")) if path.is_file() and path.name not in ("zarr.json", ".zattrs")]
    for path in shards:
        reorder_shard(path, chunk_order, sharding.index_at_end, sharding.index_checksum)
    return len(shards)
