"""The cloud's slot tagger: SLURP slots read from a transcript, one BIO label per word.

    SlotTagger = all-MiniLM-L6-v2 token states (frozen; the text pass's encoder) + logistic regression

A word's features are the encoder's state of its first sub-token, next to those of the words before and after
it (context beyond what the encoder's attention already mixes in, cheaply). Labels are BIO over SLURP slot
types (`B-date`, `I-date`, `O`); training labels come from each sentence's `[type : value]` spans, found in its
words. A Whisper transcript has no slot markup: this is what gives offloaded answers their slots.

Saved next to the intent classifier (`pasu text-intent train`): `slots.npz` (weights, bias) and a `slots`
entry (labels, options, measured F1) in `text_intent.json`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from pasu.slu import Slot

if TYPE_CHECKING:
    from pasu.corpus.text import Sentence

OUTSIDE = "O"
WEIGHTS_FILE = "slots.npz"


class WordEncoder(Protocol):
    name: str

    def word_states(self, sentences: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """One (words, dim) float32 array per sentence: the state of each word's first sub-token."""
        ...


@dataclass(frozen=True)
class SlotTrainOptions:
    c: float = 1.0  # inverse L2 strength of the logistic regression
    max_iter: int = 300  # lbfgs iterations (tens of thousands of words, ~100 labels: minutes on 2 cores)


def class_weights(lr: Any) -> tuple[np.ndarray, np.ndarray]:
    """A fitted scikit-learn LogisticRegression as one (weights, bias) row per class. With two classes sklearn
    keeps one row, the second class's logit; softmax and argmax over the classes need both."""
    weights, bias = lr.coef_, lr.intercept_
    if len(lr.classes_) == 2:
        weights, bias = np.vstack([np.zeros_like(weights), weights]), np.concatenate([[0.0], bias])
    return weights, bias


def bio_labels(words: Sequence[str], slots: Sequence[Slot]) -> list[str] | None:
    """BIO labels of `words` for `slots`, each value found as a run of words left to right; None when one is not."""
    labels = [OUTSIDE] * len(words)
    for slot in slots:
        value = slot.value.split()
        start = _find_free(words, value, labels)
        if start is None:
            return None
        labels[start : start + len(value)] = [f"B-{slot.type}"] + [f"I-{slot.type}"] * (len(value) - 1)
    return labels


def _find_free(words: Sequence[str], value: list[str], labels: list[str]) -> int | None:
    for start in range(len(words) - len(value) + 1):
        if list(words[start : start + len(value)]) == value and all(
                label == OUTSIDE for label in labels[start : start + len(value)]):
            return start
    return None


def spans(words: Sequence[str], labels: Sequence[str]) -> tuple[Slot, ...]:
    """Slots from BIO labels; an I- that does not continue its type opens a new slot (as conlleval reads it)."""
    slots: list[Slot] = []
    current: tuple[str, list[str]] | None = None
    for word, label in zip(words, labels):
        kind, _, slot_type = label.partition("-")
        if kind == "I" and current is not None and current[0] == slot_type:
            current[1].append(word)
            continue
        if current is not None:
            slots.append(Slot(current[0], " ".join(current[1])))
        current = (slot_type, [word]) if kind in ("B", "I") else None
    if current is not None:
        slots.append(Slot(current[0], " ".join(current[1])))
    return tuple(slots)


def word_features(states: np.ndarray) -> np.ndarray:
    """(words, 3 * dim): each word's state, then its left and right neighbours' (zeros past the ends)."""
    pad = np.zeros((1, states.shape[1]), dtype=states.dtype)
    left = np.vstack([pad, states[:-1]]) if len(states) else states
    right = np.vstack([states[1:], pad]) if len(states) else states
    return np.hstack([states, left, right])


class SlotTagger:
    """Multinomial logistic regression over BIO labels, on word features from a frozen encoder."""

    def __init__(self, labels: Sequence[str], weights: np.ndarray, bias: np.ndarray, encoder: WordEncoder,
                 info: dict | None = None):
        self.labels = tuple(labels)
        self.weights = np.asarray(weights, dtype=np.float32)  # (labels, 3 * dim)
        self.bias = np.asarray(bias, dtype=np.float32)  # (labels,)
        self.encoder = encoder
        self.info = dict(info or {})

    @classmethod
    def train(cls, sentences: Sequence[tuple[str, Sequence[Slot]]], encoder: WordEncoder,
              options: SlotTrainOptions = SlotTrainOptions()) -> SlotTagger:
        """Fit on (text, slots) pairs; sentences whose slot values are not in their words are left out."""
        from sklearn.linear_model import LogisticRegression

        words, labels = [], []
        for text, slots in sentences:
            w = text.split()
            bio = bio_labels(w, slots)
            if w and bio is not None:
                words.append(w)
                labels.append(bio)
        if not words:
            raise ValueError("no sentence with findable slot values to train on")
        x = np.vstack([word_features(s) for s in encoder.word_states(words)])
        y = [label for sentence in labels for label in sentence]
        lr = LogisticRegression(C=options.c, max_iter=options.max_iter).fit(x, y)
        weights, bias = class_weights(lr)
        info = {"sentences": len(words), "skipped": len(sentences) - len(words), "words": len(y),
                "options": asdict(options)}
        return cls([str(c) for c in lr.classes_], weights, bias, encoder, info)

    def tag(self, texts: Sequence[str]) -> list[tuple[Slot, ...]]:
        """The slots of each (SLURP-style, lower-case) transcript."""
        words = [t.split() for t in texts]
        out: list[tuple[Slot, ...]] = [()] * len(texts)
        present = [i for i, w in enumerate(words) if w]
        states = self.encoder.word_states([words[i] for i in present])
        for i, s in zip(present, states):
            best = (word_features(s) @ self.weights.T + self.bias).argmax(axis=1)
            out[i] = spans(words[i], [self.labels[k] for k in best])
        return out

    def slu_f1(self, sentences: Sequence[Sentence]) -> float:
        """SLURP SLU-F1 of the tagged slots on labelled sentences, their gold text as the transcript."""
        from pasu.metrics import SluResult, evaluate_slu

        scored = [s for s in sentences if s.slots is not None]
        tagged = self.tag([s.text for s in scored])
        refs = [SluResult(s.text, s.intent, s.slots) for s in scored]
        return evaluate_slu(refs, [SluResult(s.text, s.intent, t) for s, t in zip(scored, tagged)]).slu_f1

    def arrays(self) -> dict[str, np.ndarray]:
        return {"weights": self.weights, "bias": self.bias}
