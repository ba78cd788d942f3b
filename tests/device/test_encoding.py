"""Chunked ingestion gives the same encoder output as one-shot input, for both kinds of stream."""

from __future__ import annotations

import numpy as np
import torch
from pasu.device.encoding import LateContextStream, RecomputeStream, open_stream


def _offline(model, wave: np.ndarray) -> torch.Tensor:
    with torch.inference_mode():
        enc, lengths = model.encode(torch.from_numpy(wave).unsqueeze(0), torch.tensor([len(wave)]))
    return enc[0, : int(lengths[0])]


def _feed(stream, wave: np.ndarray, sizes: list[int]) -> None:
    i = 0
    for size in sizes:
        stream.accept(wave[i : i + size])
        i += size
    stream.accept(wave[i:])


def test_late_context_stream_in_uneven_chunks_equals_the_offline_encoder(tiny_model, speech_like):
    wave = speech_like(1.3, seed=5)
    stream = open_stream(tiny_model.model)
    assert isinstance(stream, LateContextStream)
    _feed(stream, wave, [1, 159, 1600, 333, 4000, 17, 2500])
    assert torch.allclose(stream.encode(), _offline(tiny_model.model, wave), atol=1e-4)


def test_pilot_encodes_in_between_do_not_change_the_final_output(tiny_model, speech_like):
    wave = speech_like(1.5, seed=6)
    stream = open_stream(tiny_model.model)
    for i in range(0, len(wave), 1600):
        stream.accept(wave[i : i + 1600])
        if i % 4800 == 0:
            stream.encode()  # a pilot
    assert torch.allclose(stream.encode(), _offline(tiny_model.model, wave), atol=1e-4)


def test_recompute_stream_equals_the_offline_encoder(tiny_model, speech_like):
    wave = speech_like(1.1, seed=7)
    stream = RecomputeStream(tiny_model.model)
    assert stream.encode().size(0) == 0  # nothing yet
    _feed(stream, wave, [800] * 10)
    assert torch.allclose(stream.encode(), _offline(tiny_model.model, wave), atol=1e-5)
