"""Offramp thresholds from dev data: for a target offload ratio, or the least offloading that meets a target WER.

An offramp offloads when its score exceeds the threshold, so raising the threshold walks down the utterances
sorted by score. Every distinct score is one step of that walk: `offload_curve` lists them with the offload ratio
and the corpus WER each step gives (offloaded utterances take the cloud's word edits, the rest the device's).
NaiveHybrid has no scores; its expected WER is linear in its probability, which `naive_probability` inverts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from sklearn.metrics import average_precision_score, roc_auc_score

# The paper's Ours-Offload-L/M/H settings: shares of utterances offloaded (Sec. 7.1).
OFFLOAD_LEVELS = {"L": 0.25, "M": 0.47, "H": 0.63}


@dataclass(frozen=True)
class OffloadCurve:
    """One point per threshold, from offloading nothing to offloading everything."""

    thresholds: np.ndarray  # offload when score > threshold; decreasing
    offload_ratio: np.ndarray  # share of utterances offloaded at each threshold; increasing
    wer: np.ndarray  # corpus WER at each threshold (nan when cloud edits were not given)


@dataclass(frozen=True)
class Calibration:
    """A threshold and what it gave on the calibration data."""

    target: str  # what was asked, e.g. "offload=0.47" or "wer=0.12"
    threshold: float  # offload when score > threshold
    offload_ratio: float  # on the calibration data
    wer: float | None  # on the calibration data (None without cloud edits)


def offload_curve(scores: Sequence[float], local_edits: Sequence[float] | None = None,
                  cloud_edits: Sequence[float] | None = None, ref_words: Sequence[float] | None = None) -> OffloadCurve:
    """Every distinct offloading set a threshold can pick, highest scores offloaded first."""
    s = np.asarray(scores, dtype=np.float64)
    if s.size == 0 or np.isnan(s).any():
        raise ValueError("need at least one score and no NaN")
    distinct = np.unique(s)[::-1]  # decreasing
    thresholds = np.append(distinct, -math.inf)  # > the highest: nothing; > -inf: everything
    # the utterances scoring above a threshold are the first ones of the scores sorted in decreasing order, so
    # each step's sums are prefix sums of that order: O(n log n), which bootstrap resampling needs
    offloaded = s.size - np.searchsorted(np.sort(s), thresholds, side="right")
    wer = np.full(len(thresholds), np.nan)
    if local_edits is not None and cloud_edits is not None and ref_words is not None:
        order = np.argsort(-s, kind="stable")
        local, cloud = np.asarray(local_edits, float)[order], np.asarray(cloud_edits, float)[order]
        local_kept = local.sum() - np.concatenate([[0.0], np.cumsum(local)])[offloaded]
        cloud_taken = np.concatenate([[0.0], np.cumsum(cloud)])[offloaded]
        wer = (local_kept + cloud_taken) / float(np.sum(ref_words))
    return OffloadCurve(thresholds, offloaded / s.size, wer)


def for_ratio(curve: OffloadCurve, ratio: float) -> Calibration:
    """The threshold whose offload ratio is nearest `ratio` (the lower one on ties)."""
    i = int(np.argmin(np.abs(curve.offload_ratio - ratio)))
    return _point(curve, i, f"offload={ratio:g}")


def for_wer(curve: OffloadCurve, target: float) -> Calibration | None:
    """The least offloading whose WER is at most `target`; None when even offloading everything misses it."""
    if np.isnan(curve.wer).all():
        raise ValueError("the curve has no WER: give local and cloud edits")
    meeting = np.flatnonzero(curve.wer <= target + 1e-12)
    return _point(curve, int(meeting[0]), f"wer={target:g}") if meeting.size else None


def _point(curve: OffloadCurve, i: int, target: str) -> Calibration:
    wer = None if np.isnan(curve.wer[i]) else float(curve.wer[i])
    return Calibration(target, float(curve.thresholds[i]), float(curve.offload_ratio[i]), wer)


def naive_probability(local_edits: float, cloud_edits: float, words: float, target: float) -> float | None:
    """NaiveHybrid's offload probability whose expected WER is `target`; None when the cloud alone misses it."""
    local_wer, cloud_wer = local_edits / words, cloud_edits / words
    if target >= local_wer:
        return 0.0
    if target < cloud_wer or local_wer <= cloud_wer:
        return None
    return (local_wer - target) / (local_wer - cloud_wer)  # E[WER](p) = (1 - p) local + p cloud


def wer_targets(local_wer: float, cloud_wer: float, count: int = 4) -> list[float]:
    """`count` WER targets evenly inside (cloud, device), as the columns of the paper's Table 5."""
    if cloud_wer >= local_wer:
        return []
    step = (local_wer - cloud_wer) / (count + 1)
    return [round(local_wer - step * (k + 1), 4) for k in range(count)]


def selectivity(scores: Sequence[float], labels: Sequence[bool]) -> dict[str, float | None]:
    """How well scores rank bad local results first: ROC AUC and average precision (None: one class only)."""
    y = np.asarray(labels, dtype=bool)
    s = np.nan_to_num(np.asarray(scores, dtype=np.float64), posinf=np.finfo(np.float64).max)
    if y.all() or not y.any():
        return {"roc_auc": None, "average_precision": None, "positives": float(y.mean()) if y.size else None}
    return {"roc_auc": float(roc_auc_score(y, s)), "average_precision": float(average_precision_score(y, s)),
            "positives": float(y.mean())}
