"""Reference models: channel-adapted ResNet-18, the small CNN, embedding heads, fixed seeds."""

from __future__ import annotations

import pytest
import torch

from cropbench.errors import ConfigError
from cropbench.tracks.training.models import build_model, embedding_model


@pytest.mark.parametrize("name", ["resnet18", "smallcnn"])
def test_models_take_any_channel_count_and_classify(name: str) -> None:
    model = build_model(name, channels=5, classes=7).eval()
    with torch.inference_mode():
        assert model(torch.randn(2, 5, 64, 64)).shape == (2, 7)
        embeddings = embedding_model(model)(torch.randn(2, 5, 64, 64))
    assert embeddings.shape == (2, 512 if name == "resnet18" else 128)


def test_resnet18_first_convolution_is_adapted() -> None:
    model = build_model("resnet18", channels=3 + 2, classes=4)
    assert model.conv1.in_channels == 5 and model.conv1.out_channels == 64
    assert model.fc.out_features == 4


def test_a_fixed_seed_gives_the_same_weights() -> None:
    torch.manual_seed(3)
    first = build_model("smallcnn", 5, 4).state_dict()
    torch.manual_seed(3)
    second = build_model("smallcnn", 5, 4).state_dict()
    assert all(torch.equal(first[key], second[key]) for key in first)


def test_unknown_model_and_bad_sizes_are_rejected() -> None:
    with pytest.raises(ConfigError, match="vit"):
        build_model("vit", 5, 4)
    with pytest.raises(ConfigError):
        build_model("smallcnn", 0, 4)
    with pytest.raises(ConfigError):
        embedding_model(torch.nn.Linear(2, 2))
