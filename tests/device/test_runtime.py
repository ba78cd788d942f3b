"""DeviceModel: loading a model folder, naming exactly which weights it holds, and what it answers."""

from __future__ import annotations

import math

import pytest
import torch
from pasu.device.decoding.search import Hypothesis
from pasu.device.intent_offramp import DECODER_SHARE, IntentMixture
from pasu.device.offramp_train import OFFRAMP_DIR, load_device_model
from pasu.device.runtime import DeviceModel


def test_a_retrained_model_keeps_its_name_but_not_its_weights_id(tmp_path, cloud_support):
    folder = cloud_support.write_model_folder(tmp_path / "model")
    before = DeviceModel.from_folder(folder)
    state = torch.load(folder / "model.pt")
    state["ctc.ctc_lo.bias"] = state["ctc.ctc_lo.bias"] + 1.0  # "more training"
    torch.save(state, folder / "model.pt")
    after = DeviceModel.from_folder(folder)
    assert before.model_id == after.model_id == "tiny-untrained"  # what tables and logs show
    assert before.weights_id != after.weights_id  # what replay caches are keyed by
    assert after.weights_id.startswith("tiny-untrained@")


def test_the_answer_weighs_in_the_intent_reader_of_the_offramp_folder(tmp_path, cloud_support, small_reader):
    """load_device_model attaches MODEL/offramp's reader at the decoder's share: an unsure decoder's intent, or a
    sure one's at that share, yields to words of another command."""
    folder = cloud_support.write_model_folder(tmp_path / "model")
    assert load_device_model(folder).intent_mixture is None  # no reader yet: the decoder's intent as it is
    small_reader.save(folder / OFFRAMP_DIR)
    model = load_device_model(folder)
    tokens = cloud_support.tiny_parts()[1].encode("alarm_set what is the weather today")
    assert model.read(tokens).intent == "alarm_set"

    def hypothesis(intent_probability: float) -> Hypothesis:
        return Hypothesis(tuple(tokens), 0.0, True, (math.log(intent_probability),) + (-0.1,) * (len(tokens) - 1))

    assert model.intent_mixture.decoder_share == DECODER_SHARE
    assert model.answer(tokens, hypothesis(0.9)).intent == "weather_query"  # words of another command overrule
    model.intent_mixture = IntentMixture(small_reader, 1.0)  # the decoder's confidence as it is: a sure one keeps
    assert model.answer(tokens, hypothesis(0.9)).intent == "alarm_set"
    unsure = model.answer(tokens, hypothesis(0.1))
    assert unsure.intent == "weather_query" and unsure.text == model.read(tokens).text
    assert model.answer(tokens, None) == model.read(tokens)  # ESPnet's search gives no per-token probabilities


def test_an_lm_on_other_tokens_is_refused(tiny_model, tmp_path):
    from pasu.device.runtime import DeviceModel
    from pasu.models.lm import LmNetOptions, PackagedLm, build_lm

    tokens = list(tiny_model.token_list)
    other = tokens[:-1] + ["<something-else>"]
    network = build_lm(len(other), LmNetOptions(unit=8, nlayers=1, dropout_rate=0.0)).eval()
    model = DeviceModel(tiny_model.model, tokens, tiny_model.detokenize, "tiny")
    with pytest.raises(ValueError, match="another token list"):
        model.use_lm(PackagedLm(network, other, "other-lm", tmp_path / "model.pt"))
    assert model.lm is None and model.weights_id == "tiny"


def test_a_words_file_in_the_folder_corrects_the_answer_and_names_itself_in_the_weights_id(tmp_path, cloud_support):
    from pasu.device.spelling import WORDS_FILE
    from pasu.models.ngram_lm import NgramLm

    folder = cloud_support.write_model_folder(tmp_path / "model")
    plain = load_device_model(folder)
    assert plain.speller is None
    NgramLm.train(cloud_support.TEXTS).save(folder / WORDS_FILE)
    model = load_device_model(folder)
    assert model.weights_id.startswith(plain.weights_id + "+words@")  # replays made without it are not reused
    tokens = cloud_support.tiny_parts()[1].encode("alarm_set wake me up at fiv am")
    assert model.read(tokens).text == "wake me up at fiv am"  # what the decoder wrote (pilots, benchmarks)
    assert model.answer(tokens, None).text == "wake me up at five am"  # what the device answers
