"""pasu demo: which offload threshold it plays with."""

from __future__ import annotations

import json

from pasu.demo import offload_threshold
from pasu.device.offramp_train import CALIBRATION_VERSION
from pasu.device.routing import RoutingOptions


def test_the_demo_offloads_at_the_models_calibrated_offload_m_threshold(tmp_path):
    assert offload_threshold(tmp_path) == RoutingOptions().threshold  # no `pasu offramp train` output: the default
    (tmp_path / "offramp").mkdir()
    levels = {level: {"threshold": value} for level, value in (("L", 2.5), ("M", 1.9), ("H", 1.6))}
    (tmp_path / "offramp" / "offramp.json").write_text(json.dumps({"calibration_version": CALIBRATION_VERSION, "ppl": {"levels": levels}}))
    assert offload_threshold(tmp_path) == 1.9


def test_the_demo_plays_the_intent_check_when_the_model_has_its_reader(tmp_path, capsys):
    from pasu.demo import DemoOptions, demo_policy
    from pasu.models.intent_reader import IntentReader, ReaderOptions
    from pasu.device.intent_offramp import IntentMixture
    from pasu.device.routing import PerplexityOfframp
    from pasu.device.runtime import DeviceModel

    import pasu_tests_cloud_support as support  # loaded by tests/conftest.py

    parts, tokenizer = support.tiny_parts()
    model = DeviceModel(parts, tokenizer.token_list, tokenizer.decode, "tiny-untrained")
    without_reader = demo_policy(model, tmp_path, DemoOptions())
    assert isinstance(without_reader.offramp, PerplexityOfframp)  # no `pasu offramp train` output: perplexity
    assert without_reader.threshold == RoutingOptions().threshold and "no intent reader" in capsys.readouterr().err
    reader = IntentReader.fit(["wake me up at five", "play the radio"], ["alarm_set", "play_radio"],
                              ReaderOptions(min_df=1))
    reader.save(tmp_path / "offramp")
    model.intent_mixture = IntentMixture(reader)  # what load_device_model attaches from MODEL/offramp
    levels = {level: {"threshold": value} for level, value in (("L", 1.7), ("M", 0.9), ("H", 0.4))}
    (tmp_path / "offramp" / "offramp.json").write_text(json.dumps({"calibration_version": CALIBRATION_VERSION, "intent": {"levels": levels}}))
    policy = demo_policy(model, tmp_path, DemoOptions())
    assert policy.name == "Ours-Intent" and policy.threshold == 0.9
    assert demo_policy(model, tmp_path, DemoOptions(threshold=2.0)).threshold == 2.0
