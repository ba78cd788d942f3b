"""Incremental encoding of one utterance: what runs while audio arrives, and what waits for a pilot or the end.

`LateContextStream` runs the frontend, the convolution-only blocks and most of the first attention block
(`pasu.models.attention_stream`) on every chunk, since their work on old frames never changes, and leaves the
other attention blocks for `encode()`. `RecomputeStream` is for unmodified
ESPnet models (Conformer, Branchformer, ...), whose every block attends over the whole input: each `encode()`
runs the whole model front to back on all audio so far.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch
from pasu.models.frontend import StreamingFrontend
from pasu.models.late_context_encoder import (
    SUBSAMPLING_RECEPTIVE_FIELD,
    IncrementalEncoder,
    LateContextEncoder,
)


class EncoderStream(Protocol):
    num_samples: int  # audio samples accepted so far

    def accept(self, samples: np.ndarray) -> None:
        """Ingest a chunk of 16 kHz float32 audio (the work done while the user speaks)."""
        ...

    def encode(self) -> torch.Tensor:
        """(T, D) encoder output over all audio accepted so far; (0, D) when too short to encode."""
        ...


class LateContextStream:
    """Frontend, conv blocks and the first attention block chunk by chunk; the other attention blocks on demand."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.frontend = StreamingFrontend(model.frontend)
        self.encoder = IncrementalEncoder(model.encoder)
        self.num_samples = 0

    @torch.inference_mode()
    def accept(self, samples: np.ndarray) -> None:
        self.num_samples += len(samples)
        feats = self.frontend.accept_waveform(samples)
        if feats.size(0):
            self.encoder.accept(feats.unsqueeze(0))

    @torch.inference_mode()
    def encode(self) -> torch.Tensor:
        return self.encoder.encode()[0]


class RecomputeStream:
    """Buffers audio; every encode runs the model's whole frontend and encoder on it."""

    def __init__(self, model: torch.nn.Module, min_samples: int = 400 + 160 * SUBSAMPLING_RECEPTIVE_FIELD):
        # min_samples: below this no encoder frame comes out (a 25 ms window + the subsampling's 7 frames)
        self.model = model
        self.min_samples = min_samples
        self.chunks: list[np.ndarray] = []
        self.num_samples = 0

    def accept(self, samples: np.ndarray) -> None:
        self.num_samples += len(samples)
        self.chunks.append(np.asarray(samples, dtype=np.float32))

    @torch.inference_mode()
    def encode(self) -> torch.Tensor:
        if self.num_samples < self.min_samples:
            return torch.zeros(0, self.model.encoder.output_size())
        audio = torch.from_numpy(np.concatenate(self.chunks)).unsqueeze(0)
        self.chunks = [audio[0].numpy()]
        encoded, lengths = self.model.encode(audio, torch.tensor([audio.size(1)]))
        return encoded[0, : int(lengths[0])]


def open_stream(model: torch.nn.Module) -> EncoderStream:
    """The cheapest exact stream the model's architecture allows."""
    if isinstance(model.encoder, LateContextEncoder) and hasattr(model.frontend, "normalize"):
        return LateContextStream(model)
    return RecomputeStream(model)
