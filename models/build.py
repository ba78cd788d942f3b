"""Build an ESPnet hybrid CTC/attention ASR model from a plain dict, without espnet2.tasks.asr.

espnet2.tasks.asr imports torchaudio (through the BEATs encoder), which these machines lack, so ASRTask
cannot build models here; this assembles the same pieces directly.

Config keys (all but token_list optional):
    token_list: list[str]           ESPnet order: "<blank>" first, "<sos/eos>" last
    frontend_conf: dict             FbankFrontend kwargs
    normalize: "frontend" | "global_mvn" | None   (default "frontend": FbankFrontend's GlobalNormalize)
    normalize_conf: dict            GlobalMVN kwargs (stats_file) when normalize == "global_mvn"
    stats: {"mean": ..., "std": ...}  installed into the frontend's normalizer when normalize == "frontend"
    specaug: "specaug" | None, specaug_conf: dict
    encoder: "late_context" | "conformer" | "branchformer" | "e_branchformer"; encoder_conf: dict
    decoder_conf: dict              TransformerDecoder kwargs
    ctc_conf: dict                  CTC kwargs
    model_conf: dict                ESPnetASRModel kwargs (ctc_weight, lsm_weight, ...)
    init: str | None                espnet2.torch_utils.initialize scheme (e.g. "xavier_uniform")
"""

from __future__ import annotations

from typing import Any

import torch

from espnet2.asr.ctc import CTC
from espnet2.asr.decoder.transformer_decoder import TransformerDecoder
from espnet2.asr.encoder.abs_encoder import AbsEncoder
from espnet2.asr.espnet_model import ESPnetASRModel
from pasu.models.frontend import FbankFrontend
from pasu.models.late_context_encoder import LateContextEncoder

# Size-matched defaults (~3-4M encoder parameters each, d=144) so baselines compare with the device model.
ENCODER_DEFAULTS: dict[str, dict[str, Any]] = {
    "late_context": {},  # LateContextEncoder's own defaults: d=144, 6 conv + 3 attention blocks
    "conformer": dict(
        output_size=144,
        attention_heads=4,
        linear_units=576,
        num_blocks=6,
        macaron_style=True,
        rel_pos_type="latest",
        pos_enc_layer_type="rel_pos",
        selfattention_layer_type="rel_selfattn",
        use_cnn_module=True,
        cnn_module_kernel=31,
    ),
    "branchformer": dict(
        output_size=144,
        attention_heads=4,
        cgmlp_linear_units=1152,
        cgmlp_conv_kernel=31,
        num_blocks=9,
        merge_method="learned_ave",  # learned branch weights pick k for the late-context model (paper 4.1)
    ),
    "e_branchformer": dict(
        output_size=144,
        attention_heads=4,
        cgmlp_linear_units=576,
        cgmlp_conv_kernel=31,
        num_blocks=6,
        use_ffn=True,
        macaron_ffn=True,
        linear_units=576,
    ),
}

# SpecAugment when the config turns it on without settings: ESPnet's usual ASR values (freq masks of up
# to 27 of 80 bins, time masks of up to 5% of the utterance, 2 each, light time warp).
DEFAULT_SPECAUG_CONF: dict[str, Any] = dict(
    apply_time_warp=True,
    time_warp_window=5,
    time_warp_mode="bicubic",
    apply_freq_mask=True,
    freq_mask_width_range=[0, 27],
    num_freq_mask=2,
    apply_time_mask=True,
    time_mask_width_ratio_range=[0.0, 0.05],
    num_time_mask=2,
)

DECODER_DEFAULTS: dict[str, Any] = dict(attention_heads=4, linear_units=1024, num_blocks=1)  # paper: 1 layer
MODEL_DEFAULTS: dict[str, Any] = dict(ctc_weight=0.3, lsm_weight=0.1, length_normalized_loss=False)


def build_encoder(name: str, input_size: int, conf: dict[str, Any] | None = None) -> AbsEncoder:
    """Encoder by name with the size-matched defaults overridden by `conf`."""
    if name not in ENCODER_DEFAULTS:
        raise ValueError(f"unknown encoder {name!r}; choose from {sorted(ENCODER_DEFAULTS)}")
    kwargs = {**ENCODER_DEFAULTS[name], **(conf or {})}
    if name == "late_context":
        return LateContextEncoder(input_size, **kwargs)
    # Imported lazily: each ESPnet encoder module costs import time (typeguard instrumentation).
    if name == "conformer":
        from espnet2.asr.encoder.conformer_encoder import ConformerEncoder

        return ConformerEncoder(input_size, **kwargs)
    if name == "branchformer":
        from espnet2.asr.encoder.branchformer_encoder import BranchformerEncoder

        return BranchformerEncoder(input_size, **kwargs)
    from espnet2.asr.encoder.e_branchformer_encoder import EBranchformerEncoder

    return EBranchformerEncoder(input_size, **kwargs)


def build_asr_model(config: dict[str, Any]) -> ESPnetASRModel:
    """ESPnetASRModel (our fbank frontend, encoder by name, TransformerDecoder, CTC) from a dict."""
    token_list = list(config["token_list"])
    vocab_size = len(token_list)
    norm_kind = config.get("normalize", "frontend")
    if norm_kind not in ("frontend", "global_mvn", None):
        raise ValueError(f"unknown normalize {norm_kind!r}")

    frontend = FbankFrontend(**{**config.get("frontend_conf", {}), "global_norm": norm_kind == "frontend"})
    if norm_kind == "frontend" and config.get("stats") is not None:
        frontend.set_stats(torch.as_tensor(config["stats"]["mean"]), torch.as_tensor(config["stats"]["std"]))
    normalize = None
    if norm_kind == "global_mvn":
        from espnet2.layers.global_mvn import GlobalMVN

        normalize = GlobalMVN(**config.get("normalize_conf", {}))

    specaug = None
    if config.get("specaug") == "specaug":
        from espnet2.asr.specaug.specaug import SpecAug

        specaug = SpecAug(**config.get("specaug_conf", {}))
    elif config.get("specaug") is not None:
        raise ValueError(f"unknown specaug {config['specaug']!r}")

    encoder = build_encoder(config.get("encoder", "late_context"), frontend.output_size(), config.get("encoder_conf"))
    decoder = TransformerDecoder(
        vocab_size, encoder.output_size(), **{**DECODER_DEFAULTS, **config.get("decoder_conf", {})}
    )
    ctc = CTC(odim=vocab_size, encoder_output_size=encoder.output_size(), **config.get("ctc_conf", {}))
    model = ESPnetASRModel(
        vocab_size=vocab_size,
        token_list=token_list,
        frontend=frontend,
        specaug=specaug,
        normalize=normalize,
        preencoder=None,
        encoder=encoder,
        postencoder=None,
        decoder=decoder,
        ctc=ctc,
        joint_network=None,
        **{**MODEL_DEFAULTS, **config.get("model_conf", {})},
    )
    if config.get("init") is not None:
        from espnet2.torch_utils.initialize import initialize

        initialize(model, config["init"])
    return model
