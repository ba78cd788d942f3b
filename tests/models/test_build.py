"""build_asr_model: every encoder type trains (finite loss, gradients) on random audio."""

import pytest
import torch

from espnet2.asr.espnet_model import ESPnetASRModel
from pasu.models.build import build_asr_model
from pasu.models.frontend import compute_global_stats
from pasu.models.late_context_encoder import LateContextEncoder

TOKENS = ["<blank>", "<unk>", "calendar_set", "▁"] + [chr(97 + i) for i in range(26)] + ["<sos/eos>"]
SMALL = {
    "late_context": dict(output_size=64, num_conv_blocks=2, num_attn_blocks=1, cgmlp_linear_units=128),
    "conformer": dict(output_size=64, num_blocks=2, linear_units=128),
    "branchformer": dict(output_size=64, num_blocks=2, cgmlp_linear_units=128),
    "e_branchformer": dict(output_size=64, num_blocks=2, cgmlp_linear_units=128, linear_units=128),
}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_forward_backward_finite(name):
    torch.manual_seed(0)
    speech = 0.1 * torch.randn(2, 16000)
    mean, std = compute_global_stats(list(speech))
    model = build_asr_model(
        {
            "token_list": TOKENS,
            "encoder": name,
            "encoder_conf": SMALL[name],
            "decoder_conf": {"linear_units": 128},
            "stats": {"mean": mean, "std": std},
        }
    )
    assert isinstance(model, ESPnetASRModel)
    text = torch.randint(2, len(TOKENS) - 1, (2, 6))
    loss, stats, _ = model(speech, torch.tensor([16000, 11000]), text, torch.tensor([6, 4]))
    assert torch.isfinite(loss).all() and torch.isfinite(stats["loss_ctc"]).all()
    loss.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_default_config_is_the_device_model():
    model = build_asr_model({"token_list": TOKENS, "init": "xavier_uniform"})
    assert isinstance(model.encoder, LateContextEncoder) and model.normalize is None
    assert "frontend.normalize.mean" in model.state_dict()
    assert model.ctc_weight == 0.3 and len(model.decoder.decoders) == 1


def test_unknown_encoder():
    with pytest.raises(ValueError):
        build_asr_model({"token_list": TOKENS, "encoder": "rnn"})
