"""Encoder FLOPs per top-level module and the fraction that can run while the user speaks.

FLOPs come from torch.utils.flop_counter.FlopCounterMode (2 per multiply-add), which counts matmuls and
convolutions only; norms, softmax and element-wise ops are not counted (they are a small share here).
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from pasu.models.frontend import HOP_LENGTH, N_MELS, SAMPLE_RATE, WIN_LENGTH, num_frames

# Modules that can run during ingestion. ESPnet's Conformer / Branchformer / E-Branchformer have
# attention in every block, so only their conv subsampling ("embed") can stream.
DEFAULT_STREAMING_MODULES: tuple[str, ...] = ("embed",)


def streaming_module_names(encoder: torch.nn.Module) -> tuple[str, ...]:
    """Top-level child names whose work can be done chunk by chunk during ingestion."""
    return tuple(getattr(encoder, "STREAMING_MODULES", DEFAULT_STREAMING_MODULES))


def feature_frames(seconds: float) -> int:
    """Fbank frames the frontend makes from `seconds` of 16 kHz audio."""
    return num_frames(round(seconds * SAMPLE_RATE), WIN_LENGTH, HOP_LENGTH)


def encoder_flops(encoder: torch.nn.Module, seconds: float, input_size: int = N_MELS) -> dict[str, int]:
    """FLOPs of one forward pass on `seconds` of audio, per top-level child of `encoder` (plus 'total')."""
    n = feature_frames(seconds)
    x = torch.zeros(1, n, input_size)
    was_training = encoder.training
    encoder.eval()
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            encoder(x, torch.tensor([n]))
    finally:
        encoder.train(was_training)
    counts = {fqn: sum(ops.values()) for fqn, ops in counter.get_flop_counts().items()}
    root = type(encoder).__name__
    per_module: dict[str, int] = {}
    for name, _ in encoder.named_children():
        prefix = f"{root}.{name}"
        under = [fqn for fqn in counts if fqn == prefix or fqn.startswith(prefix + ".")]
        # An op counts for every module on the call stack; a child may be skipped and its own children
        # called directly (the encoder's _subsample calls embed.conv / embed.out), so sum the topmost
        # modules seen under the child: those are disjoint.
        topmost = [f for f in under if not any(f.startswith(g + ".") for g in under if g != f)]
        per_module[name] = sum(counts[f] for f in topmost)
    total = counts.get("Global", 0)
    per_module["total"] = total
    return per_module


def ingestion_fraction(encoder: torch.nn.Module, seconds: float, input_size: int = N_MELS) -> float:
    """FLOPs of the streaming modules (subsampling + conv blocks) / all encoder FLOPs, for `seconds` of audio."""
    flops = encoder_flops(encoder, seconds, input_size)
    streaming = sum(flops.get(name, 0) for name in streaming_module_names(encoder))
    return streaming / flops["total"]
