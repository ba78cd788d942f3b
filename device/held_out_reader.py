"""Intent readers that did not learn a replayed split's sentences, so that the split can teach the shipped reader
too and still calibrate the intent check.

The device's intent reader learns labelled sentences; the split the offramps are fitted on (dev) holds 2,032 more
that no training split has. When the shipped reader learns them as well, a replay of a dev utterance must not be
read by it: it would know the answer, and the intent check fitted on such replays would trust the reader more
than it should on new sentences. So the split's sentences are cut into folds by a hash of their text, and each
utterance is replayed and judged with the reader that learned every sentence but those of its own fold (cross-
fitting, as in stacking).
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Mapping, Sequence

from pasu.models.intent_reader import IntentReader, ReaderOptions

# folds of the split's sentences: each fold's reader learns 4/5 of them, close to the shipped reader's all
READER_FOLDS = 5


def sentence_fold(sentence: str, folds: int = READER_FOLDS) -> int:
    """The fold of a sentence: the same for every recording of it, on every machine and run."""
    return int(hashlib.sha1(sentence.encode()).hexdigest(), 16) % folds


def fit_as_saved(sentences: Mapping[str, str], options: ReaderOptions) -> IntentReader:
    """A reader of sentence -> intent, as saved and loaded back (float16 weights): the one the agent would read with."""
    reader = IntentReader.fit(list(sentences), list(sentences.values()), options)
    with tempfile.TemporaryDirectory() as folder:
        return IntentReader.load(reader.save(folder))


def fold_readers(sentences: Mapping[str, str], split_sentences: Mapping[str, str], options: ReaderOptions,
                 folds: int = READER_FOLDS) -> list[IntentReader]:
    """Reader f learns `sentences` and the split's sentences outside fold f (a sentence both hold keeps
    `sentences`' label, as the shipped reader does)."""
    readers = []
    for fold in range(folds):
        learned = dict(sentences)
        for sentence, intent in split_sentences.items():
            if sentence_fold(sentence, folds) != fold:
                learned.setdefault(sentence, intent)
        readers.append(fit_as_saved(learned, options))
    return readers


def by_fold(sentences: Sequence[str], folds: int = READER_FOLDS) -> list[list[int]]:
    """The positions of `sentences` in each fold."""
    positions: list[list[int]] = [[] for _ in range(folds)]
    for i, sentence in enumerate(sentences):
        positions[sentence_fold(sentence, folds)].append(i)
    return positions
