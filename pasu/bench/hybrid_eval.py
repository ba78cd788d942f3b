"""Pricing offloading policies from measured parts: local replays, and cloud round trips through a network.

Neither part depends on the policy: the device's answer and timing for an utterance are the same whatever is
decided (the decision's own cost is measured and added), and so is the cloud's answer and round trip for an
utterance on a given network. So each is measured once, and every policy and threshold is an exact
recombination of them, decided by the real policy objects of pasu.device.routing:

- kept local: the local answer, at the local latency;
- offloaded at end of speech (early): the cloud's answer, at decision time + round trip;
- offloaded on the end-of-speech pilot: the cloud's answer, at that pilot's decision time + round trip;
- offloaded after the full local decode (late): the cloud's answer, at local latency + round trip;
- offloaded but the cloud failed (deadline, ...): the local answer, at local latency + the failed round trip.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from pasu.device.calibration import (
    for_wer,
    naive_probability,
    offload_curve,
    wer_targets,
)
from pasu.device.decoding.search import Hypothesis
from pasu.device.offramp_data import OfframpSample
from pasu.device.routing import (
    EitherPolicy,
    Judged,
    Offramp,
    OfframpPolicy,
    Policy,
    Weighing,
    perplexity_offramp,
    weighing_for,
)
from pasu.metrics import LatencyStats, SluResult, evaluate_slu, mean_rtf, word_edits


# Issue 5's bars: an offramp offloads at most OFFLOAD_BAR x what NaiveHybrid needs at each WER target; at
# Offload-M its intent accuracy is at most INTENT_SLACK below AllOffload's
OFFLOAD_BAR = 0.6
INTENT_SLACK = 0.01


@dataclass(frozen=True)
class CloudCall:
    """One utterance offloaded through the network under test."""

    ok: bool  # the cloud answered within the deadline
    latency: float  # seconds: the client's understand() wall time, retries included
    result: SluResult | None  # the cloud's answer when ok
    fallback: str = ""  # why not, when not ok


def measure_cloud(understand: Callable[[OfframpSample], object], samples: Sequence[OfframpSample],
                  progress: Callable[[int, int], None] | None = None) -> list[CloudCall]:
    """Offload every utterance once; `understand` returns a pasu.device.cloud_client.CloudOutcome."""
    calls = []
    for i, sample in enumerate(samples):
        outcome = understand(sample)
        result = outcome.cloud.result if outcome.ok else None
        calls.append(CloudCall(outcome.ok, outcome.latency_s,
                               SluResult(result.text, result.intent, tuple(result.slots)) if result else None,
                               outcome.fallback.value if outcome.fallback else ""))
        if progress:
            progress(i + 1, len(samples))
    return calls


@dataclass(frozen=True)
class Outcome:
    """One design's scores on the utterances (fields None where a design has no such number)."""

    design: str
    offload_ratio: float
    wer: float
    intent_accuracy: float
    mean_latency: float
    mean_rtf: float
    slu_f1: float | None = None
    p50: float | None = None
    p90: float | None = None
    fallbacks: int = 0  # offloads the cloud did not answer (the local answer was used)
    threshold: float | None = None  # the offramp threshold, or NaiveHybrid's probability
    # selectivity (the paper's Fig. 6): the share offloaded of the "target" utterances, those the device gets
    # wrong (local WER above 0.1, the paper's offramp label), and of the others; None: no such utterance
    target_offloaded: float | None = None
    other_offloaded: float | None = None


def hypotheses(samples: Sequence[OfframpSample], judges: Judged) -> list[Hypothesis | None]:
    """What a policy judges for each utterance: the early decision's hypothesis, the end-of-speech pilot, or the
    full decode's."""
    return [f.hypothesis() if (f := s.judged(judges)) else None for s in samples]


def decision_seconds(sample: OfframpSample, judges: Judged) -> float:
    """Seconds from end of speech until a policy judging `judges` has decided (the round trip starts there)."""
    return {"pilot": sample.decision_at, "end": sample.end_decision_at, "final": sample.local_latency}[judges]


def decide(policy: Policy, samples: Sequence[OfframpSample]) -> tuple[np.ndarray, np.ndarray]:
    """Per utterance: does `policy` offload, and how long did deciding take (seconds)."""
    offload, cost = [], []
    for hypothesis, sample in zip(hypotheses(samples, policy.judges), samples):
        start = time.perf_counter()
        offload.append(policy.decide(hypothesis, sample.duration).offload)
        cost.append(time.perf_counter() - start)
    return np.array(offload, dtype=bool), np.array(cost)


