"""The device agent's settings: agent and routing options, read from YAML, then overridden by command-line flags.

device/agent.yaml (installed as pasu/device/agent.yaml, `pasu device run`'s default --config) holds every
field at its default, with its comment; a file of your own needs only what it changes:

    agent:
      pilot: {interval_seconds: 0.5, search: {beam_size: 4}}   # other search fields keep the pilot's defaults
    routing: {cloud: ["10.0.0.2:50051"], policy: ppl, threshold: 2.5, token_file: /run/secrets/pasu-token}
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pasu.config import from_dict, load_yaml
from pasu.device.agent import AgentOptions
from pasu.device.routing import RoutingOptions


@dataclass(frozen=True)
class DeviceConfig:
    """Everything `pasu device run` needs besides the model and the audio."""

    agent: AgentOptions = AgentOptions()  # ingestion, pilots while the user speaks, the final decode
    routing: RoutingOptions = RoutingOptions()  # whether and where to offload at end of speech


def config_from_dict(raw: Mapping[str, Any], where: str = "device config") -> DeviceConfig:
    """DeviceConfig from plain data (parsed YAML) over the defaults; unknown keys are errors, not ignored."""
    return from_dict(DeviceConfig, raw, where, DeviceConfig())


def load_config(path: str | os.PathLike | None) -> DeviceConfig:
    """DeviceConfig from a YAML file; the defaults when `path` is None."""
    return DeviceConfig() if path is None else config_from_dict(load_yaml(path), str(path))
