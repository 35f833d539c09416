"""One step of Track 3's compute on a batch already on the device: the model, its optimiser and AMP."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch.nn import functional

from cropbench.measure.accelerator import autocast, check_amp, grad_scaler
from cropbench.objects import MISSING_CLASS
from cropbench.tracks.training.cases import TrainingCase
from cropbench.tracks.training.models import build_model, embedding_model

#: Wraps the model before the loop (``DistributedDataParallel`` under a distributed run).
ModelWrap = Callable[[torch.nn.Module], torch.nn.Module]


class StepCompute:
    """One step of the workload on a batch already on the device; a fixed seed gives fixed weights.

    ``wrap`` wraps a training model once it is on the device (gradients then synchronise across ranks).
    """

    def __init__(self, case: TrainingCase, device: torch.device, channels: int, wrap: ModelWrap | None = None) -> None:
        check_amp(case.amp, device)
        self.case = case
        self.device = device
        self.losses: list[torch.Tensor] = []
        self.model: Callable[[torch.Tensor], torch.Tensor] | None = None
        if case.model == "emulated":
            return
        torch.manual_seed(case.seed)
        model = build_model(case.model, channels, case.classes)
        if case.workload == "embed":
            model = embedding_model(model).eval()
        model = model.to(device)
        if case.channels_last:
            model = model.to(memory_format=torch.channels_last)
        if wrap is not None and case.workload == "train":
            model = wrap(model)
        if case.workload == "train":
            parameters = model.parameters()
            self.optimizer = (
                torch.optim.SGD(parameters, lr=0.01, momentum=0.9)
                if case.optimizer == "sgd"
                else torch.optim.Adam(parameters, lr=1e-3)
            )
            self.scaler = grad_scaler(case.amp, device)
        self.model = torch.compile(model) if case.compile else model

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        if self.model is None:
            time.sleep(self.case.emulated_step_ms / 1000)
            return
        if self.case.workload == "embed":
            with torch.inference_mode(), autocast(self.case.amp, self.device):
                self.model(images)
            return
        self.optimizer.zero_grad(set_to_none=True)
        with autocast(self.case.amp, self.device):
            loss = functional.cross_entropy(self.model(images), labels, ignore_index=MISSING_CLASS)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            self.optimizer.step()
        self.losses.append(loss.detach())
