"""Whisper's audio encoder and log-mel features in PyTorch, on CTranslate2's variables, so the whole of Whisper can
be fine-tuned on our commands (`models/whisper_finetune.py`), on a GPU where one is lent.

Whisper's encoder was trained on real speech; on our synthetic, noisy voices its output is what limits the cloud
(adapting the decoder alone took Whisper from 54% to 33% WER on dev). This module computes, batched and on any
device, exactly what the served model computes: faster-whisper's log-mel features of a window padded to 30 s
(`log_mel`), then CTranslate2's Whisper encoder (two GELU convolutions, the second of stride 2, sinusoidal
positions, pre-norm self-attention blocks, a final norm). Trained variables go back under their CTranslate2 names,
as the decoder's do (`models/whisper_decoder.py`), so one adaptation file can hold both.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F

from pasu.models.whisper_layers import WhisperPart

SAMPLE_RATE = 16000
N_FFT = 400
HOP = 160
WINDOW_FRAMES = 3000  # 30 s of 10-ms frames: the encoder's fixed input


def mel_filters(n_mels: int = 80) -> np.ndarray:
    """faster-whisper's (librosa's Slaney-style) mel filterbank, [n_mels, N_FFT // 2 + 1]."""
    from faster_whisper.feature_extractor import FeatureExtractor

    return FeatureExtractor.get_mel_filters(SAMPLE_RATE, N_FFT, n_mels=n_mels).astype(np.float32)


def log_mel(waveforms: torch.Tensor, lengths: torch.Tensor, filters: torch.Tensor) -> torch.Tensor:
    """Whisper's normalized log-mel features of each waveform, padded with zeros to 30 s: [B, n_mels, 3000].

    waveforms [B, N] (right-padded with zeros), lengths [B] in samples. Matches faster-whisper's FeatureExtractor
    (160 zero samples appended, a centred periodic-Hann STFT, the last frame dropped, log10 clamped 8 below each
    utterance's own maximum) followed by the recognizer's cut or zero-pad to 3000 frames.
    """
    padded = F.pad(waveforms.float(), (0, HOP))
    window = torch.hann_window(N_FFT, periodic=True, device=waveforms.device)
    spectrum = torch.stft(padded, N_FFT, HOP, window=window, center=True, pad_mode="reflect", return_complex=True)
    power = spectrum[..., :-1].abs() ** 2
    logs = torch.log10(torch.clamp(filters @ power, min=1e-10))
    frames = torch.clamp((lengths + HOP) // HOP, max=WINDOW_FRAMES)
    valid = torch.arange(logs.shape[-1], device=logs.device)[None] < frames[:, None]  # [B, T]
    peak = logs.masked_fill(~valid[:, None], -torch.inf).amax(dim=(1, 2), keepdim=True)
    logs = (torch.maximum(logs, peak - 8.0) + 4.0) / 4.0
    logs = logs.masked_fill(~valid[:, None], 0.0)[..., :WINDOW_FRAMES]
    return F.pad(logs, (0, WINDOW_FRAMES - logs.shape[-1]))


class WhisperEncoder(WhisperPart):
    """Log-mel features [B, n_mels, 3000] -> encoder output [B, 1500, width], as CTranslate2 computes it."""

    def __init__(self, variables: dict[str, np.ndarray], trainable: bool = True):
        # the sinusoidal positions are a function, not a weight: they stay as Whisper has them
        super().__init__(variables, "encoder/",
                         lambda name: trainable and not name.endswith("position_encodings/encodings"))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        x = F.gelu(F.conv1d(features, self.w("conv1/weight"), self.w("conv1/bias"), padding=1))
        x = F.gelu(F.conv1d(x, self.w("conv2/weight"), self.w("conv2/bias"), stride=2, padding=1))
        x = x.transpose(1, 2) + self.w("position_encodings/encodings")[: x.shape[-1]]
        for i in range(self.layers):
            layer = f"layer_{i}/"
            h = self._norm(x, layer + "self_attention/layer_norm")
            q, k, v = self._linear(h, layer + "self_attention/linear_0").chunk(3, dim=-1)
            x = x + self._linear(self._attend(q, k, v), layer + "self_attention/linear_1")
            h = self._norm(x, layer + "ffn/layer_norm")
            x = x + self._linear(F.gelu(self._linear(h, layer + "ffn/linear_0")), layer + "ffn/linear_1")
        return self._norm(x, "layer_norm")
