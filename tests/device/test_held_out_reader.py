"""Readers that did not learn a fold of the replayed split's sentences (`pasu offramp train --reader-learns-split`)."""

from __future__ import annotations

import numpy as np
import pytest
from pasu.device.held_out_reader import (
    by_fold,
    fit_as_saved,
    fold_readers,
    read_by_fold,
    readers_without,
    sentence_fold,
)
from pasu.models.intent_reader import IntentReader, ReaderOptions

# sentences only the replayed split has, each with an intent of its own: a reader knows the intent iff it learned it
SPLIT_ONLY = {f"please do thing number {n}": f"task_{n}" for n in range(12)}


def test_every_recording_of_a_sentence_is_in_its_sentences_fold():
    sentences = [f"command {n}" for n in range(40)] * 2
    folds = by_fold(sentences, 5)
    assert sorted(i for fold in folds for i in fold) == list(range(80))  # each position once
    assert all(folds)  # 40 sentences reach every fold
    for f, positions in enumerate(folds):
        assert {sentence_fold(sentences[i], 5) for i in positions} == {f}


def test_each_fold_reader_learns_all_but_its_folds_sentences(commands):
    readers = fold_readers(commands, SPLIT_ONLY, ReaderOptions(min_df=1), folds=3)
    assert len(readers) == 3
    for fold, reader in enumerate(readers):
        assert {"alarm_set", "play_music", "weather_query"} <= set(reader.classes)  # every training sentence
        for sentence, intent in SPLIT_ONLY.items():
            assert (intent in reader.classes) == (sentence_fold(sentence, 3) != fold)


def test_a_sentence_the_training_text_holds_keeps_its_label(commands):
    relabelled = {"play some jazz": "task_jazz", **SPLIT_ONLY}
    for reader in fold_readers(commands, relabelled, ReaderOptions(min_df=1), folds=2):
        assert "task_jazz" not in reader.classes


def test_a_fitted_reader_reads_as_it_will_once_saved(commands, tmp_path):
    """float16 weights, as the agent loads them: the replays answer as the shipped reader would."""
    reader = fit_as_saved(commands, ReaderOptions(min_df=1))
    again = IntentReader.load(reader.save(tmp_path))
    texts = ["set an alarm for seven", "play jazz", "rain today"]
    assert np.array_equal(reader.distribution(texts, reader.classes), again.distribution(texts, again.classes))


def test_each_fold_is_read_by_its_reader_and_the_models_own_comes_back(commands, small_reader, tmp_path):
    from pasu.device.intent_offramp import IntentMixture
    from pasu.device.offramp_train import load_device_model

    import pasu_tests_cloud_support as support  # loaded by tests/conftest.py

    model = load_device_model(support.write_model_folder(tmp_path / "model"))
    model.intent_mixture = IntentMixture(small_reader, 0.5)
    readers = fold_readers(commands, SPLIT_ONLY, ReaderOptions(min_df=1), folds=3)
    sentences = list(SPLIT_ONLY) * 2

    def run(fold, positions):
        assert model.intent_mixture.reader is readers[fold] and model.intent_mixture.decoder_share == 0.5
        return [(fold, sentences[i]) for i in positions]

    results = read_by_fold(model, readers, sentences, run)
    assert [s for _, s in results] == sentences  # back in the sentences' order
    assert all(fold == sentence_fold(s, 3) for fold, s in results)
    assert model.intent_mixture.reader is small_reader


def test_a_reader_that_did_not_learn_the_split_has_none_to_hold_out(small_reader):
    with pytest.raises(ValueError, match="did not learn"):
        readers_without(small_reader, "data/corpus-full", "dev")


def test_a_source_this_machine_lacks_is_named(commands, tmp_path):
    """Refitting needs every corpus the reader learned from: the error says which the reader names."""
    from pasu.models.data import MissingSplitError, write_synthetic_corpus

    corpus = write_synthetic_corpus(tmp_path / "corpus", n_train=4, n_dev=2)
    reader = IntentReader.fit(list(commands), list(commands.values()), ReaderOptions(min_df=1),
                              [f"{tmp_path / 'gone'}:train", f"{corpus}:dev"])
    with pytest.raises(MissingSplitError, match="refits the intent reader on what it learned .*gone:train"):
        readers_without(reader, corpus, "dev")
