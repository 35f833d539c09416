"""Where a number was measured: software versions, hardware, storage of the data path, git commit."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

PACKAGES = ("cropbench", "torch", "torchvision", "zarr", "numcodecs", "numpy", "pyarrow")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """Commit of the cropbench checkout this code runs from (None when installed from a wheel)."""
    source = Path(__file__).resolve().parent
    try:
        result = subprocess.run(
            ["git", "-C", str(source), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    dirty = subprocess.run(
        ["git", "-C", str(source), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        timeout=5,
        check=False,
    ).stdout.strip()
    return result.stdout.strip() + ("-dirty" if dirty else "")


def storage_of(path: str | Path) -> dict[str, Any]:
    """Filesystem, device and medium (see :func:`medium`) holding ``path``.

    ``path`` is recorded as given (a relative plate path stays relative, so rows written in a
    checkout do not carry the checkout's location); it is resolved only to find its mount."""
    target = Path(path).resolve()
    while not target.exists() and target != target.parent:
        target = target.parent
    best = None
    for partition in psutil.disk_partitions(all=True):
        mount = Path(partition.mountpoint)
        contains = target == mount or mount in target.parents
        if contains and (best is None or len(str(mount)) > len(str(best.mountpoint))):
            best = partition
    if best is None:
        return {"path": str(path)}
    return {
        "path": str(path),
        "mountpoint": best.mountpoint,
        "filesystem": best.fstype,
        "device": best.device,
        "medium": medium(best.device, best.fstype),
    }


#: Block devices of a hypervisor or of the kernel itself (virtio, Xen, loop, device mapper, RAID, RAM,
#: network blocks): their rotational flag says nothing of the disk under them (virtio's is 1 by default).
VIRTUAL_BLOCK_PREFIXES = ("vd", "xvd", "loop", "dm-", "md", "zram", "nbd", "rbd")
#: Vendor or model words of disks a hypervisor emulates (QEMU, VMware, Hyper-V, VirtualBox, cloud volumes).
VIRTUAL_DISK_WORDS = ("qemu", "vmware", "virtual", "vbox", "persistentdisk", "elastic block store")


def medium(device: str, filesystem: str, sys_block: Path = Path("/sys/block")) -> str:
    """What holds a filesystem: tmpfs, overlay, network, nvme, ssd, hdd, virtual (a disk a hypervisor
    presents, whose rotational flag cannot be trusted), or unknown; ``sys_block`` is sysfs's block folder."""
    if filesystem in ("tmpfs", "ramfs"):
        return "tmpfs"
    if filesystem in ("overlay", "fuse.overlayfs"):
        return "overlay"
    if filesystem in ("nfs", "nfs4", "cifs", "smbfs", "lustre", "gpfs", "beegfs") or filesystem.startswith("fuse"):
        return "network"
    name = Path(device).name
    if name.startswith("nvme"):
        return "nvme"
    block = name.rstrip("0123456789")
    if block.startswith(VIRTUAL_BLOCK_PREFIXES) or name.startswith(VIRTUAL_BLOCK_PREFIXES):
        return "virtual"
    folder = sys_block / block
    try:
        rotational = (folder / "queue" / "rotational").read_text().strip()
    except OSError:
        return "unknown"
    described = " ".join(_read(folder / "device" / part) for part in ("vendor", "model")).lower()
    if any(word in described for word in VIRTUAL_DISK_WORDS) or "virtio" in _resolved(folder / "device"):
        return "virtual"
    return "hdd" if rotational == "1" else "ssd"


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _resolved(path: Path) -> str:
    try:
        return str(path.resolve())
    except OSError:
        return ""


def gpu_info() -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        return {"cuda_available": False}
    properties = torch.cuda.get_device_properties(0)
    return {
        "cuda_available": True,
        "gpu_name": properties.name,
        "gpu_memory_bytes": properties.total_memory,
        "cuda_version": torch.version.cuda,
        "gpu_count": torch.cuda.device_count(),
        "driver": _nvidia_driver(),
    }


def _nvidia_driver() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # NVML is optional and fails in many ways without a driver
        return None


def collect(data_path: str | Path | None = None) -> dict[str, Any]:
    """Environment metadata for a record; ``data_path`` adds the storage it lives on."""
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "packages": {name: _version(name) for name in PACKAGES},
        "cropbench_commit": git_commit(),
        "os": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_logical": psutil.cpu_count(logical=True),
        "cpu_physical": psutil.cpu_count(logical=False),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "ram_bytes": psutil.virtual_memory().total,
        **gpu_info(),
    }
    if data_path is not None:
        info["storage"] = storage_of(data_path)
    return info
