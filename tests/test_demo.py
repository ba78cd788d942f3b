"""pasu demo: which offload threshold it plays with."""

from __future__ import annotations

import json

from pasu.demo import offload_routing
from pasu.device.offramp_train import CALIBRATION_VERSION
from pasu.device.routing import RoutingOptions


def levels(l: float, m: float, h: float) -> dict:
    """An offramp's calibrated thresholds as offramp.json holds them."""
    return {"levels": {level: {"threshold": value} for level, value in (("L", l), ("M", m), ("H", h))}}


def test_the_demo_offloads_at_the_models_calibrated_offload_m_threshold(tmp_path):
    assert offload_routing(tmp_path) == RoutingOptions()  # no `pasu offramp train` output: the agent's defaults
    (tmp_path / "offramp").mkdir()
    report = {"calibration_version": CALIBRATION_VERSION, "ppl": levels(2.5, 1.9, 1.6), "intent": levels(0.7, 0.3, 0.1)}
    (tmp_path / "offramp" / "offramp.json").write_text(json.dumps(report))
    assert offload_routing(tmp_path).threshold == 1.9
    assert offload_routing(tmp_path, "intent").intent_threshold == 0.3
    both = offload_routing(tmp_path, "ppl+intent")  # calibrated before the combined check: each part at its M
    assert (both.policy, both.threshold, both.intent_threshold) == ("ppl+intent", 1.9, 0.3)
    report["ppl_intent"] = {"scales": {"ppl": 1.9, "intent": 0.3}, **levels(3.0, 1.5, 1.1)}
    (tmp_path / "offramp" / "offramp.json").write_text(json.dumps(report))
    both = offload_routing(tmp_path, "ppl+intent")  # the pair that offloads Offload-M's share together
    assert (both.threshold, both.intent_threshold) == (1.5 * 1.9, 1.5 * 0.3)


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
    report = {"calibration_version": CALIBRATION_VERSION, "ppl": levels(4.0, 3.0, 2.5), "intent": levels(1.7, 0.9, 0.4)}
    (tmp_path / "offramp" / "offramp.json").write_text(json.dumps(report))
    policy = demo_policy(model, tmp_path, DemoOptions(policy="intent"))
    assert policy.name == "Ours-Intent" and policy.threshold == 0.9
    assert demo_policy(model, tmp_path, DemoOptions(policy="intent", threshold=2.0)).threshold == 2.0
    assert demo_policy(model, tmp_path, DemoOptions()).name == "Ours-PPL+Intent"  # the default, with a reader
