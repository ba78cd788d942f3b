"""Recognition errors as a recognizer makes them, learned from its transcripts and put into clean sentences.

A text classifier trained only on the clean training sentences reads a recognizer's transcripts worse than it
reads those sentences: the words it leans on are the ones the recognizer mishears. `ConfusionModel` counts, from
(reference, transcript) pairs, what happens to each reference word (kept, replaced by which word, dropped) and
how often words are inserted, and `corrupt` writes sentences as that recognizer might have heard them.
`scripts/reader_noise_check.py` fits the device's intent reader on such copies beside the clean sentences; on the
shipped device's dev replays they did not help (the offramp's calibration log has the numbers), so the shipped
reader learns the clean sentences alone.
"""

from __future__ import annotations

import difflib
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

DROP = ""  # the outcome "the word was not heard"


def aligned_words(ref: str, hyp: str) -> tuple[list[tuple[str, str]], list[str]]:
    """(reference word, what was heard in its place: a word or DROP) for every reference word, and the words
    heard in no reference word's place (insertions); difflib's matching blocks, unequal replaced runs paired
    from the left."""
    ref_words, hyp_words = ref.split(), hyp.split()
    pairs: list[tuple[str, str]] = []
    inserted: list[str] = []
    matcher = difflib.SequenceMatcher(a=ref_words, b=hyp_words, autojunk=False)
    for _, i1, i2, j1, j2 in matcher.get_opcodes():
        heard = hyp_words[j1:j2]
        for k, word in enumerate(ref_words[i1:i2]):
            pairs.append((word, heard[k] if k < len(heard) else DROP))
        inserted.extend(heard[i2 - i1:])
    return pairs, inserted


@dataclass
class ConfusionModel:
    """What a recognizer does to each word, counted over its transcripts."""

    outcomes: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))  # word -> heard -> count
    inserted: Counter = field(default_factory=Counter)  # words heard in no reference word's place
    # a word seen fewer times than this borrows the overall rates (its own counts are too few to trust)
    min_count: int = 3

    @classmethod
    def fit(cls, pairs: Iterable[tuple[str, str]], min_count: int = 3) -> ConfusionModel:
        """Counted over (reference, transcript) pairs."""
        model = cls(min_count=min_count)
        for ref, hyp in pairs:
            aligned, inserted = aligned_words(ref, hyp)
            for word, heard in aligned:
                model.outcomes[word][heard] += 1
            model.inserted.update(inserted)
        if not model.outcomes:
            raise ValueError("a confusion model needs transcripts of non-empty references")
        return model

    def rates(self) -> tuple[float, float, float]:
        """The overall share of reference words replaced and dropped, and insertions per reference word."""
        return self._rates(self._substitutes())

    def _rates(self, substitutes: Counter) -> tuple[float, float, float]:
        words = sum(sum(heard.values()) for heard in self.outcomes.values())
        dropped = sum(heard[DROP] for heard in self.outcomes.values())
        return (sum(substitutes.values()) / words, dropped / words, sum(self.inserted.values()) / words)

    def corrupt(self, sentences: Iterable[str], seed: int = 0) -> list[str]:
        """Each sentence as the recognizer might have heard it (seeded: the same copies each time)."""
        rng = np.random.default_rng(seed)
        substitutes = self._substitutes()
        replaced, dropped, inserting = self._rates(substitutes)
        familiar = {word for word, heard in self.outcomes.items() if sum(heard.values()) >= self.min_count}
        substitutes = substitutes or Counter({DROP: 1})  # what an unfamiliar word becomes
        tables = _Tables()
        copies = []
        for sentence in sentences:
            heard: list[str] = []
            for word in sentence.split():
                if word in familiar:
                    outcome = tables.draw(("word", word), self.outcomes[word], rng)
                else:
                    u = rng.random()
                    outcome = word if u >= replaced + dropped else DROP if u < dropped else \
                        tables.draw(("substitute",), substitutes, rng)
                if outcome:
                    heard.append(outcome)
                if self.inserted and rng.random() < inserting:
                    heard.append(tables.draw(("inserted",), self.inserted, rng))
            copies.append(" ".join(heard))
        return copies

    def _substitutes(self) -> Counter:
        """Every word heard in place of another, counted over all reference words."""
        substitutes = Counter()
        for word, heard in self.outcomes.items():
            substitutes.update({h: n for h, n in heard.items() if h not in (word, DROP)})
        return substitutes


class _Tables:
    """Cumulative distributions of the counters drawn from, built on first use."""

    def __init__(self) -> None:
        self._built: dict[tuple[str, ...], tuple[list[str], np.ndarray]] = {}

    def draw(self, key: tuple[str, ...], counts: Counter, rng: np.random.Generator) -> str:
        """A word drawn from `counts`, whose distribution is kept under `key`."""
        if key not in self._built:
            weights = np.cumsum(np.fromiter(counts.values(), float, len(counts)))
            self._built[key] = (list(counts), weights / weights[-1])
        words, cdf = self._built[key]
        return words[min(int(np.searchsorted(cdf, rng.random(), side="right")), len(words) - 1)]
