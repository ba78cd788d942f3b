"""Word-level spelling correction of the device's answer: a word no training sentence holds is replaced by the
known word nearest in spelling and likeliest in its context.

The device model writes words from about 300 sentencepiece tokens, and often hears a word right but spells it
wrong ("windi", "birthdy"): 10.5% of the words of its `dev` answers are in no training sentence. Each such word of
`min_length` letters or more is replaced by the known word, of those within `max_relative_distance` edits per
letter and `edit_slack` edits of the nearest, that scores best on
`-edits + lm_weight x (log P(word | the two before) + log P(the next word | ...))` under a word trigram of the
training sentences; known words stay. Slot values are words of the transcript, so they follow the
same replacements. Candidates come from rapidfuzz's Levenshtein search over the vocabulary: about 0.5 ms an
utterance on the build machine. The trigram ships in the model folder (`MODEL/words.json.gz`, `pasu lm ngram`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace

from rapidfuzz import process
from rapidfuzz.distance import Levenshtein

from pasu.metrics import SluResult
from pasu.models.ngram_lm import BOS, EOS, NgramLm
from pasu.slu import Slot

WORDS_FILE = "words.json.gz"  # in a device model folder: the trigram whose words are the known ones


@dataclass(frozen=True)
class SpellingOptions:
    """How far a heard word may be from the word it becomes. Chosen on all 2,033 `dev` replays (the device
    card): WER 24.7% -> 22.4%; the neighbours (0.6-1.0 edits per letter, weight 0.1-0.3) within 0.2 points."""

    max_relative_distance: float = 0.8  # edits per letter of the heard word (at least one edit)
    lm_weight: float = 0.2  # of the trigram's log-probabilities (natural log) against one edit
    min_length: int = 3  # shorter words ("a", "an", "to"'s misspellings) stay as heard: too many neighbours
    # only candidates within this many edits of the nearest are scored by the trigram: 0.5 ms an utterance
    # against 3.1 ms for all within reach, at 0.05 points of `dev` WER
    edit_slack: int = 1


class SpellingCorrector:
    """Replaces unknown words by known ones (see the module doc)."""

    def __init__(self, lm: NgramLm, options: SpellingOptions = SpellingOptions()):
        self.lm = lm
        self.options = options
        self.vocabulary = sorted(gram[0] for gram in lm.counts[0] if gram[0] not in (BOS, EOS))
        self._known = frozenset(self.vocabulary)

    @classmethod
    def load(cls, path: str | os.PathLike, options: SpellingOptions = SpellingOptions()) -> SpellingCorrector:
        """From a word n-gram file (`pasu lm ngram --out FILE`)."""
        return cls(NgramLm.load(path), options)

    def correct(self, result: SluResult) -> SluResult:
        """`result` with its unknown words, in the transcript and in the slot values, replaced."""
        heard = result.text.split()
        written = self.words(heard)
        if written == heard:
            return result
        replaced = {h: w for h, w in zip(heard, written) if h != w}
        slots = tuple(Slot(s.type, " ".join(replaced.get(w, w) for w in s.value.split())) for s in result.slots)
        return replace(result, text=" ".join(written), slots=slots)

    def words(self, heard: Sequence[str]) -> list[str]:
        """The words with each unknown one replaced (context: the words already written, the next one heard)."""
        written: list[str] = []
        for i, word in enumerate(heard):
            following = heard[i + 1] if i + 1 < len(heard) else EOS
            written.append(self._word(word, written[-2:], following))
        return written

    def _word(self, word: str, before: list[str], following: str) -> str:
        o = self.options
        if word in self._known or len(word) < o.min_length:
            return word
        budget = max(1, int(o.max_relative_distance * len(word)))
        candidates = process.extract(word, self.vocabulary, scorer=Levenshtein.distance, score_cutoff=budget,
                                     limit=None)
        if not candidates:
            return word
        nearest = candidates[0][1]  # sorted by distance
        candidates = [c for c in candidates if c[1] <= nearest + o.edit_slack]
        context = [BOS] * (self.lm.order - 1) + before

        def score(candidate: tuple[str, int, int]) -> float:
            known, edits, _ = candidate
            fit = self.lm.logprob(known, context) + self.lm.logprob(following, context + [known])
            return -edits + o.lm_weight * fit

        return max(candidates, key=score)[0]
