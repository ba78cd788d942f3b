"""Scores PASU reports: WER, intent accuracy, SLURP's SLU-F1 and span F1, latency and real-time factor.

SLU-F1 reproduces the official SLURP evaluation (Bastianelli et al., "SLURP: A Spoken Language
Understanding Resource Package", EMNLP 2020), github.com/pswietojanski/slurp:
  - scripts/evaluation/evaluate.py: one `span_distance_f1` metric per distance ("word", "char"), each fed
    every utterance's gold and predicted entities; SLU-F1 is `slu_f1` fed both metrics' per-type results;
  - scripts/evaluation/metrics/metrics.py: `SpanDistanceFMeasure` (pairing, soft counts), `SpanFMeasure`
    (exact span F1), `SLUF1` (sum of the two confusion counts) and `compute_metrics` (P/R/F1, zero rules);
  - scripts/evaluation/metrics/distance.py: word distance = jiwer WER, char distance = textdistance's
    normalised Levenshtein.
evaluate.py was read in pswietojanski/slurp itself; metrics.py and distance.py were read in the copy
espnet vendors (egs2/slurp_entity/asr1/local/evaluation/metrics/), which NeMo also vendors unchanged.

The SLURP algorithm, per utterance and separately for each distance (so word and char may pair differently):
  1. walk the predicted slots in order; one whose type matches a still-unpaired gold slot is paired with the
     unpaired gold slot of that type at the lowest distance (the first one on ties), adding TP += 1,
     FP += distance, FN += distance, and that gold slot is used up;
  2. a predicted slot with no unpaired gold slot of its type adds FP += 1;
  3. each gold slot left unpaired adds FN += 1.
Counts are summed per slot type over the corpus. Two consequences people find surprising, both official:
a right-type wrong-filler pair still earns TP = 1 (word distance 1 gives P = R = F1 = 0.5, not 0), and the
word distance is a WER, so it can exceed 1 (gold "five", predicted "five thirty pm": distance 2).

Normalisation (case, punctuation) is the caller's job everywhere; text is only split on whitespace. SLURP
lowercases its gold fillers, so compare against lowercased predictions to match its published numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import editdistance
import numpy as np

from pasu.slu import Slot

Average = Literal["micro", "macro"]


# --- WER ------------------------------------------------------------------------------------------


def word_edits(ref: str, hyp: str) -> int:
    """Word-level Levenshtein distance (substitutions + deletions + insertions) between two transcripts."""
    return editdistance.eval(ref.split(), hyp.split())


def utterance_wer(ref: str, hyp: str) -> float:
    """Edits per reference word; an empty reference counts as one word, so it scores len(hyp words)."""
    # An empty reference has no rate; dividing by max(n, 1) keeps the value finite and still penalises
    # every inserted word (0.0 only when the hypothesis is empty too).
    return word_edits(ref, hyp) / max(len(ref.split()), 1)


@dataclass(frozen=True)
class WordErrors:
    """A minimum-edit alignment's error counts, as sclite's Sub / Del / Ins columns; they add over utterances."""

    substitutions: int = 0
    deletions: int = 0  # reference words the hypothesis lacks
    insertions: int = 0  # hypothesis words the reference lacks
    ref_words: int = 0

    @property
    def edits(self) -> int:
        return self.substitutions + self.deletions + self.insertions

    def __add__(self, other: WordErrors) -> WordErrors:
        return WordErrors(self.substitutions + other.substitutions, self.deletions + other.deletions,
                          self.insertions + other.insertions, self.ref_words + other.ref_words)

    def rate(self, count: int) -> float:
        """`count` per reference word (ValueError over zero reference words)."""
        if self.ref_words == 0:
            raise ValueError("error rates are undefined over zero reference words")
        return count / self.ref_words


def word_errors(ref: str, hyp: str) -> WordErrors:
    """Substitutions, deletions and insertions of one minimum-edit alignment (they sum to `word_edits`)."""
    r, h = ref.split(), hyp.split()
    # deletions - insertions = len(r) - len(h) in every alignment, so when the edit distance (editdistance's C
    # code) is that difference there is nothing to substitute: most answers leave here, before the Python walk
    edits, surplus = editdistance.eval(r, h), len(r) - len(h)
    if edits == abs(surplus):
        return WordErrors(0, max(surplus, 0), max(-surplus, 0), len(r))
    # cost[i][j]: edits turning r[:i] into h[:j]; the walk back takes the diagonal whenever it is on a cheapest
    # path, so of equally cheap alignments the one with the fewest deletions and insertions is counted
    # ("a b" -> "b a": two substitutions, not a deletion and an insertion)
    cost = [[i + j if i == 0 or j == 0 else 0 for j in range(len(h) + 1)] for i in range(len(r) + 1)]
    for i in range(1, len(r) + 1):
        for j in range(1, len(h) + 1):
            cost[i][j] = min(cost[i - 1][j - 1] + (r[i - 1] != h[j - 1]), cost[i - 1][j] + 1, cost[i][j - 1] + 1)
    sub = dele = ins = 0
    i, j = len(r), len(h)
    while i or j:
        if i and j and cost[i][j] == cost[i - 1][j - 1] + (r[i - 1] != h[j - 1]):
            sub += r[i - 1] != h[j - 1]
            i, j = i - 1, j - 1
        elif i and cost[i][j] == cost[i - 1][j] + 1:
            dele, i = dele + 1, i - 1
        else:
            ins, j = ins + 1, j - 1
    return WordErrors(sub, dele, ins, len(r))


def corpus_word_errors(refs: Sequence[str], hyps: Sequence[str]) -> WordErrors:
    """`word_errors` summed over aligned transcripts."""
    _check_aligned(refs, hyps)
    return sum((word_errors(ref, hyp) for ref, hyp in zip(refs, hyps)), WordErrors())


def corpus_wer(refs: Sequence[str], hyps: Sequence[str]) -> float:
    """Total word edits over total reference words; raises ValueError when there are no reference words."""
    _check_aligned(refs, hyps)
    ref_words = sum(len(ref.split()) for ref in refs)
    if ref_words == 0:
        raise ValueError("corpus WER is undefined over zero reference words")
    return sum(word_edits(ref, hyp) for ref, hyp in zip(refs, hyps)) / ref_words


# --- Intent accuracy --------------------------------------------------------------------------------


def intent_accuracy(refs: Sequence[str], hyps: Sequence[str]) -> float:
    """Fraction of utterances whose predicted intent equals the gold intent exactly."""
    _check_aligned(refs, hyps)
    if not refs:
        raise ValueError("intent accuracy is undefined over zero utterances")
    return sum(ref == hyp for ref, hyp in zip(refs, hyps)) / len(refs)


# --- Slot F1 (SLURP) --------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpanCounts:
    """Soft confusion counts for one slot type; SLURP's distance metrics make FP and FN fractional."""

    tp: float = 0.0
    fp: float = 0.0
    fn: float = 0.0

    def __add__(self, other: SpanCounts) -> SpanCounts:
        return SpanCounts(self.tp + other.tp, self.fp + other.fp, self.fn + other.fn)

    # SLURP's compute_metrics: a ratio with a zero numerator and zero denominator is 0, not undefined.
    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp or self.fp else 0.0

    @property
    def recall(self) -> float:
        return self.tp / (self.tp + self.fn) if self.tp or self.fn else 0.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p or r else 0.0


