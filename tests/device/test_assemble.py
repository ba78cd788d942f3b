"""`open_agent`: the agent a program embeds, assembled as `pasu device run` does, against a real server."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from pasu.cloud.config import ServerConfig
from pasu.cloud.server import ServerThread
from pasu.device.agent import AgentOptions, PilotOptions, replay
from pasu.device.assemble import open_agent
from pasu.device.config import DeviceConfig, config_from_dict
from pasu.device.offramp_train import CALIBRATION_VERSION
from pasu.device.runtime import DeviceModel


@pytest.fixture
def model_dir(tmp_path, cloud_support):
    return cloud_support.write_model_folder(tmp_path / "model")


def speak(agent, audio: np.ndarray, chunk: int = 1600):
    for start in range(0, len(audio), chunk):
        agent.feed(audio[start : start + chunk])
    return agent.end()


def test_without_a_cloud_every_utterance_is_answered_locally(model_dir, speech_like):
    with open_agent(model_dir) as agent:
        assert agent.policy is None and agent.cloud is None
        first, second = speak(agent, speech_like(2.0, seed=1)), speak(agent, speech_like(1.2, seed=2))
    assert (first.route, second.route) == ("local", "local")  # feed after end: the next utterance
    assert first.audio_seconds == pytest.approx(2.0) and second.audio_seconds == pytest.approx(1.2)


def test_the_routing_config_offloads_to_its_servers_at_the_calibrated_level(model_dir, speech_like, cloud_support):
    server = ServerThread(cloud_support.tiny_recognizer("cloud-tiny"),
                          ServerConfig(port=0, metrics_port=None, text_intent=None))
    server.start()
    report = {"calibration_version": CALIBRATION_VERSION, "ppl": cloud_support.offramp_levels(9e9, -1.0, 9e9),
              "pilots": DeviceConfig().agent.pilot.schedule()}
    (model_dir / "offramp").mkdir()
    (model_dir / "offramp" / "offramp.json").write_text(json.dumps(report))
    try:
        def route(level: str) -> str:
            config = config_from_dict({"routing": {"cloud": [f"127.0.0.1:{server.port}"], "policy": "ppl",
                                                   "level": level}})
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # calibrated on the agent's own schedule: nothing to warn of
                agent = open_agent(model_dir, config)
            with agent:
                return speak(agent, speech_like(2.0, seed=3)).route

        assert (route("M"), route("L")) == ("cloud", "local")  # perplexity x seconds > -1, never > 9e9
    finally:
        server.stop(grace=0)


def test_what_is_missing_is_said_before_any_audio(model_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="no device model folder"):
        open_agent(tmp_path / "nowhere")
    with_cloud = config_from_dict({"routing": {"cloud": ["127.0.0.1:9"], "policy": "ppl"}})
    with pytest.raises(ValueError, match="routing.threshold"):  # not calibrated, no threshold given
        open_agent(model_dir, with_cloud)
    with pytest.raises(FileNotFoundError, match="pasu offramp train"):  # no intent reader for ppl+intent
        open_agent(model_dir, config_from_dict({"routing": {"cloud": ["127.0.0.1:9"], "threshold": 1.0,
                                                            "intent_threshold": 0.5}}))
    with pytest.raises(ValueError, match="agent.lm"):
        open_agent(model_dir, config_from_dict({"agent": {"lm": str(tmp_path / "no-lm")}}))
    assert DeviceConfig().routing.cloud == ()  # the default: local only


def test_an_espnet_checkpoint_answers_as_espnets_own_search(tmp_path, cloud_support, speech_like):
    """The agent on a .pth and the config.yaml beside it, as ESPnet's trainer leaves them: its answer is what
    ESPnet's BatchBeamSearch gives on the same model."""
    _, weights, _ = cloud_support.write_espnet_run(tmp_path / "recipe")
    wave = speech_like(2.5, seed=5)
    with open_agent(weights) as agent:
        assert agent.model.token_list == cloud_support.ESPNET_TOKENS
        ours = speak(agent, wave)
    espnet = replay(DeviceModel.load(weights), wave,
                    AgentOptions(pilot=PilotOptions(enabled=False), decoder="espnet_batch"))
    assert ours.route == "local" and ours.tokens == espnet.tokens

    weights.with_name("config.yaml").unlink()
    with pytest.raises(FileNotFoundError, match="config.yaml"):
        open_agent(weights)


def test_thresholds_calibrated_on_other_pilots_are_warned_of(model_dir, cloud_support):
    """The shipped agent's pause pilot against a folder calibrated without it: the offload share would drift."""
    report = {"calibration_version": CALIBRATION_VERSION, "ppl": cloud_support.offramp_levels(2.5, 1.9, 1.6)}
    (model_dir / "offramp").mkdir()
    (model_dir / "offramp" / "offramp.json").write_text(json.dumps(report))  # the paper's schedule, no pause pilot
    config = config_from_dict({"routing": {"cloud": ["127.0.0.1:9"], "policy": "ppl"}})
    with pytest.warns(UserWarning, match="calibrated with pilots every 1 s"):
        open_agent(model_dir, config).close()
