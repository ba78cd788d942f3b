"""Augmentation: exact SNR, determinism, speed, RIR alignment, and working without the shared data."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict

import numpy as np
import pytest
import soundfile as sf
from scipy.signal import correlate, welch

from pasu.corpus import augment as A

SR = A.SAMPLE_RATE


def _speech_like(seconds: float = 1.5, peak: float = 0.9, seed: int = 0) -> np.ndarray:
    """Bursts of harmonic tone with pauses: enough structure for alignment and pitch checks."""
    t = np.arange(int(seconds * SR)) / SR
    envelope = (np.sin(2 * np.pi * 2.5 * t) > 0).astype(float)
    x = envelope * sum(np.sin(2 * np.pi * 150 * k * t) / k for k in range(1, 5))
    x += 0.01 * np.random.default_rng(seed).standard_normal(len(t))
    return (peak * x / np.max(np.abs(x))).astype(np.float32)


def _snr(speech: np.ndarray, noise: np.ndarray) -> float:
    return 10 * np.log10(np.mean(np.square(speech, dtype=np.float64)) / np.mean(np.square(noise, dtype=np.float64)))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A noise folder in the shared layout, in odd formats, with one broken file."""
    root = tmp_path_factory.mktemp("noise")
    (root / "recorded").mkdir()
    (root / "impulse_responses").mkdir()
    rng = np.random.default_rng(1)
    sf.write(root / "recorded" / "hum.wav", 0.1 * rng.standard_normal((8000 * 3, 2)), 8000)
    (root / "recorded" / "broken.wav").write_bytes(b"RIFF....WAVEjunk")
    rir = np.zeros(22050)
    rir[441] = 1.0  # direct path after 10 ms
    rir[442:] += 0.1 * rng.standard_normal(22050 - 442) * np.exp(-np.arange(22050 - 442) / 3000)
    sf.write(root / "impulse_responses" / "hall.wav", np.stack([rir, np.roll(rir, 5)], axis=1), 44100)
    return root


@pytest.fixture(scope="module")
def banks(data_dir):
    return A.load_banks(data_dir, babble_clips=[_speech_like(1.0, seed=s) for s in range(3)])


@pytest.mark.parametrize("snr_db", [0.0, 7.5, 25.0])
def test_mix_at_exact_snr(snr_db):
    speech = _speech_like().astype(np.float64)
    noise = 3 * np.random.default_rng(0).standard_normal(len(speech))
    mixed = A.mix_at_snr(speech, noise, snr_db)
    assert _snr(speech, mixed - speech) == pytest.approx(snr_db, abs=0.1)


@pytest.mark.parametrize("noise", ["white", "pink", "brown", "recorded:hum.wav", "babble:4"])
def test_apply_augmentation_snr(banks, noise):
    speech = _speech_like(peak=0.05)  # quiet, so the peak limiter leaves the mixture alone
    spec = A.AugmentSpec(noise=noise, snr_db=10.0)
    mixed = A.apply_augmentation(speech, spec, banks, np.random.default_rng(3))
    assert _snr(speech, mixed.astype(np.float64) - speech) == pytest.approx(10.0, abs=0.1)


def test_peak_is_limited_without_clipping(banks):
    speech = _speech_like(peak=0.99)
    spec = A.AugmentSpec(noise="white", snr_db=0.0, rir="real:hall.wav")
    mixed = A.apply_augmentation(speech, spec, banks, np.random.default_rng(0))
    assert mixed.dtype == np.float32
    assert np.max(np.abs(mixed)) <= A.PEAK_CEILING + 1e-6
    assert np.sum(np.abs(mixed) >= A.PEAK_CEILING - 1e-6) <= 2  # scaled down, not flattened


def test_deterministic(banks):
    speech = _speech_like()
    outs = []
    for _ in range(2):
        rng = np.random.default_rng(42)
        spec = A.sample_augmentation(rng, banks)
        outs.append((spec, A.apply_augmentation(speech, spec, banks, rng)))
    assert outs[0][0] == outs[1][0]
    assert np.array_equal(outs[0][1], outs[1][1])
    for seed in range(8):
        spec = A.AugmentSpec(noise="babble:3", snr_db=5.0, rir="real:hall.wav", speed=1.05)
        a = A.apply_augmentation(speech, spec, banks, np.random.default_rng(seed))
        b = A.apply_augmentation(speech, spec, banks, np.random.default_rng(seed))
        assert np.array_equal(a, b)
    other = A.apply_augmentation(speech, spec, banks, np.random.default_rng(99))
    assert not np.array_equal(a, other)


@pytest.mark.parametrize("factor", [0.9, 1.1])
def test_speed_changes_length_and_pitch(factor):
    t = np.arange(SR) / SR
    tone = 0.5 * np.sin(2 * np.pi * 440 * t)
    out = A.speed_perturb(tone, factor)
    assert abs(len(out) - len(tone) / factor) <= 2
    spectrum = np.abs(np.fft.rfft(out * np.hanning(len(out))))
    peak_hz = np.argmax(spectrum) * SR / len(out)
    assert peak_hz == pytest.approx(440 * factor, rel=0.01)


