"""Reference models for Track 3: torchvision's ResNet-18 and a small CNN, both for C-channel crops;
or a model of the user's own, named ``path/to/file.py:factory``.

Weights are never downloaded (``weights=None``): the loop measures speed, not accuracy, and a
fixed seed gives the same initial weights on every run. Each model ends in a classification head
for training; :func:`embedding_model` swaps the head for an identity to extract embeddings. A user's
factory is called as ``factory(channels, classes)`` and returns a module that takes crops of shape
``(batch, channels, crop, crop)`` and returns ``classes`` logits per crop, as the reference models do.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
from collections.abc import Callable
from pathlib import Path

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


#: A model of the user's own: a Python file and the name of the factory in it.
USER_MODEL = re.compile(r"^(?P<path>.+\.py):(?P<factory>[A-Za-z_]\w*)$")


def is_user_model(name: str) -> bool:
    """Whether ``name`` names a model of the user's own (``path/to/file.py:factory``)."""
    return USER_MODEL.match(name) is not None


def user_factory(name: str) -> Callable[[int, int], nn.Module]:
    """The factory ``path/to/file.py:factory`` names, the file imported under a name of its own."""
    match = USER_MODEL.match(name)
    if match is None:
        raise ConfigError(f"model {name!r} is not of the form path/to/file.py:factory")
    path = Path(match["path"])
    if not path.is_file():
        raise ConfigError(f"model {name}: {path} is not a file")
    module_name = "cropbench_user_model_" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"model {name}: {path} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as error:  # the user's code: whatever it raises is the one-line answer
        raise ConfigError(f"model {name}: importing {path} failed: {type(error).__name__}: {error}") from error
    factory = getattr(module, match["factory"], None)
    if not callable(factory):
        raise ConfigError(f"model {name}: {path} defines no callable {match['factory']!r}")
    return factory


def _user_model(name: str, channels: int, classes: int) -> nn.Module:
    try:
        model = user_factory(name)(channels, classes)
    except ConfigError:
        raise
    except Exception as error:  # the user's code
        raise ConfigError(
            f"model {name}: factory({channels}, {classes}) failed: {type(error).__name__}: {error}"
        ) from error
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model {name}: the factory returned {type(model).__name__}, not a torch.nn.Module")
    return model


def check_input(name: str, channels: int, classes: int, crop_size: int) -> None:
    """Build model ``name`` and run one crop of ``(1, channels, crop_size, crop_size)`` through it, so a model
    that does not take the crops (or does not return ``classes`` logits) is one line before anything is
    measured."""
    model = build_model(name, channels, classes).eval()
    shape = (1, channels, crop_size, crop_size)
    try:
        with torch.no_grad():
            out = model(torch.zeros(shape))
    except Exception as error:  # the model's own code
        raise ConfigError(
            f"model {name} does not take crops of shape {shape}: {type(error).__name__}: {error}"
        ) from error
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (1, classes):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ConfigError(f"model {name} returned {got} for crops of shape {shape}, expected (1, {classes}) logits")


def build_model(name: str, channels: int, classes: int) -> nn.Module:
    """A freshly initialised model (seed the torch RNG first for identical weights)."""
    if channels < 1 or classes < 1:
        raise ConfigError(f"a model needs channels >= 1 and classes >= 1, got channels={channels}, classes={classes}")
    if is_user_model(name):
        return _user_model(name, channels, classes)
    if name == "resnet18":
        return resnet18(channels, classes)
    if name == "smallcnn":
        return SmallCNN(channels, classes)
    raise ConfigError(f"model={name!r} is not one of {', '.join(MODELS)} or path/to/file.py:factory")


def embedding_model(model: nn.Module) -> nn.Module:
    """The model with its head (``fc``) replaced by an identity, so it returns embeddings."""
    if not hasattr(model, "fc"):
        raise ConfigError(f"{type(model).__name__} has no 'fc' head to remove")
    model.fc = nn.Identity()
    return model


__all__ = [
    "MODELS",
    "USER_MODEL",
    "SmallCNN",
    "build_model",
    "check_input",
    "embedding_model",
    "is_user_model",
    "resnet18",
    "user_factory",
]
