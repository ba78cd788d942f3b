"""Audio in: any common format and rate becomes 16 kHz mono; bad input gets a clear AudioError."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
from pasu.device.audio import AudioError, check_length, load_audio, prepare


def test_stereo_44k_file_becomes_16k_mono(tmp_path):
    t = np.arange(44100) / 44100
    stereo = np.stack([np.sin(2 * np.pi * 440 * t), np.sin(2 * np.pi * 440 * t)], axis=1) * 0.5
    sf.write(tmp_path / "a.wav", stereo, 44100)
    audio = load_audio(tmp_path / "a.wav")
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert abs(len(audio) - 16000) <= 2
    assert 0.4 < np.abs(audio).max() < 0.6


@pytest.mark.parametrize("rate", [8000, 48000])
def test_other_rates_are_resampled(tmp_path, rate):
    sf.write(tmp_path / "a.flac", np.zeros(rate // 2, dtype=np.float32), rate)
    assert abs(len(load_audio(tmp_path / "a.flac")) - 8000) <= 2


def test_int16_samples_are_scaled():
    assert prepare(np.array([16384, -32767], dtype=np.int16), 16000).tolist() == pytest.approx([0.5, -1.0], abs=1e-4)


def test_bad_inputs_say_what_is_wrong(tmp_path):
    with pytest.raises(AudioError, match="no such file"):
        load_audio(tmp_path / "missing.wav")
    (tmp_path / "junk.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk")
    with pytest.raises(AudioError, match="not a readable audio file"):
        load_audio(tmp_path / "junk.wav")
    with pytest.raises(AudioError, match="NaN or infinite"):
        prepare(np.array([0.0, np.nan, np.inf], dtype=np.float32), 16000)
    with pytest.raises(AudioError, match="shape"):
        prepare(np.zeros((2, 2, 2)), 16000)
    with pytest.raises(AudioError, match="zero samples"):
        check_length(0)
    with pytest.raises(AudioError, match="too short"):
        check_length(800)


def test_truncated_file_is_rejected_or_decoded_short(tmp_path):
    sf.write(tmp_path / "a.wav", np.zeros(16000, dtype=np.float32), 16000, subtype="PCM_16")
    data = (tmp_path / "a.wav").read_bytes()
    (tmp_path / "cut.wav").write_bytes(data[:30])  # header cut in the middle
    with pytest.raises(AudioError):
        load_audio(tmp_path / "cut.wav")
