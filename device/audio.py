"""Audio in: files of any common format and rate to 16 kHz mono float32, with clear errors for bad input."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

import numpy as np

SAMPLE_RATE = 16000
MIN_SECONDS = 0.12  # below this the encoder produces no frame (25 ms window + 7 frames of subsampling)


class AudioError(ValueError):
    """The audio cannot be used; the message says what is wrong with it."""


def load_audio(path: str | Path, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Decode a WAV/FLAC/OGG/... file, mix to mono and resample: 1-D float32 in [-1, 1]."""
    path = Path(path)
    if not path.is_file():
        raise AudioError(f"{path}: no such file")
    return decode_audio(str(path), sample_rate, source=str(path))


def decode_audio(file: str | BinaryIO, sample_rate: int = SAMPLE_RATE, source: str = "audio") -> np.ndarray:
    """`load_audio` of a path or an open binary file (an upload's bytes in a BytesIO)."""
    import soundfile as sf

    try:
        data, rate = sf.read(file, dtype="float32", always_2d=True)
    except sf.LibsndfileError as error:  # its own text names the problem (and the file object, said by `source`)
        raise AudioError(f"{source}: not a readable audio file ({error.error_string})") from None
    except RuntimeError as error:
        raise AudioError(f"{source}: not a readable audio file ({error})") from None
    return prepare(data.mean(axis=1), rate, sample_rate, source=source)


def prepare(samples: np.ndarray, rate: int, sample_rate: int = SAMPLE_RATE, source: str = "audio") -> np.ndarray:
    """Validate 1-D (or channels-last 2-D) samples and resample them to `sample_rate`."""
    samples = np.asarray(samples)
    if samples.ndim == 2:
        samples = samples.mean(axis=1)
    if samples.ndim != 1:
        raise AudioError(f"{source}: expected mono or (samples, channels) audio, got shape {samples.shape}")
    if np.issubdtype(samples.dtype, np.integer):
        samples = samples.astype(np.float32) / float(np.iinfo(samples.dtype).max)
    samples = samples.astype(np.float32, copy=False)
    check_finite(samples, source)
    if rate <= 0:
        raise AudioError(f"{source}: invalid sample rate {rate}")
    if rate != sample_rate and samples.size:
        import soxr

        samples = soxr.resample(samples, rate, sample_rate).astype(np.float32)
    return samples


def check_finite(samples: np.ndarray, source: str = "audio") -> None:
    if not np.all(np.isfinite(samples)):
        bad = int(np.count_nonzero(~np.isfinite(samples)))
        raise AudioError(f"{source}: {bad} samples are NaN or infinite")


def check_length(num_samples: int, sample_rate: int = SAMPLE_RATE, source: str = "audio") -> None:
    """Raise unless there is enough audio for the encoder to produce a frame."""
    if num_samples == 0:
        raise AudioError(f"{source}: no audio (zero samples)")
    if num_samples < MIN_SECONDS * sample_rate:
        raise AudioError(f"{source}: {1000 * num_samples / sample_rate:.0f} ms of audio is too short; "
                         f"at least {1000 * MIN_SECONDS:.0f} ms is needed")


def chunks(samples: np.ndarray, chunk_seconds: float, sample_rate: int = SAMPLE_RATE) -> list[np.ndarray]:
    """Consecutive chunks of `chunk_seconds` (the last may be shorter)."""
    size = max(round(chunk_seconds * sample_rate), 1)
    return [samples[i : i + size] for i in range(0, len(samples), size)]
