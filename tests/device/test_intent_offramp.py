"""The device's intent mixture (decoder + a text classifier over its words) and the offramp that judges it."""

from __future__ import annotations

import json
import math
from dataclasses import asdict

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from pasu.device.offramp_net import TrainOptions
from pasu.device.decoding.search import Hypothesis
from pasu.device.intent_offramp import (
    INTENT_EVIDENCE,
    IntentErrorModel,
    IntentEvidence,
    IntentMixture,
    IntentOfframp,
    intent_confidence,
)
from pasu.device.offramp_data import HypothesisFeatures, OfframpSample
from pasu.device.offramp_train import OfframpTrainOptions, fit_offramps
from pasu.device.routing import OfframpPolicy
from pasu.metrics import SluResult


def hypothesis(tokens: tuple[int, ...], intent_probability: float) -> Hypothesis:
    """A hypothesis whose decoder gave its first token (the intent) this probability."""
    return Hypothesis(tokens, 0.0, True, (math.log(intent_probability),) + (-0.1,) * (len(tokens) - 1))


def test_a_sure_decoder_keeps_its_intent_and_an_unsure_one_yields_to_the_words(small_reader):
    mixture = IntentMixture(small_reader, decoder_share=1.0)  # the decoder's confidence as it is
    heard = SluResult("play some jazz", "alarm_set")  # the decoder's intent, and words of another command
    assert mixture.reading(heard, 0.9)[0] == "alarm_set"
    intent, probability = mixture.reading(heard, 0.2)
    assert intent == "play_music" and 0.4 < probability < 0.8  # most of the words' 0.8 share
    agreeing, _ = mixture.reading(SluResult("set an alarm for six", "alarm_set"), 0.2)
    assert agreeing == "alarm_set"


def test_an_intent_the_classifier_never_saw_keeps_the_decoders_share(small_reader):
    mixture = IntentMixture(small_reader, decoder_share=1.0)
    assert mixture.reading(SluResult("turn the lights off", "iot_hue_lightoff"), 0.6) == ("iot_hue_lightoff", 0.6)
    assert mixture.reading(SluResult("play some jazz", "iot_hue_lightoff"), 0.1)[0] == "play_music"
    assert IntentMixture(small_reader, 0.5).reading(SluResult("turn the lights off", "iot_hue_lightoff"), 0.6) \
        == ("iot_hue_lightoff", pytest.approx(0.3))


def test_the_decoders_share_decides_how_far_its_confidence_is_trusted(small_reader):
    """The device's default share lets words that read clearly as another command overrule a sure decoder."""
    heard = SluResult("play some jazz", "alarm_set")
    assert IntentMixture(small_reader, 1.0).reading(heard, 0.9)[0] == "alarm_set"
    assert IntentMixture(small_reader).reading(heard, 0.9)[0] == "play_music"
    assert IntentMixture(small_reader).reading(SluResult("set an alarm for six", "alarm_set"), 0.9)[0] == "alarm_set"
    # replay caches key on the digest: another share answers otherwise
    assert IntentMixture(small_reader, 0.5).digest() != IntentMixture(small_reader, 1.0).digest()
    with pytest.raises(ValueError, match="share"):
        IntentMixture(small_reader, 1.5)


def test_the_decoders_confidence_is_its_intent_tokens_probability():
    assert intent_confidence(hypothesis((5, 6, 7), 0.25)) == pytest.approx(0.25)
    assert intent_confidence(Hypothesis((), 0.0, True)) == 0.0


