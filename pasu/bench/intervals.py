"""How far the hybrid bench's headline numbers move when the test utterances are drawn again (bootstrap).

Table 5's ratios and the Offload-M intent gap are measured on one set of utterances, and a design 0.001x over a
bar may meet it on another draw of the same size. Each resample draws the utterances with replacement,
derives the WER targets and NaiveHybrid's need from its own device and cloud WER (as the bench does on the
originals), tunes each design's threshold on it again and reads the ratio. The offramps' scores and the answers
stay as measured: what varies is which utterances were asked.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from pasu.bench.hybrid_eval import INTENT_SLACK, OFFLOAD_BAR
from pasu.device.calibration import for_wer, naive_probability, offload_curve, wer_targets


@dataclass(frozen=True)
class ResampleOptions:
    draws: int = 1000  # bootstrap resamples of the utterances
    level: float = 0.95  # the central share of the resampled values an interval holds
    seed: int = 0  # the same seed draws the same resamples for every number of one run


@dataclass(frozen=True)
class Interval:
    """A number's spread over the resamples, and how often it met its bar."""

    low: float
    high: float
    meeting: float  # share of resamples in which the bar was met


def resamples(count: int, options: ResampleOptions) -> Iterator[np.ndarray]:
    """Indices of `options.draws` resamples with replacement of `count` utterances."""
    rng = np.random.default_rng(options.seed)
    for _ in range(options.draws):
        yield rng.integers(0, count, count)


def interval(values: np.ndarray, met: np.ndarray, level: float) -> Interval:
    """The central `level` of `values` (inf where a resample had none: it ranks last) and the share `met`."""
    tail = (1 - level) / 2
    return Interval(float(np.quantile(values, tail, method="lower")),
                    float(np.quantile(values, 1 - tail, method="higher")), float(np.mean(met)))


def table5_intervals(scores: Mapping[str, np.ndarray], local: np.ndarray, cloud: np.ndarray, words: np.ndarray,
                     options: ResampleOptions, count: int = 4, bar: float = OFFLOAD_BAR) -> dict[str, list[Interval]]:
    """{design: per WER target, its offload as a multiple of NaiveHybrid's}, each design's `scores` ranking the
    utterances (higher: offload first) with their local and cloud word edits and reference words. A resample
    where a design or NaiveHybrid cannot reach a target counts as missing the bar."""
    ratios = {name: np.full((options.draws, count), np.inf) for name in scores}
    for d, idx in enumerate(resamples(len(local), options)):
        l, c, w = local[idx], cloud[idx], words[idx]
        totals = (l.sum(), c.sum(), w.sum())
        targets = wer_targets(totals[0] / totals[2], totals[1] / totals[2], count)
        needs = [naive_probability(*totals, t) for t in targets]
        for name, s in scores.items():
            curve = offload_curve(s[idx], l, c, w)
            for k, (target, need) in enumerate(zip(targets, needs)):
                if need and (cal := for_wer(curve, target)):
                    ratios[name][d, k] = cal.offload_ratio / need
    return {name: [interval(r[:, k], r[:, k] <= bar + 1e-12, options.level) for k in range(count)]
            for name, r in ratios.items()}


def gap_interval(right: np.ndarray, reference_right: np.ndarray, options: ResampleOptions,
                 bar: float = -INTENT_SLACK) -> Interval:
    """A design's accuracy minus a reference's on the same utterances (per utterance: right or not), and how
    often it stays at or above `bar` (Offload-M: within 1 point of AllOffload)."""
    diff = np.asarray(right, float) - np.asarray(reference_right, float)
    gaps = np.array([diff[idx].mean() for idx in resamples(len(diff), options)])
    return interval(gaps, gaps >= bar - 1e-12, options.level)
