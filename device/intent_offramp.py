"""The device's intent, read twice: by its decoder and by a small text classifier over the decoded words.

The SLU model emits the intent first and the words after it; a classifier trained on the training sentences
(`pasu.models.intent_reader.IntentReader`, TF-IDF over word uni- and bigrams and the character 2- to 5-grams
inside words + logistic regression; `pasu offramp train` fits it) reads the same words. The device answers with
their mixture: the decoder's intent carries a share (`DECODER_SHARE`) of the probability the decoder gave it, the
rest is spread as the classifier reads the words. The decoder is sure of intents it misheard; the character
n-grams read a misheard word by its right parts. Chosen on all 2,033 dev replays of the shipped device model
(`scripts/intent_mixture_check.py`, the reader fitted also on the pseudo-labelled sentences the model trained
on): 79.6% of the answers right against 77.8% for the word reader at the decoder's full confidence (the mixture
before) and 77.1% for the decoder alone; on the 1,000 `test` replays of `pasu bench hybrid --utterances 1000`,
not used to choose, 77.3% against 74.0% and 72.7%.

The intent offramp ranks the last pilot by how likely the device's intent is wrong: a logistic regression over
what the pilot shows about its intent (`INTENT_EVIDENCE`: the mixture's doubt, 1 - the probability of its
intent, first), fitted on the dev replays by `pasu offramp train`. Intent accuracy counts utterances, not words,
so its score is not weighed by the speech's length. On 1,000 `test` utterances (`pasu bench hybrid
--utterances 1000`, Wi-Fi), at Offload-M it offloads 44.6% for 81.2% hybrid intent accuracy (41.9% for 81.0% with
the word reader at the decoder's full confidence, against 43.8% for 80.2% by that mixture's doubt weighed by
seconds, the check it replaced); offloading everything gives 81.9%.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from pasu.device.decoding.search import Hypothesis
from pasu.metrics import SluResult

if TYPE_CHECKING:  # scikit-learn loads only with a reader (load_device_model), not with every DeviceModel
    from pasu.models.intent_reader import IntentReader


def intent_confidence(hypothesis: Hypothesis) -> float:
    """The decoder's probability of the hypothesis's first token, its intent (0 for an empty hypothesis)."""
    return math.exp(hypothesis.token_att[0]) if hypothesis.tokens and hypothesis.token_att else 0.0


# The device's reader reads word 1-2-grams and the character 2-to-this-grams inside words (ReaderOptions). Chosen
# with DECODER_SHARE on the shipped model's 2,033 dev replays (`scripts/intent_mixture_check.py`): 79.6% of their
# answers right against 77.8% for words alone with the decoder's full confidence.
READER_CHAR_NGRAMS = 5
# How much of its confidence the decoder's intent keeps in the mixture: the decoder is over-confident on words
# it misheard, the reader's character n-grams still see what the words were meant to be
DECODER_SHARE = 0.35


class IntentMixture:
    """P(intent) = s c [intent = the decoder's] + (1 - s c) P_reader(intent | words), c the decoder's confidence,
    s its share (`DECODER_SHARE`)."""

    def __init__(self, reader: IntentReader, decoder_share: float = DECODER_SHARE):
        if not 0.0 <= decoder_share <= 1.0:
            raise ValueError(f"the decoder's share of the intent mixture must be in [0, 1], not {decoder_share}")
        self.reader = reader
        self.decoder_share = decoder_share

    def digest(self) -> str:
        """Names what the mixture answers (replay caches key on it): the reader's weights and the decoder's share."""
        return f"{self.reader.digest()}@{self.decoder_share:g}"

    def reading(self, slu: SluResult, confidence: float) -> tuple[str, float]:
        """The mixture's most probable intent for the decoder's reading `slu`, and its probability."""
        return self.most_probable(slu, *self.distribution(slu, confidence))

    def most_probable(self, slu: SluResult, mixture: np.ndarray, own: float) -> tuple[str, float]:
        """`reading` from the mixture `distribution` gave."""
        best = int(mixture.argmax())
        # ties go to the decoder, whose intent may be one the training sentences never had
        return (slu.intent, own) if own >= mixture[best] else (self.reader.classes[best], float(mixture[best]))

    def words(self, slu: SluResult) -> np.ndarray:
        """P_reader(intent | the decoded words) over the reader's classes."""
        return self.reader.distribution([slu.text], self.reader.classes)[0]

    def distribution(self, slu: SluResult, confidence: float,
                     words: np.ndarray | None = None) -> tuple[np.ndarray, float]:
        """The mixture over the reader's classes, and the probability of the decoder's intent (which the reader's
        classes may lack: then the distribution sums to 1 - its share); `words`: the reader's distribution, when
        already read."""
        share = self.decoder_share * confidence
        mixture = (1.0 - share) * (self.words(slu) if words is None else words)
        if slu.intent not in self.reader.index:
            return mixture, share
        mixture[self.reader.index[slu.intent]] += share
        return mixture, float(mixture[self.reader.index[slu.intent]])


# What the intent offramp reads off a pilot, in this order (IntentEvidence). Chosen on dev (out-of-fold over the
# 2,033 replays: ROC AUC 0.838 for the device's intent errors against 0.821 for the doubt alone); the speech's
# length and the pilots' count, which the policy does not hand an offramp, add nothing there.
INTENT_EVIDENCE = (
    "doubt",  # 1 - the mixture's probability of its intent
    "log_perplexity",  # of the attention decoder over the hypothesis
    "decoder_confidence",  # the decoder's probability of its intent token
    "reader_top",  # the reader's highest probability over the words
    "reader_margin",  # its highest minus its second
    "agree",  # 1 when the reader's top intent is the decoder's
    "tokens",  # the hypothesis' length
    "ended",  # 1 when the pilot reached <eos>
    "entropy",  # of the mixture (decoder's share on its intent, the rest as the reader reads the words)
)


class IntentEvidence:
    """A hypothesis -> the `INTENT_EVIDENCE` vector, as the device reads its intent (decoder + reader)."""

    def __init__(self, mixture: IntentMixture, read: Callable[[Sequence[int]], SluResult]):
        self.mixture = mixture
        self.read = read  # output tokens -> transcript and intent (DeviceModel.read)

    def __call__(self, hypothesis: Hypothesis) -> np.ndarray:
        slu, confidence = self.read(hypothesis.tokens), intent_confidence(hypothesis)
        words = self.mixture.words(slu)
        mixture, own = self.mixture.distribution(slu, confidence, words)
        _, probability = self.mixture.most_probable(slu, mixture, own)
        mixture = mixture / max(float(mixture.sum()), 1e-9)  # an intent the reader lacks took the decoder's share
        second, top = np.sort(words)[-2:] if len(words) > 1 else (0.0, float(words.max()))
        logps = hypothesis.token_att
        return np.array([
            1.0 - probability,
            -sum(logps) / len(logps) if logps else 0.0,
            confidence,
            top,
            top - second,
            float(self.mixture.reader.classes[int(words.argmax())] == slu.intent),
            len(hypothesis.tokens),
            float(hypothesis.ended),
            float(-(mixture * np.log(np.maximum(mixture, 1e-12))).sum()),
        ])


@dataclass(frozen=True)
class IntentErrorModel:
    """P(the device's intent is wrong | evidence): logistic regression over standardized evidence, kept as its
    arrays (a JSON file, no pickle)."""

    names: tuple[str, ...]  # the evidence, in column order
    mean: np.ndarray  # standardization
    scale: np.ndarray
    coef: np.ndarray  # on the standardized evidence
    intercept: float

    FILE = "intent_errors.json"  # inside MODEL/offramp

    @classmethod
    def fit(cls, evidence: Sequence[np.ndarray], wrong: np.ndarray,
            names: Sequence[str] | None = None) -> IntentErrorModel:
        """Fitted on rows of evidence and whether the device's intent was wrong (scikit-learn, L2, C = 1);
        `names`: the columns' (default: `INTENT_EVIDENCE` where the widths agree, else numbered)."""
        from sklearn.linear_model import LogisticRegression

        if len(set(np.asarray(wrong, bool).tolist())) < 2:
            raise ValueError("fitting the intent offramp needs replays with right and with wrong intents")
        evidence = np.asarray(evidence, float)
        width = evidence.shape[1]
        if names is None:
            names = INTENT_EVIDENCE if width == len(INTENT_EVIDENCE) else [f"evidence{i}" for i in range(width)]
        mean, scale = evidence.mean(0), evidence.std(0) + 1e-9
        fitted = LogisticRegression(max_iter=2000).fit((evidence - mean) / scale, wrong)
        return cls(tuple(names), mean, scale, fitted.coef_[0], float(fitted.intercept_[0]))

    def probabilities(self, evidence: Sequence[np.ndarray]) -> np.ndarray:
        """P(wrong) for each row."""
        standard = (np.asarray(evidence, float) - self.mean) / self.scale
        return 1.0 / (1.0 + np.exp(-(standard @ self.coef + self.intercept)))

    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        arrays = {k: getattr(self, k).tolist() for k in ("mean", "scale", "coef")}
        (folder / self.FILE).write_text(json.dumps({"names": list(self.names), **arrays,
                                                    "intercept": self.intercept}, indent=1))
        return folder

    @classmethod
    def exists(cls, folder: str | Path) -> bool:
        return (Path(folder) / cls.FILE).is_file()

    @classmethod
    def load(cls, folder: str | Path) -> IntentErrorModel:
        saved = json.loads((Path(folder) / cls.FILE).read_text())
        return cls(tuple(saved["names"]), *(np.array(saved[k]) for k in ("mean", "scale", "coef")),
                   float(saved["intercept"]))


class IntentOfframp:
    """P(the device's intent is wrong) for a hypothesis: the model over its intent evidence."""

    def __init__(self, evidence: Callable[[Hypothesis], np.ndarray], model: IntentErrorModel):
        self.evidence = evidence  # IntentEvidence of the device model
        self.model = model

    def score(self, hypothesis: Hypothesis) -> float:
        return float(self.model.probabilities(self.evidence(hypothesis)[None])[0])
