"""DeviceModel: loading a model folder and naming exactly which weights it holds."""

from __future__ import annotations

import torch
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
