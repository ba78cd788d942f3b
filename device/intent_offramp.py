"""Offramp: do the last pilot's words, read by a small text classifier, agree with the pilot's intent?

The SLU model emits the intent first and the words after it. When the words it has heard so far read as
another command to a classifier trained on the training sentences, its intent is likely wrong, and wrong
intents are what the cloud fixes and what perplexity ranks worst (it scores words, most of which are right).
The policy weighs the score by the speech's seconds, as it does every offramp's. On the 300 dev utterances of
the shipped calibration, with the answers of the cloud of that time (the Conformer's third run as second
opinion) decoded offline: offloading the top 47% by the weighed score
kept intent accuracy 0.7 points under offloading everything (unweighed: 0.3 above), and needed 0.20 / 0.53 /
0.74 / 0.81x NaiveHybrid's offloading at the four WER targets (unweighed: 0.32 / 0.65 / 0.80 / 0.85x).
The classifier is `pasu.models.intent_reader.IntentReader` (TF-IDF over word uni- and bigrams + logistic
regression), fitted on the training sentences.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pasu.device.decoding.search import Hypothesis
from pasu.metrics import SluResult
from pasu.models.intent_reader import IntentReader


class IntentAgreementOfframp:
    """1 - P(the hypothesis's intent | its words): higher when the words read as another command."""

    def __init__(self, reader: IntentReader, read: Callable[[Sequence[int]], SluResult]):
        self.reader = reader
        self.read = read  # output tokens -> transcript and intent (DeviceModel.read)

    def score(self, hypothesis: Hypothesis) -> float:
        slu = self.read(hypothesis.tokens)
        return float(1.0 - self.reader.probabilities([slu.text], [slu.intent])[0])
