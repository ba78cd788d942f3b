"""The learned offramp: a 1-layer BiLSTM over per-token [attention log-prob, CTC increment] (Wang & Lin, Sec. 6).

Low-probability tokens in a run suggest the model lost the sentence, scattered ones mere acoustic noise; rather
than hand-write such rules, a ~11k-parameter BiLSTM reads the sequence and predicts P(local WER > a bar; the
paper's is 0.1). It is trained on dev-split replays (`pasu.device.offramp_data`) and scores a hypothesis through
the `Offramp` protocol.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from pasu.device.decoding.search import Hypothesis
from pasu.device.offramp_data import BAD_WER, HypothesisFeatures, OfframpSample
from torch import nn

LOGP_FLOOR = -30.0  # clip log-probs here: a banned or impossible token (-1e10) would swamp the LSTM's inputs
WEIGHTS = "bilstm.pt"
CONFIG = "bilstm.json"


@dataclass(frozen=True)
class BiLstmConfig:
    """Shape of the network."""

    hidden_size: int = 35  # per direction: 35 gives 10,991 parameters (the paper: 11.1k)
    input_size: int = 2  # [attention log-prob, CTC prefix-score increment] per token


@dataclass(frozen=True)
class TrainOptions:
    """How the BiLSTM is fitted on dev replays."""

    epochs: int = 60  # passes over the training samples
    batch_size: int = 32  # samples per step
    learning_rate: float = 3e-3  # Adam
    weight_decay: float = 1e-4  # Adam's L2 term: dev splits are small
    seed: int = 0  # initialization and shuffling
    # The label: local WER above this is "wrong". The paper's 0.1 splits its dev set usefully; for a device whose
    # WER is far above it nearly every utterance is "wrong", and a higher bar ranks better (`pasu offramp train`
    # prints how well a perfect classifier of the label would do).
    bad_wer: float = BAD_WER


def token_features(hypothesis: Hypothesis | HypothesisFeatures) -> np.ndarray:
    """(L, 2) float32: per-token attention log-prob and CTC increment, clipped to [LOGP_FLOOR, 0]."""
    att = np.asarray(hypothesis.token_att, dtype=np.float64)
    ctc = np.zeros_like(att)
    n = min(len(att), len(hypothesis.token_ctc))
    ctc[:n] = np.asarray(hypothesis.token_ctc[:n], dtype=np.float64)  # no CTC record (weight 0): zeros
    features = np.stack([att, ctc], axis=1) if len(att) else np.zeros((1, 2))  # an empty hypothesis: one blank step
    return np.clip(np.nan_to_num(features, neginf=LOGP_FLOOR), LOGP_FLOOR, 0.0).astype(np.float32)


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


def parameter_count(net: nn.Module) -> int:
    return sum(p.numel() for p in net.parameters())


def _batch(sequences: Sequence[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([len(s) for s in sequences])
    padded = nn.utils.rnn.pad_sequence([torch.from_numpy(s) for s in sequences], batch_first=True)
    return padded, lengths


class BiLstmOfframp:
    """Offramp: P(local WER above the training bar) of a hypothesis under a trained BiLstmNet."""

    def __init__(self, net: BiLstmNet):
        self.net = net.eval()

    def score(self, hypothesis: Hypothesis) -> float:
        return float(self.probabilities([token_features(hypothesis)])[0])

    @torch.no_grad()
    def probabilities(self, sequences: Sequence[np.ndarray]) -> np.ndarray:
        """Scores of many feature sequences at once (benchmarks, calibration)."""
        padded, lengths = _batch(sequences)
        return torch.sigmoid(self.net(padded, lengths)).numpy()

    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(self.net.state_dict(), folder / WEIGHTS)
        (folder / CONFIG).write_text(json.dumps(asdict(self.net.config), indent=2))
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> BiLstmOfframp:
        folder = Path(folder)
        net = BiLstmNet(BiLstmConfig(**json.loads((folder / CONFIG).read_text())))
        net.load_state_dict(torch.load(folder / WEIGHTS, map_location="cpu", weights_only=True))
        return cls(net)


def training_set(samples: Sequence[OfframpSample], bad_wer: float = BAD_WER) -> tuple[list[np.ndarray], np.ndarray]:
    """Features of the hypotheses the early decision judged, and the labels (1: local WER > `bad_wer`)."""
    kept = [s for s in samples if s.early is not None]
    return [token_features(s.early) for s in kept], np.array([float(s.bad(bad_wer)) for s in kept], dtype=np.float32)


def train(sequences: Sequence[np.ndarray], labels: np.ndarray, options: TrainOptions = TrainOptions(),
          config: BiLstmConfig = BiLstmConfig()) -> BiLstmOfframp:
    """Fit a BiLstmNet with class-balanced binary cross-entropy (bad local results may be rare or common)."""
    if len(sequences) != len(labels) or not len(sequences):
        raise ValueError(f"need aligned, non-empty data ({len(sequences)} sequences, {len(labels)} labels)")
    torch.manual_seed(options.seed)
    rng = random.Random(options.seed)
    net = BiLstmNet(config)
    optimizer = torch.optim.Adam(net.parameters(), lr=options.learning_rate, weight_decay=options.weight_decay)
    positives = float(labels.sum())
    pos_weight = torch.tensor((len(labels) - positives) / positives if 0 < positives < len(labels) else 1.0)
    loss_fn = nn.BCEWithLogitsLoss(pos_weight=pos_weight)
    order = list(range(len(sequences)))
    net.train()
    for _ in range(options.epochs):
        rng.shuffle(order)
        for start in range(0, len(order), options.batch_size):
            idx = order[start:start + options.batch_size]
            padded, lengths = _batch([sequences[i] for i in idx])
            loss = loss_fn(net(padded, lengths), torch.from_numpy(labels[idx]))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return BiLstmOfframp(net)
