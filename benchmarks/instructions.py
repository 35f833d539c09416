"""Instructions per crop of the format libraries' read paths, and of cropbench's ``direct`` reader.

A count, not a clock (:mod:`cropbench.measure.instructions`): a seeded list of 96 px crops of the smoke
plate is read in a child under valgrind's cachegrind, twice (``crops`` and five times as many), and the
difference per extra crop is the value; gated with a factor near 1.03 (docs/results/gate.md).
``ZarrReads`` is in zarr's gate, ``ArrowReads`` in ome-arrow's, ``DirectReads`` in cropbench's. Each case
skips where valgrind or the library is missing; one call takes 1-3 minutes on a busy 2-core machine.
"""

from __future__ import annotations

import shutil
from typing import Any

from .common import Benchmark, make_arrow_plates, older_commit, plate_for, skip

OLDER_COMMIT: str | None = None
try:
    from cropbench.measure.instructions import InstructionWorkload, measure_instructions
except ImportError as error:
    OLDER_COMMIT = older_commit(error)

#: Crops of the smaller run per decode path (the larger reads five times as many): enough extra
#: crops that their instructions stand well above the start-up's run-to-run wobble.
CROPS = {"zarr": 20, "direct": 100, "as-py": 16}
#: valgrind's install command (also in the measure's error; repeated here for commits without it).
VALGRIND_INSTALL = "apt-get install -y valgrind"
#: The decoded-chunk cache of the ``direct`` reads: 1 MiB, so nearly every crop decodes.
CACHE_BYTES = 2**20


def no_valgrind() -> str | None:
    """Why no case runs on this machine (valgrind is missing), or None."""
    return None if shutil.which("valgrind") else f"valgrind is not installed: {VALGRIND_INSTALL}"


class ZarrReads(Benchmark):
    """zarr-python's read path: slicing the plate the installed zarr wrote."""

    unit = "instructions per crop"
    params = (["random", "grouped-field"],)
    param_names = ("access",)
    rounds, timeout = 1, 900  # a count (asv keeps the last round); two children under valgrind

    def setup(self, plates: dict[str, str], access: str) -> None:
        plate = plate_for(plates, "default")
        skip(OLDER_COMMIT or no_valgrind())
        self.workload = InstructionWorkload(plate, "zarr", access, chunk_cache_bytes=CACHE_BYTES, crops=CROPS["zarr"])

    def track_instructions_per_crop(self, *params: Any) -> float:
        return float(measure_instructions(self.workload).per_crop)


class ArrowReads(Benchmark):
    """ome-arrow's read path: zero-copy Arrow buffers (``direct``) and ``.as_py()`` (``as-py``)."""

    unit = "instructions per crop"
    params = (["direct", "as-py"],)
    param_names = ("decode",)
    rounds, timeout = 1, 900
    setup_cache = staticmethod(make_arrow_plates)

    def setup(self, plates: dict[str, str], decode: str) -> None:
        plate = plate_for(plates, "ome-arrow")
        skip(OLDER_COMMIT or no_valgrind())
        self.workload = InstructionWorkload(plate, decode, "random", chunk_cache_bytes=CACHE_BYTES, crops=CROPS[decode])

    def track_instructions_per_crop(self, *params: Any) -> float:
        return float(measure_instructions(self.workload).per_crop)


class DirectReads(Benchmark):
    """cropbench's ``direct`` chunk reader on the default layout, decoded-chunk cache 1 MiB."""

    unit = "instructions per crop"
    params = (["random"],)
    param_names = ("access",)
    rounds, timeout = 1, 900

    def setup(self, plates: dict[str, str], access: str) -> None:
        plate = plate_for(plates, "default")
        skip(OLDER_COMMIT or no_valgrind())
        self.workload = InstructionWorkload(
            plate, "direct", access, chunk_cache_bytes=CACHE_BYTES, crops=CROPS["direct"]
        )

    def track_instructions_per_crop(self, *params: Any) -> float:
        return float(measure_instructions(self.workload).per_crop)
