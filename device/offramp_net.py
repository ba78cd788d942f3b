"""What the learned offramps share: a small network over a sequence (per-token scores, encoder frames) that
predicts P(local WER above a bar), fitted on dev replays with class-balanced binary cross-entropy from a few
seeds whose probabilities are averaged, scored through the `Offramp` protocol and saved as weights + a JSON
config.

Each offramp module brings its network (`forward(features (B, L, D) zero-padded, lengths (B,)) -> logits
(B,)`), its config dataclass and how it reads a hypothesis (`features`); the rest is here.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from pasu.device.decoding.search import Hypothesis
from pasu.device.offramp_data import BAD_WER, HypothesisFeatures, OfframpSample
from pasu.device.routing import Judged
from torch import nn

SCORE_BATCH = 256  # sequences per forward pass when scoring many (calibration, benchmarks)
LABELS = ("bad", "wer")  # TrainOptions.label


@dataclass(frozen=True)
class TrainOptions:
    """How a learned offramp is fitted on dev replays."""

    epochs: int = 60  # passes over the training samples
    batch_size: int = 32  # samples per step
    learning_rate: float = 3e-3  # Adam
    weight_decay: float = 1e-4  # Adam's L2 term: dev splits are small
    seed: int = 0  # initialization and shuffling of the first network; the others take the next seeds
    # Networks fitted, each from its own seed, whose probabilities the offramp averages. One network's seed moved
    # the pilot BiLSTM's offload at the fourth WER target between 0.56 and 0.62x NaiveHybrid on 1,000 `test`
    # replays; the mean of three or five seeds held 0.56-0.57x (the offramp's calibration log).
    networks: int = 3
    # The label: local WER above this is "wrong". The paper's 0.1 splits its dev set usefully; for a device whose
    # WER is far above it nearly every utterance is "wrong", and a higher bar ranks better (`pasu offramp train`
    # prints how well a perfect classifier of the label would do).
    bad_wer: float = BAD_WER
    # What the network learns to predict: "bad", the paper's label (1 when local WER > bad_wer); "wer", the local
    # WER itself, clipped to 1, as a soft label. The policy weighs a score by the speech's seconds, so a score that
    # tracks how wrong the pilot is, not only whether it is, ranks by expected word errors, what WER targets count
    # (on all 2,974 `test` utterances it did no better than the paper's label: the offramp's calibration log).
    label: str = "bad"

    def __post_init__(self) -> None:
        if self.networks < 1:
            raise ValueError(f"an offramp needs at least one network, not {self.networks}")
        if self.label not in LABELS:
            raise ValueError(f"offramp label {self.label!r}: choose one of {', '.join(LABELS)}")

    def label_of(self, sample: OfframpSample) -> float:
        """What the network is fitted to predict of a replay."""
        return min(sample.local_wer, 1.0) if self.label == "wer" else float(sample.bad(self.bad_wer))


def pad_batch(sequences: Sequence[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L, D) zero-padded float32 features and the (B,) lengths."""
    lengths = torch.tensor([len(s) for s in sequences])
    padded = nn.utils.rnn.pad_sequence([torch.from_numpy(np.asarray(s, np.float32)) for s in sequences],
                                       batch_first=True)
    return padded, lengths


def fit(net: nn.Module, sequences: Sequence[np.ndarray], labels: np.ndarray, options: TrainOptions) -> nn.Module:
    """`net` trained in place (and returned, in eval mode); on the paper's label class-balanced, as bad local
    results may be rare or common; on soft labels (label "wer") not, so that scores estimate the WER."""
    if len(sequences) != len(labels) or not len(sequences):
        raise ValueError(f"need aligned, non-empty data ({len(sequences)} sequences, {len(labels)} labels)")
    rng = random.Random(options.seed)
    optimizer = torch.optim.Adam(net.parameters(), lr=options.learning_rate, weight_decay=options.weight_decay)
    positives = float(labels.sum())
    balanced = options.label == "bad" and 0 < positives < len(labels)
    pos_weight = torch.tensor((len(labels) - positives) / positives if balanced else 1.0)
    loss_fn = nn.BCEWithLogitsLoss(pos_weight=pos_weight)
    order = list(range(len(sequences)))
    net.train()
    for _ in range(options.epochs):
        rng.shuffle(order)
        for start in range(0, len(order), options.batch_size):
            idx = order[start:start + options.batch_size]
            padded, lengths = pad_batch([sequences[i] for i in idx])
            loss = loss_fn(net(padded, lengths), torch.from_numpy(np.asarray(labels[idx], np.float32)))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return net.eval()


