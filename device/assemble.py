"""The device agent as `pasu device run` assembles it, for programs that embed PASU:

    from pasu.device.assemble import open_agent
    from pasu.device.config import load_config

    with open_agent("models/shipped/device", load_config("my-agent.yaml")) as agent:
        for chunk in microphone():        # 16 kHz mono float32, any chunk size
            agent.feed(chunk)
            if heard_a_pause():           # the endpointer's first 0.2 s of silence (agent.pilot.pause_seconds)
                agent.pause()             # the pause pilot, which the calibrated thresholds expect
        result = agent.end()              # at end of speech: text, intent, slots, route, latency, ...

One utterance at a time; `feed` again after `end` starts the next one.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from pasu.device.agent import DeviceAgent, use_lm_of
from pasu.device.config import DeviceConfig
from pasu.device.routing import Policy, RoutingOptions
from pasu.device.runtime import DeviceModel, model_folder

if TYPE_CHECKING:
    from pasu.device.cloud_client import CloudClient


def open_agent(model: str | os.PathLike, config: DeviceConfig = DeviceConfig(),
               token: str | None = None) -> DeviceAgent:
    """The agent for a device model (a packaged folder, or an ESPnet checkpoint: a .pth with its config.yaml
    beside it) and `config` (device/agent.yaml's fields): the model with the intent reader of MODEL/offramp, the LM
    `agent.lm` names, and with `routing.cloud` set, the routing policy at the model's calibrated thresholds and a
    client of those servers (`token` overrides `routing.token_file`).
    Sets the process's torch threads to `agent.threads`. Close the agent (or use it in `with`) to close its client.

    FileNotFoundError: no model there, or a policy needs offramps the model lacks; ValueError: a threshold neither
    set nor calibrated, an LM that does not fit, a setting out of range. Warns (UserWarning) when the thresholds
    were calibrated on pilots scheduled otherwise than `agent.pilot` (`schedule_mismatch`)."""
    from pasu.device.offramp_train import OFFRAMP_DIR, load_device_model, schedule_mismatch
    from pasu.torch_threads import set_torch_threads

    set_torch_threads(config.agent.threads)
    device_model = load_device_model(model)  # with its intent reader, when `pasu offramp train` left one
    model_dir = model_folder(model)
    try:
        use_lm_of(device_model, config.agent)
    except (OSError, ValueError) as error:
        raise ValueError(f"agent.lm {config.agent.lm!r}: {error}") from error
    policy, cloud = routing_of(config.routing, device_model, model_dir, token)
    if policy is not None and (mismatch := schedule_mismatch(config.routing, config.agent.pilot,
                                                              model_dir / OFFRAMP_DIR)):
        warnings.warn(mismatch, stacklevel=2)
    return DeviceAgent(device_model, config.agent, policy, cloud)


def routing_of(routing: RoutingOptions, model: DeviceModel, model_dir: Path,
               token: str | None = None) -> tuple[Policy | None, CloudClient | None]:
    """The offloading policy and cloud client `routing` asks for; (None, None) without cloud servers."""
    from pasu.device.cloud_client import CloudClient
    from pasu.device.offramp_train import OFFRAMP_DIR, model_policy

    if not routing.cloud:
        return None, None
    try:
        policy = model_policy(routing, model, model_dir / OFFRAMP_DIR)
    except FileNotFoundError as error:  # a policy with the intent check or the BiLSTM, and the model lacks it
        raise FileNotFoundError(f"{error}: the {routing.policy} policy needs `pasu offramp train {model_dir}` "
                                "first") from error
    return policy, CloudClient(routing.cloud, token=token or routing.token(), tls=routing.tls,
                               encoding=routing.encoding)
