"""A decoder step with the encoder output's projections computed once: ESPnet's batch_score, step for step."""

from __future__ import annotations

import copy

import pytest
import torch
from pasu.device.decoding.decoder_step import SourceKeys, batch_score


@pytest.fixture(scope="module")
def memory(tiny_model, speech_like):
    """(1, T, D) encoder output of one utterance."""
    with torch.inference_mode():
        wave = torch.from_numpy(speech_like(1.3, 5)).unsqueeze(0)
        enc, lengths = tiny_model.model.encode(wave, torch.tensor([wave.size(1)]))
    return enc[:, : int(lengths[0])]


def test_steps_give_espnets_scores_and_states(tiny_model, memory):
    decoder = tiny_model.model.decoder
    sos = tiny_model.model.sos
    with torch.inference_mode():
        keys = SourceKeys.of(decoder, memory)
        assert keys is not None and len(keys.keys_values) == len(decoder.decoders)
        # three steps over a beam of 3 prefixes, each step feeding back its states, as the search does
        ys = torch.full((3, 1), sos)
        ours_states = theirs_states = [None] * 3
        for step in range(3):
            ours, ours_states = batch_score(decoder, ys, ours_states, keys)
            theirs, theirs_states = decoder.batch_score(ys, theirs_states, memory.expand(3, -1, -1))
            assert torch.allclose(ours, theirs, atol=1e-5), f"step {step}"
            for a, b in zip(ours_states, theirs_states):
                assert all(torch.allclose(x, y, atol=1e-5) for x, y in zip(a, b))
            ys = torch.cat([ys, torch.tensor([[5], [6], [7]]) + step], 1)


def test_other_decoders_keep_espnets_own_step(tiny_model, memory):
    decoder = copy.deepcopy(tiny_model.model.decoder)
    decoder.decoders[0].concat_after = True  # a variant _layer_step does not reproduce
    assert SourceKeys.of(decoder, memory) is None
    assert SourceKeys.of(torch.nn.Linear(2, 2), memory) is None  # not a transformer decoder at all


def test_the_search_projects_the_memory_once_per_utterance(tiny_model, memory):
    """The point of the module: a search's steps no longer run the source attention's key/value projections."""
    layer = tiny_model.model.decoder.decoders[0].src_attn.linear_k
    calls = []
    handle = layer.register_forward_hook(lambda *_: calls.append(1))
    try:
        result = tiny_model.search.search(memory[0])
    finally:
        handle.remove()
    assert result.stats.steps > 1 and len(calls) == 1
