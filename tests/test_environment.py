"""What a row records of the machine and of the storage holding the plate."""

from __future__ import annotations

from pathlib import Path

import pytest

from cropbench.measure.environment import storage_of


def test_storage_records_a_relative_plate_path_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "data").mkdir()
    monkeypatch.chdir(tmp_path)
    storage = storage_of("data/plate.zarr")
    assert storage["path"] == "data/plate.zarr"
    assert str(tmp_path) not in str(storage)
    assert storage["mountpoint"] and storage["filesystem"]
