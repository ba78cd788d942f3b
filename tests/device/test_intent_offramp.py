"""The intent-agreement offramp: a text classifier reading the pilot's words, stored without pickle."""

from __future__ import annotations

import numpy as np
import pytest

from pasu.device.bilstm_offramp import TrainOptions
from pasu.device.decoding.search import Hypothesis
from pasu.device.intent_offramp import READER_FILES, IntentAgreementOfframp, IntentReader, ReaderOptions
from pasu.device.offramp_data import HypothesisFeatures, OfframpSample
from pasu.device.offramp_train import OfframpTrainOptions, fit_offramps
from pasu.metrics import SluResult

SENTENCES = {
    "wake me up at seven": "alarm_set", "set an alarm for six am": "alarm_set", "alarm at nine please": "alarm_set",
    "set an alarm for noon": "alarm_set", "play some jazz": "play_music", "play my rock playlist": "play_music",
    "put on some music": "play_music", "play the new album": "play_music", "what is the weather today": "weather_query",
    "will it rain tomorrow": "weather_query", "is it cold outside": "weather_query", "weather in paris": "weather_query",
}
SMALL = ReaderOptions(min_df=1)  # a dozen sentences: every n-gram is rare


def reader() -> IntentReader:
    return IntentReader.fit(list(SENTENCES), list(SENTENCES.values()), SMALL)


def test_the_reader_tells_which_command_the_words_are():
    p = reader().probabilities(["play some rock music", "set an alarm for seven", "play some rock music"],
                               ["play_music", "alarm_set", "weather_query"])
    assert p[0] > 0.5 and p[1] > 0.5 and p[2] < 0.2
    assert reader().probabilities(["play jazz"], ["an_intent_never_seen"])[0] == 0.0


def test_saved_as_arrays_and_loaded_back_the_same(tmp_path):
    original = reader()
    folder = original.save(tmp_path / "offramp")
    assert sorted(f.name for f in folder.iterdir()) == sorted(READER_FILES)  # no pickle
    texts, intents = ["will it rain in paris", "play the album"], ["weather_query", "alarm_set"]
    loaded = IntentReader.load(folder)
    np.testing.assert_allclose(loaded.probabilities(texts, intents), original.probabilities(texts, intents), atol=2e-3)


def test_words_that_read_as_another_command_score_higher():
    # the device model's reading of its tokens, here a table: tokens (1, ...) mean "alarm_set" + these words
    readings = {(1, 2): SluResult("set an alarm for six", "alarm_set"), (1, 3): SluResult("play some jazz", "alarm_set")}
    offramp = IntentAgreementOfframp(reader(), lambda tokens: readings[tuple(tokens)])
    agreeing = offramp.score(Hypothesis((1, 2), 0.0, True))
    contradicting = offramp.score(Hypothesis((1, 3), 0.0, True))
    assert 0.0 <= agreeing < 0.5 < contradicting <= 1.0


def test_calibrated_beside_the_other_offramps():
    """Its thresholds sit in the same report, for the same offload levels, on scores weighed by length."""
    texts = list(SENTENCES)
    samples, readings = [], {}
    for i in range(30):
        wrong = i % 2 == 1  # the pilot says alarm_set, its words say otherwise
        heard = SluResult(texts[(4 + i) % 8] if wrong else texts[i % 4], "alarm_set")
        readings[(i,)] = heard
        features = HypothesisFeatures((i,), (-0.5, -0.5), (-0.5, -0.5), True)
        samples.append(OfframpSample(f"u{i}", 1.0 + i % 3, SluResult(texts[i % 4], "alarm_set"), heard,
                                     4 if wrong else 0, 5, 0.1, 0.02, 1, features, features))
    offramp = IntentAgreementOfframp(reader(), lambda tokens: readings[tuple(tokens)])
    _, report = fit_offramps(samples, OfframpTrainOptions(bilstm=TrainOptions(epochs=2), folds=3), intent=offramp)
    assert report["intent"]["selectivity"]["roc_auc"] > 0.9  # it finds the utterances whose words disagree
    levels = report["intent"]["levels"]
    assert levels["L"]["threshold"] >= levels["M"]["threshold"] >= levels["H"]["threshold"]
    scores = np.array([offramp.score(s.early.hypothesis()) * s.duration for s in samples])
    assert np.mean(scores > levels["M"]["threshold"]) == pytest.approx(levels["M"]["offload_ratio"])
