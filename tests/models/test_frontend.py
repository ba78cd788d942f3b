"""Streaming-exact fbank frontend and global normalization."""

import numpy as np
import pytest
import torch

from pasu.models.frontend import (
    N_MELS,
    FbankFrontend,
    GlobalNormalize,
    StreamingFrontend,
    compute_global_stats,
    num_frames,
)


def _audio(seconds: float, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    n = int(seconds * 16000)
    t = torch.arange(n) / 16000
    return 0.3 * torch.sin(2 * np.pi * 440 * t) + 0.05 * torch.randn(n, generator=g)


@pytest.fixture(scope="module")
def frontend() -> FbankFrontend:
    fe = FbankFrontend()
    mean, std = compute_global_stats([_audio(1.0, s) for s in range(3)])
    fe.set_stats(mean, std)
    return fe


def test_num_frames_has_no_centre_padding():
    assert [num_frames(n) for n in (0, 399, 400, 559, 560, 16000)] == [0, 0, 1, 1, 2, 98]


def test_prefix_features_are_a_prefix(frontend):
    wave = _audio(1.3)
    full = frontend.extract(wave)
    part = frontend.extract(wave[:9000])
    assert part.shape == (num_frames(9000), N_MELS)
    torch.testing.assert_close(part, full[: part.size(0)], atol=1e-5, rtol=0)


@pytest.mark.parametrize("chunking", ["100ms", "random"])
def test_streaming_equals_one_shot(frontend, chunking):
    wave = _audio(2.017, seed=4)
    if chunking == "100ms":
        sizes = [1600] * (wave.numel() // 1600 + 1)
    else:
        rng = np.random.default_rng(1)
        sizes = list(rng.choice([1, 7, 159, 160, 399, 401, 1600, 3333], size=200))
    stream = StreamingFrontend(frontend)
    outs, pos = [], 0
    for size in sizes:
        if pos >= wave.numel():
            break
        outs.append(stream.accept_waveform(wave[pos : pos + size]))
        pos += size
    assert pos >= wave.numel()
    streamed = torch.cat(outs + [stream.flush()])
    full = frontend.extract(wave)
    assert streamed.shape == full.shape
    assert (streamed - full).abs().max().item() < 1e-5


def test_global_stats_normalize_training_data():
    waves = [_audio(1.0, s) for s in range(3)]
    mean, std = compute_global_stats(waves)
    fe = FbankFrontend()
    fe.set_stats(mean, std)
    feats = torch.cat([fe.extract(w) for w in waves])
    assert feats.mean(0).abs().max() < 1e-3
    assert (feats.std(0, unbiased=False) - 1).abs().max() < 1e-3


def test_stats_are_saved_with_the_model(frontend):
    state = frontend.state_dict()
    assert set(state) == {"normalize.mean", "normalize.std"}
    fresh = FbankFrontend()
    fresh.load_state_dict(state)
    wave = _audio(0.5)
    torch.testing.assert_close(fresh.extract(wave), frontend.extract(wave))


def test_batch_forward_matches_single_and_zeroes_padding(frontend):
    a, b = _audio(1.0, 1), _audio(0.61, 2)
    batch = torch.zeros(2, a.numel())
    batch[0], batch[1, : b.numel()] = a, b
    feats, lens = frontend(batch, torch.tensor([a.numel(), b.numel()]))
    assert lens.tolist() == [num_frames(a.numel()), num_frames(b.numel())]
    torch.testing.assert_close(feats[1, : lens[1]], frontend.extract(b), atol=1e-5, rtol=0)
    assert feats[1, lens[1] :].abs().max() == 0


def test_sine_peaks_in_the_right_mel_bin():
    import librosa

    fe = FbankFrontend(global_norm=False)
    t = torch.arange(16000) / 16000
    feats = fe.log_mel(torch.sin(2 * np.pi * 1000 * t)[None])[0]
    centres = librosa.mel_frequencies(n_mels=N_MELS + 2, fmax=8000)[1:-1]
    assert abs(centres[int(feats.mean(0).argmax())] - 1000) < 100


def test_global_normalize_identity_by_default():
    x = torch.randn(2, 5, N_MELS)
    y, _ = GlobalNormalize()(x.clone(), torch.tensor([5, 5]))
    torch.testing.assert_close(x, y)
