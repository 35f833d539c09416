"""Instructions per crop: the CPU work of a plate reader's read path, counted by valgrind, not timed.

A wall clock on a shared machine moves more than a small regression does (identical code reads far
apart between runs of the gates: docs/asv.md); the number of instructions a fixed workload executes
does not depend on the neighbours. This counts them: a child process reads a fixed, seeded list of crops
through one of cropbench's plate readers (``direct``: cropbench's chunk reader or OME-Arrow's
zero-copy path; ``zarr``: zarr-python slicing of the plate; ``as-py``: OME-Arrow's reference
script's way) under ``valgrind --tool=cachegrind --cache-sim=no``, which counts every instruction
the process executes in user space (all its threads; the kernel's work is not counted).

Per crop, by differencing: the same child runs twice, reading ``crops`` and ``scale * crops`` crops
after the same warm-up (one crop of every field, so every array is open and its metadata read), and
the difference over the extra crops drops interpreter start-up, imports and the warm-up out.

What is pinned so that the same code gives the same count (:data:`PINNED_ENVIRONMENT`):

- ``PYTHONHASHSEED=0`` (set and dict orders, hence the work they do, follow the hash seed);
- ``PYTHONDONTWRITEBYTECODE=1``: a run that writes ``.pyc`` files makes the next one cheaper;
  with it every run compiles the same modules (start-up, which differencing drops anyway);
- one thread everywhere: OpenMP, BLAS, blosc (``BLOSC_NTHREADS`` and numcodecs' ``use_threads``),
  zarr's ``threading.max_workers`` and ``async.concurrency``, Arrow's CPU and I/O pools (OME-Arrow
  plates are Parquet files read by pyarrow); valgrind runs threads one at a time,
  and fewer threads means fewer scheduling-dependent wake-ups counted;
- the crops: a seeded order of the plate's objects (``random``: every object once per epoch in a
  seeded permutation; ``grouped-field``: fields in seeded order, objects in order inside each),
  windows centred on each object and shifted inside the field, as the dataset cuts them;
- the child never imports torch (minutes under valgrind): it calls the reader's ``read_region``.

Valgrind must be installed (``apt-get install -y valgrind``); without it the measure raises
:class:`ValgrindUnavailableError`, never a 0.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cropbench.config import DEFAULT_CROP_SIZE
from cropbench.errors import ConfigError, CropbenchError
from cropbench.formats import read_plate_metadata, supported_decodes
from cropbench.scratch import scratch_folder

#: How to install valgrind (Debian and Ubuntu); the error of a machine without it names it.
VALGRIND_INSTALL = "apt-get install -y valgrind"
#: The unit of the measure (asv's ``unit`` of the benchmarks).
UNIT = "instructions per crop"
#: Decode paths a workload reads through (``open_plate``'s; which apply depends on the plate's format).
DECODES = ("direct", "zarr", "as-py")
#: Access patterns of the workload's crop order.
ACCESSES = ("random", "grouped-field")
#: Environment of the child that counts; see the module docstring for why each is set.
PINNED_ENVIRONMENT = {
    "PYTHONHASHSEED": "0",
    "PYTHONDONTWRITEBYTECODE": "1",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "BLOSC_NTHREADS": "1",
    "NUMEXPR_NUM_THREADS": "1",
    "ZARR_THREADING__MAX_WORKERS": "1",
    "ZARR_ASYNC__CONCURRENCY": "1",
    "ARROW_IO_THREADS": "1",
}
#: valgrind's tool and options: count instructions only (no cache simulation: ten times faster).
VALGRIND_OPTIONS = ("--tool=cachegrind", "--cache-sim=no")


class ValgrindUnavailableError(CropbenchError):
    """valgrind is not installed, so instructions cannot be counted here."""


class InstructionCountError(CropbenchError):
    """The counting child failed, or cachegrind's output holds no instruction count."""


