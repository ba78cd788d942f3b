"""Encoder FLOP counting and the ingestion fraction."""

import pytest
import torch

from pasu.models.build import build_encoder
from pasu.models.flops import (
    encoder_flops,
    feature_frames,
    ingestion_fraction,
    streamed_flops,
    streaming_module_names,
)
from pasu.models.late_context_encoder import LateContextEncoder


@pytest.fixture(scope="module")
def encoder() -> LateContextEncoder:
    torch.manual_seed(0)
    return LateContextEncoder(80)


def test_feature_frames():
    assert feature_frames(1.0) == 98 and feature_frames(3.0) == 298


def test_per_module_flops_add_up(encoder):
    flops = encoder_flops(encoder, 3.0)
    assert set(flops) == {"embed", "conv_blocks", "attn_blocks", "after_norm", "total"}
    assert flops["embed"] + flops["conv_blocks"] + flops["attn_blocks"] + flops["after_norm"] == flops["total"]


def test_subsampling_flops_match_the_formula(encoder):
    d, t = 144, feature_frames(3.0)
    t1, f1 = (t - 3) // 2 + 1, (80 - 3) // 2 + 1
    t2, f2 = (t1 - 3) // 2 + 1, (f1 - 3) // 2 + 1
    macs = d * 9 * t1 * f1 + d * d * 9 * t2 * f2 + (d * f2) * d * t2  # conv1, conv2, linear
    assert encoder_flops(encoder, 3.0)["embed"] == 2 * macs


def test_ingestion_fraction(encoder):
    assert streaming_module_names(encoder) == ("embed", "conv_blocks")
    f3, f6 = ingestion_fraction(encoder, 3.0), ingestion_fraction(encoder, 6.0)
    assert 0.8 < f6 < f3 < 0.97  # attention cost grows faster than linear in T, so the share shrinks
    # The device streams more than its streaming modules: most of the first attention block too.
    flops = encoder_flops(encoder, 3.0)
    assert f3 > (flops["embed"] + flops["conv_blocks"]) / flops["total"] + 0.02


def test_streamed_flops_cost_about_one_offline_pass(encoder):
    ingest, final = streamed_flops(encoder, 3.0)
    offline = encoder_flops(encoder, 3.0)
    # Doing the work on arrival adds little (position tables grow by doubling) and leaves little after.
    assert offline["total"] <= ingest + final < 1.05 * offline["total"]
    assert final < offline["attn_blocks"]


def test_shipped_device_model_streams_over_90_percent():
    from pasu.device.runtime import DeviceModel
    from pasu.settings import shipped_model

    encoder = DeviceModel.from_folder(shipped_model("device")).model.encoder
    assert ingestion_fraction(encoder, 3.0) >= 0.9


def test_the_streaming_baseline_runs_its_whole_encoder_during_ingestion():
    streaming = LateContextEncoder(80, num_conv_blocks=9, num_attn_blocks=0)
    assert encoder_flops(streaming, 3.0)["attn_blocks"] == 0
    assert ingestion_fraction(streaming, 3.0) == pytest.approx(1.0, abs=1e-3)  # only the final LayerNorm waits


def test_plain_encoders_only_ingest_subsampling(encoder):
    conformer = build_encoder("conformer", 80, dict(num_blocks=2))
    assert streaming_module_names(conformer) == ("embed",)
    flops = encoder_flops(conformer, 3.0)
    assert ingestion_fraction(conformer, 3.0) == pytest.approx(flops["embed"] / flops["total"])
    assert ingestion_fraction(build_encoder("conformer", 80), 3.0) < ingestion_fraction(encoder, 3.0)
