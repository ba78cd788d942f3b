"""The device's intent, read twice: by its decoder and by a small text classifier over the decoded words.

The SLU model emits the intent first and the words after it; a classifier trained on the training sentences
(`pasu.models.intent_reader.IntentReader`, TF-IDF over word uni- and bigrams + logistic regression) reads the
same words. The device answers with their mixture: the decoder's intent carries the probability the decoder
gave it, the rest is spread as the classifier reads the words. It needs no tuning: on all 2,033 dev replays
of the shipped device model (`pasu offramp train` prints it) it answers the right intent for 68.3% of them
against 65.2% for the decoder alone; on the 300 of the calibration, 70.3% against 64.7% (a fixed weight for the
decoder, tuned on them in 2-fold cross-validation: 67-69%).

The intent offramp judges the last pilot by the same mixture: its doubt is 1 - the probability of the
mixture's intent. Offloading the top 47% of those 300 by it (weighed by the speech's seconds, as every
offramp's score is), with the answers of the cloud of then (the Conformer's fifth run as second opinion)
decoded offline, gave 76.3% hybrid intent accuracy, against 73.3% for the previous score (1 -
P_classifier(decoder's intent | words), the local answer the decoder's); offloading everything gave 78.7%.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from pasu.device.decoding.search import Hypothesis
from pasu.metrics import SluResult

if TYPE_CHECKING:  # scikit-learn loads only with a reader (load_device_model), not with every DeviceModel
    from pasu.models.intent_reader import IntentReader


def intent_confidence(hypothesis: Hypothesis) -> float:
    """The decoder's probability of the hypothesis's first token, its intent (0 for an empty hypothesis)."""
    return math.exp(hypothesis.token_att[0]) if hypothesis.tokens and hypothesis.token_att else 0.0


class IntentMixture:
    """P(intent) = c [intent = the decoder's] + (1 - c) P_reader(intent | words), c the decoder's confidence."""

    def __init__(self, reader: IntentReader):
        self.reader = reader

    def reading(self, slu: SluResult, confidence: float) -> tuple[str, float]:
        """The mixture's most probable intent for the decoder's reading `slu`, and its probability."""
        reader = self.reader
        mixture = (1.0 - confidence) * reader.distribution([slu.text], reader.classes)[0]
        own = confidence + (float(mixture[reader.index[slu.intent]]) if slu.intent in reader.index else 0.0)
        best = int(mixture.argmax())
        # ties go to the decoder, whose intent may be one the training sentences never had
        return (slu.intent, own) if own >= mixture[best] else (reader.classes[best], float(mixture[best]))


class IntentAgreementOfframp:
    """1 - P_mixture(its intent): high when neither the decoder nor the words are sure of the command."""

    def __init__(self, mixture: IntentMixture, read: Callable[[Sequence[int]], SluResult]):
        self.mixture = mixture
        self.read = read  # output tokens -> transcript and intent (DeviceModel.read)

    def score(self, hypothesis: Hypothesis) -> float:
        _, probability = self.mixture.reading(self.read(hypothesis.tokens), intent_confidence(hypothesis))
        return 1.0 - probability
