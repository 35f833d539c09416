"""The object table: one row per cell, with where it is (plate, well, field) and its geometry."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from cropbench.errors import ObjectTableError

OBJECT_TABLE_NAME = "cropbench_objects.parquet"
REQUIRED_COLUMNS = ("object_id", "well", "field", "centroid_y", "centroid_x")
BBOX_COLUMNS = ("bbox_y0", "bbox_x0", "bbox_y1", "bbox_x1")


@dataclass(frozen=True)
class ObjectTable:
    """Columns as numpy arrays; row i is object i. Bounding boxes are [y0, y1) × [x0, x1)."""

    object_id: np.ndarray
    plate: np.ndarray
    well: np.ndarray
    field: np.ndarray
    centroid_y: np.ndarray
    centroid_x: np.ndarray
    bbox: np.ndarray

    def __post_init__(self) -> None:
        lengths = {len(self.object_id), len(self.plate), len(self.well), len(self.field),
                   len(self.centroid_y), len(self.centroid_x), len(self.bbox)}
        if len(lengths) != 1:
            raise ObjectTableError(f"object table columns have different lengths: {sorted(lengths)}")
        bad = ~(np.isfinite(self.centroid_y) & np.isfinite(self.centroid_x))
        if bad.any():
            raise ObjectTableError(
                f"{int(bad.sum())} objects have NaN/inf centroids, first object_id={int(self.object_id[bad][0])}"
            )
        if len(np.unique(self.object_id)) != len(self.object_id):
            raise ObjectTableError("object_id values are not unique")

    def __len__(self) -> int:
        return len(self.object_id)

    def to_arrow(self) -> pa.Table:
        return pa.table({
            "object_id": self.object_id, "plate": self.plate, "well": self.well, "field": self.field,
            "centroid_y": self.centroid_y, "centroid_x": self.centroid_x,
            **{name: self.bbox[:, i] for i, name in enumerate(BBOX_COLUMNS)},
        })

    def write(self, path: str | Path) -> None:
        pq.write_table(self.to_arrow(), str(path))

    @classmethod
    def from_columns(
        cls, well: np.ndarray, field: np.ndarray, centroid_y: np.ndarray, centroid_x: np.ndarray,
        plate: str | np.ndarray = "", bbox: np.ndarray | None = None, object_id: np.ndarray | None = None,
    ) -> ObjectTable:
        count = len(well)
        plates = np.full(count, plate, dtype=object) if isinstance(plate, str) else np.asarray(plate, dtype=object)
        if bbox is None:
            bbox = np.full((count, 4), -1, dtype=np.int64)
        return cls(
            object_id=np.arange(count, dtype=np.int64) if object_id is None else np.asarray(object_id, np.int64),
            plate=plates, well=np.asarray(well, dtype=object), field=np.asarray(field, dtype=np.int64),
            centroid_y=np.asarray(centroid_y, np.float64), centroid_x=np.asarray(centroid_x, np.float64),
            bbox=np.asarray(bbox, np.int64),
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
        raise ObjectTableError(
            f"object table {source} lacks columns {missing}; it needs {list(REQUIRED_COLUMNS)}"
        )
    if all(name in table.column_names for name in BBOX_COLUMNS):
        bbox = np.stack([table[name].to_numpy() for name in BBOX_COLUMNS], axis=1).astype(np.int64)
    else:
        bbox = None
    plate = table["plate"].to_numpy(zero_copy_only=False) if "plate" in table.column_names else ""
    return ObjectTable.from_columns(
        well=table["well"].to_numpy(zero_copy_only=False).astype(str).astype(object),
        field=table["field"].to_numpy(), plate=plate,
        centroid_y=table["centroid_y"].to_numpy().astype(np.float64),
        centroid_x=table["centroid_x"].to_numpy().astype(np.float64),
        bbox=bbox, object_id=table["object_id"].to_numpy() if count else np.zeros(0, np.int64),
    )

