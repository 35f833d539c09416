"""Track 3 in asv: an end-to-end training loop — does the loader keep the model fed?

``Loop`` runs :func:`cropbench.tracks.training.run_case` (a fixed number of steps and a compute-only
baseline) and reports mean step over compute-only step, from one call, not interleaved: not in the
recommended gate. ``FullLoop`` and ``LoopLatency`` are the full grid (``CROPBENCH_ASV_FULL=1``): more
models and workers, ``cuda`` (skipped without a GPU), every layout, data wait, images/s, first batch.
"""

from __future__ import annotations

from typing import Any

import torch

from .common import Benchmark, full_grid_off, full_layouts, make_full_plates, older_commit, plate_for, skip

OLDER_COMMIT: str | None = None
try:
    from cropbench import metrics as m
    from cropbench.harness.context import RunContext
    from cropbench.measure.protocol import configure_threads
    from cropbench.tracks.training.cases import short_loop_case
    from cropbench.tracks.training.loop import run_case, step_over_compute
except ImportError as error:
    OLDER_COMMIT = older_commit(error)

#: Timed steps (after warm-up) per run: short on CPU, long enough for a fraction to mean something.
STEPS = 12


def no_cuda(device: str) -> str | None:
    """Why a ``cuda`` case skips on this machine, or None."""
    return "no CUDA device on this machine" if device == "cuda" and not torch.cuda.is_available() else None


class Loop(Benchmark):
    """How much the loader stretches each step beyond its compute (a small CNN on CPU, the smoke plate)."""

    unit = "x compute-only step"
    params = (["smallcnn"], [0, 2], ["cpu"])
    param_names = ("model", "num_workers", "device")
    version = "2"

    def setup(self, plates: dict[str, str], model: str, num_workers: int, device: str) -> None:
        skip(OLDER_COMMIT)
        configure_threads(1)
        self.plate, self.case = plate_for(plates, "default"), short_loop_case(model, num_workers, device, STEPS)

    def track_step_over_compute(self, *params: Any) -> float:
        return step_over_compute(run_case(RunContext(self.plate), self.case))


class _FullGrid(Benchmark):
    """The full grid's cases: more models and workers, ``cuda``, every layout of the full plate; no benchmarks."""

    params = (["smallcnn", "resnet18", "emulated"], [0, 1, 2], ["cpu", "cuda"], full_layouts())
    param_names = ("model", "num_workers", "device", "layout")
    setup_cache = staticmethod(make_full_plates)

    def setup(self, plates: dict[str, str], model: str, num_workers: int, device: str, layout: str) -> None:
        skip(full_grid_off(type(self).__name__) or OLDER_COMMIT or no_cuda(device))
        configure_threads(1)
        self.plate, self.case = plate_for(plates, layout), short_loop_case(model, num_workers, device, STEPS)


class FullLoop(_FullGrid):
    """``Loop.track_step_over_compute`` over the full grid."""

    unit = "x compute-only step"

    def track_step_over_compute(self, *params: Any) -> float:
        return step_over_compute(run_case(RunContext(self.plate), self.case))


class LoopLatency(_FullGrid):
    """Data-wait fraction and raw milliseconds from ``run_case`` (full grid only)."""

    def track_data_wait_fraction(self, *params: Any) -> float:
        return float(run_case(RunContext(self.plate), self.case)[m.DATA_WAIT_FRACTION])

    track_data_wait_fraction.unit = "fraction of step time"  # type: ignore[attr-defined]

    def track_ms_per_image(self, *params: Any) -> float:
        """Images per second, inverted: asv reads every value as lower-is-better."""
        return 1000.0 / float(run_case(RunContext(self.plate), self.case)[m.IMAGES_PER_S])

    track_ms_per_image.unit = "ms/image"  # type: ignore[attr-defined]

    def track_first_batch_ms(self, *params: Any) -> float:
        return float(run_case(RunContext(self.plate), self.case)[m.FIRST_BATCH_MS])

    track_first_batch_ms.unit = "ms"  # type: ignore[attr-defined]