class LearnedOfframp:
    """Offramp: P(local WER above the training bar) of a hypothesis, the mean of its trained networks'."""

    weights_file: ClassVar[str]
    config_file: ClassVar[str]
    net_class: ClassVar[type[nn.Module]]  # built from one config_class instance
    config_class: ClassVar[type]
    # what the network judges and learns from (routing.Judged): the last pilot (the early decision), the
    # end-of-speech pilot, or the full local decode (the decisions after either)
    judges: ClassVar[Judged] = "pilot"

    def __init__(self, nets: nn.Module | Sequence[nn.Module]):
        self.nets = [n.eval() for n in ([nets] if isinstance(nets, nn.Module) else nets)]
        if not self.nets:
            raise ValueError("an offramp needs at least one network")

    @property
    def config(self) -> Any:
        """The networks' shape (all share it)."""
        return self.nets[0].config

    @staticmethod
    def features(hypothesis: Hypothesis | HypothesisFeatures) -> np.ndarray:
        """(L, D) what the network reads of a hypothesis."""
        raise NotImplementedError

    @classmethod
    def judged(cls, sample: OfframpSample) -> HypothesisFeatures | None:
        """The hypothesis of a replay this network judges (`judges`; replays missing it lend their pilot); None: the
        replay has nothing to judge."""
        return (sample.judged(cls.judges) or sample.early) if sample.early is not None else None

    @classmethod
    def training_set(cls, samples: Sequence[OfframpSample],
                     options: TrainOptions = TrainOptions()) -> tuple[list[np.ndarray], np.ndarray]:
        """Features of the hypotheses the network judges (`judged`) of the replays the early decision had one for,
        and their labels (`TrainOptions.label_of`)."""
        kept = [s for s in samples if s.early is not None]
        return [cls.features(cls.judged(s)) for s in kept], np.array([options.label_of(s) for s in kept], np.float32)

    def score(self, hypothesis: Hypothesis) -> float:
        return float(self.probabilities([self.features(hypothesis)])[0])

    @torch.no_grad()
    def probabilities(self, sequences: Sequence[np.ndarray]) -> np.ndarray:
        """Scores of many feature sequences at once (benchmarks, calibration)."""
        out = []
        for i in range(0, len(sequences), SCORE_BATCH):
            batch = pad_batch(sequences[i:i + SCORE_BATCH])
            out.append(torch.stack([torch.sigmoid(net(*batch)) for net in self.nets]).mean(0).numpy())
        return np.concatenate(out) if out else np.zeros(0, np.float32)

    def save(self, folder: str | Path) -> Path:
        """The weights file holds one network's state dict, or a list of them for several (float32: ~45 kB a
        BiLSTM)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        states = [net.state_dict() for net in self.nets]
        torch.save(states[0] if len(states) == 1 else states, folder / self.weights_file)
        (folder / self.config_file).write_text(json.dumps(asdict(self.config), indent=2))
        return folder

    @classmethod
    def exists(cls, folder: str | Path) -> bool:
        return (Path(folder) / cls.weights_file).is_file()

    @classmethod
    def load(cls, folder: str | Path) -> LearnedOfframp:
        folder = Path(folder)
        config = cls.config_class(**json.loads((folder / cls.config_file).read_text()))
        states = torch.load(folder / cls.weights_file, map_location="cpu", weights_only=True)
        nets = []
        for state in states if isinstance(states, list) else [states]:  # one network: a bare state dict
            net = cls.net_class(config)
            net.load_state_dict(state)
            nets.append(net)
        return cls(nets)

    @classmethod
    def train(cls, sequences: Sequence[np.ndarray], labels: np.ndarray, options: TrainOptions = TrainOptions(),
              config: Any = None) -> LearnedOfframp:
        """`options.networks` networks fitted on `sequences` from seeds `options.seed` on; `config`: their shape
        (None: config_class's defaults)."""
        nets = []
        for k in range(options.networks):
            seeded = replace(options, seed=options.seed + k)
            torch.manual_seed(seeded.seed)
            net = cls.net_class(config if config is not None else cls.config_class())
            nets.append(fit(net, sequences, labels, seeded))
        return cls(nets)


Fitter = Callable[[Sequence[np.ndarray], np.ndarray], LearnedOfframp]  # (sequences, labels) -> fitted offramp