TypeCounts = dict[str, SpanCounts]  # slot type -> counts, for every type seen in gold or prediction


@dataclass(frozen=True)
class F1Score:
    """Precision, recall and F1 with the summed counts behind them (macro averages the rates, not counts)."""

    precision: float
    recall: float
    f1: float
    tp: float
    fp: float
    fn: float


@dataclass(frozen=True)
class SlotScores:
    """SLURP's entity scores: word-F1, char-F1, their combination SLU-F1, and exact-match span F1."""

    word: F1Score
    char: F1Score
    slu: F1Score
    span: F1Score


def word_distance(gold: str, pred: str) -> float:
    """SLURP's word distance between fillers: the WER of `pred` against `gold` (can exceed 1)."""
    # SLURP calls jiwer, which raises on an empty gold filler; we use utterance_wer's convention instead.
    return utterance_wer(gold, pred)


def char_distance(gold: str, pred: str) -> float:
    """SLURP's char distance: Levenshtein over characters (spaces included) / the longer length, in [0, 1]."""
    longest = max(len(gold), len(pred))
    return editdistance.eval(gold, pred) / longest if longest else 0.0


def exact_span_counts(gold: Sequence[Slot], pred: Sequence[Slot]) -> TypeCounts:
    """One utterance's exact-match counts: a prediction is a TP only if an unused gold slot equals it."""
    unused = list(gold)
    counts: TypeCounts = {}
    for slot in pred:
        if slot in unused:
            unused.remove(slot)  # removes one copy, so a duplicated prediction can't match one gold twice
            _add(counts, slot.type, SpanCounts(tp=1.0))
        else:
            _add(counts, slot.type, SpanCounts(fp=1.0))
    for slot in unused:
        _add(counts, slot.type, SpanCounts(fn=1.0))
    return counts


