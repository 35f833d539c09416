"""Track 3 in asv: an end-to-end loop — does the loader keep the model fed?

``Loop`` wraps :func:`cropbench.tracks.track3.run_case`: a fixed number of training steps, each
split into data wait and compute, and a compute-only baseline on batches already in place.
``track_step_over_compute`` (mean step time over compute-only step time, same process) is the
number to gate on. ``LoopLatency`` holds the data-wait fraction (a small fraction whose ratio
between runs swings widely), images/s and first-batch latency, with ``CROPBENCH_ASV_FULL=1``
only. ``cuda`` cases are skipped where there is no GPU.
"""

from __future__ import annotations

from typing import Any

from .common import Suite, crop_config, grid, layouts, one_thread, plate_for, require, require_full_grid

#: Timed steps (after warm-up) per run: short on CPU, long enough for a fraction to mean something.
STEPS = 12


class _Training(Suite):
    """One model and workload fed by one DataLoader configuration for ``STEPS`` steps (no benchmarks)."""

    params = (
        grid(["smallcnn"], ["smallcnn", "resnet18", "emulated"]),
        grid([0, 2], [0, 1, 2]),
        grid(["cpu"], ["cpu", "cuda"]),
        layouts(),
    )
    param_names = ("model", "num_workers", "device", "layout")

    def setup(self, plates: dict[str, str], model: str, num_workers: int, device: str, layout: str) -> None:
        import torch

        if device == "cuda" and not torch.cuda.is_available():
            raise NotImplementedError("no CUDA device on this machine")
        one_thread()
        self.plate = plate_for(plates, layout)
        loader_spec = require("cropbench.data.loader", "LoaderSpec")(
            num_workers=num_workers,
            batch_size=64,
            pin_memory=device == "cuda",
        )
        self.case = require("cropbench.tracks.track3", "Track3Case")(
            crop=crop_config(crop_size=96, tier="light"),
            loader=loader_spec,
            model=model,
            device=device,
            steps=STEPS,
            warmup_steps=2,
            emulated_step_ms=40.0 if model == "emulated" else 0.0,
        )

    def _run_case(self) -> dict[str, Any]:
        return require("cropbench.tracks.track3", "run_case")(self.plate, self.case)


class Loop(_Training):
    """How much the loader stretches each step beyond its compute."""

    def track_step_over_compute(self, *params: Any) -> float:
        metrics = self._run_case()
        return float(metrics["step_mean_ms"] / metrics["compute_only_step_mean_ms"])

    track_step_over_compute.unit = "x compute-only step"  # type: ignore[attr-defined]


class LoopLatency(_Training):
    """Data-wait fraction and raw milliseconds from ``run_case`` (full grid only)."""

    def setup(self, *args: Any) -> None:
        require_full_grid("Track 3 data-wait fraction, images/s and first-batch latency")
        super().setup(*args)

    def track_data_wait_fraction(self, *params: Any) -> float:
        return float(self._run_case()["data_wait_fraction"])

    track_data_wait_fraction.unit = "fraction of step time"  # type: ignore[attr-defined]

    def track_ms_per_image(self, *params: Any) -> float:
        """Images per second, inverted: asv reads every value as lower-is-better."""
        return 1000.0 / float(self._run_case()["images_per_s"])

    track_ms_per_image.unit = "ms/image"  # type: ignore[attr-defined]

    def track_first_batch_ms(self, *params: Any) -> float:
        return float(self._run_case()["first_batch_ms"])

    track_first_batch_ms.unit = "ms"  # type: ignore[attr-defined]
