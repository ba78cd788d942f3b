"""Fixtures for the device tests: the tiny real ESPnet model of tests/cloud/support.py as a DeviceModel."""

from __future__ import annotations

import numpy as np
import pytest
import torch


@pytest.fixture(scope="session")
def tiny_model(cloud_support):
    """An untrained ~100k-parameter late-context model with a real tokenizer, wrapped for the agent."""
    from pasu.device.runtime import DeviceModel

    model, tokenizer = cloud_support.tiny_parts()
    return DeviceModel(model, tokenizer.token_list, tokenizer.decode, "tiny-untrained")


@pytest.fixture(scope="session")
def speech_like():
    """speech_like(seconds, seed) -> 16 kHz float32 audio: noise bursts shaped like syllables."""

    def make(seconds: float = 1.0, seed: int = 0) -> np.ndarray:
        rng = np.random.default_rng(seed)
        n = int(seconds * 16000)
        envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 4 * np.arange(n) / 16000 + rng.uniform(0, 6))
        return (0.1 * rng.standard_normal(n) * envelope).astype(np.float32)

    return make


@pytest.fixture(scope="session")
def with_lm(tiny_model, tmp_path_factory):
    """The tiny model with a random token LM fused in (a sharpened output layer, so that it has opinions)."""
    from pasu.device.runtime import DeviceModel
    from pasu.models.lm import LmNetOptions, PackagedLm, build_lm

    torch.manual_seed(0)
    network = build_lm(len(tiny_model.token_list), LmNetOptions(unit=32, nlayers=1, dropout_rate=0.0)).eval()
    torch.nn.init.normal_(network.lm.decoder.weight, std=2.0)
    weights = tmp_path_factory.mktemp("tiny-lm") / "model.pt"
    torch.save(network.state_dict(), weights)
    model = DeviceModel(tiny_model.model, tiny_model.token_list, tiny_model.detokenize, "tiny-untrained")
    model.use_lm(PackagedLm(network, list(tiny_model.token_list), "tiny-lm", weights))
    return model
