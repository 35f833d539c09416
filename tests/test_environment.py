"""What a row records of the machine and of the storage holding the plate."""

from __future__ import annotations

from pathlib import Path

import pytest

from cropbench.measure.environment import medium, storage_of


def test_storage_records_a_relative_plate_path_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "data").mkdir()
    monkeypatch.chdir(tmp_path)
    storage = storage_of("data/plate.zarr")
    assert storage["path"] == "data/plate.zarr"
    assert str(tmp_path) not in str(storage)
    assert storage["mountpoint"] and storage["filesystem"]


def _fake_disk(sys_block: Path, name: str, rotational: str, vendor: str = "", model: str = "") -> None:
    (sys_block / name / "queue").mkdir(parents=True)
    (sys_block / name / "queue" / "rotational").write_text(f"{rotational}\n")
    (sys_block / name / "device").mkdir()
    (sys_block / name / "device" / "vendor").write_text(f"{vendor}\n")
    (sys_block / name / "device" / "model").write_text(f"{model}\n")


@pytest.mark.parametrize(
    ("device", "disk", "expected"),
    [
        ("/dev/vda1", ("vda", "1", "0x1af4", ""), "virtual"),  # virtio: rotational is 1 by default
        ("/dev/xvda", ("xvda", "1", "", ""), "virtual"),
        ("/dev/loop3", ("loop3", "1", "", ""), "virtual"),
        ("/dev/sda2", ("sda", "1", "QEMU", "QEMU HARDDISK"), "virtual"),
        ("/dev/sdb", ("sdb", "1", "VMware", "Virtual disk"), "virtual"),
        ("/dev/sda1", ("sda", "1", "ATA", "ST4000DM004-2CV1"), "hdd"),
        ("/dev/sda1", ("sda", "0", "ATA", "Samsung SSD 870"), "ssd"),
        ("/dev/nvme0n1p2", ("nvme0n1", "0", "", ""), "nvme"),
        ("/dev/mapper/vg-root", ("sdz", "1", "ATA", ""), "unknown"),
    ],
)
def test_the_medium_trusts_the_rotational_flag_only_on_a_real_disk(
    tmp_path: Path, device: str, disk: tuple[str, str, str, str], expected: str
) -> None:
    _fake_disk(tmp_path, *disk)
    assert medium(device, "ext4", sys_block=tmp_path) == expected


def test_filesystems_name_their_medium_before_any_device() -> None:
    assert medium("tmpfs", "tmpfs") == "tmpfs"
    assert medium("overlay", "overlay") == "overlay"
    assert medium("server:/export", "nfs4") == "network"
