"""The encoder-output offramp (Wang & Lin, Sec. 6, "CNN-based approach"): two 1-D convolutions over the encoder
output the last pilot searched, pooled over time, then two linear layers, predict P(local WER > a bar).

The per-token scores the PPL and BiLSTM offramps read say how sure the decoder was of the words it chose; the
encoder output also shows what the audio was like (noise, an unclear stretch) where the decoder stayed sure.
The paper's CNN has 192.5 M parameters over a much larger encoder; fitted on ~2k dev replays here, a network of
that size would only memorize them, so this one reduces the encoder's frames to 32 channels first (29,281
parameters for a 144-dim encoder). It reads the pilot's encoder output, which the pilot search already holds
(`Hypothesis.encoded`), so it decides at the same moment as the other early offramps. With the shipped device it
ranked dev's calibration utterances better than the BiLSTM and `test`'s no better (its calibration log,
models/shipped/device/offramp/CALIBRATION_LOG.md): the bench prices it, the agent's policies do not use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from pasu.device.decoding.search import Hypothesis
from pasu.device.offramp_data import HypothesisFeatures, OfframpSample
from pasu.device.offramp_net import LearnedOfframp, TrainOptions
from torch import nn

# fitting: fewer, slower steps than the BiLSTM's (frames, not tokens: ~20x longer sequences, 70x the inputs), and
# one network: three would triple the slowest fit of `pasu offramp train` for a check only the bench prices
CNN_TRAINING = TrainOptions(epochs=30, learning_rate=1e-3, weight_decay=1e-3, networks=1)


@dataclass(frozen=True)
class CnnConfig:
    """Shape of the network."""

    input_size: int = 144  # the encoder's output size (the shipped device model's; fitting reads it off the data)
    channels: int = 32  # of both convolutions
    kernel_size: int = 5  # frames (odd: centered); the second convolution strides by 2
    hidden_size: int = 16  # of the first linear layer


class CnnNet(nn.Module):
    """(B, T, D) frames -> logit of "local WER above the bar": conv, conv (stride 2), mean and max over the valid
    frames, linear, linear."""

    def __init__(self, config: CnnConfig = CnnConfig()):
        super().__init__()
        self.config = config
        pad = config.kernel_size // 2
        self.conv1 = nn.Conv1d(config.input_size, config.channels, config.kernel_size, padding=pad)
        self.conv2 = nn.Conv1d(config.channels, config.channels, config.kernel_size, stride=2, padding=pad)
        self.fc1 = nn.Linear(2 * config.channels, config.hidden_size)
        self.fc2 = nn.Linear(config.hidden_size, 1)

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        # Frames past a sequence's length are zeroed after each convolution, as the convolution's own zero
        # padding would be: a sequence scores the same alone and in a padded batch.
        x = features.transpose(1, 2) * _valid(lengths, features.size(1))  # (B, D, T)
        x = torch.relu(self.conv1(x)) * _valid(lengths, x.size(2))
        lengths = (lengths - 1) // 2 + 1  # after the stride (kernel odd, padding kernel // 2)
        x = torch.relu(self.conv2(x))
        mask = _valid(lengths, x.size(2))
        mean = (x * mask).sum(2) / lengths.unsqueeze(1)
        peak = x.masked_fill(mask == 0, 0.0).amax(2)  # after ReLU: 0 is below no valid frame
        hidden = torch.relu(self.fc1(torch.cat([mean, peak], dim=1)))
        return self.fc2(hidden).squeeze(1)


def _valid(lengths: torch.Tensor, frames: int) -> torch.Tensor:
    """(B, 1, frames) 1.0 where a frame is within its sequence's length."""
    return (torch.arange(frames).unsqueeze(0) < lengths.unsqueeze(1)).unsqueeze(1).float()


def encoder_features(hypothesis: Hypothesis | HypothesisFeatures) -> np.ndarray:
    """(T, D) float32: the encoder output the hypothesis was searched on."""
    encoded = hypothesis.encoded
    if encoded is None:
        raise ValueError("the CNN offramp reads the encoder output a hypothesis was searched on, and this one "
                         "carries none (replays cached before it was kept: run `pasu offramp train` again)")
    array = encoded.numpy() if isinstance(encoded, torch.Tensor) else np.asarray(encoded)
    if not len(array):
        return np.zeros((1, array.shape[1]), np.float32)  # no frames yet: one silent step
    return array.astype(np.float32)


class CnnOfframp(LearnedOfframp):
    """Offramp: P(local WER above the training bar) of a hypothesis' encoder output under a trained CnnNet."""

    weights_file = "cnn.pt"
    config_file = "cnn.json"
    net_class = CnnNet
    config_class = CnnConfig
    features = staticmethod(encoder_features)


def has_encodings(samples: Sequence[OfframpSample]) -> bool:
    """Whether every early hypothesis of `samples` kept its encoder output (replays made since it is kept)."""
    return all(s.early.encoded is not None for s in samples if s.early is not None)


def train(sequences: Sequence[np.ndarray], labels: np.ndarray, options: TrainOptions = CNN_TRAINING) -> CnnOfframp:
    """A CnnNet sized to the sequences' frames, fitted on them (pasu.device.offramp_net.fit)."""
    if not len(sequences):
        raise ValueError("need at least one encoder output to fit the CNN offramp")
    return CnnOfframp.train(sequences, labels, options, CnnConfig(input_size=int(sequences[0].shape[1])))
