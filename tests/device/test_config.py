"""The device agent's settings: the shipped agent.yaml, partial files, mistakes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pasu.device.agent import AgentOptions, PilotOptions
from pasu.device.cli import DEFAULT_CONFIG
from pasu.device.config import DeviceConfig, config_from_dict, load_config
from pasu.device.routing import RoutingOptions


def test_shipped_yaml_is_every_default_with_its_comment(template_problems):
    assert load_config(DEFAULT_CONFIG) == DeviceConfig()  # values never drift from the dataclasses
    assert template_problems(DEFAULT_CONFIG, DeviceConfig()) == []


def test_a_partial_file_keeps_every_other_default(tmp_path):
    (tmp_path / "agent.yaml").write_text("agent:\n  pilot: {interval_seconds: 0.5, search: {beam_size: 4}}\n"
                                         "routing: {cloud: ['10.0.0.2:50051'], threshold: 2}\n")
    config = load_config(tmp_path / "agent.yaml")
    # The pilots' search keeps PilotOptions' search (beam 3, at most 30 tokens), not SearchOptions' defaults.
    pilot = replace(PilotOptions(), interval_seconds=0.5, search=replace(PilotOptions().search, beam_size=4))
    assert config.agent == replace(AgentOptions(), pilot=pilot)
    assert config.routing == RoutingOptions(cloud=("10.0.0.2:50051",), threshold=2.0)


@pytest.mark.parametrize("raw, message", [
    ({"agnet": {}}, r"unknown keys \['agnet'\]"),
    ({"agent": {"pilot": {"serch": {}}}}, r"agent.pilot: unknown keys \['serch'\]"),
    ({"agent": {"final_search": {"beam": 4}}}, r"agent.final_search: unknown keys \['beam'\]"),
    ({"agent": {"decoder": "espnet"}}, r"agent.decoder: 'espnet' is not one of"),
    ({"routing": {"policy": "always"}}, r"routing.policy: 'always' is not one of"),
    ({"routing": {"level": "medium"}}, r"routing.level: 'medium' is not one of"),
    ({"routing": {"cloud": "host:1"}}, r"routing.cloud: expected a list"),
    ({"agent": {"pilot": {"interval_seconds": "1s"}}}, r"agent.pilot.interval_seconds: expected float"),
])
def test_mistakes_fail_naming_the_key(raw, message):
    with pytest.raises(ValueError, match=f"^device config: {message}"):
        config_from_dict(raw)


def test_errors_name_the_file(tmp_path):
    (tmp_path / "agent.yaml").write_text("routing: {treshold: 2}\n")
    with pytest.raises(ValueError, match=r"agent.yaml: routing: unknown keys \['treshold'\]"):
        load_config(tmp_path / "agent.yaml")
