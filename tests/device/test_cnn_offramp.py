"""The CNN offramp over encoder output: size, batch invariance, training on a separable split, save/load, the
Offramp protocol on a real search's hypothesis, and a clear error for a hypothesis without encoder output."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pasu.device.cnn_offramp import CnnConfig, CnnNet, CnnOfframp, encoder_features, train
from pasu.device.decoding.search import Hypothesis
from pasu.device.offramp_net import TrainOptions, pad_batch
from pasu.models.checkpoints import count_parameters
from pasu.device.routing import OfframpPolicy

FAST = TrainOptions(epochs=20, learning_rate=3e-3, networks=1)


def frames(n: int, seed: int, width: int = 16) -> tuple[list[np.ndarray], np.ndarray]:
    """Encoder-like outputs of random lengths: calm ones (labels 0) and ones with a long erratic stretch somewhere
    inside (labels 1), as noisy audio would leave."""
    rng = np.random.default_rng(seed)
    seqs, labels = [], []
    for i in range(n):
        x = rng.normal(0.0, 0.3, size=(int(rng.integers(12, 40)), width))
        if i % 2:
            start = int(rng.integers(0, len(x) - 8))
            x[start:start + 8] += rng.normal(0.0, 2.0, size=(8, width))
        seqs.append(x.astype(np.float32))
        labels.append(float(i % 2))
    return seqs, np.array(labels, np.float32)


def test_the_network_is_small_beside_the_papers():
    """Two convolutions and two linear layers over the shipped encoder's 144 channels: tens of thousands of
    parameters (the paper's 192.5 M would only memorize ~2k dev replays)."""
    assert 20_000 <= count_parameters(CnnNet(CnnConfig(input_size=144))) <= 40_000


def test_a_sequence_scores_the_same_alone_and_in_a_padded_batch():
    torch.manual_seed(0)
    net = CnnNet(CnnConfig(input_size=16)).eval()
    seqs, _ = frames(5, seed=3)
    with torch.no_grad():
        batched = net(*pad_batch(seqs))
        alone = torch.cat([net(*pad_batch([s])) for s in seqs])
    torch.testing.assert_close(batched, alone, rtol=1e-5, atol=1e-6)


def test_training_separates_noisy_stretches_on_held_out_data(tmp_path):
    x, y = frames(200, seed=0)  # fewer, and it learns the training stretches' noise rather than noisiness
    offramp = train(x, y, FAST)
    assert offramp.config.input_size == 16  # sized to the frames it was fitted on
    held_x, held_y = frames(40, seed=1)
    p = offramp.probabilities(held_x)
    assert np.mean((p > 0.5) == (held_y > 0.5)) >= 0.9
    loaded = CnnOfframp.load(offramp.save(tmp_path / "offramp"))
    np.testing.assert_allclose(loaded.probabilities(held_x), p, rtol=1e-6)


def test_it_judges_the_encoder_output_a_real_search_read(tiny_model, speech_like):
    """The pilot search's best hypothesis carries the frames it was searched on; the CNN scores them through the
    Offramp protocol, so a policy can offload on it at end of speech."""
    with torch.no_grad():
        stream = tiny_model.open_stream()
        stream.accept(speech_like(1.5, seed=4))
        encoded = stream.encode()
    best = tiny_model.search.search(encoded).best
    assert best.encoded is not None and torch.equal(best.encoded, encoded)
    x, y = frames(20, seed=5, width=encoded.size(1))
    offramp = train(x, y, TrainOptions(epochs=2))
    score = offramp.score(best)
    assert 0.0 <= score <= 1.0 and score == pytest.approx(float(offramp.probabilities([encoded.numpy()])[0]))
    policy = OfframpPolicy(offramp, threshold=-1.0, name="Ours-CNN")
    assert policy.decide(best, 1.5).offload


def test_a_hypothesis_without_encoder_output_is_refused_with_what_to_run():
    with pytest.raises(ValueError, match="pasu offramp train"):
        encoder_features(Hypothesis((1, 2), 0.0, True, token_att=(-0.1, -0.2, -0.1)))
    empty = Hypothesis((), 0.0, False, encoded=torch.zeros(0, 16))
    assert encoder_features(empty).shape == (1, 16)  # no frames yet: one silent step
