"""Streaming-exact log-mel fbank frontend with global mean/variance normalization.

The frontend frames the waveform WITHOUT centre padding (frame i covers samples
[i*hop, i*hop + win)), so the features of any prefix of a waveform are exactly the first
frames of the whole waveform's features. Normalization uses fixed (global) statistics rather
than per-utterance ones, which would change old frames whenever audio is appended.
"""

from __future__ import annotations

from collections.abc import Iterable

import librosa
import numpy as np
import torch

from espnet.nets.pytorch_backend.nets_utils import make_pad_mask
from espnet2.asr.frontend.abs_frontend import AbsFrontend
from espnet2.layers.abs_normalize import AbsNormalize

SAMPLE_RATE = 16000
WIN_LENGTH = 400  # 25 ms at 16 kHz
HOP_LENGTH = 160  # 10 ms at 16 kHz
N_MELS = 80
LOG_FLOOR = 1e-10  # same floor as ESPnet's LogMel


def num_frames(num_samples: int, win_length: int = WIN_LENGTH, hop_length: int = HOP_LENGTH) -> int:
    """Number of complete analysis windows in `num_samples` samples (no centre padding)."""
    if num_samples < win_length:
        return 0
    return 1 + (num_samples - win_length) // hop_length


class GlobalNormalize(AbsNormalize):
    """GlobalMVN-style normalization whose mean/std live in buffers (saved with the model)."""

    def __init__(self, dim: int = N_MELS, mean: torch.Tensor | None = None, std: torch.Tensor | None = None):
        super().__init__()
        # Identity statistics until real ones are set; persistent buffers so they go into state_dict.
        self.register_buffer("mean", torch.zeros(dim) if mean is None else torch.as_tensor(mean, dtype=torch.float32))
        self.register_buffer("std", torch.ones(dim) if std is None else torch.as_tensor(std, dtype=torch.float32))

    def set_stats(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        """Overwrite the statistics in place (keeps buffer identity)."""
        self.mean.copy_(torch.as_tensor(mean, dtype=self.mean.dtype))
        self.std.copy_(torch.as_tensor(std, dtype=self.std.dtype))

    def forward(
        self, x: torch.Tensor, ilens: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalize (B, T, D) features; frames beyond `ilens` are zeroed like ESPnet's GlobalMVN."""
        if ilens is None:
            ilens = x.new_full([x.size(0)], x.size(1), dtype=torch.long)
        x = (x - self.mean) / self.std
        x = x.masked_fill(make_pad_mask(ilens, x, 1), 0.0)
        return x, ilens


class FbankFrontend(AbsFrontend):
    """Log-mel fbank (torch.stft + librosa mel filters), no centre padding, optional global norm."""

    def __init__(
        self,
        fs: int = SAMPLE_RATE,
        n_mels: int = N_MELS,
        win_length: int = WIN_LENGTH,
        hop_length: int = HOP_LENGTH,
        fmin: float = 0.0,
        fmax: float | None = None,
        global_norm: bool = True,
    ):
        super().__init__()
        self.fs = fs
        self.n_mels = n_mels
        self.win_length = win_length
        self.hop_length = hop_length
        # n_fft == win_length (as Whisper): no zero-padded FFT, every frame is exactly one window.
        mel = librosa.filters.mel(sr=fs, n_fft=win_length, n_mels=n_mels, fmin=fmin, fmax=fmax)
        # Derived constants: not persistent so checkpoints hold only the learned/estimated state.
        self.register_buffer("mel_basis", torch.from_numpy(mel).float(), persistent=False)
        self.register_buffer("window", torch.hann_window(win_length), persistent=False)
        self.normalize: GlobalNormalize | None = GlobalNormalize(n_mels) if global_norm else None

    def output_size(self) -> int:
        return self.n_mels

    def set_stats(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        """Install global statistics (e.g. from `compute_global_stats`)."""
        if self.normalize is None:
            raise ValueError("frontend was built with global_norm=False")
        self.normalize.set_stats(mean, std)

    def log_mel(self, wave: torch.Tensor) -> torch.Tensor:
        """Un-normalized log-mel of (B, N) audio -> (B, num_frames(N), n_mels)."""
        if wave.size(-1) < self.win_length:
            return wave.new_zeros(wave.size(0), 0, self.n_mels)
        spec = torch.stft(
            wave.float(),
            n_fft=self.win_length,
            hop_length=self.hop_length,
            win_length=self.win_length,
            window=self.window,
            center=False,  # the streaming-exactness property depends on this
            return_complex=True,
        )  # (B, F, T)
        power = spec.real.square() + spec.imag.square()
        mel = torch.matmul(self.mel_basis, power)  # (B, n_mels, T)
        return mel.clamp(min=LOG_FLOOR).log().transpose(1, 2)

    def forward(
        self, input: torch.Tensor, input_lengths: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """ESPnet frontend API: (B, N) padded audio, (B,) lengths -> (B, T, n_mels), (B,)."""
        feats = self.log_mel(input)
        lengths = torch.clamp(
            (input_lengths - self.win_length) // self.hop_length + 1, min=0
        ).to(torch.long)
        if self.normalize is not None:
            feats, lengths = self.normalize(feats, lengths)
        else:
            feats = feats.masked_fill(make_pad_mask(lengths, feats, 1), 0.0)
        return feats, lengths

    def extract(self, wave: torch.Tensor) -> torch.Tensor:
        """Features of one 1-D waveform -> (T, n_mels)."""
        wave = torch.as_tensor(wave, dtype=torch.float32).reshape(1, -1)
        feats, _ = self.forward(wave, torch.tensor([wave.size(1)]))
        return feats[0]


def compute_global_stats(
    waveforms: Iterable[torch.Tensor | np.ndarray],
    frontend: FbankFrontend | None = None,
    var_floor: float = 1e-10,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-bin mean and std of un-normalized log-mel frames over all `waveforms` (1-D each)."""
    frontend = frontend or FbankFrontend(global_norm=False)
    total = torch.zeros(frontend.n_mels, dtype=torch.float64)
    total_sq = torch.zeros(frontend.n_mels, dtype=torch.float64)
    count = 0
    with torch.no_grad():
        for wave in waveforms:
            wave = torch.as_tensor(wave, dtype=torch.float32).reshape(1, -1)
            feats = frontend.log_mel(wave)[0].double()
            total += feats.sum(0)
            total_sq += feats.square().sum(0)
            count += feats.size(0)
    if count == 0:
        raise ValueError("no complete frames in the given waveforms")
    mean = total / count
    var = (total_sq / count - mean.square()).clamp(min=var_floor)
    return mean.float(), var.sqrt().float()


class StreamingFrontend:
    """Feeds audio chunks of any size and returns exactly the frames that became complete."""

    def __init__(self, frontend: FbankFrontend):
        self.frontend = frontend
        self.reset()

    def reset(self) -> None:
        self._pending = torch.zeros(0)  # samples from the start of the next (incomplete) frame on
        self.num_samples = 0
        self.num_frames = 0

    @torch.no_grad()
    def accept_waveform(self, chunk: torch.Tensor | np.ndarray) -> torch.Tensor:
        """Append a 1-D chunk; return the (n_new, n_mels) normalized frames it completes."""
        chunk = torch.as_tensor(chunk, dtype=torch.float32).reshape(-1)
        self.num_samples += chunk.numel()
        buf = torch.cat([self._pending, chunk])
        n = num_frames(buf.numel(), self.frontend.win_length, self.frontend.hop_length)
        if n == 0:
            self._pending = buf
            return torch.zeros(0, self.frontend.n_mels)
        hop = self.frontend.hop_length
        feats = self.frontend.extract(buf[: (n - 1) * hop + self.frontend.win_length])
        # Keep everything from the next frame's first sample (windows overlap, so this is > 0).
        self._pending = buf[n * hop :].clone()
        self.num_frames += n
        return feats

    def flush(self) -> torch.Tensor:
        """End of stream: nothing is pending (no centre padding), so no frames; resets the stream."""
        self.reset()
        return torch.zeros(0, self.frontend.n_mels)
