"""Offramp thresholds: offload-ratio and WER-target calibration, NaiveHybrid's probability, WER targets."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pasu.device.calibration import (
    for_ratio,
    for_wer,
    naive_probability,
    offload_curve,
    selectivity,
    wer_targets,
)


def test_curve_walks_from_nothing_to_everything_offloaded_highest_scores_first():
    curve = offload_curve([0.9, 0.1, 0.5, 0.5], local_edits=[3, 0, 1, 1], cloud_edits=[0, 0, 0, 1], ref_words=[2] * 4)
    assert list(curve.offload_ratio) == [0.0, 0.25, 0.75, 1.0]  # the tied 0.5s go together
    assert curve.thresholds[-1] == -math.inf
    assert curve.wer[0] == pytest.approx(5 / 8) and curve.wer[1] == pytest.approx(2 / 8)
    assert curve.wer[-1] == pytest.approx(1 / 8)


def test_a_ratio_threshold_offloads_that_share_when_scores_are_applied_with_greater_than():
    scores = np.linspace(0, 1, 100)
    cal = for_ratio(offload_curve(scores), 0.47)
    assert cal.offload_ratio == pytest.approx(0.47)
    assert np.mean(scores > cal.threshold) == pytest.approx(0.47)


def test_wer_target_takes_the_least_offloading_that_meets_it_or_none():
    # utterance 0 is the device's only error: offloading it alone meets any target above the cloud's WER
    curve = offload_curve([0.9, 0.2, 0.1], [4, 0, 0], [0, 1, 0], [4, 4, 4])
    cal = for_wer(curve, 0.1)
    assert cal.offload_ratio == pytest.approx(1 / 3) and cal.wer == 0.0
    assert for_wer(curve, -0.01) is None


def test_naive_probability_inverts_the_expected_wer():
    p = naive_probability(local_edits=30, cloud_edits=10, words=100, target=0.25)
    assert (1 - p) * 0.30 + p * 0.10 == pytest.approx(0.25)
    assert naive_probability(30, 10, 100, 0.05) is None
    assert naive_probability(30, 10, 100, 0.40) == 0.0


def test_wer_targets_lie_strictly_between_cloud_and_device():
    targets = wer_targets(0.3, 0.1, count=4)
    assert len(targets) == 4 and all(0.1 < t < 0.3 for t in targets) and targets == sorted(targets, reverse=True)
    assert wer_targets(0.1, 0.2) == []


def test_selectivity_reports_auc_and_none_for_a_single_class():
    assert selectivity([0.9, 0.8, 0.1, 0.2], [True, True, False, False])["roc_auc"] == 1.0
    assert selectivity([0.9, 0.1], [True, True])["roc_auc"] is None


def test_curve_matches_offloading_each_threshold_one_by_one_with_ties_and_unscored_utterances():
    rng = np.random.default_rng(3)
    scores = np.append(rng.integers(0, 20, 300).astype(float), [np.inf, np.inf])  # ties; inf: no hypothesis
    local, cloud, words = rng.integers(0, 5, 302), rng.integers(0, 3, 302), rng.integers(1, 9, 302)
    curve = offload_curve(scores, local, cloud, words)
    for t, ratio, wer in zip(curve.thresholds, curve.offload_ratio, curve.wer):
        off = scores > t
        assert ratio == pytest.approx(off.mean())
        assert wer == pytest.approx((local[~off].sum() + cloud[off].sum()) / words.sum())
