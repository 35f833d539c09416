"""The image files of an import: one file per channel of each field, found from the table's file name
columns or as Phenix-style names in the image folder, checked from their TIFF headers, and read."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import tifffile

from cropbench.errors import ImportInputError
from cropbench.plates.importing.columns import column_strings

IMAGE_SUFFIXES = (".tif", ".tiff")
#: Pixel types a plate stores.
DTYPES = ("uint8", "uint16", "int16", "float32")
_PHENIX = re.compile(
    r"^r(?P<row>\d+)c(?P<column>\d+)f(?P<field>\d+)p(?P<plane>\d+)-ch(?P<channel>\d+)"
    r"sk\d+fk\d+fl\d+\.tiff?$",
    re.IGNORECASE,
)
_MISSING_SHOWN = 3


@dataclass(frozen=True)
class FieldSource:
    """One field of the imported plate: its well, site, and one file per channel."""

    row: str
    column: str
    site: str
    files: tuple[Path, ...]

    @property
    def well(self) -> str:
        return f"{self.row}{self.column}"


def _resolve_file(images: Path, name: str, folder: str | None) -> Path:
    """The recorded folder's file when it lies under ``images``, else the name under ``images``."""
    if folder:
        recorded = Path(folder) / name
        if recorded.is_file() and recorded.resolve().is_relative_to(images.resolve()):
            return recorded
    return images / name


def check_files_inside(
    images: Path, row_files: Sequence[tuple[Path, ...]], sources: Sequence[str], row_numbers: Sequence[int]
) -> None:
    """Every file must resolve (links followed) to a place under ``images``: a name like ``../x.tif``, an
    absolute path or a link out of the folder would put pixels from elsewhere into the plate."""
    root = images.resolve()
    checked: set[Path] = set()
    for row, files in zip(row_numbers, row_files, strict=True):
        for source, path in zip(sources, files, strict=True):
            if path in checked:
                continue
            resolved = path.resolve()
            if not resolved.is_relative_to(root):
                raise ImportInputError(
                    f"table row {row} names image file {path} (channel {source}), which is {resolved}, outside "
                    f"--images {images}; import reads only files under the image folder"
                )
            checked.add(path)


def files_from_columns(
    table: pa.Table,
    images: Path,
    columns: dict[str, dict[str, str]],
    chosen: list[tuple[str, str]],
) -> list[tuple[Path, ...]]:
    per_channel = []
    for source, _ in chosen:
        names = column_strings(table, columns[source]["FileName"])
        folders = (
            column_strings(table, columns[source]["PathName"]) if "PathName" in columns[source] else [""] * len(names)
        )
        per_channel.append([_resolve_file(images, n, f) for n, f in zip(names, folders, strict=True)])
    return [tuple(files) for files in zip(*per_channel, strict=True)]


def phenix_files(images: Path) -> dict[tuple[int, int, int, int, int], Path]:
    found = {}
    for path in sorted(images.iterdir()) if images.is_dir() else []:
        match = _PHENIX.match(path.name)
        if match:
            key = tuple(int(match[k]) for k in ("row", "column", "field", "plane", "channel"))
            found[key] = path
    return found  # type: ignore[return-value]


def phenix_name(row: int, column: int, field: int, plane: int, channel: int) -> str:
    return f"r{row:02d}c{column:02d}f{field:02d}p{plane:02d}-ch{channel}sk1fk1fl1.tiff"


def check_files_exist(fields: list[FieldSource], sources: list[str], source_names: list[str]) -> None:
    """Every file must exist; the error says which channel each missing file is and which channels are whole."""
    missing: dict[str, list[Path]] = {}
    for field in fields:
        for source, path in zip(sources, field.files, strict=True):
            if not path.is_file():
                if path.exists():  # a FIFO would block the header read forever, a device never ends
                    raise ImportInputError(
                        f"image file {path} (channel {source}) is not a regular file (a FIFO, device or folder)"
                    )
                missing.setdefault(source, []).append(path)
    if not missing:
        return
    paths = sorted({(str(path), source) for source, files in missing.items() for path in files})
    shown = ", ".join(f"{path} (channel {source})" for path, source in paths[:_MISSING_SHOWN])
    more = f" and {len(paths) - _MISSING_SHOWN} more" if len(paths) > _MISSING_SHOWN else ""
    per_channel = ", ".join(
        f"{source} ({len(set(files))} of {len(fields)} fields)" for source, files in missing.items()
    )
    whole = [source for source in sources if source not in missing]
    hint = (
        f"to import only the channels whose files are all there: {' '.join(f'--channel {s}' for s in whole)}"
        if whole
        else f"no channel has all its files: is --images the right folder? (channels: {', '.join(source_names)})"
    )
    # One line (the CLI prints one): counts per channel, the first files, then what to do.
    raise ImportInputError(f"{len(paths)} image files are missing, of channels {per_channel}: {shown}{more}; {hint}")


