"""Offramp: do the last pilot's words, read by a small text classifier, agree with the pilot's intent?

The SLU model emits the intent first and the words after it. When the words it has heard so far read as
another command to a classifier trained on the training sentences, its intent is likely wrong, and wrong
intents are what the cloud fixes and what perplexity ranks worst (it scores words, most of which are right).
The policy weighs the score by the speech's seconds, as it does every offramp's. On the 300 dev utterances of
the shipped calibration, with the answers of the cloud of that time (the Conformer's third run as second
opinion) decoded offline: offloading the top 47% by the weighed score
kept intent accuracy 0.7 points under offloading everything (unweighed: 0.3 above), and needed 0.20 / 0.53 /
0.74 / 0.81x NaiveHybrid's offloading at the four WER targets (unweighed: 0.32 / 0.65 / 0.80 / 0.85x).
The classifier is TF-IDF over word uni- and bigrams + logistic regression (scikit-learn), under 1 MB on disk.
It is stored as arrays and a vocabulary, not pickled: loading a model folder runs no code.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression

from pasu.device.decoding.search import Hypothesis
from pasu.metrics import SluResult

READER_FILES = ("intent_reader.json", "intent_reader.npz")


@dataclass(frozen=True)
class ReaderOptions:
    ngram_max: int = 2  # word n-grams up to this length
    min_df: int = 2  # n-grams in fewer training sentences are dropped (7k terms instead of 23k)
    c: float = 10.0  # inverse strength of the logistic regression's L2 penalty
    max_iter: int = 2000  # the solver's iterations


class IntentReader:
    """P(intent | transcript) from TF-IDF + logistic regression."""

    def __init__(self, vectorizer: TfidfVectorizer, classifier: LogisticRegression, options: ReaderOptions):
        self.vectorizer = vectorizer
        self.classifier = classifier
        self.options = options
        self._index = {intent: i for i, intent in enumerate(classifier.classes_)}

    @classmethod
    def fit(cls, texts: Sequence[str], intents: Sequence[str], options: ReaderOptions = ReaderOptions()) -> IntentReader:
        vectorizer = TfidfVectorizer(ngram_range=(1, options.ngram_max), sublinear_tf=True, min_df=options.min_df)
        classifier = LogisticRegression(C=options.c, max_iter=options.max_iter)
        classifier.fit(vectorizer.fit_transform(texts), intents)
        return cls(vectorizer, classifier, options)

    def probabilities(self, texts: Sequence[str], intents: Sequence[str]) -> np.ndarray:
        """P(intent_i | text_i) for each pair; 0 for an intent the training sentences never had."""
        p = self.classifier.predict_proba(self.vectorizer.transform(texts))
        return np.array([p[i, self._index[intent]] if intent in self._index else 0.0
                         for i, intent in enumerate(intents)])

    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        meta = {"options": asdict(self.options), "classes": [str(c) for c in self.classifier.classes_],
                "vocabulary": {term: int(i) for term, i in self.vectorizer.vocabulary_.items()}}
        (folder / READER_FILES[0]).write_text(json.dumps(meta))
        np.savez_compressed(folder / READER_FILES[1], idf=self.vectorizer.idf_.astype(np.float32),
                            coef=self.classifier.coef_.astype(np.float16),
                            intercept=self.classifier.intercept_.astype(np.float32))
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> IntentReader:
        folder = Path(folder)
        meta = json.loads((folder / READER_FILES[0]).read_text())
        arrays = np.load(folder / READER_FILES[1])
        options = ReaderOptions(**meta["options"])
        vectorizer = TfidfVectorizer(ngram_range=(1, options.ngram_max), sublinear_tf=True,
                                     vocabulary=meta["vocabulary"])
        vectorizer.idf_ = arrays["idf"].astype(np.float64)
        classifier = LogisticRegression(C=options.c)
        classifier.classes_ = np.array(meta["classes"])
        classifier.coef_ = arrays["coef"].astype(np.float64)
        classifier.intercept_ = arrays["intercept"].astype(np.float64)
        return cls(vectorizer, classifier, options)


class IntentAgreementOfframp:
    """1 - P(the hypothesis's intent | its words): higher when the words read as another command."""

    def __init__(self, reader: IntentReader, read: Callable[[Sequence[int]], SluResult]):
        self.reader = reader
        self.read = read  # output tokens -> transcript and intent (DeviceModel.read)

    def score(self, hypothesis: Hypothesis) -> float:
        slu = self.read(hypothesis.tokens)
        return float(1.0 - self.reader.probabilities([slu.text], [slu.intent])[0])