def test_words_that_read_as_another_command_raise_the_doubt(small_reader):
    # the device model's reading of its tokens, here a table: tokens (1, ...) mean "alarm_set" + these words
    readings = {(1, 2): SluResult("set an alarm for six", "alarm_set"), (1, 3): SluResult("play some jazz", "alarm_set")}
    evidence = IntentEvidence(IntentMixture(small_reader), lambda tokens: readings[tuple(tokens)])
    agreeing, contradicting = evidence(hypothesis((1, 2), 0.6)), evidence(hypothesis((1, 3), 0.6))
    assert len(agreeing) == len(INTENT_EVIDENCE) and INTENT_EVIDENCE[0] == "doubt"
    assert 0.0 <= agreeing[0] < 0.2 < contradicting[0] <= 0.5  # the decoder's 0.6 still holds its intent up
    assert evidence(hypothesis((1, 3), 0.05))[0] < contradicting[0]  # the words alone are sure: little doubt
    column = dict(zip(INTENT_EVIDENCE, zip(agreeing, contradicting)))
    assert column["agree"] == (1.0, 0.0) and column["decoder_confidence"] == pytest.approx((0.6, 0.6))
    assert column["entropy"][0] < column["entropy"][1] and column["tokens"] == (2, 2)


def test_the_intent_offramp_learns_which_evidence_marks_a_wrong_intent(tmp_path):
    rng = np.random.default_rng(0)
    doubt = rng.uniform(0, 1, 400)
    rows = np.column_stack([doubt, rng.normal(size=400)])  # the second column is noise
    wrong = (doubt + rng.normal(0, 0.15, 400) > 0.6).astype(float)
    model = IntentErrorModel.fit(rows[:300], wrong[:300])
    held = model.probabilities(rows[300:])
    assert roc_auc_score(wrong[300:], held) > 0.9 and abs(model.coef[0]) > 5 * abs(model.coef[1])
    loaded = IntentErrorModel.load(model.save(tmp_path))
    assert loaded.names == ("evidence0", "evidence1") and np.allclose(loaded.probabilities(rows), model.probabilities(rows))
    assert json.loads((tmp_path / IntentErrorModel.FILE).read_text())["names"] == ["evidence0", "evidence1"]
    with pytest.raises(ValueError, match="right and with wrong"):
        IntentErrorModel.fit(rows, np.zeros(400))
    offramp = IntentOfframp(lambda h: np.array([1.0 - math.exp(h.token_att[0]), 0.0]), model)
    decision = OfframpPolicy(offramp, 0.5, weighing="none").decide(hypothesis((1, 3), 0.1), 2.0)
    assert json.loads(json.dumps(asdict(decision)))["offload"] is True  # timelines and results are JSON


def test_calibrated_beside_the_other_offramps(small_reader, commands):
    """Its thresholds sit in the same report, for the same offload levels, on its scores as they are."""
    texts = list(commands)
    samples, readings = [], {}
    for i in range(30):
        wrong = i % 2 == 1  # the pilot says alarm_set, its words say otherwise, and its answer is wrong
        heard = SluResult(texts[(4 + i) % 8] if wrong else texts[i % 4], "alarm_set")
        readings[(i,)] = heard
        features = HypothesisFeatures((i,), (-0.5, -0.5), (-0.5, -0.5), True)
        answer = SluResult(heard.text, "play_music" if wrong else "alarm_set")
        samples.append(OfframpSample(f"u{i}", 1.0 + i % 3, SluResult(texts[i % 4], "alarm_set"), answer,
                                     4 if wrong else 0, 5, 0.1, 0.02, 1, features, features))
    evidence = IntentEvidence(IntentMixture(small_reader), lambda tokens: readings[tuple(tokens)])
    trained = fit_offramps(samples, OfframpTrainOptions(bilstm=TrainOptions(epochs=2), folds=3), intent=evidence)
    report = trained.report
    assert report["intent"]["selectivity_intent"]["roc_auc"] > 0.9  # it finds the answers whose words disagree
    assert report["intent"]["evidence"] == list(INTENT_EVIDENCE)
    levels = report["intent"]["levels"]
    assert levels["L"]["threshold"] >= levels["M"]["threshold"] >= levels["H"]["threshold"]
    offramp = IntentOfframp(evidence, trained.intent)
    scores = np.array([offramp.score(s.early.hypothesis()) for s in samples])
    assert np.mean(scores > levels["M"]["threshold"]) == pytest.approx(levels["M"]["offload_ratio"])