def distance_span_counts(
    gold: Sequence[Slot], pred: Sequence[Slot], distance: Callable[[str, str], float]
) -> TypeCounts:
    """One utterance's SLURP soft counts under `distance(gold_filler, pred_filler)`; see the module doc."""
    unpaired = list(gold)
    counts: TypeCounts = {}
    for slot in pred:
        candidates = [
            (distance(g.value, slot.value), i) for i, g in enumerate(unpaired) if g.type == slot.type
        ]
        if not candidates:
            _add(counts, slot.type, SpanCounts(fp=1.0))
            continue
        # Tuples order ties by index, so the first closest gold slot wins, as SLURP's strict `<` scan does.
        d, best = min(candidates)
        unpaired.pop(best)
        _add(counts, slot.type, SpanCounts(tp=1.0, fp=d, fn=d))
    for g in unpaired:
        _add(counts, g.type, SpanCounts(fn=1.0))
    return counts


def slot_scores(
    golds: Sequence[Sequence[Slot]], preds: Sequence[Sequence[Slot]], average: Average = "micro"
) -> SlotScores:
    """Corpus SLU-F1 (word, char, combined) and span F1, as SLURP's evaluate.py with --average."""
    _check_aligned(golds, preds)
    word: TypeCounts = {}
    char: TypeCounts = {}
    span: TypeCounts = {}
    for gold, pred in zip(golds, preds):
        _merge_into(word, distance_span_counts(gold, pred, word_distance))
        _merge_into(char, distance_span_counts(gold, pred, char_distance))
        _merge_into(span, exact_span_counts(gold, pred))
    slu = dict(word)
    _merge_into(slu, char)  # SLUF1 sums the word and char confusion counts type by type
    return SlotScores(
        word=f1_score(word, average),
        char=f1_score(char, average),
        slu=f1_score(slu, average),
        span=f1_score(span, average),
    )


def f1_score(counts: Mapping[str, SpanCounts], average: Average = "micro") -> F1Score:
    """Micro: P/R/F1 of the summed counts. Macro: unweighted means of per-type P, R and F1 (as SLURP)."""
    total = sum(counts.values(), SpanCounts())
    if average == "micro":
        return F1Score(total.precision, total.recall, total.f1, total.tp, total.fp, total.fn)
    if average != "macro":
        raise ValueError(f"average must be 'micro' or 'macro', not {average!r}")
    # SLURP averages F1 itself, not the harmonic mean of averaged P and R; with no types at all it would
    # divide by zero, and we return zeros like the micro case.
    n = max(len(counts), 1)
    return F1Score(
        sum(c.precision for c in counts.values()) / n,
        sum(c.recall for c in counts.values()) / n,
        sum(c.f1 for c in counts.values()) / n,
        total.tp,
        total.fp,
        total.fn,
    )


def _add(counts: TypeCounts, slot_type: str, delta: SpanCounts) -> None:
    counts[slot_type] = counts.get(slot_type, SpanCounts()) + delta


def _merge_into(counts: TypeCounts, other: Mapping[str, SpanCounts]) -> None:
    for slot_type, delta in other.items():
        _add(counts, slot_type, delta)


# --- Whole-utterance SLU evaluation -----------------------------------------------------------------


