"""The accelerator side of Track 3: device choice, honest clocks, AMP, host-to-device copies, NVML.

Everything here works on a CPU-only machine: ``device="auto"`` falls back to the CPU, the
synchroniser is a no-op, pinned memory and non-blocking copies are switched off, and NVML
sampling reports why it is unavailable instead of failing. Asking for ``cuda`` where there is
none is an error, so a GPU check can never silently measure the CPU.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from cropbench import metrics as m
from cropbench.errors import ConfigError

DEVICES = ("auto", "cpu", "cuda")
AMP_MODES = ("off", "bf16", "fp16")
AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: Seconds between NVML samples: fine enough for steps of tens of milliseconds, cheap for the CPU.
NVML_INTERVAL_S = 0.05


def resolve_device(name: str) -> torch.device:
    """``auto`` → CUDA when present, else CPU; ``cuda`` without a GPU is an error with a hint."""
    if name not in DEVICES:
        raise ConfigError(f"device={name!r} is not one of {', '.join(DEVICES)}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "device='cuda' but torch sees no CUDA device; without a GPU run `cropbench run --preset smoke` "
            "or `--preset full` (the gpu presets need CUDA), or in Python use device='auto' or 'cpu'"
        )
    return torch.device(name)


def synchroniser(device: torch.device) -> Callable[[], None]:
    """Call before every clock read: CUDA kernels run asynchronously, a clock would see only the launch."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def check_amp(amp: str, device: torch.device) -> None:
    if amp not in AMP_MODES:
        raise ConfigError(f"amp={amp!r} is not one of {', '.join(AMP_MODES)}")
    if amp == "fp16" and device.type != "cuda":
        raise ConfigError("amp='fp16' needs CUDA (it uses a gradient scaler); use amp='bf16' on the CPU")


def autocast(amp: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The autocast context of an AMP mode (a no-op for ``off``)."""
    check_amp(amp, device)
    if amp == "off":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=AMP_DTYPES[amp])


def grad_scaler(amp: str, device: torch.device) -> torch.amp.GradScaler | None:
    """A gradient scaler for fp16 on CUDA (fp16 gradients underflow without one); None otherwise."""
    check_amp(amp, device)
    return torch.amp.GradScaler("cuda") if amp == "fp16" else None


def pin_in_effect(requested: bool, device: torch.device) -> bool:
    """Pinned memory helps only copies to an accelerator; on the CPU it is switched off."""
    return requested and device.type == "cuda"


def to_device(
    tensor: torch.Tensor, device: torch.device, non_blocking: bool, channels_last: bool = False, floating: bool = False
) -> torch.Tensor:
    """Copy to the device; integer images become float32 there (half the bytes cross the bus)."""
    moved = tensor.to(device, non_blocking=non_blocking)
    if floating and not moved.is_floating_point():
        moved = moved.to(torch.float32)
    if channels_last and moved.dim() == 4:
        moved = moved.contiguous(memory_format=torch.channels_last)
    return moved


def device_info(device: torch.device) -> dict[str, Any]:
    """Name, memory, CUDA and driver versions of the device a row ran on."""
    from cropbench.measure.environment import gpu_info

    if device.type != "cuda":
        return {m.DEVICE: "cpu"}
    index = device.index if device.index is not None else torch.cuda.current_device()
    properties = torch.cuda.get_device_properties(index)
    return {
        **gpu_info(),
        m.DEVICE: f"cuda:{index}",
        m.GPU_NAME: properties.name,
        m.GPU_CAPABILITY: f"{properties.major}.{properties.minor}",
        m.GPU_MULTIPROCESSORS: properties.multi_processor_count,
    }


class NvmlSampler:
    """Samples GPU utilisation and memory through NVML in a background thread, best effort.

    NVML (the ``nvidia-ml-py`` package, module ``pynvml``) is optional: without it, without a GPU
    or when the driver refuses, :meth:`metrics` says why in ``nvml`` and nothing fails.
    """

    def __init__(self, device: torch.device, interval_s: float = NVML_INTERVAL_S) -> None:
        self.device = device
        self.interval_s = interval_s
        self.status = "not started"
        self._utilisation: list[float] = []
        self._memory: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: Any = None
        self._handle: Any = None

    def _open(self) -> bool:
        if self.device.type != "cuda":
            self.status = "skipped: not a CUDA device"
            return False
        try:
            import pynvml
        except ImportError:
            self.status = "skipped: pynvml is not installed (.venv/bin/pip install nvidia-ml-py)"
            return False
        try:
            pynvml.nvmlInit()
            index = self.device.index if self.device.index is not None else torch.cuda.current_device()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as error:  # NVML raises its own error types, and drivers fail in many ways
            self.status = f"skipped: NVML failed ({type(error).__name__}: {error})"
            return False
        self._nvml = pynvml
        self.status = "sampled"
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._utilisation.append(float(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu))
                self._memory.append(float(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used))
            except Exception as error:  # a failing read ends sampling, never the measurement
                self.status = f"stopped: NVML read failed ({type(error).__name__})"
                return
            self._stop.wait(self.interval_s)

    def __enter__(self) -> NvmlSampler:
        if self._open():
            self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)

    def metrics(self) -> dict[str, Any]:
        result: dict[str, Any] = {m.NVML: self.status, m.NVML_SAMPLES: len(self._utilisation)}
        if self._utilisation:
            result.update(
                {
                    m.GPU_UTIL_MEAN: float(np.mean(self._utilisation)),
                    m.GPU_UTIL_P50: float(np.percentile(self._utilisation, 50)),
                    m.GPU_MEM_USED_MIB_MAX: max(self._memory) / 2**20,
                }
            )
        return result


@contextlib.contextmanager
def cuda_memory(device: torch.device) -> Iterator[dict[str, Any]]:
    """Peak CUDA memory allocated inside the block (empty on the CPU)."""
    result: dict[str, Any] = {}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    yield result
    if device.type == "cuda":
        result[m.CUDA_MAX_ALLOCATED_MIB] = torch.cuda.max_memory_allocated(device) / 2**20


__all__ = [
    "AMP_MODES",
    "DEVICES",
    "NvmlSampler",
    "autocast",
    "check_amp",
    "cuda_memory",
    "device_info",
    "grad_scaler",
    "pin_in_effect",
    "resolve_device",
    "synchroniser",
    "to_device",
]
