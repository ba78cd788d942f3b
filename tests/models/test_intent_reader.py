"""The TF-IDF intent reader: which command a transcript's words are, stored without pickle."""

from __future__ import annotations

import numpy as np

from pasu.models.intent_reader import READER_FILES, IntentReader


def test_the_reader_tells_which_command_the_words_are(small_reader):
    p = small_reader.probabilities(["play some rock music", "set an alarm for seven", "play some rock music"],
                                   ["play_music", "alarm_set", "weather_query"])
    assert p[0] > 0.5 and p[1] > 0.5 and p[2] < 0.2
    assert small_reader.probabilities(["play jazz"], ["an_intent_never_seen"])[0] == 0.0


def test_saved_as_arrays_and_loaded_back_the_same(small_reader, tmp_path):
    folder = small_reader.save(tmp_path / "offramp")
    assert sorted(f.name for f in folder.iterdir()) == sorted(READER_FILES)  # no pickle
    texts, intents = ["will it rain in paris", "play the album"], ["weather_query", "alarm_set"]
    loaded = IntentReader.load(folder)
    np.testing.assert_allclose(loaded.probabilities(texts, intents), small_reader.probabilities(texts, intents),
                               atol=2e-3)


def test_its_distribution_covers_the_classes_asked_for(small_reader):
    classes = ("weather_query", "play_music", "an_intent_never_seen", "alarm_set")
    p = small_reader.distribution(["play some jazz", "will it rain"], classes)
    assert p.shape == (2, 4) and (p[:, 2] == 0.0).all()  # never seen: no probability
    np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-6)
    assert p[0].argmax() == 1 and p[1].argmax() == 0
    np.testing.assert_allclose(p[:, 1], small_reader.probabilities(["play some jazz", "will it rain"],
                                                                   ["play_music"] * 2))


def test_its_digest_names_the_saved_weights(small_reader, commands, tmp_path):
    """Replay caches key on it: a save and load keep it, a reader fitted on other sentences changes it."""
    loaded = IntentReader.load(small_reader.save(tmp_path))
    assert loaded.digest() == small_reader.digest()
    other = IntentReader.fit(list(commands)[:8], list(commands.values())[:8], small_reader.options)
    assert other.digest() != small_reader.digest()
