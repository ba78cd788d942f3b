"""Bootstrap intervals of the hybrid bench: Table 5's ratios and the Offload-M intent gap over resamples."""

from __future__ import annotations

import numpy as np
import pytest

from pasu.bench.intervals import ResampleOptions, gap_interval, interval, resamples, table5_intervals

OPTIONS = ResampleOptions(draws=200, seed=1)


def utterances(n: int = 400, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Local and cloud word edits and reference words: the device wrong on about a third, the cloud rarely."""
    rng = np.random.default_rng(seed)
    words = rng.integers(3, 10, n).astype(float)
    local = np.where(rng.random(n) < 0.35, rng.integers(1, 4, n), 0).astype(float)
    cloud = np.where(rng.random(n) < 0.1, 1, 0).astype(float)
    return local, cloud, words


def test_a_ranking_that_knows_the_errors_meets_the_bar_on_every_resample_and_chance_on_none():
    local, cloud, words = utterances()
    noise = np.random.default_rng(2).random(len(local))
    spans = table5_intervals({"knows": local - cloud + 1e-3 * noise, "chance": noise}, local, cloud, words, OPTIONS)
    assert len(spans["knows"]) == 4
    for knows, chance in zip(spans["knows"], spans["chance"]):
        assert knows.high < 0.6 and knows.meeting == 1.0
        assert chance.low > 0.6 and chance.high > 1.0 and chance.meeting < 0.1  # a random ranking is NaiveHybrid


def test_the_same_seed_draws_the_same_resamples_for_every_number():
    first = [idx.copy() for idx in resamples(50, OPTIONS)]
    assert all(np.array_equal(a, b) for a, b in zip(first, resamples(50, OPTIONS)))
    assert not np.array_equal(first[0], first[1])


def test_an_unreachable_resample_ranks_last_and_misses_the_bar():
    values = np.array([0.5, 0.55, np.inf, 0.58])
    span = interval(values, values <= 0.6, level=0.5)
    assert span.meeting == 0.75 and span.high == np.inf and span.low == 0.5


def test_the_intent_gap_interval_holds_the_measured_gap_and_how_often_it_is_within_a_point():
    rng = np.random.default_rng(4)
    everything = rng.random(3000) < 0.82
    same = gap_interval(everything, everything, OPTIONS)
    assert (same.low, same.high, same.meeting) == (0.0, 0.0, 1.0)
    worse = everything.copy()
    worse[np.flatnonzero(everything)[:90]] = False  # 3 points fewer right
    gap = gap_interval(worse, everything, OPTIONS)
    assert gap.low <= -0.03 <= gap.high and gap.meeting == 0.0
    assert gap.high - gap.low < 0.02  # paired: only the 90 changed answers vary
    assert gap_interval(worse, everything, OPTIONS, bar=-0.05).meeting == pytest.approx(1.0)
