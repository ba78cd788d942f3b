"""pasu demo: which offload threshold it plays with."""

from __future__ import annotations

import json

from pasu.demo import offload_threshold
from pasu.device.routing import RoutingOptions


def test_the_demo_offloads_at_the_models_calibrated_offload_m_threshold(tmp_path):
    assert offload_threshold(tmp_path) == RoutingOptions().threshold  # no `pasu offramp train` output: the default
    (tmp_path / "offramp").mkdir()
    levels = {level: {"threshold": value} for level, value in (("L", 2.5), ("M", 1.9), ("H", 1.6))}
    (tmp_path / "offramp" / "offramp.json").write_text(json.dumps({"calibration_version": 3, "ppl": {"levels": levels}}))
    assert offload_threshold(tmp_path) == 1.9
