"""The learned offramp: a 1-layer BiLSTM over per-token [attention log-prob, CTC increment] (Wang & Lin, Sec. 6).

Low-probability tokens in a run suggest the model lost the sentence, scattered ones mere acoustic noise; rather
than hand-write such rules, a ~11k-parameter BiLSTM reads the sequence and predicts P(local WER > a bar; the
paper's is 0.1); the last pilot's offramp averages three, fitted from three seeds (offramp_net.TrainOptions).
They are trained on dev-split replays (`pasu.device.offramp_data`) and score a hypothesis through the `Offramp`
protocol (fitting, scoring and saving: `pasu.device.offramp_net`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from pasu.device.decoding.search import Hypothesis
from pasu.device.offramp_data import HypothesisFeatures
from pasu.device.offramp_net import LearnedOfframp, TrainOptions
from torch import nn

LOGP_FLOOR = -30.0  # clip log-probs here: a banned or impossible token (-1e10) would swamp the LSTM's inputs


@dataclass(frozen=True)
class BiLstmConfig:
    """Shape of the network."""

    hidden_size: int = 35  # per direction: 35 gives 10,991 parameters (the paper: 11.1k)
    input_size: int = 2  # [attention log-prob, CTC prefix-score increment] per token


def token_features(hypothesis: Hypothesis | HypothesisFeatures, with_end: bool = True) -> np.ndarray:
    """(L, 2) float32: per-token attention log-prob and CTC increment, clipped to [LOGP_FLOOR, 0]; without
    `with_end`, the <eos> step left out."""
    att = np.asarray(hypothesis.token_att, dtype=np.float64)
    if not with_end:
        att = att[:len(hypothesis.tokens)]
    ctc = np.zeros_like(att)
    n = min(len(att), len(hypothesis.token_ctc))
    ctc[:n] = np.asarray(hypothesis.token_ctc[:n], dtype=np.float64)  # no CTC record (weight 0): zeros
    features = np.stack([att, ctc], axis=1) if len(att) else np.zeros((1, 2))  # an empty hypothesis: one blank step
    return np.clip(np.nan_to_num(features, neginf=LOGP_FLOOR), LOGP_FLOOR, 0.0).astype(np.float32)


def pilot_features(hypothesis: Hypothesis | HypothesisFeatures) -> np.ndarray:
    """A pilot's `token_features` over its words: its <eos> step, which only the pilots that ended before the
    token cap have, says whether the command sounded finished when it ran, not whether its words are right (on
    all 2,033 `dev` replays, two seeds, 0.60 / 0.67x NaiveHybrid at the fourth WER target with it, 0.59 / 0.63x
    without: the offramp's calibration log)."""
    return token_features(hypothesis, with_end=False)


class BiLstmNet(nn.Module):
    """Sequence -> logit of "local WER above the bar": both directions' last states, then one linear layer."""

    def __init__(self, config: BiLstmConfig = BiLstmConfig()):
        super().__init__()
        self.config = config
        self.lstm = nn.LSTM(config.input_size, config.hidden_size, num_layers=1, batch_first=True,
                            bidirectional=True)
        self.head = nn.Linear(2 * config.hidden_size, 1)

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        # features: (B, L, 2) zero-padded; lengths: (B,) on the CPU. Packing keeps padding out of the states.
        packed = nn.utils.rnn.pack_padded_sequence(features, lengths, batch_first=True, enforce_sorted=False)
        _, (h, _) = self.lstm(packed)  # h: (2, B, H), forward and backward final states
        return self.head(torch.cat([h[0], h[1]], dim=1)).squeeze(1)


class BiLstmOfframp(LearnedOfframp):
    """Offramp: P(local WER above the training bar) of a hypothesis under a trained BiLstmNet."""

    weights_file = "bilstm.pt"
    config_file = "bilstm.json"
    net_class = BiLstmNet
    config_class = BiLstmConfig
    features = staticmethod(pilot_features)


class LateBiLstmOfframp(BiLstmOfframp):
    """The same network fitted on, and judging, the full local decode (the bilstm-late policy). A full decode has
    heard the whole command: the pilots' network reads it better than it reads a pilot, and one fitted on full
    decodes better still (the offramp's calibration log)."""

    weights_file = "bilstm_late.pt"
    config_file = "bilstm_late.json"
    judges = "final"
    features = staticmethod(token_features)  # it heard the whole command: its <eos> counts


class EndBiLstmOfframp(BiLstmOfframp):
    """The same network fitted on, and judging, the end-of-speech pilot (the bilstm-end policy): the CTC's best path
    over the whole input, a few milliseconds after its encode (BeamSearch.ctc_greedy)."""

    weights_file = "bilstm_end.pt"
    config_file = "bilstm_end.json"
    judges = "end"
    features = staticmethod(token_features)  # as the full decode's


def train(sequences: Sequence[np.ndarray], labels: np.ndarray, options: TrainOptions = TrainOptions(),
          config: BiLstmConfig = BiLstmConfig()) -> BiLstmOfframp:
    """A BiLstmNet fitted on `sequences` (pasu.device.offramp_net.fit)."""
    return BiLstmOfframp.train(sequences, labels, options, config)