def check_shapes(fields: list[FieldSource], channel_names: tuple[str, ...]) -> tuple[tuple[int, int, int], str]:
    """Every channel of every field must be one 2-D plane of the same shape and dtype (read from headers)."""
    expected: tuple[tuple[int, int], str, Path] | None = None
    for field in fields:
        shapes = []
        for channel, path in zip(channel_names, field.files, strict=True):
            shape, dtype = _tiff_plane(path, channel)
            shapes.append((channel, shape, dtype, path))
        first_channel, first_shape, first_dtype, first_path = shapes[0]
        for channel, shape, dtype, path in shapes[1:]:
            if shape != first_shape or dtype != first_dtype:
                raise ImportInputError(
                    f"channels of well {field.well} site {field.site} differ: {first_channel} is {first_shape} "
                    f"{first_dtype} ({first_path}), {channel} is {shape} {dtype} ({path})"
                )
        if expected is None:
            expected = (first_shape, first_dtype, first_path)
        elif (first_shape, first_dtype) != expected[:2]:
            raise ImportInputError(
                f"fields differ in shape or dtype: {expected[2].name} is {expected[0]} {expected[1]}, "
                f"{first_path.name} is {first_shape} {first_dtype}; a plate needs one field shape"
            )
    assert expected is not None
    (height, width), dtype, _ = expected
    return (len(channel_names), height, width), dtype


def _tiff_plane(path: Path, channel: str) -> tuple[tuple[int, int], str]:
    """(height, width) and dtype of one channel file, from its header; its pixel data must all be there."""
    try:
        size = path.stat().st_size
        with tifffile.TiffFile(path) as tiff:
            series = tiff.series[0] if tiff.series else None
            page = tiff.pages.first if series is not None else None
            shape = tuple(int(s) for s in series.shape) if series is not None else ()
            dtype = np.dtype(series.dtype).name if series is not None else ""
            end = (
                max((int(o) + int(b) for o, b in zip(page.dataoffsets, page.databytecounts, strict=True)), default=0)
                if page is not None
                else 0
            )
    except Exception as error:  # tifffile raises many unrelated types (IndexError, struct.error, ...) on bad bytes
        raise ImportInputError(f"cannot read TIFF {path} ({channel}), damaged or cut short: {error}") from error
    if series is None:
        raise ImportInputError(f"TIFF {path} ({channel}) holds no image: its header is cut short or damaged")
    plane = tuple(s for s in shape if s != 1)
    if len(plane) != 2:
        raise ImportInputError(f"TIFF {path} ({channel}) holds shape {shape}, not one 2-D plane")
    if end > size:
        raise ImportInputError(
            f"TIFF {path} ({channel}) is truncated: its pixel data ends at byte {end:,}, the file has {size:,} bytes"
        )
    if dtype not in DTYPES:
        raise ImportInputError(f"TIFF {path} ({channel}) holds {dtype} pixels; a plate stores {', '.join(DTYPES)}")
    return (plane[0], plane[1]), dtype


def field_numbers(fields: Sequence[FieldSource]) -> list[tuple[int, FieldSource]]:
    """(site index inside its well, field), in plate order."""
    seen: dict[str, int] = {}
    numbered = []
    for field in fields:
        numbered.append((seen.get(field.well, 0), field))
        seen[field.well] = seen.get(field.well, 0) + 1
    return numbered


def read_field(field: FieldSource, channel_names: Sequence[str], shape: tuple[int, int, int]) -> np.ndarray:
    planes = []
    for channel, path in zip(channel_names, field.files, strict=True):
        try:
            planes.append(tifffile.imread(path).reshape(shape[1:]))
        except Exception as error:  # tifffile and imagecodecs raise many unrelated types on corrupt data
            raise ImportInputError(
                f"cannot read TIFF {path} ({channel}) of well {field.well} site {field.site}: "
                f"{type(error).__name__}: {error}"
            ) from error
    return np.stack(planes)
