"""The intent-agreement offramp: a text classifier reading the pilot's words, stored without pickle."""

from __future__ import annotations

import numpy as np
import pytest

from pasu.device.bilstm_offramp import TrainOptions
from pasu.device.decoding.search import Hypothesis
from pasu.device.intent_offramp import IntentAgreementOfframp
from pasu.device.offramp_data import HypothesisFeatures, OfframpSample
from pasu.device.offramp_train import OfframpTrainOptions, fit_offramps
from pasu.metrics import SluResult


def test_words_that_read_as_another_command_score_higher(small_reader):
    # the device model's reading of its tokens, here a table: tokens (1, ...) mean "alarm_set" + these words
    readings = {(1, 2): SluResult("set an alarm for six", "alarm_set"), (1, 3): SluResult("play some jazz", "alarm_set")}
    offramp = IntentAgreementOfframp(small_reader, lambda tokens: readings[tuple(tokens)])
    agreeing = offramp.score(Hypothesis((1, 2), 0.0, True))
    contradicting = offramp.score(Hypothesis((1, 3), 0.0, True))
    assert 0.0 <= agreeing < 0.5 < contradicting <= 1.0


def test_calibrated_beside_the_other_offramps(small_reader, commands):
    """Its thresholds sit in the same report, for the same offload levels, on scores weighed by length."""
    texts = list(commands)
    samples, readings = [], {}
    for i in range(30):
        wrong = i % 2 == 1  # the pilot says alarm_set, its words say otherwise
        heard = SluResult(texts[(4 + i) % 8] if wrong else texts[i % 4], "alarm_set")
        readings[(i,)] = heard
        features = HypothesisFeatures((i,), (-0.5, -0.5), (-0.5, -0.5), True)
        samples.append(OfframpSample(f"u{i}", 1.0 + i % 3, SluResult(texts[i % 4], "alarm_set"), heard,
                                     4 if wrong else 0, 5, 0.1, 0.02, 1, features, features))
    offramp = IntentAgreementOfframp(small_reader, lambda tokens: readings[tuple(tokens)])
    _, report = fit_offramps(samples, OfframpTrainOptions(bilstm=TrainOptions(epochs=2), folds=3), intent=offramp)
    assert report["intent"]["selectivity"]["roc_auc"] > 0.9  # it finds the utterances whose words disagree
    levels = report["intent"]["levels"]
    assert levels["L"]["threshold"] >= levels["M"]["threshold"] >= levels["H"]["threshold"]
    scores = np.array([offramp.score(s.early.hypothesis()) * s.duration for s in samples])
    assert np.mean(scores > levels["M"]["threshold"]) == pytest.approx(levels["M"]["offload_ratio"])