@dataclass(frozen=True)
class InstructionWorkload:
    """A fixed, seeded list of crops read through one decode path of one plate."""

    plate: str
    decode: str = "direct"
    access: str = "random"
    crop_size: int = DEFAULT_CROP_SIZE
    #: Crops of the smaller run; the larger one reads ``scale`` times as many.
    crops: int = 20
    scale: int = 5
    #: The decoded-chunk cache of the ``direct`` readers: 1 MiB, so nearly every crop decodes.
    chunk_cache_bytes: int = 2**20
    seed: int = 0

    def __post_init__(self) -> None:
        if self.decode not in DECODES:
            raise ConfigError(f"decode must be one of {', '.join(DECODES)}, got {self.decode!r}")
        if self.access not in ACCESSES:
            raise ConfigError(f"access must be one of {', '.join(ACCESSES)}, got {self.access!r}")
        for name in ("crop_size", "crops"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.scale < 2:
            raise ConfigError(f"scale must be at least 2 (the larger run reads scale * crops), got {self.scale}")
        if self.chunk_cache_bytes < 0:
            raise ConfigError(f"chunk_cache_bytes must be 0 or more, got {self.chunk_cache_bytes}")


@dataclass(frozen=True)
class InstructionCount:
    """Instructions of the two runs of a workload and what one crop costs."""

    small: int
    large: int
    small_crops: int
    large_crops: int

    @property
    def per_crop(self) -> float:
        """Instructions per crop: the larger run's extra instructions over its extra crops."""
        return per_crop(self.small, self.large, self.small_crops, self.large_crops)


def per_crop(small: int, large: int, small_crops: int, large_crops: int) -> float:
    """(large - small) / (large_crops - small_crops); a larger run that counted less is an error, not a value."""
    if large_crops <= small_crops:
        raise ValueError(f"the larger run must read more crops: {large_crops} after {small_crops}")
    if large <= small:
        raise InstructionCountError(
            f"the run of {large_crops} crops counted {large:,} instructions, not more than the run of "
            f"{small_crops} ({small:,}): the workload is not what was measured"
        )
    return (large - small) / (large_crops - small_crops)


_EVENTS = re.compile(r"^events:\s*(.+)$", re.MULTILINE)
_SUMMARY = re.compile(r"^(?:summary|totals):\s*(.+)$", re.MULTILINE)


def parse_cachegrind(text: str, source: str = "cachegrind output") -> int:
    """The total instruction count (event ``Ir``) of a cachegrind output file."""
    events, summary = _EVENTS.search(text), _SUMMARY.search(text)
    if events is None or summary is None:
        raise InstructionCountError(f"{source} has no 'events:' and 'summary:' lines: not a cachegrind output file")
    names, values = events.group(1).split(), summary.group(1).split()
    if "Ir" not in names:
        raise InstructionCountError(f"{source} counts {' '.join(names)}, not instructions (Ir)")
    position = names.index("Ir")
    if position >= len(values) or not values[position].isdigit():
        raise InstructionCountError(f"{source}: summary line {summary.group(0)!r} has no count for Ir")
    return int(values[position])


def valgrind_binary() -> str:
    """The path of valgrind, or :class:`ValgrindUnavailableError` saying how to install it."""
    path = shutil.which("valgrind")
    if path is None:
        raise ValgrindUnavailableError(f"valgrind is not installed (needed to count instructions): {VALGRIND_INSTALL}")
    return path


def check_workload(workload: InstructionWorkload) -> None:
    """The plate and its decode path, checked here: under valgrind a bad one would fail after a minute of imports."""
    metadata = read_plate_metadata(workload.plate)
    if workload.decode not in supported_decodes(metadata):
        raise ConfigError(
            f"decode={workload.decode!r} does not apply to the {metadata.format} layout of {workload.plate}; "
            f"it supports {', '.join(supported_decodes(metadata))}"
        )
    _, height, width = metadata.field_shape
    if workload.crop_size > min(height, width):
        raise ConfigError(
            f"crop_size={workload.crop_size} is larger than the fields of {workload.plate} ({height}x{width})"
        )


def count_instructions(workload: InstructionWorkload, crops: int, library_path: Sequence[str] = ()) -> int:
    """Instructions of one child that reads the warm-up and then ``crops`` crops of ``workload``, under valgrind.

    ``library_path``: folders the child imports from before anything installed (a library's source
    tree with a patch applied, so a change is counted without building and installing it)."""
    valgrind = valgrind_binary()
    check_workload(workload)
    source = str(Path(__file__).resolve().parents[2])  # the folder holding the cropbench package
    environment = {**os.environ, **PINNED_ENVIRONMENT}
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, (source, *library_path, os.environ.get("PYTHONPATH"))))
    with scratch_folder("instructions") as scratch:
        output = scratch / "cachegrind.out"
        command = [
            valgrind,
            *VALGRIND_OPTIONS,
            f"--cachegrind-out-file={output}",
            sys.executable,
            "-m",
            __name__,
            json.dumps({**asdict(workload), "count": crops}),
        ]
        result = subprocess.run(command, env=environment, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if result.returncode != 0 or not output.is_file():
            tail = " | ".join(result.stderr.strip().splitlines()[-3:])
            raise InstructionCountError(
                f"counting {crops} crops of {workload.plate} ({workload.decode}, {workload.access}) failed "
                f"(exit {result.returncode}): {tail}"
            )
        return parse_cachegrind(output.read_text(), str(output))


def measure_instructions(workload: InstructionWorkload, library_path: Sequence[str] = ()) -> InstructionCount:
    """Instructions per crop of ``workload``: two children, ``crops`` and ``scale * crops`` crops, differenced
    (``library_path``: as :func:`count_instructions`)."""
    small = count_instructions(workload, workload.crops, library_path)
    large = count_instructions(workload, workload.crops * workload.scale, library_path)
    return InstructionCount(small, large, workload.crops, workload.crops * workload.scale)


def crop_order(field_index: np.ndarray, access: str, count: int, seed: int) -> np.ndarray:
    """``count`` object indices in the access pattern's seeded order, epoch after epoch."""
    if access not in ACCESSES:
        raise ConfigError(f"access must be one of {', '.join(ACCESSES)}, got {access!r}")
    orders: list[np.ndarray] = []
    epoch = 0
    while sum(len(order) for order in orders) < count:
        rng = np.random.default_rng([seed, epoch])
        if access == "random":
            orders.append(rng.permutation(len(field_index)))
        else:
            fields, inverse = np.unique(field_index, return_inverse=True)
            orders.append(np.lexsort((np.arange(len(field_index)), rng.permutation(len(fields))[inverse])))
        epoch += 1
    return np.concatenate(orders)[:count]


def crop_windows(reader: Any, objects: Any, crop_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(field index, y0, x0) of every object's window: centred on it, shifted inside the field."""
    _, height, width = reader.metadata.field_shape
    if crop_size > min(height, width):
        raise ConfigError(f"crop_size={crop_size} is larger than the field ({height}x{width})")
    lookup = {(info.well, info.field): info.index for info in reader.metadata.fields}
    field_index = np.array([lookup[key] for key in zip(objects.well.tolist(), objects.field.tolist(), strict=True)])
    y0 = np.floor(objects.centroid_y - (crop_size - 1) / 2 + 0.5).astype(np.int64)
    x0 = np.floor(objects.centroid_x - (crop_size - 1) / 2 + 0.5).astype(np.int64)
    return field_index, np.clip(y0, 0, height - crop_size), np.clip(x0, 0, width - crop_size)


def pin_library_threads() -> None:
    """One thread in blosc, zarr's event loop and pool and Arrow's pools, where they are loaded (child side)."""
    try:
        from numcodecs import blosc

        blosc.use_threads = False
        blosc.set_nthreads(1)
    except ImportError:
        pass
    if "zarr" in sys.modules:
        import zarr

        zarr.config.set({"threading.max_workers": 1, "async.concurrency": 1})
    if "pyarrow" in sys.modules:
        import pyarrow

        pyarrow.set_cpu_count(1)
        pyarrow.set_io_thread_count(1)


def read_crops(workload: InstructionWorkload, count: int) -> int:
    """The child's work: the warm-up (one crop of every field), then ``count`` crops; returns crops read."""
    from cropbench.formats import open_plate, plate_objects

    reader = open_plate(workload.plate, decode=workload.decode, chunk_cache_bytes=workload.chunk_cache_bytes)
    pin_library_threads()
    field_index, y0, x0 = crop_windows(reader, plate_objects(workload.plate), workload.crop_size)
    _, first = np.unique(field_index, return_index=True)
    order = crop_order(field_index, workload.access, count, workload.seed)
    size = workload.crop_size
    for index in [*first.tolist(), *order.tolist()]:
        top, left = int(y0[index]), int(x0[index])
        reader.read_region(int(field_index[index]), top, top + size, left, left + size)
    reader.close()
    return len(order)


def main(argv: Sequence[str] | None = None) -> int:
    """Child entry: ``python -m cropbench.measure.instructions '{"plate": ..., "count": N, ...}'``."""
    arguments = dict(json.loads((sys.argv[1:] if argv is None else argv)[0]))
    count = int(arguments.pop("count"))
    read_crops(InstructionWorkload(**arguments), count)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
