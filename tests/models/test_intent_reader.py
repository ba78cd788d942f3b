"""The TF-IDF intent reader: which command a transcript's words are, stored without pickle."""

from __future__ import annotations

import numpy as np

from pasu.models.intent_reader import READER_FILES, IntentReader, ReaderOptions


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


def test_character_ngrams_read_a_misheard_word_by_its_right_parts(commands, tmp_path):
    """Neither "musik" nor "wether" is a training word: only the reader with character n-grams still reads them."""
    texts, intents = list(commands), list(commands.values())
    words = IntentReader.fit(texts, intents, ReaderOptions(min_df=1))
    chars = IntentReader.fit(texts, intents, ReaderOptions(min_df=1, char_ngram_max=5))
    heard, meant = ["musik", "wether"], ["play_music", "weather_query"]
    assert (chars.probabilities(heard, meant) > words.probabilities(heard, meant) + 0.1).all()
    assert [chars.classes[i] for i in chars.distribution(heard, chars.classes).argmax(1)] == meant
    loaded = IntentReader.load(chars.save(tmp_path))  # both vocabularies saved, still no pickle
    np.testing.assert_allclose(loaded.probabilities(heard, meant), chars.probabilities(heard, meant), atol=2e-3)
    assert loaded.digest() == chars.digest() != words.digest()


def test_it_keeps_where_its_sentences_came_from(commands, tmp_path, monkeypatch):
    """`learned_from` survives a save and load, names no weight (the digest is the same without it) and tells
    whether a corpus folder's split was learned, however the folder is written."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus").mkdir()
    texts, intents = list(commands), list(commands.values())
    reader = IntentReader.fit(texts, intents, ReaderOptions(min_df=1), ["corpus:train", "corpus:dev"])
    again = IntentReader.load(reader.save(tmp_path / "reader"))
    assert again.learned_from == ("corpus:train", "corpus:dev")
    assert again.learned(tmp_path / "corpus", "dev") and again.learned("./corpus", "train")
    assert not again.learned(tmp_path / "corpus", "test") and not again.learned(tmp_path / "other", "dev")
    assert again.digest() == IntentReader.fit(texts, intents, ReaderOptions(min_df=1)).digest()
