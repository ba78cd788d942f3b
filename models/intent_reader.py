"""P(intent | transcript) from TF-IDF over word n-grams (and, optionally, the character n-grams inside words) +
logistic regression (scikit-learn), a few MB on disk at most.

A small, fast reader of the training sentences, used twice: on the device, it reads the decoder's words beside
the decoder's own intent, for the answer and for the intent offramp (device/intent_offramp.py); in the cloud,
the text pass weighs it beside the sentence-encoder classifier (models/text_intent.py), as word n-grams hold on
to the keywords a garbled transcript keeps (character n-grams to the parts of a misheard word that are right:
the device's reader has them). It is stored as arrays and a vocabulary, not pickled: loading a model
folder runs no code.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import scipy.sparse
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression

READER_FILES = ("intent_reader.json", "intent_reader.npz")


@dataclass(frozen=True)
class ReaderOptions:
    ngram_max: int = 2  # word n-grams up to this length
    min_df: int = 2  # n-grams in fewer training sentences are dropped (7k terms instead of 23k)
    c: float = 10.0  # inverse strength of the logistic regression's L2 penalty
    max_iter: int = 2000  # the solver's iterations
    # character n-grams within words, 2 up to this length, beside the words' (0: none). They read a misheard word
    # by its right parts ("remainder" for "reminder"); the device's reader uses 5 (device/intent_offramp.py)
    char_ngram_max: int = 0


class IntentReader:
    """P(intent | transcript) from TF-IDF + logistic regression."""

    def __init__(self, vectorizers: Sequence[TfidfVectorizer], classifier: LogisticRegression,
                 options: ReaderOptions, learned_from: Sequence[str] = ()):
        self.vectorizers = list(vectorizers)  # words first, then characters when options.char_ngram_max
        self.classifier = classifier
        self.options = options
        # where its sentences came from, "CORPUS:SPLIT" (as given; empty: not said): an evaluation on a split it
        # learned reads sentences it knows (`pasu eval --as-agent` says so). Not part of the digest: no weight.
        self.learned_from = tuple(learned_from)
        self.classes = [str(c) for c in classifier.classes_]  # the intents it knows, in its columns' order
        self.index = {intent: i for i, intent in enumerate(self.classes)}  # intent -> its column

    def digest(self) -> str:
        """12 hex digits naming exactly these weights as saved (the same before and after a save and load)."""
        h = hashlib.sha1(json.dumps([self.classes, *(sorted(v.vocabulary_.items()) for v in self.vectorizers),
                                     asdict(self.options)]).encode())
        for array in self._saved_arrays().values():
            h.update(array.tobytes())
        return h.hexdigest()[:12]

    @classmethod
    def fit(cls, texts: Sequence[str], intents: Sequence[str], options: ReaderOptions = ReaderOptions(),
            learned_from: Sequence[str] = ()) -> IntentReader:
        vectorizers = _vectorizers(options)
        features = scipy.sparse.hstack([v.fit_transform(texts) for v in vectorizers]).tocsr()
        classifier = LogisticRegression(C=options.c, max_iter=options.max_iter)
        classifier.fit(features, intents)
        return cls(vectorizers, classifier, options, learned_from)

    def learned(self, corpus: str | Path, split: str) -> bool:
        """Whether it learned the sentences of this corpus folder's split."""
        return any(names_split(source, corpus, split) for source in self.learned_from)

    def _features(self, texts: Sequence[str]) -> scipy.sparse.csr_matrix:
        return scipy.sparse.hstack([v.transform(texts) for v in self.vectorizers]).tocsr()

    def probabilities(self, texts: Sequence[str], intents: Sequence[str]) -> np.ndarray:
        """P(intent_i | text_i) for each pair; 0 for an intent the training sentences never had."""
        p = self.classifier.predict_proba(self._features(texts))
        return np.array([p[i, self.index[intent]] if intent in self.index else 0.0
                         for i, intent in enumerate(intents)])

    def distribution(self, texts: Sequence[str], classes: Sequence[str]) -> np.ndarray:
        """(texts, classes): P(class | text) in the order asked; 0 for a class the training sentences never had."""
        p = self.classifier.predict_proba(self._features(texts))
        out = np.zeros((len(texts), len(classes)))
        for j, intent in enumerate(classes):
            if intent in self.index:
                out[:, j] = p[:, self.index[intent]]
        return out

    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        vocabularies = [{term: int(i) for term, i in v.vocabulary_.items()} for v in self.vectorizers]
        meta = {"options": asdict(self.options), "classes": self.classes, "vocabulary": vocabularies[0],
                "char_vocabulary": vocabularies[1] if len(vocabularies) > 1 else None,
                "learned_from": list(self.learned_from)}
        (folder / READER_FILES[0]).write_text(json.dumps(meta))
        np.savez_compressed(folder / READER_FILES[1], **self._saved_arrays())
        return folder

    def _saved_arrays(self) -> dict[str, np.ndarray]:
        idf = {name: v.idf_.astype(np.float32) for name, v in zip(("idf", "char_idf"), self.vectorizers)}
        return {**idf, "coef": self.classifier.coef_.astype(np.float16),
                "intercept": self.classifier.intercept_.astype(np.float32)}

    @classmethod
    def load(cls, folder: str | Path) -> IntentReader:
        folder = Path(folder)
        meta = json.loads((folder / READER_FILES[0]).read_text())
        arrays = np.load(folder / READER_FILES[1])
        options = ReaderOptions(**meta["options"])  # a reader saved before character n-grams has none
        vocabularies = [meta["vocabulary"]] + ([meta["char_vocabulary"]] if options.char_ngram_max else [])
        vectorizers = _vectorizers(options, vocabularies)
        for vectorizer, name in zip(vectorizers, ("idf", "char_idf")):
            vectorizer.idf_ = arrays[name].astype(np.float64)
        classifier = LogisticRegression(C=options.c)
        classifier.classes_ = np.array(meta["classes"])
        classifier.coef_ = arrays["coef"].astype(np.float64)
        classifier.intercept_ = arrays["intercept"].astype(np.float64)
        return cls(vectorizers, classifier, options, meta.get("learned_from", ()))


def names_split(source: str, corpus: str | Path, split: str) -> bool:
    """Whether a "CORPUS:SPLIT" source (`IntentReader.learned_from`) is this corpus folder's split, however the
    folder is written."""
    folder, _, source_split = source.rpartition(":")
    return source_split == split and Path(folder).resolve() == Path(corpus).resolve()


def _vectorizers(options: ReaderOptions,
                 vocabularies: Sequence[dict[str, int]] | None = None) -> list[TfidfVectorizer]:
    """The word n-gram vectorizer, and the character one when the options ask for it; fixed `vocabularies`
    (a loaded reader's) or fitted ones (min_df)."""
    kinds = [{"ngram_range": (1, options.ngram_max)}]
    if options.char_ngram_max:
        kinds.append({"analyzer": "char_wb", "ngram_range": (2, options.char_ngram_max)})
    if vocabularies is None:
        return [TfidfVectorizer(sublinear_tf=True, min_df=options.min_df, **kind) for kind in kinds]
    return [TfidfVectorizer(sublinear_tf=True, vocabulary=vocabulary, **kind)
            for kind, vocabulary in zip(kinds, vocabularies)]
