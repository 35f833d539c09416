"""The single-cell table: reading the columns cropbench can use, and finding each one under the names
CellProfiler and CytoTable give it (plate, well, site, centroids, boxes, file names, identity, labels,
pixel size)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from cropbench.errors import ImportInputError
from cropbench.objects import column_values

MERGE_SUFFIXES = ("", "_x", "_y")
PLATE_COLUMNS = ("Metadata_Plate", "Image_Metadata_Plate")
WELL_COLUMNS = ("Metadata_Well", "Image_Metadata_Well")
ROW_COLUMNS = ("Metadata_Row", "Image_Metadata_Row")
COLUMN_COLUMNS = ("Metadata_Col", "Metadata_Column", "Image_Metadata_Col", "Image_Metadata_Column")
SITE_COLUMNS = (
    "Metadata_Site",
    "Image_Metadata_Site",
    "Metadata_Field",
    "Image_Metadata_Field",
    "Metadata_FieldID",
    "Image_Metadata_FieldID",
)
IMAGE_NUMBER_COLUMNS = ("ImageNumber", "Metadata_ImageNumber", "Image_ImageNumber")
OBJECT_NUMBER_COLUMNS = ("ObjectNumber", "Metadata_ObjectNumber")
RESOLUTION_COLUMNS = {
    axis: (f"Image_Metadata_ImageResolution{axis}", f"Metadata_ImageResolution{axis}") for axis in "XY"
}
#: Identity columns the importer adds to the object table (labels may not take these names).
IDENTITY_COLUMNS = ("source_row", "source_site", "ImageNumber", "ObjectNumber")
#: Compartments tried, in order, when none is chosen.
COMPARTMENTS = ("Nuclei", "Cells", "Cytoplasm")

_FILE_COLUMN = re.compile(r"^(?:Image_)?(?P<kind>FileName|PathName)_(?P<orig>Orig)?(?P<channel>.+?)(?P<suffix>_x|_y)?$")
_WELL = re.compile(r"^(?P<row>[A-Za-z]+)0*(?P<column>\d+)$")
_PHENIX_WELL = re.compile(r"^r0*(?P<row>\d+)c0*(?P<column>\d+)$", re.IGNORECASE)
_CENTROID_X = re.compile(r"^(?:Metadata_)?(?P<compartment>[A-Za-z0-9]+)_Location_Center_X(?:_x|_y)?$")


def read_table(path: str | Path, labels: Sequence[str] = ()) -> pa.Table:
    """The columns cropbench can use from a Parquet or CSV single-cell table (thousands are skipped),
    and the ``labels`` columns (matched like every column: any case, with or without merge suffix)."""
    source = Path(path)
    wanted_labels = {label.lower() for label in labels}

    def useful(name: str) -> bool:
        return _useful(name) or _without_suffix(name).lower() in wanted_labels

    if not source.is_file():
        if source.exists():
            raise ImportInputError(f"single-cell table {source} is not a regular file (a FIFO, device or folder)")
        raise ImportInputError(f"single-cell table {source} does not exist")
    try:
        if source.suffix.lower() in (".csv", ".gz") or source.name.lower().endswith(".csv.gz"):
            import pyarrow.csv as pacsv

            names = pacsv.open_csv(str(source)).schema.names
            wanted = [n for n in names if useful(n)]
            return pacsv.read_csv(str(source), convert_options=pacsv.ConvertOptions(include_columns=wanted))
        import pyarrow.parquet as pq

        names = pq.read_schema(str(source)).names
        return pq.read_table(str(source), columns=[n for n in names if useful(n)])
    except (pa.ArrowInvalid, OSError) as error:
        raise ImportInputError(f"cannot read single-cell table {source}: {error}") from error


def _useful(name: str) -> bool:
    """Whether a column may be one cropbench looks up; in any case, as :func:`find_column` matches them."""
    folded = name.casefold()
    return (
        any(part in folded for part in ("metadata", "location_center", "boundingbox", "imagenumber", "object_number"))
        or folded == "objectnumber"
        or _FILE_COLUMN.match(name) is not None
    )


def _without_suffix(name: str) -> str:
    return name[:-2] if name.endswith(("_x", "_y")) else name


def find_column(names: Sequence[str], bases: Sequence[str]) -> str | None:
    """The first column named like one of ``bases``, with or without merge suffix: the exact name
    first, else the one column equal but for case; two such columns are an :class:`ImportInputError`
    naming both (the table says two things, and guessing would store the wrong one)."""
    exact = set(names)
    for base in bases:
        for suffix in MERGE_SUFFIXES:
            wanted = base + suffix
            if wanted in exact:
                return wanted
            folded = [name for name in names if name.casefold() == wanted.casefold()]
            if len(folded) > 1:
                raise ImportInputError(
                    f"{wanted} matches both {folded[0]!r} and {folded[1]!r}"
                    f"{f' (and {len(folded) - 2} more)' if len(folded) > 2 else ''}, columns that differ only in "
                    "case: rename one, or name the one you mean exactly"
                )
            if folded:
                return folded[0]
    return None


def looked_for(bases: Sequence[str]) -> str:
    return ", ".join(bases) + " (each optionally with _x/_y)"


def column_strings(table: pa.Table, column: str) -> list[str]:
    values = table[column].to_pylist()
    return ["" if v is None else (str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)) for v in values]


def _well_of(value: str) -> tuple[str, str] | None:
    for pattern, letters in ((_WELL, True), (_PHENIX_WELL, False)):
        match = pattern.match(value.strip())
        if match:
            row = match["row"].upper() if letters else _row_letters(int(match["row"]))
            return row, str(int(match["column"]))
    return None


def _row_letters(number: int) -> str:
    letters = ""
    while number > 0:
        number, remainder = divmod(number - 1, 26)
        letters = chr(ord("A") + remainder) + letters
    return letters


def row_number(row: str) -> int:
    number = 0
    for letter in row:
        number = number * 26 + ord(letter) - ord("A") + 1
    return number


def table_wells(table: pa.Table) -> tuple[list[tuple[str, str]], dict[str, str]]:
    names = table.column_names
    well_column = find_column(names, WELL_COLUMNS)
    if well_column is not None:
        wells = []
        for value in column_strings(table, well_column):
            well = _well_of(value)
            if well is None:
                raise ImportInputError(f"well {value!r} in column {well_column} is not like B7, B07 or r02c07")
            wells.append(well)
        return wells, {"well": well_column}
    row_column, column_column = find_column(names, ROW_COLUMNS), find_column(names, COLUMN_COLUMNS)
    if row_column is None or column_column is None:
        raise ImportInputError(
            f"the table names no well: looked for {looked_for(WELL_COLUMNS)}, or a row column "
            f"({looked_for(ROW_COLUMNS)}) with a column column ({looked_for(COLUMN_COLUMNS)})"
        )
    wells = []
    for row, column in zip(column_strings(table, row_column), column_strings(table, column_column), strict=True):
        row_name = _row_letters(int(row)) if row.isdigit() else row.strip().upper()
        if not row_name.isalpha() or not column.strip().isdigit():
            raise ImportInputError(f"row {row!r} / column {column!r} ({row_column}, {column_column}) are not a well")
        wells.append((row_name, str(int(column))))
    return wells, {"row": row_column, "column": column_column}


def table_centroids(
    table: pa.Table, compartment: str | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
    """(y, x, bbox) from the chosen compartment, or the first of Nuclei, Cells, Cytoplasm present."""
    names = table.column_names
    compartments = (compartment,) if compartment else COMPARTMENTS
    looked: list[str] = []
    for name in compartments:
        bases_x = (f"{name}_Location_Center_X", f"Metadata_{name}_Location_Center_X")
        bases_y = (f"{name}_Location_Center_Y", f"Metadata_{name}_Location_Center_Y")
        looked += [*bases_x, *bases_y]
        x_column, y_column = find_column(names, bases_x), find_column(names, bases_y)
        if x_column and y_column:
            y, x, bbox = _coordinates(table, name, y_column, x_column)
            return y, x, bbox, {"compartment": name}
    if compartment is None:
        x_column, y_column = find_column(names, ("Location_Center_X",)), find_column(names, ("Location_Center_Y",))
        looked += ["Location_Center_X", "Location_Center_Y"]
        if x_column and y_column:
            y, x, bbox = _coordinates(table, "", y_column, x_column)
            return y, x, bbox, {"compartment": None}
    present = sorted({m["compartment"] for m in map(_CENTROID_X.match, names) if m})
    has = (
        f"; the table has centroids of {', '.join(present)} (choose one with --compartment)"
        if present
        else "; the table has no <Compartment>_Location_Center_X column at all"
    )
    raise ImportInputError(f"the table has no object centroids: looked for {looked_for(looked)}{has}")


def _coordinates(
    table: pa.Table,
    compartment: str,
    y_column: str,
    x_column: str,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    y = np.asarray(table[y_column].to_numpy(zero_copy_only=False), dtype=np.float64)
    x = np.asarray(table[x_column].to_numpy(zero_copy_only=False), dtype=np.float64)
    bad = ~(np.isfinite(y) & np.isfinite(x))
    if bad.any():
        raise ImportInputError(
            f"{int(bad.sum())} rows have no centroid in {x_column}/{y_column}, first row {int(np.flatnonzero(bad)[0])}"
        )
    prefix = f"{compartment}_" if compartment else ""
    box_bases = [
        f"{prefix}AreaShape_BoundingBox{edge}_{axis}"
        for edge, axis in (("Minimum", "Y"), ("Minimum", "X"), ("Maximum", "Y"), ("Maximum", "X"))
    ]
    box_columns = [find_column(table.column_names, (base,)) for base in box_bases]
    if all(box_columns):
        boxes = np.stack([np.asarray(table[c].to_numpy(zero_copy_only=False), np.float64) for c in box_columns], 1)
        boxes = np.where(np.isfinite(boxes), boxes, -1)
        bbox = np.concatenate([np.floor(boxes[:, :2]), np.ceil(boxes[:, 2:])], axis=1).astype(np.int64)
    else:
        bbox = np.full((len(y), 4), -1, dtype=np.int64)
    return y, x, bbox


def find_file_columns(names: Sequence[str]) -> dict[str, dict[str, str]]:
    """channel → {"FileName": column, "PathName": column}; ``Orig`` and merge suffixes dropped.

    When both ``FileName_X`` and ``FileName_OrigX`` exist, the ``Orig`` column (the raw image the
    pipeline started from) wins; a column without merge suffix wins over ``_x``, ``_x`` over ``_y``.
    """
    found: dict[str, dict[str, tuple[tuple[int, int], str]]] = {}
    for name in names:
        match = _FILE_COLUMN.match(name)
        if match is None:
            continue
        rank = (0 if match["orig"] else 1, MERGE_SUFFIXES.index(match["suffix"] or ""))
        slot = found.setdefault(match["channel"], {})
        if match["kind"] not in slot or rank < slot[match["kind"]][0]:
            slot[match["kind"]] = (rank, name)
    return {
        channel: {kind: column for kind, (_, column) in kinds.items()}
        for channel, kinds in found.items()
        if "FileName" in kinds
    }


def table_identity(
    table: pa.Table,
    sites: list[str],
    row_numbers: np.ndarray,
    compartment: str | None,
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Where each cell came from: source row and site, and CellProfiler's ImageNumber / ObjectNumber if present."""
    identity: dict[str, np.ndarray] = {
        "source_row": row_numbers.copy(),
        "source_site": (
            np.array([int(site) for site in sites], dtype=np.int64)
            if all(s.isdigit() for s in sites)
            else np.array(sites, dtype=object)
        ),
    }
    used: dict[str, str] = {}
    object_bases = (
        (f"{compartment}_Number_Object_Number", f"Metadata_{compartment}_Number_Object_Number") if compartment else ()
    )
    numbers = (("ImageNumber", IMAGE_NUMBER_COLUMNS), ("ObjectNumber", (*object_bases, *OBJECT_NUMBER_COLUMNS)))
    for name, bases in numbers:
        column = find_column(table.column_names, bases)
        if column is not None:
            values = _within_int64(column, column_values(table[column]))
            integral = values.dtype.kind in "iu" or (
                values.dtype.kind == "f" and np.all(np.isfinite(values)) and np.all(values == np.round(values))
            )
            if integral and values.dtype.kind == "f" and values.size and np.abs(values).max() >= 2.0**63:
                raise ImportInputError(f"{column} holds {np.abs(values).max():.0f}, outside int64")
            identity[name] = values.astype(np.int64) if integral else values
            used[name] = column
    return identity, used