def combine(name: str, samples: Sequence[OfframpSample], calls: Sequence[CloudCall], offload: np.ndarray,
            judges: Judged, cost: np.ndarray, threshold: float | None = None) -> Outcome:
    """Answers and latencies when `offload` marks what went to the cloud (see the module doc)."""
    latencies, fallbacks = [], 0
    for sample, call, off, spent in zip(samples, calls, offload, cost):
        if not off:
            latencies.append(sample.local_latency + spent)
        elif call.ok:
            latencies.append(decision_seconds(sample, judges) + spent + call.latency)
        else:
            fallbacks += 1
            latencies.append(sample.local_latency + spent + call.latency)
    scores = evaluate_slu([s.reference for s in samples], answers(samples, calls, offload))
    stats = LatencyStats.from_seconds(latencies)
    target = np.array([s.bad() for s in samples], dtype=bool)
    return Outcome(name, float(np.mean(offload)), scores.wer, scores.intent_accuracy, stats.mean,
                   mean_rtf(latencies, [s.duration for s in samples]), scores.slu_f1, stats.p50, stats.p90,
                   fallbacks, threshold, _share(offload[target]), _share(offload[~target]))


def answers(samples: Sequence[OfframpSample], calls: Sequence[CloudCall], offload: np.ndarray) -> list[SluResult]:
    """What the user gets: the cloud's answer where offloaded and answered, else the local one."""
    return [call.result if off and call.ok else sample.local for sample, call, off in zip(samples, calls, offload)]


def intent_right(samples: Sequence[OfframpSample], calls: Sequence[CloudCall], offload: np.ndarray) -> np.ndarray:
    """Per utterance: is the answer's intent the reference's."""
    return np.array([a.intent == s.reference.intent for a, s in zip(answers(samples, calls, offload), samples)])


def _share(offloaded: np.ndarray) -> float | None:
    return float(np.mean(offloaded)) if len(offloaded) else None


def run_policy(policy: Policy, samples: Sequence[OfframpSample], calls: Sequence[CloudCall],
               threshold: float | None = None) -> Outcome:
    offload, cost = decide(policy, samples)
    return combine(policy.name, samples, calls, offload, policy.judges, cost, threshold)


def naive_expected(p: float, on_device: Outcome, all_offload: Outcome, edits: tuple[float, float, float]) -> Outcome:
    """NaiveHybrid(p) in expectation over its draws: WER, accuracy and mean latency are linear in p."""
    local_edits, cloud_edits, words = edits
    mix = lambda a, b: (1 - p) * a + p * b
    return Outcome(f"NaiveHybrid(p={p:.2f})", p, mix(local_edits, cloud_edits) / words,
                   mix(on_device.intent_accuracy, all_offload.intent_accuracy),
                   mix(on_device.mean_latency, all_offload.mean_latency), mix(on_device.mean_rtf, all_offload.mean_rtf),
                   threshold=p, target_offloaded=p, other_offloaded=p)  # chance: as many of either


