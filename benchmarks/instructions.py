"""Instructions per crop of the format libraries' read paths, and of cropbench's ``direct`` reader.

A count of the CPU work, not a clock: a fixed, seeded list of 96 px crops of the smoke plate is
read in a child process under ``valgrind --tool=cachegrind --cache-sim=no``, twice (``crops`` and
five times as many after the same warm-up), and the difference per extra crop is the value
(:mod:`cropbench.measure.instructions`). Identical code gives the same value within a fraction of
a per cent on a busy machine, so these are gated with a factor near 1.03 where the wall-clock
ratios need 1.2 (docs/explanation/benchmark-kinds.md, docs/results/gate.md):

- ``ZarrReads``: zarr-python slicing of the zarr-written plate, random and grouped-field access
  (``track1.Fetch``'s ``zarr`` case, in zarr's gate);
- ``ArrowReads``: ome-arrow's plate, zero-copy ``direct`` and the reference script's ``as-py``
  (``track1.ArrowFetch``'s cases, in ome-arrow's gate);
- ``DirectReads``: cropbench's own chunk reader, decoded-chunk cache 1 MiB (in cropbench's gate).

Each case skips where valgrind is missing (with the install command) or the library is. One call
runs two children under valgrind: 1-3 minutes on a busy 2-core machine, mostly their imports.
"""

from __future__ import annotations

import shutil
from typing import Any

from .common import BOUNDED_CACHE_BYTES, ArrowSuite, Suite, plate_for, skips_older_commits

#: Crops of the smaller run per decode path (the larger reads five times as many): enough extra
#: crops that their instructions stand well above the start-up's run-to-run wobble.
CROPS = {"zarr": 20, "direct": 100, "as-py": 16}
#: valgrind's install command (also in the measure's error; repeated here for commits without it).
VALGRIND_INSTALL = "apt-get install -y valgrind"
#: The benchmarks' unit (``cropbench.measure.instructions.UNIT``).
UNIT = "instructions per crop"


class _Instructions:
    """One workload counted per call (no benchmarks; mixed into suites)."""

    rounds = 1  # a count: a second round would only replace the first (asv keeps the last)
    timeout = 900  # two children under valgrind, slower beside other work
    version = "1"

    @skips_older_commits()
    def prepare(self, plate: str, decode: str, access: str) -> None:
        from cropbench.measure.instructions import InstructionWorkload, measure_instructions

        if shutil.which("valgrind") is None:
            raise NotImplementedError(f"valgrind is not installed: {VALGRIND_INSTALL}")
        self.measure = measure_instructions
        self.workload = InstructionWorkload(
            plate, decode=decode, access=access, crops=CROPS[decode], chunk_cache_bytes=BOUNDED_CACHE_BYTES
        )

    def count(self) -> float:
        """Instructions per crop of the workload (two children under valgrind)."""
        return float(self.measure(self.workload).per_crop)


class ZarrReads(_Instructions, Suite):
    """zarr-python's read path: slicing the plate the installed zarr wrote."""

    params = (["random", "grouped-field"],)
    param_names = ("access",)

    def setup(self, plates: dict[str, str], access: str) -> None:
        self.prepare(plate_for(plates, "default"), "zarr", access)

    def track_instructions_per_crop(self, *params: Any) -> float:
        return self.count()

    track_instructions_per_crop.unit = UNIT  # type: ignore[attr-defined]


class ArrowReads(_Instructions, ArrowSuite):
    """ome-arrow's read path: zero-copy Arrow buffers (``direct``) and ``.as_py()`` (``as-py``)."""

    params = (["direct", "as-py"],)
    param_names = ("decode",)

    def setup(self, plates: dict[str, str], decode: str) -> None:
        self.prepare(plate_for(plates, "ome-arrow"), decode, "random")

    def track_instructions_per_crop(self, *params: Any) -> float:
        return self.count()

    track_instructions_per_crop.unit = UNIT  # type: ignore[attr-defined]


class DirectReads(_Instructions, Suite):
    """cropbench's ``direct`` chunk reader on the default layout, decoded-chunk cache 1 MiB."""

    params = (["random"],)
    param_names = ("access",)

    def setup(self, plates: dict[str, str], access: str) -> None:
        self.prepare(plate_for(plates, "default"), "direct", access)

    def track_instructions_per_crop(self, *params: Any) -> float:
        return self.count()

    track_instructions_per_crop.unit = UNIT  # type: ignore[attr-defined]
