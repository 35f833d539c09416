"""Track 3 in asv: an end-to-end loop — does the loader keep the model fed?

``Loop`` wraps :func:`cropbench.tracks.training.run_case`: a fixed number of training steps, each
split into data wait and compute, and a compute-only baseline on batches already in place.
``track_step_over_compute`` is mean step time over compute-only step time, from one call; the
two are not interleaved block by block, so it is not part of the recommended gate (see README).
``FullLoop`` and ``LoopLatency`` are the full grid (``CROPBENCH_ASV_FULL=1``): more models and
workers, ``cuda`` (skipped where there is no GPU), every layout, and the data-wait fraction,
images/s and first-batch latency.
"""

from __future__ import annotations

from typing import Any

from .common import (
    FullSuite,
    Suite,
    crop_config,
    full_layouts,
    import_track_piece,
    one_thread,
    plate_for,
    require_full_grid,
    skips_older_commits,
)

#: Timed steps (after warm-up) per run: short on CPU, long enough for a fraction to mean something.
STEPS = 12


class _Training:
    """One model and workload fed by one DataLoader configuration for ``STEPS`` steps (no benchmarks)."""

    def prepare(self, plate: str, model: str, num_workers: int, device: str) -> None:
        import torch

        from cropbench.data.loader import LoaderSpec

        if device == "cuda" and not torch.cuda.is_available():
            raise NotImplementedError("no CUDA device on this machine")
        one_thread()
        self.plate = plate
        self.training_case, self.run_context = import_track_piece("training case"), import_track_piece("run context")
        self.case = self.training_case.Track3Case(
            crop=crop_config(crop_size=96, tier="light"),
            loader=LoaderSpec(num_workers=num_workers, batch_size=64, pin_memory=device == "cuda"),
            model=model,
            device=device,
            steps=STEPS,
            warmup_steps=2,
            emulated_step_ms=40.0 if model == "emulated" else 0.0,
        )

    def run_case(self) -> dict[str, Any]:
        return self.training_case.run_case(self.run_context.RunContext(plate=self.plate), self.case)

    def step_over_compute(self) -> float:
        metrics = self.run_case()
        return float(metrics["step_mean_ms"] / metrics["compute_only_step_mean_ms"])


class Loop(_Training, Suite):
    """How much the loader stretches each step beyond its compute (a small CNN on CPU, the smoke plate)."""

    params = (["smallcnn"], [0, 2], ["cpu"])
    param_names = ("model", "num_workers", "device")
    version = "2"

    @skips_older_commits()
    def setup(self, plates: dict[str, str], model: str, num_workers: int, device: str) -> None:
        self.prepare(plate_for(plates, "default"), model, num_workers, device)

    def track_step_over_compute(self, *params: Any) -> float:
        return self.step_over_compute()

    track_step_over_compute.unit = "x compute-only step"  # type: ignore[attr-defined]


class _FullTraining(_Training, FullSuite):
    """The full grid: more models and workers, ``cuda``, every layout of the full plate."""

    params = (["smallcnn", "resnet18", "emulated"], [0, 1, 2], ["cpu", "cuda"], full_layouts())
    param_names = ("model", "num_workers", "device", "layout")

    @skips_older_commits()
    def setup(self, plates: dict[str, str], model: str, num_workers: int, device: str, layout: str) -> None:
        require_full_grid(type(self).__name__)
        self.prepare(plate_for(plates, layout), model, num_workers, device)


class FullLoop(_FullTraining):
    """``Loop.track_step_over_compute`` over the full grid."""

    def track_step_over_compute(self, *params: Any) -> float:
        return self.step_over_compute()

    track_step_over_compute.unit = "x compute-only step"  # type: ignore[attr-defined]


class LoopLatency(_FullTraining):
    """Data-wait fraction and raw milliseconds from ``run_case`` (full grid only)."""

    def track_data_wait_fraction(self, *params: Any) -> float:
        return float(self.run_case()["data_wait_fraction"])

    track_data_wait_fraction.unit = "fraction of step time"  # type: ignore[attr-defined]

    def track_ms_per_image(self, *params: Any) -> float:
        """Images per second, inverted: asv reads every value as lower-is-better."""
        return 1000.0 / float(self.run_case()["images_per_s"])

    track_ms_per_image.unit = "ms/image"  # type: ignore[attr-defined]

    def track_first_batch_ms(self, *params: Any) -> float:
        return float(self.run_case()["first_batch_ms"])

    track_first_batch_ms.unit = "ms"  # type: ignore[attr-defined]
