"""The device's spelling correction: unknown words become the nearest known word that fits its context."""

from __future__ import annotations

import pytest

from pasu.device.spelling import SpellingCorrector, SpellingOptions
from pasu.metrics import SluResult
from pasu.models.ngram_lm import NgramLm
from pasu.slu import Slot

SENTENCES = ["is it windy in paris today", "walk in the park", "the dog will bark", "remind me of the birthday party",
             "set an alarm for seven am"]


@pytest.fixture(scope="module")
def speller() -> SpellingCorrector:
    return SpellingCorrector(NgramLm.train(SENTENCES))


def test_a_misspelt_word_and_the_slot_that_holds_it_are_corrected(speller):
    heard = SluResult("is it windi in paris today", "weather_query",
                      (Slot("weather_descriptor", "windi"), Slot("place_name", "paris")))
    written = speller.correct(heard)
    assert written.text == "is it windy in paris today"
    assert written.slots == (Slot("weather_descriptor", "windy"), Slot("place_name", "paris"))
    assert written.intent == "weather_query"
    assert speller.correct(SluResult("remind me of the birthdy party", "calendar_set")).text == \
        "remind me of the birthday party"


def test_the_context_chooses_among_equally_near_words(speller):
    # "wark" is one edit from "park", "bark" and "walk": the trigram knows which follows its words
    assert speller.words("walk in the wark".split())[-1] == "park"
    assert speller.words("the dog will wark".split())[-1] == "bark"


def test_known_short_and_unreachable_words_stay_as_heard(speller):
    assert speller.words("walk in the park".split()) == "walk in the park".split()
    assert speller.words(["ab", "xq"]) == ["ab", "xq"]  # shorter than min_length
    assert speller.words(["zzzzzzzzzzzzzzzz"]) == ["zzzzzzzzzzzzzzzz"]  # no known word within reach
    strict = SpellingCorrector(speller.lm, SpellingOptions(max_relative_distance=0.1))
    assert strict.words(["parkk"]) == ["park"] and strict.words(["prakk"]) == ["prakk"]  # one edit allowed, not two
    unchanged = SluResult("set an alarm for seven am", "alarm_set", (Slot("time", "seven am"),))
    assert speller.correct(unchanged) is unchanged


def test_the_vocabulary_is_the_trigrams_words_without_its_markers(speller):
    assert "<s>" not in speller.vocabulary and "</s>" not in speller.vocabulary
    assert set(speller.vocabulary) == {w for s in SENTENCES for w in s.split()}
