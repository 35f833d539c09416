"""The object table: extra columns (source identity, labels) travel through Parquet, labels become class ids."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from cropbench.errors import ObjectTableError
from cropbench.objects import (
    MISSING_CLASS,
    ObjectTable,
    label_columns,
    read_label_classes,
    read_object_table,
    write_label_classes,
)


def _table() -> ObjectTable:
    return ObjectTable.from_columns(
        well=np.array(["B7", "B7", "C3"]),
        field=np.array([0, 1, 0]),
        centroid_y=np.array([5.0, 6.0, 7.0]),
        centroid_x=np.array([8.0, 9.0, 10.0]),
        extra={
            "source_site": np.array([3, 10, 7]),
            "dose": np.array([0.1, np.nan, 1.0]),
            "Metadata_pert_iname": np.array(["DMSO", "aspirin", None], dtype=object),
        },
    )


def test_extra_columns_round_trip_through_parquet(tmp_path: Path) -> None:
    _table().write(tmp_path / "objects.parquet")
    table = read_object_table(tmp_path / "objects.parquet")
    assert list(table.extra) == ["source_site", "dose", "Metadata_pert_iname"]
    assert table.column("source_site").tolist() == [3, 10, 7]
    np.testing.assert_array_equal(table.column("dose"), [0.1, np.nan, 1.0])
    assert table.column("Metadata_pert_iname").tolist() == ["DMSO", "aspirin", None]
    with pytest.raises(ObjectTableError, match="no column 'Metadata_moa'.*source_site.*--label"):
        table.column("Metadata_moa")


def test_extra_columns_cannot_shadow_the_tables_own() -> None:
    with pytest.raises(ObjectTableError, match=r"\['well'\] clash"):
        ObjectTable.from_columns(
            well=np.array(["A1"]),
            field=np.array([0]),
            centroid_y=np.array([1.0]),
            centroid_x=np.array([1.0]),
            extra={"well": np.array(["B2"])},
        )


def test_string_labels_become_class_ids_numbers_stay_numbers(tmp_path: Path) -> None:
    table = _table()
    values, classes = label_columns(table, ["Metadata_pert_iname", "dose"], {})
    assert classes == {"Metadata_pert_iname": ("DMSO", "aspirin")}
    assert values["Metadata_pert_iname"].tolist() == [0, 1, MISSING_CLASS]
    assert values["dose"].dtype == np.float64
    write_label_classes(tmp_path, {"Metadata_pert_iname": ("aspirin", "DMSO", "taxol")})
    stored = read_label_classes(tmp_path)
    values, classes = label_columns(table, ["Metadata_pert_iname"], stored)
    assert values["Metadata_pert_iname"].tolist() == [1, 0, MISSING_CLASS]  # the stored order wins
    with pytest.raises(ObjectTableError, match=r"values \['aspirin'\] outside its 1 classes"):
        label_columns(table, ["Metadata_pert_iname"], {"Metadata_pert_iname": ("DMSO",)})
    assert read_label_classes(tmp_path / "elsewhere") == {}


def test_a_label_beyond_int64_in_a_plates_table_is_refused_before_any_batch(tmp_path: Path) -> None:
    table = _table()
    huge = dataclasses.replace(table, extra={**table.extra, "count": np.array([1, 2**63, 3], np.uint64)})
    with pytest.raises(ObjectTableError, match=rf"label 'count' holds {2**63}.*int64"):
        label_columns(huge, ["count"], {})
    small = dataclasses.replace(table, extra={**table.extra, "count": np.array([1, 2, 3], np.uint64)})
    values, _ = label_columns(small, ["count"], {})
    assert values["count"].dtype == np.int64 and values["count"].tolist() == [1, 2, 3]


def test_an_object_table_that_is_not_a_regular_file_is_refused_without_opening_it(tmp_path: Path) -> None:
    import os

    os.mkfifo(tmp_path / "objects.parquet")
    with pytest.raises(ObjectTableError, match=r"objects\.parquet is not a regular file"):
        read_object_table(tmp_path / "objects.parquet")