class SluRecord(Protocol):
    """Anything with a transcript, an intent and slots, e.g. SluResult."""

    @property
    def text(self) -> str: ...
    @property
    def intent(self) -> str: ...
    @property
    def slots(self) -> Sequence[Slot]: ...


@dataclass(frozen=True)
class SluResult:
    """One utterance's SLU output (or gold label): transcript, intent and slots."""

    text: str
    intent: str
    slots: tuple[Slot, ...] = ()


@dataclass(frozen=True)
class SluScores:
    """Corpus scores, micro-averaged; slot P/R and counts are in slot_scores()."""

    n: int
    wer: float
    # the WER's parts, per reference word: they sum to `wer` (sclite's Sub / Del / Ins)
    substitution_rate: float
    deletion_rate: float
    insertion_rate: float
    intent_accuracy: float
    slu_f1: float
    word_f1: float
    char_f1: float
    span_f1: float


def evaluate_slu(refs: Sequence[SluRecord], hyps: Sequence[SluRecord]) -> SluScores:
    """Score aligned gold/predicted records; ValueError if empty, misaligned or with no reference words."""
    _check_aligned(refs, hyps)
    slots = slot_scores([r.slots for r in refs], [h.slots for h in hyps])
    errors = corpus_word_errors([r.text for r in refs], [h.text for h in hyps])
    return SluScores(
        n=len(refs),
        wer=errors.rate(errors.edits),
        substitution_rate=errors.rate(errors.substitutions),
        deletion_rate=errors.rate(errors.deletions),
        insertion_rate=errors.rate(errors.insertions),
        intent_accuracy=intent_accuracy([r.intent for r in refs], [h.intent for h in hyps]),
        slu_f1=slots.slu.f1,
        word_f1=slots.word.f1,
        char_f1=slots.char.f1,
        span_f1=slots.span.f1,
    )


# --- Latency and real-time factor -------------------------------------------------------------------


@dataclass(frozen=True)
class LatencyStats:
    """Latencies in seconds; percentiles by numpy's "linear" method (interpolating between ranks)."""

    n: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def from_seconds(cls, seconds: Sequence[float]) -> LatencyStats:
        x = np.asarray(seconds, dtype=np.float64)
        if x.size == 0:
            raise ValueError("latency stats need at least one latency")
        if not np.all(np.isfinite(x)) or np.any(x < 0):
            raise ValueError("latencies must be finite and non-negative seconds")
        # "linear": the q-th percentile sits at rank q/100 * (n - 1), interpolated between neighbours,
        # so p50 of an even count is the mean of the two middle values and p100 would be the max.
        p50, p90, p99 = np.percentile(x, [50, 90, 99], method="linear")
        return cls(
            n=int(x.size),
            mean=float(x.mean()),
            p50=float(p50),
            p90=float(p90),
            p99=float(p99),
            max=float(x.max()),
        )


def rtf(latency_s: float, audio_s: float) -> float:
    """One utterance's real-time factor: processing seconds per audio second (< 1: faster than real time)."""
    if audio_s <= 0:
        raise ValueError("audio duration must be positive")
    return latency_s / audio_s


def mean_rtf(latencies_s: Sequence[float], durations_s: Sequence[float]) -> float:
    """Mean of per-utterance RTFs: each utterance weighs the same, short ones (fixed overheads) included."""
    _check_aligned(latencies_s, durations_s)
    if not latencies_s:
        raise ValueError("RTF needs at least one utterance")
    return sum(rtf(lat, dur) for lat, dur in zip(latencies_s, durations_s)) / len(latencies_s)


def total_rtf(latencies_s: Sequence[float], durations_s: Sequence[float]) -> float:
    """Total processing time over total audio time: the throughput view, weighted by duration."""
    _check_aligned(latencies_s, durations_s)
    if not latencies_s:
        raise ValueError("RTF needs at least one utterance")
    if any(dur <= 0 for dur in durations_s):
        raise ValueError("audio durations must be positive")
    return sum(latencies_s) / sum(durations_s)


def _check_aligned(refs: Sequence[object], hyps: Sequence[object]) -> None:
    if len(refs) != len(hyps):
        raise ValueError(f"{len(refs)} references but {len(hyps)} hypotheses")
