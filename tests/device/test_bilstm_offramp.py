"""The BiLSTM offramp: size, features, training on a separable split, save/load, the Offramp protocol."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pasu.device.bilstm_offramp import (
    LOGP_FLOOR,
    BiLstmNet,
    BiLstmOfframp,
    EndBiLstmOfframp,
    LateBiLstmOfframp,
    pilot_features,
    token_features,
    train,
)
from pasu.device.decoding.search import Hypothesis
from pasu.device.offramp_net import TrainOptions
from pasu.models.checkpoints import count_parameters
from pasu.device.routing import OfframpPolicy


def sequences(n: int, seed: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Confident sequences (labels 0) and ones with a run of unlikely tokens (labels 1), random lengths."""
    rng = np.random.default_rng(seed)
    seqs, labels = [], []
    for i in range(n):
        length = int(rng.integers(4, 14))
        x = -rng.exponential(0.2, size=(length, 2))
        if i % 2:
            start = int(rng.integers(0, length - 2))
            x[start:start + 3] -= rng.uniform(3, 6, size=(3, 2))
        seqs.append(x.astype(np.float32))
        labels.append(float(i % 2))
    return seqs, np.array(labels, dtype=np.float32)


def test_the_network_has_about_eleven_thousand_parameters():
    assert 10_500 <= count_parameters(BiLstmNet()) <= 11_600


def test_features_pair_attention_and_ctc_and_clip_impossible_tokens():
    hyp = Hypothesis((1, 2), 0.0, True, token_att=(-0.1, -2.0, -1e10), token_ctc=(-0.5, float("-inf"), -0.2))
    x = token_features(hyp)
    assert x.shape == (3, 2)
    assert x[0].tolist() == [np.float32(-0.1), np.float32(-0.5)]
    assert x[1, 1] == LOGP_FLOOR and x[2, 0] == LOGP_FLOOR
    assert token_features(Hypothesis((), 0.0, False)).shape == (1, 2)  # nothing decoded yet: one blank step


def test_a_pilots_network_reads_its_words_and_the_whole_inputs_networks_its_eos_too():
    ended = Hypothesis((1, 2), 0.0, True, token_att=(-0.1, -2.0, -7.0), token_ctc=(-0.5, -0.4))
    capped = Hypothesis((1, 2), 0.0, False, token_att=(-0.1, -2.0), token_ctc=(-0.5, -0.4))
    assert (pilot_features(ended) == pilot_features(capped)).all() and pilot_features(ended).shape == (2, 2)
    assert BiLstmOfframp.features(ended).shape == (2, 2)
    assert LateBiLstmOfframp.features(ended).shape == EndBiLstmOfframp.features(ended).shape == (3, 2)
    assert pilot_features(Hypothesis((), 0.0, True, token_att=(-0.2,))).shape == (1, 2)  # only <eos>: a blank step


def test_training_separates_runs_of_unlikely_tokens_on_held_out_data(tmp_path):
    x, y = sequences(80, seed=0)
    offramp = train(x, y, TrainOptions(epochs=25))
    held_x, held_y = sequences(40, seed=1)
    p = offramp.probabilities(held_x)
    assert np.mean((p > 0.5) == (held_y > 0.5)) >= 0.9
    loaded = BiLstmOfframp.load(offramp.save(tmp_path / "offramp"))
    np.testing.assert_allclose(loaded.probabilities(held_x), p, rtol=1e-6)


def test_its_score_is_the_mean_of_networks_fitted_from_successive_seeds(tmp_path):
    x, y = sequences(40, seed=3)
    offramp = train(x, y, TrainOptions(epochs=3, seed=5, networks=3))
    singles = [train(x, y, TrainOptions(epochs=3, seed=seed, networks=1)).probabilities(x) for seed in (5, 6, 7)]
    assert len(offramp.nets) == 3 and not np.allclose(singles[0], singles[1])  # seeds that differ
    np.testing.assert_allclose(offramp.probabilities(x), np.mean(singles, axis=0), rtol=1e-5)
    loaded = BiLstmOfframp.load(offramp.save(tmp_path / "offramp"))
    assert len(loaded.nets) == 3
    np.testing.assert_allclose(loaded.probabilities(x), offramp.probabilities(x), rtol=1e-6)


def test_a_folder_with_one_network_loads_as_before(tmp_path):
    """Folders fitted before the averaging hold a bare state dict; they load and score as one network."""
    x, y = sequences(20, seed=4)
    single = train(x, y, TrainOptions(epochs=2, networks=1))
    folder = single.save(tmp_path / "offramp")
    assert isinstance(torch.load(folder / BiLstmOfframp.weights_file, weights_only=True), dict)
    loaded = BiLstmOfframp.load(folder)
    assert len(loaded.nets) == 1
    np.testing.assert_allclose(loaded.probabilities(x), single.probabilities(x), rtol=1e-6)


def test_an_offramp_needs_a_network():
    with pytest.raises(ValueError, match="at least one network"):
        TrainOptions(networks=0)
    with pytest.raises(ValueError, match="at least one network"):
        BiLstmOfframp([])


def test_it_drives_an_offramp_policy():
    x, y = sequences(40, seed=2)
    offramp = train(x, y, TrainOptions(epochs=25))
    bad = Hypothesis((1, 2, 3, 4), 0.0, True, token_att=(-0.1, -5.0, -5.5, -6.0, -0.1), token_ctc=(-0.1, -4, -5, -4, -0.1))
    good = Hypothesis((1, 2, 3, 4), 0.0, True, token_att=(-0.1,) * 5, token_ctc=(-0.05,) * 5)
    policy = OfframpPolicy(offramp, 0.5 * 3.0, "Ours-BiLSTM")  # P(bad) 0.5 in a 3-second utterance
    assert policy.decide(bad, 3.0).offload and not policy.decide(good, 3.0).offload
