"""The object table: one row per cell, with where it is (plate, well, field) and its geometry.

Further columns travel with it unchanged: where the cell came from in the source experiment
(``source_row``, ``source_site``, CellProfiler's ``ImageNumber`` / ``ObjectNumber``) and labels for
training (perturbation, control type, dose, ...). Label columns of strings become integer class ids
through a mapping stored beside the plate (``cropbench_labels.json``), so ids stay the same whichever
subset of the plate a dataset holds.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from cropbench.errors import ObjectTableError

OBJECT_TABLE_NAME = "cropbench_objects.parquet"
#: String label columns → their classes, in class-id order (JSON beside the plate's object table).
LABEL_CLASSES_NAME = "cropbench_labels.json"
REQUIRED_COLUMNS = ("object_id", "well", "field", "centroid_y", "centroid_x")
BBOX_COLUMNS = ("bbox_y0", "bbox_x0", "bbox_y1", "bbox_x1")
#: Columns the table itself defines; any other column is kept in ``ObjectTable.extra``.
CORE_COLUMNS = (*REQUIRED_COLUMNS, "plate", *BBOX_COLUMNS)
#: Class id of an object whose string label is missing (ignored by ``cross_entropy(ignore_index=-1)``).
MISSING_CLASS = -1


@dataclass(frozen=True)
class ObjectTable:
    """Columns as numpy arrays; row i is object i. Bounding boxes are [y0, y1) × [x0, x1).

    ``extra`` holds any further per-object column by name (source identity, labels): strings as
    object arrays (None where missing), numbers as numeric arrays.
    """

    object_id: np.ndarray
    plate: np.ndarray
    well: np.ndarray
    field: np.ndarray
    centroid_y: np.ndarray
    centroid_x: np.ndarray
    bbox: np.ndarray
    extra: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        lengths = {
            len(self.object_id),
            len(self.plate),
            len(self.well),
            len(self.field),
            len(self.centroid_y),
            len(self.centroid_x),
            len(self.bbox),
            *map(len, self.extra.values()),
        }
        if len(lengths) != 1:
            raise ObjectTableError(f"object table columns have different lengths: {sorted(lengths)}")
        bad = ~(np.isfinite(self.centroid_y) & np.isfinite(self.centroid_x))
        if bad.any():
            raise ObjectTableError(
                f"{int(bad.sum())} objects have NaN/inf centroids, first object_id={int(self.object_id[bad][0])}"
            )
        if len(np.unique(self.object_id)) != len(self.object_id):
            raise ObjectTableError("object_id values are not unique")
        clashing = sorted(set(self.extra) & set(CORE_COLUMNS))
        if clashing:
            raise ObjectTableError(f"extra columns {clashing} clash with the table's own columns {CORE_COLUMNS}")

    def __len__(self) -> int:
        return len(self.object_id)

    def to_arrow(self) -> pa.Table:
        return pa.table(
            {
                "object_id": self.object_id,
                "plate": self.plate,
                "well": self.well,
                "field": self.field,
                "centroid_y": self.centroid_y,
                "centroid_x": self.centroid_x,
                **{name: self.bbox[:, i] for i, name in enumerate(BBOX_COLUMNS)},
                **{name: pa.array(values, from_pandas=True) for name, values in self.extra.items()},
            }
        )

    def column(self, name: str) -> np.ndarray:
        """An extra column by name, with the columns there are when it is missing."""
        if name not in self.extra:
            raise ObjectTableError(
                f"the object table has no column {name!r}; its extra columns: {', '.join(self.extra) or 'none'} "
                "(import with --label COLUMN to carry a column of the source table)"
            )
        return self.extra[name]

    def write(self, path: str | Path) -> None:
        pq.write_table(self.to_arrow(), str(path))

    @classmethod
    def from_columns(
        cls,
        well: np.ndarray,
        field: np.ndarray,
        centroid_y: np.ndarray,
        centroid_x: np.ndarray,
        plate: str | np.ndarray = "",
        bbox: np.ndarray | None = None,
        object_id: np.ndarray | None = None,
        extra: Mapping[str, np.ndarray] | None = None,
    ) -> ObjectTable:
        count = len(well)
        plates = np.full(count, plate, dtype=object) if isinstance(plate, str) else np.asarray(plate, dtype=object)
        if bbox is None:
            bbox = np.full((count, 4), -1, dtype=np.int64)
        return cls(
            object_id=np.arange(count, dtype=np.int64) if object_id is None else np.asarray(object_id, np.int64),
            plate=plates,
            well=np.asarray(well, dtype=object),
            field=np.asarray(field, dtype=np.int64),
            centroid_y=np.asarray(centroid_y, np.float64),
            centroid_x=np.asarray(centroid_x, np.float64),
            bbox=np.asarray(bbox, np.int64),
            extra=dict(extra or {}),
        )


def crop_origins(centroid_y: np.ndarray, centroid_x: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """The top-left corner (y0, x0) of each ``size``-pixel crop window centred on a centroid:
    ``floor(c - (size - 1) / 2 + 1 / 2)`` on each axis, within half a pixel of the centroid (pixel
    centres at integer coordinates, as CellProfiler measures them). The one formula of every reader
    and writer of crops, so a crop stored once and a crop cut again cover the same pixels."""
    return (
        np.floor(np.asarray(centroid_y) - (size - 1) / 2 + 0.5).astype(np.int64),
        np.floor(np.asarray(centroid_x) - (size - 1) / 2 + 0.5).astype(np.int64),
    )


def read_object_table(path: str | Path, location: tuple[str, int] | None = None) -> ObjectTable:
    """Read a table (Parquet or CSV); a plate directory means its bundled cropbench table.

    ``location`` (well, field) places every row of a table without ``well``/``field`` columns
    there: a plain OME-Zarr image is a one-field plate, and its users supply only centroids.
    A table without ``object_id`` numbers its rows.
    """
    source = Path(path)
    if source.is_dir():
        source = source / OBJECT_TABLE_NAME
    if not source.is_file():
        if source.exists():  # a FIFO would block the read forever, a device never ends
            raise ObjectTableError(f"object table {source} is not a regular file (a FIFO, device or folder)")
        raise ObjectTableError(f"object table {source} does not exist (generate or import the plate first)")
    try:
        if source.suffix == ".csv":
            import pyarrow.csv as pacsv

            table = pacsv.read_csv(str(source))
        else:
            table = pq.read_table(str(source))
    except (pa.ArrowInvalid, OSError) as error:
        raise ObjectTableError(f"cannot read object table {source}: {error}") from error
    count = table.num_rows
    if location is not None:
        for name, value in (("well", location[0]), ("field", location[1])):
            if name not in table.column_names:
                table = table.append_column(name, pa.array([value] * count))
    if "object_id" not in table.column_names and "centroid_y" in table.column_names:
        table = table.append_column("object_id", pa.array(np.arange(count, dtype=np.int64)))
    missing = [name for name in REQUIRED_COLUMNS if name not in table.column_names]
    if missing:
        raise ObjectTableError(f"object table {source} lacks columns {missing}; it needs {list(REQUIRED_COLUMNS)}")
    for name, integral in (("field", True), ("centroid_y", False), ("centroid_x", False)):
        _check_numeric(source, table[name], name, integral)
    if all(name in table.column_names for name in BBOX_COLUMNS):
        bbox = np.stack([table[name].to_numpy() for name in BBOX_COLUMNS], axis=1).astype(np.int64)
    else:
        bbox = None
    plate = table["plate"].to_numpy(zero_copy_only=False) if "plate" in table.column_names else ""
    return ObjectTable.from_columns(
        well=table["well"].to_numpy(zero_copy_only=False).astype(str).astype(object),
        field=table["field"].to_numpy(),
        plate=plate,
        centroid_y=table["centroid_y"].to_numpy().astype(np.float64),
        centroid_x=table["centroid_x"].to_numpy().astype(np.float64),
        bbox=bbox,
        object_id=table["object_id"].to_numpy() if count else np.zeros(0, np.int64),
        extra={name: column_values(table[name]) for name in table.column_names if name not in CORE_COLUMNS},
    )


def _check_numeric(source: Path, column: pa.ChunkedArray, name: str, integral: bool) -> None:
    """Refuse nulls, non-numbers and (for ``field``) fractions, naming the first bad row."""
    kind = column.type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)) or pa.types.is_boolean(kind):
        raise ObjectTableError(f"object table {source}: column {name!r} holds {kind} values; it needs numbers")
    values = column.to_numpy(zero_copy_only=False).astype(np.float64)  # nulls become NaN
    bad = np.flatnonzero(np.isnan(values) | (integral & (values != np.round(values))))
    if bad.size:
        row = int(bad[0])
        raise ObjectTableError(
            f"object table {source}: {name!r} of row {row} is {column[row].as_py()!r}; "
            f"it needs {'a whole number' if integral else 'a number'} ({bad.size} such rows)"
        )


def column_values(column: pa.ChunkedArray) -> np.ndarray:
    """Numbers as numeric arrays (NaN where missing), anything else as an object array (None where missing)."""
    kind = column.type
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        return np.asarray(column.to_numpy(zero_copy_only=False))
    return np.asarray(column.to_pylist(), dtype=object)


def label_classes(values: np.ndarray) -> tuple[str, ...]:
    """The classes of a string label column: its distinct present values, sorted (missing ones left out)."""
    return tuple(sorted({str(value) for value in values if value is not None}))


def encode_labels(name: str, values: np.ndarray, classes: Sequence[str]) -> np.ndarray:
    """Class ids (int64) of ``values`` under ``classes``; missing values get ``MISSING_CLASS``."""
    ids = {value: index for index, value in enumerate(classes)}
    unknown = sorted({str(v) for v in values if v is not None and str(v) not in ids})
    if unknown:
        raise ObjectTableError(
            f"label {name!r} has values {unknown[:5]} outside its {len(classes)} classes; "
            f"the class list beside the plate ({LABEL_CLASSES_NAME}) was written for another table"
        )
    return np.fromiter((MISSING_CLASS if v is None else ids[str(v)] for v in values), np.int64, count=len(values))


def label_columns(
    table: ObjectTable,
    names: Sequence[str],
    stored: Mapping[str, Sequence[str]],
) -> tuple[dict[str, np.ndarray], dict[str, tuple[str, ...]]]:
    """Per label column: its values for training, and the classes of the string ones.

    Numbers stay numbers; strings become class ids under the classes stored beside the plate, or,
    for a table without them (plates written by others), its sorted distinct values.
    """
    values: dict[str, np.ndarray] = {}
    classes: dict[str, tuple[str, ...]] = {}
    for name in names:
        column = table.column(name)
        if column.dtype.kind == "u":  # a batch holds int64: a larger value would fail every batch
            beyond = np.flatnonzero(column > np.iinfo(np.int64).max)
            if beyond.size:
                raise ObjectTableError(
                    f"label {name!r} holds {int(column[beyond[0]])} (object {beyond[0]}), outside int64: "
                    "store it as a signed integer or a string"
                )
            column = column.astype(np.int64)
        if column.dtype.kind in "biuf":
            values[name] = column
            continue
        classes[name] = tuple(stored[name]) if name in stored else label_classes(column)
        values[name] = encode_labels(name, column, classes[name])
    return values, classes


def write_label_classes(plate: str | Path, classes: Mapping[str, Sequence[str]]) -> None:
    """Store the class list of each string label column beside the plate."""
    document = {"labels": {name: list(values) for name, values in classes.items()}, "missing": MISSING_CLASS}
    (Path(plate) / LABEL_CLASSES_NAME).write_text(json.dumps(document, indent=1))


def read_label_classes(plate: str | Path) -> dict[str, tuple[str, ...]]:
    """The class lists stored beside a plate; empty when it has none (plates written by others)."""
    path = Path(plate) / LABEL_CLASSES_NAME
    if not path.is_file():
        return {}
    try:
        document: dict[str, Any] = json.loads(path.read_text())
        return {str(name): tuple(str(v) for v in values) for name, values in document["labels"].items()}
    except (OSError, json.JSONDecodeError, KeyError, AttributeError, TypeError) as error:
        raise ObjectTableError(f"cannot read label classes {path}: {error}") from error
