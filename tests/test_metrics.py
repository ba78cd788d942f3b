"""Hand-worked checks of pasu.metrics; every expected number is derived in the comment beside it."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import pytest

from pasu.metrics import (
    LatencyStats,
    SluResult,
    WordErrors,
    char_distance,
    corpus_word_errors,
    corpus_wer,
    evaluate_slu,
    intent_accuracy,
    mean_rtf,
    rtf,
    slot_scores,
    total_rtf,
    utterance_wer,
    word_distance,
    word_edits,
    word_errors,
)
from pasu.slu import Slot

approx = pytest.approx


# --- WER ------------------------------------------------------------------------------------------


def test_wer_substitutions():
    # on->off, lights->light: 2 substitutions / 5 reference words
    assert utterance_wer("turn on the kitchen lights", "turn off the kitchen light") == approx(2 / 5)


def test_wer_insertions():
    # "now", "please" inserted: 2 / 3
    assert utterance_wer("wake me up", "wake me up now please") == approx(2 / 3)


def test_wer_deletions():
    # "an", "for" deleted: 2 / 5
    assert utterance_wer("set an alarm for five", "set alarm five") == approx(2 / 5)


def test_wer_mixed_edit_count():
    # "play some jazz music" -> "play jazz musics loud": delete "some", music->musics, insert "loud" = 3
    assert word_edits("play some jazz music", "play jazz musics loud") == 3


def test_corpus_wer_pools_edits_not_rates():
    refs = ["turn on the kitchen lights", "wake me up", "set an alarm for five"]
    hyps = ["turn off the kitchen light", "wake me up now please", "set alarm five"]
    # (2 + 2 + 2) edits / (5 + 3 + 5) words = 6/13 ~ 0.4615, not the mean of rates (0.4+0.667+0.4)/3 ~ 0.4889
    assert corpus_wer(refs, hyps) == approx(6 / 13)


def test_word_errors_name_each_kind_of_edit():
    # on->off, lights->light: 2 substitutions; "now", "please" inserted; "an", "for" deleted
    assert word_errors("turn on the kitchen lights", "turn off the kitchen light") == WordErrors(2, 0, 0, 5)
    assert word_errors("wake me up", "wake me up now please") == WordErrors(0, 0, 2, 3)
    assert word_errors("set an alarm for five", "set alarm five") == WordErrors(0, 2, 0, 5)
    assert word_errors("", "") == WordErrors() and word_errors("", "hi there") == WordErrors(0, 0, 2, 0)
    assert word_errors("hi there", "") == WordErrors(0, 2, 0, 2)


def test_word_errors_prefer_substitutions_among_equally_cheap_alignments():
    # two substitutions or one deletion and one insertion both cost 2: the substitutions are counted
    assert word_errors("a b", "b a") == WordErrors(2, 0, 0, 2)
    # likewise three substitutions, not "some" deleted, music->musics and "loud" inserted
    assert word_errors("play some jazz music", "play jazz musics loud") == WordErrors(3, 0, 0, 4)


def test_word_errors_always_sum_to_the_edit_distance():
    import random

    rng = random.Random(0)
    for _ in range(300):
        ref = " ".join(rng.choice("abcd") for _ in range(rng.randint(0, 8)))
        hyp = " ".join(rng.choice("abcd") for _ in range(rng.randint(0, 8)))
        errors = word_errors(ref, hyp)
        assert errors.edits == word_edits(ref, hyp) and errors.ref_words == len(ref.split())


def test_corpus_word_errors_add_up_and_their_rates_sum_to_the_wer():
    refs = ["turn on the kitchen lights", "wake me up", "set an alarm for five"]
    hyps = ["turn off the kitchen light", "wake me up now please", "set alarm five"]
    errors = corpus_word_errors(refs, hyps)
    assert errors == WordErrors(2, 2, 2, 13)
    assert errors.rate(errors.edits) == approx(corpus_wer(refs, hyps))
    with pytest.raises(ValueError, match="zero reference words"):
        WordErrors(0, 0, 1, 0).rate(1)


def test_wer_splits_on_whitespace_only():
    assert utterance_wer("  turn   on\tthe lights ", "turn on the lights") == 0.0
    # no case folding: "Turn" vs "turn" is 1 substitution / 2
    assert utterance_wer("Turn on", "turn on") == approx(0.5)


def test_wer_empty_reference_convention():
    assert utterance_wer("", "") == 0.0
    # empty reference counts as one word: 2 inserted words / max(0, 1) = 2
    assert utterance_wer("", "hello there") == approx(2.0)
    with pytest.raises(ValueError):
        corpus_wer(["", "  "], ["a", ""])
    # an empty reference among non-empty ones is fine at corpus level: 1 insertion / 2 words
    assert corpus_wer(["", "hi there"], ["oops", "hi there"]) == approx(1 / 2)


def test_wer_misaligned_raises():
    with pytest.raises(ValueError):
        corpus_wer(["a"], ["a", "b"])


# --- Intent accuracy --------------------------------------------------------------------------------


def test_intent_accuracy():
    # 3 of 4 equal
    refs = ["alarm_set", "weather_query", "play_music", "iot_hue_lightoff"]
    hyps = ["alarm_set", "weather_query", "play_radio", "iot_hue_lightoff"]
    assert intent_accuracy(refs, hyps) == approx(0.75)


def test_intent_accuracy_empty_raises():
    with pytest.raises(ValueError):
        intent_accuracy([], [])


# --- Filler distances ---------------------------------------------------------------------------------


def test_char_distance():
    # one deleted 'r' / max(8, 7) chars
    assert char_distance("tomorrow", "tomorow") == approx(1 / 8)
    # the space counts as a character: 1 / 7
    assert char_distance("five pm", "fivepm") == approx(1 / 7)
    assert char_distance("", "") == 0.0
    assert char_distance("ab", "") == 1.0


def test_word_distance_is_filler_wer_and_can_exceed_one():
    assert word_distance("tomorrow", "tomorow") == 1.0  # 1 substitution / 1 word
    assert word_distance("five", "five thirty pm") == 2.0  # 2 insertions / 1 word
    assert word_distance("", "") == 0.0


# --- SLU-F1 -------------------------------------------------------------------------------------------


def scores(gold: list[Slot], pred: list[Slot], average="micro"):
    """One-utterance corpus."""
    return slot_scores([tuple(gold)], [tuple(pred)], average)


def test_slu_f1_perfect_match():
    gold = [Slot("date", "tomorrow"), Slot("time", "five pm")]
    s = scores(gold, list(gold))
    # both distances 0: TP=2, FP=FN=0 for word and char; SLU sums them: TP=4
    for f in (s.word, s.char, s.slu, s.span):
        assert (f.precision, f.recall, f.f1) == (1.0, 1.0, 1.0)
    assert (s.slu.tp, s.slu.fp, s.slu.fn) == (4.0, 0.0, 0.0)


def test_slu_f1_empty_hypothesis():
    s = scores([Slot("date", "tomorrow")], [])
    # TP=0, FP=0 -> precision 0 by SLURP's 0/0 rule; FN=1 -> recall 0; F1 0
    for f in (s.word, s.char, s.span):
        assert (f.precision, f.recall, f.f1, f.tp, f.fp, f.fn) == (0.0, 0.0, 0.0, 0.0, 0.0, 1.0)
    # SLU sums word and char counts: FN=2
    assert (s.slu.f1, s.slu.tp, s.slu.fp, s.slu.fn) == (0.0, 0.0, 0.0, 2.0)


def test_slu_f1_no_slots_anywhere_is_zero_and_neutral():
    # no gold and no predicted slots: all counts 0, and SLURP's compute_metrics gives P = R = F1 = 0
    s = scores([], [])
    for f in (s.word, s.char, s.slu, s.span):
        assert (f.precision, f.recall, f.f1, f.tp, f.fp, f.fn) == (0.0,) * 6
    # such an utterance adds nothing to a corpus: scores equal those of the corpus without it
    with_empty = slot_scores([(Slot("date", "today"),), ()], [(Slot("date", "today"),), ()])
    without = slot_scores([(Slot("date", "today"),)], [(Slot("date", "today"),)])
    assert with_empty == without


def test_slu_f1_near_miss_filler():
    s = scores([Slot("date", "tomorrow")], [Slot("date", "tomorow")])
    # word: distance 1 (1 sub / 1 word); the right type still earns TP=1, FP=FN=1 -> P=R=F1=1/2 (SLURP's rule)
    assert (s.word.tp, s.word.fp, s.word.fn) == (1.0, 1.0, 1.0)
    assert s.word.f1 == approx(0.5)
    # char: distance 1/8 -> TP=1, FP=FN=0.125 -> P=R=F1=1/1.125=8/9 ~ 0.889: partial credit
    assert (s.char.tp, s.char.fp, s.char.fn) == (1.0, 0.125, 0.125)
    assert s.char.f1 == approx(8 / 9)
    # SLU sums the counts: TP=2, FP=FN=1.125 -> P=R=F1=2/3.125=0.64
    assert s.slu.f1 == approx(0.64)
    # exact span: "tomorow" != "tomorrow" -> TP=0, FP=1, FN=1 -> 0
    assert s.span.f1 == 0.0


def test_slu_f1_wrong_type():
    s = scores([Slot("date", "tomorrow")], [Slot("time", "tomorrow")])
    # no gold "time" -> FP[time]=1; gold "date" unpaired -> FN[date]=1; TP=0 -> 0 everywhere
    for f in (s.word, s.char, s.span):
        assert (f.f1, f.tp, f.fp, f.fn) == (0.0, 0.0, 1.0, 1.0)
    assert (s.slu.f1, s.slu.tp, s.slu.fp, s.slu.fn) == (0.0, 0.0, 2.0, 2.0)  # word + char counts


def test_slu_f1_repeated_types_pair_by_distance_not_order():
    gold = [Slot("date", "monday"), Slot("date", "friday")]
    pred = [Slot("date", "friday"), Slot("date", "monday")]
    # "friday" pairs gold "friday" (distance 0), then "monday" pairs "monday": perfect, though order differs
    s = scores(gold, pred)
    for f in (s.word, s.char, s.slu, s.span):
        assert f.f1 == 1.0


def test_slu_f1_repeated_types_one_missed():
    s = scores([Slot("date", "monday"), Slot("date", "friday")], [Slot("date", "friday")])
    # TP=1, FP=0, FN=1 -> P=1, R=1/2, F1=2/3 (word, char and span alike)
    for f in (s.word, s.char, s.span):
        assert f.f1 == approx(2 / 3)


def test_slu_f1_repeated_types_word_and_char_pair_differently():
    s = scores([Slot("date", "monday"), Slot("date", "friday")], [Slot("date", "fridy")])
    # word: "fridy" is 1 substitution from both -> tie -> the first gold ("monday") is taken, as SLURP's scan;
    #   TP=1, FP=1, FN=1 (+1 for unpaired "friday") = 2 -> P=1/2, R=1/3, F1=2*(1/6)/(5/6)=0.4
    assert (s.word.tp, s.word.fp, s.word.fn) == (1.0, 1.0, 2.0)
    assert s.word.f1 == approx(0.4)
    # char: "friday" is closest (1/6); TP=1, FP=1/6, FN=1/6+1 (unpaired "monday")
    #   P=1/(7/6)=6/7, R=1/(13/6)=6/13, F1=2*(36/91)/(120/91)=0.6
    assert s.char.fn == approx(7 / 6)
    assert s.char.f1 == approx(0.6)
    # SLU: TP=2, FP=7/6, FN=19/6 -> P=12/19, R=12/31, F1=2*(144/589)/(600/589)=0.48
    assert s.slu.f1 == approx(0.48)


def test_slu_f1_unmatched_extra_prediction_of_a_used_type():
    s = scores([Slot("date", "tomorrow")], [Slot("date", "tomorrow"), Slot("date", "today")])
    # the only gold "date" is used up, so "today" is FP=1: TP=1, FP=1, FN=0 -> P=1/2, R=1, F1=2/3
    for f in (s.word, s.char, s.slu, s.span):
        assert f.f1 == approx(2 / 3)


def test_slu_f1_word_distance_above_one():
    s = scores([Slot("time", "five")], [Slot("time", "five thirty pm")])
    # word distance 2: TP=1, FP=FN=2 -> P=R=F1=1/3
    assert s.word.f1 == approx(1 / 3)
    # char: 10 inserted chars / 14 = 5/7 -> P=R=F1=1/(12/7)=7/12
    assert s.char.f1 == approx(7 / 12)


def test_slu_f1_pools_counts_over_the_corpus():
    golds = [(Slot("date", "today"),), (Slot("time", "noon"),)]
    preds = [(Slot("date", "today"),), ()]
    # TP=1 (utt 1), FN=1 (utt 2): P=1, R=1/2, F1=2/3
    assert slot_scores(golds, preds).slu.f1 == approx(2 / 3)


def test_slot_f1_macro_average():
    gold, pred = [Slot("date", "tomorrow"), Slot("time", "five")], [Slot("date", "tomorrow")]
    macro = scores(gold, pred, average="macro")
    # per type: date F1=1, time F1=0 -> macro F1=1/2; precision: date 1, time 0 (0/0) -> 1/2
    assert (macro.word.precision, macro.word.recall, macro.word.f1) == (0.5, 0.5, 0.5)
    # micro for contrast: TP=1, FN=1 -> F1=2/3
    assert scores(gold, pred).word.f1 == approx(2 / 3)
    with pytest.raises(ValueError):
        scores([], [], average="weighted")


def test_exact_span_duplicate_prediction_matches_once():
    s = scores([Slot("date", "today")], [Slot("date", "today"), Slot("date", "today")])
    # TP=1, FP=1 -> P=1/2, R=1, F1=2/3
    assert (s.span.tp, s.span.fp, s.span.fn) == (1.0, 1.0, 0.0)
    assert s.span.f1 == approx(2 / 3)


# --- evaluate_slu -------------------------------------------------------------------------------------


def test_evaluate_slu():
    refs = [
        SluResult("wake me up at five pm", "alarm_set", (Slot("time", "five pm"),)),
        SluResult("what is the weather tomorrow", "weather_query", (Slot("date", "tomorrow"),)),
    ]
    hyps = [
        SluResult("wake me up at five pm", "alarm_query", (Slot("time", "five pm"),)),
        SluResult("what is the weather tomorow", "weather_query", (Slot("date", "tomorow"),)),
    ]
    s = evaluate_slu(refs, hyps)
    assert s.n == 2
    assert s.wer == approx(1 / 11)  # 1 substitution / (6 + 5) words
    assert (s.substitution_rate, s.deletion_rate, s.insertion_rate) == (approx(1 / 11), 0.0, 0.0)
    assert s.intent_accuracy == approx(0.5)
    assert s.word_f1 == approx(2 / 3)  # TP=2, FP=FN=1 -> 2/3
    assert s.char_f1 == approx(16 / 17)  # TP=2, FP=FN=1/8 -> 2/2.125
    assert s.slu_f1 == approx(32 / 41)  # TP=4, FP=FN=1.125 -> 4/5.125
    assert s.span_f1 == approx(0.5)  # TP=1, FP=1, FN=1


def test_evaluate_slu_accepts_any_record_with_the_attributes():
    class Rec(NamedTuple):
        text: str
        intent: str
        slots: list[Slot]

    s = evaluate_slu([Rec("hi there", "greet", [Slot("person", "bob")])], [Rec("hi", "greet", [])])
    assert (s.wer, s.intent_accuracy, s.slu_f1) == (0.5, 1.0, 0.0)


def test_evaluate_slu_rejects_empty_and_misaligned():
    with pytest.raises(ValueError):
        evaluate_slu([], [])
    with pytest.raises(ValueError):
        evaluate_slu([SluResult("a", "x")], [])


# --- Latency and RTF ----------------------------------------------------------------------------------


def test_latency_stats_known_list():
    s = LatencyStats.from_seconds([0.3, 0.1, 1.0, 0.2, 0.4])
    # sorted 0.1 0.2 0.3 0.4 1.0; mean 2.0/5 = 0.4
    # linear: rank q*(n-1): p50 -> rank 2 = 0.3; p90 -> rank 3.6 = 0.4 + 0.6*0.6 = 0.76;
    # p99 -> rank 3.96 = 0.4 + 0.96*0.6 = 0.976
    assert (s.n, s.max) == (5, 1.0)
    assert (s.mean, s.p50, s.p90, s.p99) == approx((0.4, 0.3, 0.76, 0.976))


def test_latency_stats_interpolates_even_counts_and_single_values():
    assert LatencyStats.from_seconds([1, 2, 3, 4]).p50 == approx(2.5)  # rank 1.5 -> between 2 and 3
    assert LatencyStats.from_seconds([0.25]) == LatencyStats(1, 0.25, 0.25, 0.25, 0.25, 0.25)


def test_latency_stats_rejects_bad_input_and_is_frozen():
    with pytest.raises(ValueError):
        LatencyStats.from_seconds([])
    with pytest.raises(ValueError):
        LatencyStats.from_seconds([0.1, -0.2])
    with pytest.raises(ValueError):
        LatencyStats.from_seconds([float("nan")])
    with pytest.raises(dataclasses.FrozenInstanceError):
        LatencyStats.from_seconds([1.0]).mean = 2.0  # type: ignore[misc]


def test_rtf_mean_versus_total():
    latencies, durations = [1.0, 1.0], [2.0, 8.0]
    assert rtf(1.0, 2.0) == 0.5
    assert mean_rtf(latencies, durations) == approx(0.3125)  # (1/2 + 1/8) / 2
    assert total_rtf(latencies, durations) == approx(0.2)  # 2 s / 10 s


def test_rtf_rejects_non_positive_durations_and_empty_input():
    with pytest.raises(ValueError):
        rtf(0.5, 0.0)
    with pytest.raises(ValueError):
        total_rtf([0.5], [0.0])
    with pytest.raises(ValueError):
        mean_rtf([], [])
