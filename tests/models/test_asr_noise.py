from collections import Counter

import pytest
from pasu.models.asr_noise import DROP, ConfusionModel, aligned_words


def test_alignment_gives_every_reference_word_its_outcome_and_the_insertions():
    pairs, inserted = aligned_words("set an alarm for seven am", "set alarm four seven a m")
    assert pairs == [("set", "set"), ("an", DROP), ("alarm", "alarm"), ("for", "four"), ("seven", "seven"),
                     ("am", "a")]
    assert inserted == ["m"]


def test_counted_rates_match_the_transcripts():
    model = ConfusionModel.fit([("play some jazz", "play sum jazz"), ("play music", "play")])
    replaced, dropped, inserted = model.rates()
    assert (replaced, dropped, inserted) == pytest.approx((1 / 5, 1 / 5, 0.0))


def test_corrupt_follows_a_familiar_words_own_errors_and_is_seeded():
    # "jazz" was heard as "jars" every time, "play" always right: copies say so; unfamiliar words vary
    model = ConfusionModel.fit([("play jazz", "play jars")] * 5 + [("turn it up", "turn up")] * 3)
    copies = model.corrupt(["play jazz"] * 50, seed=3)
    assert set(copies) == {"play jars"}
    unfamiliar = model.corrupt(["wake me at nine tomorrow"] * 200, seed=3)
    assert unfamiliar == model.corrupt(["wake me at nine tomorrow"] * 200, seed=3)
    words = Counter(w for copy in unfamiliar for w in copy.split())
    # the overall rates (1 of 3 words of "turn it up" dropped, one in 7 words replaced) reach unfamiliar words
    assert 0.5 * 200 < words["wake"] < 200 and "jars" in words


def test_transcripts_of_empty_references_are_refused():
    with pytest.raises(ValueError, match="non-empty"):
        ConfusionModel.fit([("", "hello")])
