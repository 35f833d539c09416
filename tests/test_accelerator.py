"""Accelerator helpers: every CUDA path has a CPU fallback that runs here, and NVML is optional."""

from __future__ import annotations

import pytest
import torch

from cropbench.errors import ConfigError
from cropbench.measure.accelerator import (
    NvmlSampler,
    autocast,
    cuda_memory,
    device_info,
    grad_scaler,
    pin_in_effect,
    resolve_device,
    synchroniser,
    to_device,
)

CPU = torch.device("cpu")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="tests the fallback of a machine without CUDA")


def test_auto_picks_what_the_machine_has() -> None:
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == CPU
    with pytest.raises(ConfigError):
        resolve_device("tpu")


@no_cuda
def test_cuda_without_a_gpu_is_an_error_not_a_silent_cpu_run() -> None:
    with pytest.raises(ConfigError, match="no CUDA device") as raised:
        resolve_device("cuda")
    assert "--preset smoke" in str(raised.value), "the hint names what a command-line user can do"


def test_cpu_fallbacks() -> None:
    synchroniser(CPU)()
    assert pin_in_effect(True, CPU) is False and pin_in_effect(False, torch.device("cuda")) is False
    assert grad_scaler("bf16", CPU) is None and grad_scaler("off", CPU) is None
    assert device_info(CPU) == {"device": "cpu"}
    with cuda_memory(CPU) as peak:
        pass
    assert peak == {}


def test_bf16_autocast_on_the_cpu_and_fp16_refused() -> None:
    with autocast("bf16", CPU):
        product = torch.ones(4, 4) @ torch.ones(4, 4)
    assert product.dtype == torch.bfloat16
    with autocast("off", CPU):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    with pytest.raises(ConfigError, match="bf16"):
        autocast("fp16", CPU)
    with pytest.raises(ConfigError):
        autocast("fp8", CPU)


def test_to_device_makes_integer_images_float_and_channels_last() -> None:
    images = torch.arange(2 * 3 * 4 * 4, dtype=torch.int32).to(torch.uint16).view(2, 3, 4, 4)
    moved = to_device(images, CPU, non_blocking=False, channels_last=True, floating=True)
    assert moved.dtype == torch.float32 and moved.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(moved, images.to(torch.float32))
    assert to_device(images, CPU, non_blocking=False).dtype == torch.uint16


def test_nvml_sampler_skips_cleanly_on_the_cpu() -> None:
    with NvmlSampler(CPU) as sampler:
        pass
    assert sampler.metrics() == {"nvml": "skipped: not a CUDA device", "nvml_samples": 0}


@no_cuda
def test_nvml_sampler_never_fails_without_a_driver() -> None:
    with NvmlSampler(torch.device("cuda")) as sampler:
        pass
    assert sampler.metrics()["nvml"].startswith("skipped") and sampler.metrics()["nvml_samples"] == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_helpers() -> None:
    device = resolve_device("cuda")
    assert pin_in_effect(True, device) and isinstance(grad_scaler("fp16", device), torch.amp.GradScaler)
    info = device_info(device)
    assert info["gpu_name"] and info["cuda_version"]
    with cuda_memory(device) as peak:
        torch.ones(1024, device=device)
    assert peak["cuda_max_allocated_mib"] > 0
    pinned = torch.zeros(2, 3, 8, 8, dtype=torch.uint16).pin_memory()
    moved = to_device(pinned, device, non_blocking=True, floating=True)
    synchroniser(device)()
    assert moved.device.type == "cuda" and moved.dtype == torch.float32
