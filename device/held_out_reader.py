"""Intent readers that did not learn a split's sentences, so that the split can teach the shipped reader too and
still calibrate the intent check and measure the agent.

The device's intent reader learns labelled sentences; the split the offramps are fitted on (dev) holds 2,032 more
that no training split has. When the shipped reader learns them as well, a dev utterance must not be read by it:
it would know the answer, and the intent check fitted on such replays (or a score on dev) would trust the reader
more than it should on new sentences. So the split's sentences are cut into folds by a hash of their text, and
each utterance is read with the reader that learned every sentence but those of its own fold (cross-fitting, as
in stacking).
"""

from __future__ import annotations

import hashlib
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from pasu.models.data import MissingSplitError, load_split
from pasu.models.intent_reader import IntentReader, ReaderOptions, names_split

if TYPE_CHECKING:
    from pasu.device.intent_offramp import IntentMixture
    from pasu.device.runtime import DeviceModel

# folds of the split's sentences: each fold's reader learns 4/5 of them, close to the shipped reader's all
READER_FOLDS = 5

T = TypeVar("T")


def sentence_fold(sentence: str, folds: int = READER_FOLDS) -> int:
    """The fold of a sentence: the same for every recording of it, on every machine and run."""
    return int(hashlib.sha1(sentence.encode()).hexdigest(), 16) % folds


def learned_sentences(sources: Sequence[str]) -> dict[str, str]:
    """sentence -> intent over "CORPUS:SPLIT" sources (as `IntentReader.learned_from` names them), the first
    source's label winning a sentence two hold."""
    sentences: dict[str, str] = {}
    for source in sources:
        corpus, _, split = source.rpartition(":")
        for utterance in load_split(corpus, split):
            sentences.setdefault(utterance.text, utterance.intent)
    return sentences


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


def readers_without(reader: IntentReader, corpus: str | Path, split: str,
                    folds: int = READER_FOLDS) -> list[IntentReader]:
    """`reader` refitted once per fold of the split's sentences, each time without that fold's: from its own
    sources (`learned_from`, which must name the split; their manifests must be at hand) and options."""
    if not reader.learned(corpus, split):
        raise ValueError(f"the intent reader did not learn {corpus}:{split} (it learned {list(reader.learned_from)})")
    print(f"{split}: the intent reader learned these sentences; fitting {folds} readers, each without a fold of them",
          file=sys.stderr, flush=True)
    held = [s for s in reader.learned_from if names_split(s, corpus, split)]
    own = [s for s in reader.learned_from if not names_split(s, corpus, split)]
    try:
        sentences, split_sentences = learned_sentences(own), learned_sentences(held)
    except MissingSplitError as e:  # a source this machine lacks (e.g. a corpus built elsewhere)
        raise MissingSplitError(f"reading {corpus}:{split} held out refits the intent reader on what it learned "
                                f"({', '.join(reader.learned_from)}): {e}") from e
    return fold_readers(sentences, split_sentences, reader.options, folds)


def model_reader_learned(model: DeviceModel, corpus: str | Path, split: str) -> bool:
    """Whether the intent reader the model answers with learned the sentences of this corpus folder's split."""
    return model.intent_mixture is not None and model.intent_mixture.reader.learned(corpus, split)


def by_fold(sentences: Sequence[str], folds: int = READER_FOLDS) -> list[list[int]]:
    """The positions of `sentences` in each fold."""
    positions: list[list[int]] = [[] for _ in range(folds)]
    for i, sentence in enumerate(sentences):
        positions[sentence_fold(sentence, folds)].append(i)
    return positions


def fold_mixtures(model: DeviceModel, readers: Sequence[IntentReader]) -> list[IntentMixture]:
    """The model's intent mixture (its decoder's share) with each fold's reader in place of its own."""
    from pasu.device.intent_offramp import IntentMixture

    return [IntentMixture(reader, model.intent_mixture.decoder_share) for reader in readers]


def read_by_fold(model: DeviceModel, readers: Sequence[IntentReader], sentences: Sequence[str],
                 run: Callable[[int, list[int]], list[T]]) -> list[T]:
    """`run(fold, positions)` once per fold, the model's intent mixture reading with that fold's reader meanwhile;
    its results (one per position) put back in the order of `sentences`. The model's own mixture is restored."""
    own, mixtures = model.intent_mixture, fold_mixtures(model, readers)
    results: list = [None] * len(sentences)
    try:
        for fold, positions in enumerate(by_fold(sentences, len(readers))):
            model.intent_mixture = mixtures[fold]
            for i, result in zip(positions, run(fold, positions)):
                results[i] = result
    finally:
        model.intent_mixture = own
    return results