@pytest.mark.parametrize("rir", ["real:hall.wav", "sim:room=6.00x4.00x3.00,rt60=0.50,src=1.50x2.00x1.60,"
                                                   "mic=4.00x2.50x1.20"])
def test_rir_keeps_length_and_alignment(banks, rir):
    # broadband bursts: their autocorrelation has a single peak, so the lag found is the RIR's alignment
    bursts = np.random.default_rng(0).standard_normal(SR) * (np.arange(SR) % 4000 < 1500)
    speech = (0.5 * bursts / np.max(np.abs(bursts))).astype(np.float32)
    wet = A.apply_augmentation(speech, A.AugmentSpec(rir=rir), banks, np.random.default_rng(0))
    assert len(wet) == len(speech)
    lags = np.arange(-len(speech) + 1, len(speech))
    assert abs(lags[np.argmax(correlate(wet, speech))]) <= 2
    assert np.max(np.abs(wet)) == pytest.approx(np.max(np.abs(speech)), rel=1e-3)
    assert not np.allclose(wet, speech, atol=1e-2)


def test_loaded_banks_are_16k_mono(banks):
    assert sorted(banks.noise.recorded) == ["hum.wav"]  # broken.wav skipped
    assert len(banks.noise.recorded["hum.wav"]) == pytest.approx(3 * SR, abs=2)
    hall = banks.rirs.real["hall.wav"]
    assert hall.ndim == 1 and np.argmax(np.abs(hall)) == pytest.approx(160, abs=2)  # 10 ms at 16 kHz


def test_without_shared_data(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="pasu.corpus.augment"):
        banks = A.load_banks(tmp_path / "absent")
    assert "generated noise and simulated rooms only" in caplog.text
    assert banks.noise.sources() == ["none", "colored"]
    speech = _speech_like(1.0)
    seen_noise, seen_rir = set(), set()
    for seed in range(30):
        rng = np.random.default_rng(seed)
        spec = A.sample_augmentation(rng, banks)
        seen_noise.add(spec.noise.split(":")[0])
        seen_rir.add(spec.rir.split(":")[0])
        if seed < 6:
            out = A.apply_augmentation(speech, spec, banks, rng)
            assert abs(len(out) - len(speech) / spec.speed) <= 2
    assert seen_noise <= {"none", "white", "pink", "brown"} and seen_rir <= {"none", "sim"}
    assert "sim" in seen_rir and "none" in seen_noise


def test_sampled_specs(banks):
    specs = [A.sample_augmentation(np.random.default_rng(s), banks) for s in range(300)]
    for spec in specs:
        json.dumps(asdict(spec))
        A.validate_spec(spec)
        assert 0.9 <= spec.speed <= 1.1
        assert (spec.snr_db is None) == (spec.noise == "none")
        assert spec.snr_db is None or 0 <= spec.snr_db <= 25
    kinds = {s.noise.split(":")[0] for s in specs}
    assert kinds == {"none", "white", "pink", "brown", "recorded", "babble"}
    assert {s.rir.split(":")[0] for s in specs} == {"none", "real", "sim"}
    assert 0.05 < np.mean([s.clean for s in specs]) < 0.25  # ~1/4 without noise x 1/2 without reverb


@pytest.mark.parametrize("color,slope", [("white", 0.0), ("pink", -1.0), ("brown", -2.0)])
def test_colored_noise_slope(color, slope):
    noise = A.colored_noise(color, 4 * SR, np.random.default_rng(0))
    assert np.sqrt(np.mean(noise ** 2)) == pytest.approx(1.0)
    freqs, power = welch(noise, SR, nperseg=4096)
    band = (freqs > 50) & (freqs < 4000)
    fitted = np.polyfit(np.log10(freqs[band]), np.log10(power[band]), 1)[0]
    assert fitted == pytest.approx(slope, abs=0.2)


def test_make_babble():
    clips = [_speech_like(s, seed=k) for k, s in enumerate((0.7, 1.0, 1.3))]
    babble = A.make_babble(clips, np.random.default_rng(0))
    assert len(babble) == len(clips[2])
    assert np.sqrt(np.mean(babble ** 2)) == pytest.approx(1.0)
    assert len(A.make_babble(clips, np.random.default_rng(0), talkers=5, length=5000)) == 5000
    with pytest.raises(ValueError):
        A.make_babble([], np.random.default_rng(0))


def test_sim_room_spec_round_trip():
    room = A.SimRoom.sample(np.random.default_rng(5))
    assert A.SimRoom.parse(room.spec()) == room
    rir = A.simulate_rir(room.spec())
    assert np.max(np.abs(rir)) == pytest.approx(1.0)
    assert np.array_equal(rir, A.simulate_rir.__wrapped__(room.spec()))
