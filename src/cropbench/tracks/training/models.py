"""Reference models for Track 3: torchvision's ResNet-18 and a small CNN, both for C-channel crops.

Weights are never downloaded (``weights=None``): the loop measures speed, not accuracy, and a
fixed seed gives the same initial weights on every run. Each model ends in a classification head
for training; :func:`embedding_model` swaps the head for an identity to extract embeddings.
"""

from __future__ import annotations

import torch
import torchvision
from torch import nn

from cropbench.errors import ConfigError

MODELS = ("resnet18", "smallcnn")


def resnet18(channels: int, classes: int) -> nn.Module:
    """ResNet-18 whose first convolution takes ``channels`` planes instead of RGB."""
    model = torchvision.models.resnet18(weights=None, num_classes=classes)
    model.conv1 = nn.Conv2d(channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    return model


class SmallCNN(nn.Module):
    """A strided stem and three conv-BN-ReLU-pool blocks (16→128 channels), pooling, a linear head.

    About 10 M multiply-adds per 96 px image, some 35× less than ResNet-18 (350 M): a stand-in for a light
    model whose steps are short enough for the loader to matter even on a CPU.
    """

    def __init__(self, channels: int, classes: int, width: int = 16) -> None:
        super().__init__()
        layers: list[nn.Module] = [
            nn.Conv2d(channels, width, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        ]
        previous = width
        for block in range(1, 4):
            out = width * 2**block
            layers += [nn.Conv2d(previous, out, 3, padding=1, bias=False), nn.BatchNorm2d(out), nn.ReLU(inplace=True)]
            layers += [nn.MaxPool2d(2)] if block < 3 else []
            previous = out
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc: nn.Module = nn.Linear(previous, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(images))


def build_model(name: str, channels: int, classes: int) -> nn.Module:
    """A freshly initialised model (seed the torch RNG first for identical weights)."""
    if channels < 1 or classes < 1:
        raise ConfigError(f"a model needs channels >= 1 and classes >= 1, got channels={channels}, classes={classes}")
    if name == "resnet18":
        return resnet18(channels, classes)
    if name == "smallcnn":
        return SmallCNN(channels, classes)
    raise ConfigError(f"model={name!r} is not one of {', '.join(MODELS)}")


def embedding_model(model: nn.Module) -> nn.Module:
    """The model with its head (``fc``) replaced by an identity, so it returns embeddings."""
    if not hasattr(model, "fc"):
        raise ConfigError(f"{type(model).__name__} has no 'fc' head to remove")
    model.fc = nn.Identity()
    return model


__all__ = ["MODELS", "SmallCNN", "build_model", "embedding_model", "resnet18"]