def edit_totals(samples: Sequence[OfframpSample], calls: Sequence[CloudCall]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per utterance: local word edits, edits of what offloading returns (the local answer if the cloud failed), words."""
    local = np.array([s.local_edits for s in samples], float)
    cloud = np.array([word_edits(s.reference.text, c.result.text) if c.ok else s.local_edits
                      for s, c in zip(samples, calls)], float)
    return local, cloud, np.array([s.ref_words for s in samples], float)


@dataclass(frozen=True)
class Scorer:
    """An offramp as the bench tunes it: how it scores, and which hypothesis it judges."""

    name: str  # row label, e.g. "Ours-PPL"
    offramp: Offramp
    judges: Judged = "pilot"
    weighing: Weighing = "seconds"  # "none": the score as it is (routing.OfframpPolicy)

    def policy(self, threshold: float) -> OfframpPolicy:
        return OfframpPolicy(self.offramp, threshold, self.name, self.judges, self.weighing)


def word_scorer(name: str, offramp: Offramp, judges: Judged) -> Scorer:
    """A word check judging `judges`, weighed as the agent weighs it (routing.weighing_for)."""
    return Scorer(name, offramp, judges, weighing_for(judges))


def ppl_scorer(name: str, judges: Judged) -> Scorer:
    """The perplexity check of a policy judging `judges`, as the agent scores it (routing.perplexity_offramp)."""
    return word_scorer(name, perplexity_offramp(judges), judges)


@dataclass(frozen=True)
class EitherScorer:
    """Scorers combined as the agent's pair policies combine them (routing.EitherPolicy): each part at its
    scale counts as 1, the threshold moves them together."""

    name: str  # row label, e.g. "Ours-PPL+Intent"
    parts: tuple[tuple[Scorer, float], ...]  # (scorer, its threshold at which it counts as 1)
    judges: Judged = "pilot"

    def policy(self, threshold: float) -> EitherPolicy:
        return EitherPolicy(tuple(scorer.policy(scale) for scorer, scale in self.parts), threshold, self.name)


def design_scores(samples: Sequence[OfframpSample], scorer: Scorer | EitherScorer) -> np.ndarray:
    """Per utterance, the score a design's threshold is compared with (inf: nothing to judge, offload first)."""
    scoring = scorer.policy(threshold=np.inf)  # only its scores are read
    return np.array([scoring.score(h, s.duration) if h else np.inf
                     for h, s in zip(hypotheses(samples, scorer.judges), samples)], dtype=np.float64)


def table5(samples: Sequence[OfframpSample], calls: Sequence[CloudCall], scorers: Sequence[Scorer | EitherScorer],
           on_device: Outcome, all_offload: Outcome, count: int = 4,
           scores: Mapping[str, np.ndarray] | None = None) -> dict[str, dict[str, Outcome | None]]:
    """{WER target: {design: outcome}}: for each target between device and cloud WER, each design's least
    offloading that meets it, thresholds tuned on these utterances as the paper's Table 5 (None: unreachable).
    `scores`: the designs' `design_scores` where already computed."""
    local, cloud, words = edit_totals(samples, calls)
    totals = (local.sum(), cloud.sum(), words.sum())
    scores = scores or {scorer.name: design_scores(samples, scorer) for scorer in scorers}
    table: dict[str, dict[str, Outcome | None]] = {}
    for target in wer_targets(totals[0] / totals[2], totals[1] / totals[2], count):
        p = naive_probability(*totals, target)
        row: dict[str, Outcome | None] = {"NaiveHybrid": naive_expected(p, on_device, all_offload, totals)
                                          if p is not None else None}
        for scorer in scorers:
            cal = for_wer(offload_curve(scores[scorer.name], local, cloud, words), target)
            row[scorer.name] = run_policy(scorer.policy(cal.threshold), samples, calls, cal.threshold) if cal else None
        table[f"{target:.4f}"] = row
    return table


def target_checks(table: dict[str, dict[str, Outcome | None]], designs: dict[str, Outcome],
                  all_offload: Outcome, ratio: float = OFFLOAD_BAR) -> list[tuple[str, bool | None]]:
    """The issue's targets: offramps offload <= OFFLOAD_BAR x NaiveHybrid at each WER target; Offload-M latency and IC.

    Each check is True, False, or None where a design is missing; plain bools (the outcomes hold numpy floats,
    whose comparisons give numpy bools, which JSON cannot write)."""
    checks: list[tuple[str, bool | None]] = []
    # the designs deciding at end of speech: on the last pilot, and on the end-of-speech pilot where priced
    early = ["Ours-PPL", "Ours-BiLSTM", *(n for n in ("End-PPL", "End-BiLSTM") if any(n in r for r in table.values()))]
    for target, row in table.items():
        naive = row.get("NaiveHybrid")
        for name in early:
            ours = row.get(name)
            ok = None if naive is None or ours is None else bool(
                ours.offload_ratio <= ratio * naive.offload_ratio + 1e-12)
            checks.append((f"WER {target}: {name} offloads <= {ratio}x NaiveHybrid", ok))
    offload_m = [name for name in designs if name.startswith(("Ours-", "End-")) and name.endswith("-M")]
    for name in offload_m or ["Ours-PPL-M"]:  # every offramp deciding at end of speech, at Offload-M
        m = designs.get(name)
        checks.append((f"{name}: mean latency <= 0.75x AllOffload",
                       None if m is None else bool(m.mean_latency <= 0.75 * all_offload.mean_latency)))
        checks.append((f"{name}: intent accuracy within {100 * INTENT_SLACK:g} point of AllOffload",
                       None if m is None else bool(m.intent_accuracy >= all_offload.intent_accuracy - INTENT_SLACK)))
    return checks