def table_labels(table: pa.Table, names: Sequence[str]) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The ``--label`` columns, as they are in the table (strings as objects, numbers as numbers)."""
    values: dict[str, np.ndarray] = {}
    used: dict[str, str] = {}
    for name in names:
        column = find_column(table.column_names, (name,))
        if column is None:
            metadata = [n for n in table.column_names if "Metadata" in n and "FileName" not in n]
            raise ImportInputError(
                f"--label {name}: the table has no column {name!r} (nor with _x/_y); "
                f"its metadata columns: {', '.join(metadata[:30]) or 'none'}"
            )
        values[name] = _within_int64(column, column_values(table[column]))
        used[name] = column
    return values, used


def _within_int64(column: str, values: np.ndarray) -> np.ndarray:
    """Unsigned integers as int64 (what a batch of labels becomes), or an :class:`ImportInputError`
    naming the column and the first value int64 cannot hold (it would fail every batch, or wrap)."""
    if values.dtype.kind != "u":
        return values
    limit = np.iinfo(np.int64).max
    beyond = np.flatnonzero(values > limit)
    if beyond.size:
        raise ImportInputError(
            f"{column} holds {int(values[beyond[0]])} (row {int(beyond[0])}, {beyond.size} such rows), outside "
            f"int64 (at most {limit}): labels and identity numbers are stored as int64"
        )
    return values.astype(np.int64)


def table_pixel_size(table: pa.Table, given: float | None) -> tuple[tuple[float, float] | None, str | None]:
    """(y, x) micrometres per pixel: ``given`` (--pixel-size), else the table's ImageResolutionX/Y, else None."""
    if given is not None:
        return (float(given), float(given)), "--pixel-size"
    sizes: dict[str, float] = {}
    columns: dict[str, str] = {}
    for axis, bases in RESOLUTION_COLUMNS.items():
        column = find_column(table.column_names, bases)
        if column is None:
            continue
        values = np.asarray(table[column].to_numpy(zero_copy_only=False), dtype=np.float64)
        distinct = np.unique(values[np.isfinite(values)])
        if len(distinct) > 1:
            raise ImportInputError(
                f"{column} holds {len(distinct)} pixel sizes ({', '.join(f'{v:g}' for v in distinct[:5])}); "
                "a plate has one: choose it with --pixel-size"
            )
        if len(distinct) == 1 and distinct[0] > 0:
            sizes[axis], columns[axis] = float(distinct[0]), column
    if "X" not in sizes:
        return None, None
    return (sizes.get("Y", sizes["X"]), sizes["X"]), ", ".join(columns.values())
