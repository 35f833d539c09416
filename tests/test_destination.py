"""cropbench never deletes what it did not create: plates are written beside their destination and
swapped in; an existing folder is replaced only when it is cropbench's own plate (for a converted
copy: of the same source, in the same layout)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from conftest import CliRunner

from cropbench.config import LAYOUTS, PlateSpec
from cropbench.errors import OutputError
from cropbench.formats import PlateGeometry, create_plate_writer, read_plate_metadata
from cropbench.plates import generate as generate_module
from cropbench.plates.convert import convert_plate, materialize_layout
from cropbench.plates.generate import generate_plate

SMALL = PlateSpec(
    name="small",
    rows=1,
    columns=1,
    fields_per_well=2,
    channels=2,
    field_height=64,
    field_width=64,
    cells_per_field=4,
    seed=1,
)


def _user_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "plate1_A01.tif").write_bytes(b"the user's own image")
    return path / "plate1_A01.tif"


def _siblings(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir())


def test_a_layout_dir_cropbench_did_not_write_is_refused(tiny_plate: Path, tmp_path: Path) -> None:
    user_file = _user_folder(tmp_path / "dir" / "tiff")
    with pytest.raises(OutputError, match="refusing to replace .*tiff"):
        materialize_layout(tiny_plate, "tiff", tmp_path / "dir")
    assert user_file.read_bytes() == b"the user's own image"
    assert _siblings(user_file.parent) == ["tiff"], "no scratch copy is left behind"


def test_cli_run_and_compare_layouts_refuse_a_users_folder(
    tiny_plate: Path, tmp_path: Path, cropbench_cli: CliRunner
) -> None:
    user_file = _user_folder(tmp_path / "dir" / "tiff")
    for args in (
        [
            "run",
            "--plate",
            str(tiny_plate),
            "--layout",
            "tiff",
            "--layout-dir",
            str(tmp_path / "dir"),
            "--out",
            str(tmp_path / "out"),
            "--no-progress",
        ],
        [
            "compare-layouts",
            "--plate",
            str(tiny_plate),
            "--layout",
            "tiff",
            "--work",
            str(tmp_path / "dir"),
            "--out",
            str(tmp_path / "cmp"),
            "--samples",
            "5",
            "--warmup",
            "0",
            "--repeats",
            "1",
            "--keep",  # without --keep a run writes beside a folder it finds, never into it
            "--no-progress",
        ],
    ):
        result = cropbench_cli(*args)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("cropbench: error: refusing to replace"), result.stderr
        assert user_file.read_bytes() == b"the user's own image"


def test_only_a_copy_of_the_same_source_in_the_same_layout_is_replaced(tiny_plate: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.zarr"
    generate_plate(other, SMALL, LAYOUTS["default"], progress=False)
    convert_plate(other, tmp_path / "dir" / "memmap", LAYOUTS["memmap"])
    with pytest.raises(OutputError, match="not cropbench's memmap copy"):
        materialize_layout(tiny_plate, "memmap", tmp_path / "dir")
    convert_plate(tiny_plate, tmp_path / "dir" / "tiff", LAYOUTS["tiff"])
    convert_plate(tiny_plate, tmp_path / "dir" / "tiff", LAYOUTS["tiff"], overwrite=True)  # its own copy: replaced
    with pytest.raises(OutputError, match="refusing"):
        convert_plate(tiny_plate, tmp_path / "dir" / "tiff", LAYOUTS["memmap"], overwrite=True)


def test_generate_force_replaces_only_a_cropbench_plate(tmp_path: Path, cropbench_cli: CliRunner) -> None:
    user_file = _user_folder(tmp_path / "data")
    result = cropbench_cli(
        "generate",
        "--out",
        str(tmp_path / "data"),
        "--force",
        "--rows",
        "1",
        "--columns",
        "1",
        "--fields",
        "1",
        "--height",
        "64",
        "--width",
        "64",
        "--no-progress",
    )
    assert result.returncode == 2 and "refusing to replace" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and user_file.exists()
    (tmp_path / "file.zarr").write_text("not a folder")
    with pytest.raises(OutputError, match="not a folder"):
        generate_plate(tmp_path / "file.zarr", SMALL, LAYOUTS["default"], overwrite=True, progress=False)
    plate = tmp_path / "p.zarr"
    generate_plate(plate, SMALL, LAYOUTS["default"], progress=False)
    generate_plate(plate, SMALL, LAYOUTS["tiff"], overwrite=True, progress=False)
    assert (plate / "cropbench_layout.json").is_file() and not (plate / "zarr.json").exists()


def test_a_failed_write_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plate = tmp_path / "p.zarr"
    generate_plate(plate, SMALL, LAYOUTS["default"], progress=False)
    before = sorted(p.relative_to(plate) for p in plate.rglob("*"))
    render = generate_module.render_field

    def fails_on_the_second_field(spec: PlateSpec, seed: int) -> object:
        if seed == 1:
            raise OSError(28, "No space left on device")
        return render(spec, seed)

    monkeypatch.setattr(generate_module, "render_field", fails_on_the_second_field)
    with pytest.raises(OutputError, match="No space left"):
        generate_plate(plate, SMALL, LAYOUTS["tiff"], overwrite=True, progress=False)
    assert sorted(p.relative_to(plate) for p in plate.rglob("*")) == before, "the old plate is untouched"
    assert _siblings(plate) == ["p.zarr"]
    with pytest.raises(OutputError):
        generate_plate(tmp_path / "new.zarr", SMALL, LAYOUTS["default"], progress=False)
    assert _siblings(plate) == ["p.zarr"], "no partial plate"


@pytest.mark.parametrize("layout", ["default", "tiff", "memmap"])
def test_a_writer_told_to_overwrite_replaces_only_a_plate_cropbench_wrote(layout: str, tmp_path: Path) -> None:
    spec = LAYOUTS[layout]

    def write(path: Path) -> None:
        geometry = PlateGeometry("p", ("a",), (1, 8, 8), (("A", "1"),))
        writer = create_plate_writer(path, geometry, spec, overwrite=True)
        writer.write_field("A", "1", 0, np.zeros((1, 8, 8), np.uint16))
        writer.close()

    user_file = _user_folder(tmp_path / "users")
    with pytest.raises(OutputError, match=f"^refusing to replace {re.escape(str(user_file.parent))}: "):
        write(user_file.parent)
    assert user_file.read_bytes() == b"the user's own image"
    with pytest.raises(OutputError, match="refusing to replace"):
        write(user_file)  # a file, not a folder
    (tmp_path / "link").symlink_to(user_file.parent)
    with pytest.raises(OutputError, match="refusing to replace"):
        write(tmp_path / "link")
    assert user_file.read_bytes() == b"the user's own image"
    (tmp_path / "empty").mkdir()
    write(tmp_path / "empty")
    write(tmp_path / "empty")  # cropbench's own plate is replaced
    assert read_plate_metadata(tmp_path / "empty").format == spec.format
