"""Encoder FLOPs per top-level module and the fraction that can run while the user speaks.

FLOPs come from torch.utils.flop_counter.FlopCounterMode (2 per multiply-add), which counts matmuls and
convolutions only; norms, softmax and element-wise ops are not counted (they are a small share here).
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from pasu.models.frontend import HOP_LENGTH, N_MELS, SAMPLE_RATE, WIN_LENGTH, num_frames
from pasu.models.late_context_encoder import IncrementalEncoder, LateContextEncoder

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


def ingestion_fraction(
    encoder: torch.nn.Module, seconds: float, input_size: int = N_MELS, chunk_frames: int = 10
) -> float:
    """Share of the encoder's FLOPs on `seconds` of audio done before the end of speech.

    A late-contextualization encoder is measured on the path the device runs (`IncrementalEncoder` fed
    `chunk_frames` feature frames at a time, 10 = 100 ms, then one `encode()`); any other encoder by its
    streaming modules' share of one offline pass (only ESPnet's conv subsampling can stream).
    """
    if not isinstance(encoder, LateContextEncoder):
        flops = encoder_flops(encoder, seconds, input_size)
        return sum(flops.get(name, 0) for name in streaming_module_names(encoder)) / flops["total"]
    ingest, final = streamed_flops(encoder, seconds, input_size, chunk_frames)
    return ingest / (ingest + final)


def streamed_flops(
    encoder: LateContextEncoder, seconds: float, input_size: int = N_MELS, chunk_frames: int = 10
) -> tuple[int, int]:
    """FLOPs of `IncrementalEncoder` on `seconds` of audio: (during ingestion, after the end of speech)."""
    n = feature_frames(seconds)
    feats = torch.zeros(1, n, input_size)
    was_training = encoder.training
    encoder.eval()
    try:
        with torch.no_grad():
            with FlopCounterMode(display=False) as ingest:
                stream = IncrementalEncoder(encoder)
                for start in range(0, n, chunk_frames):
                    stream.accept(feats[:, start : start + chunk_frames])
            with FlopCounterMode(display=False) as final:
                stream.encode()
    finally:
        encoder.train(was_training)
    return ingest.get_total_flops(), final.get_total_flops()
