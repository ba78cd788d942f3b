"""A word n-gram language model (interpolated Kneser-Ney) for rescoring a recognizer's n-best transcripts.

Whisper knows English, not our commands: among its n-best lists the in-domain sentence ("order me chinese
food") is often there but not first ("border meet chinese food"). A small word LM on the training text (the
corpus's `train` sentences, in their spoken form) picks it out; it cannot fuse into CTranslate2's beam search,
so it rescores the finished hypotheses. Interpolated Kneser-Ney with one absolute discount per order (Chen &
Goodman 1998), as kenlm and SRILM estimate it, without pruning: the training text has ~20k sentences.

Saved as JSON, gzipped when the name ends in `.gz` (`save`/`load`): counts, not probabilities, so the file
is small and the model exact.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO

BOS, EOS = "<s>", "</s>"


class NgramLm:
    """P(word | previous order-1 words) by interpolated Kneser-Ney; `sentence_logprob` scores whole sentences."""

    def __init__(self, counts: Sequence[Counter[tuple[str, ...]]], discounts: Sequence[float]):
        # counts[n-1]: raw counts for the highest order, continuation counts (distinct left words) below it
        self.order = len(counts)
        self.counts = [Counter(c) for c in counts]
        self.discounts = list(discounts)
        self._context_totals: list[Counter[tuple[str, ...]]] = []  # sum over w of counts[n-1][ctx + (w,)]
        self._context_types: list[Counter[tuple[str, ...]]] = []  # distinct w after ctx
        for level in self.counts:
            totals, types = Counter(), Counter()
            for gram, c in level.items():
                totals[gram[:-1]] += c
                types[gram[:-1]] += 1
            self._context_totals.append(totals)
            self._context_types.append(types)
        self.vocab_size = len(self.counts[0]) + 1  # + the unknown word

    @classmethod
    def train(cls, sentences: Iterable[str], order: int = 3) -> NgramLm:
        """Counts from whitespace-tokenized sentences (already normalized), discounts from counts of counts."""
        top: Counter[tuple[str, ...]] = Counter()
        for sentence in sentences:
            words = [BOS] * (order - 1) + sentence.split() + [EOS]
            for i in range(order - 1, len(words)):
                top[tuple(words[i - order + 1:i + 1])] += 1
        counts = [top]
        for _ in range(order - 1):  # continuation counts: how many distinct words precede each shorter n-gram
            left: dict[tuple[str, ...], set[str]] = defaultdict(set)
            for gram in counts[0]:
                left[gram[1:]].add(gram[0])
            counts.insert(0, Counter({gram: len(words) for gram, words in left.items()}))
        return cls(counts, [_discount(level) for level in counts])

    def logprob(self, word: str, context: Sequence[str]) -> float:
        """Natural log P(word | the last order-1 words of context)."""
        return math.log(self._prob(word, tuple(context[len(context) - self.order + 1:])))

    def _prob(self, word: str, context: tuple[str, ...]) -> float:
        if not context:
            lower = 1.0 / self.vocab_size
        else:
            lower = self._prob(word, context[1:])
        level = len(context)
        total = self._context_totals[level].get(context, 0)
        if total == 0:
            return lower
        discount = self.discounts[level]
        count = self.counts[level].get(context + (word,), 0)
        backoff = discount * self._context_types[level][context] / total
        return max(count - discount, 0.0) / total + backoff * lower

    def sentence_logprob(self, sentence: str) -> float:
        """Natural log P(sentence, end of sentence), padded with <s> as in training."""
        words = [BOS] * (self.order - 1) + sentence.split() + [EOS]
        return sum(self.logprob(words[i], words[:i]) for i in range(self.order - 1, len(words)))

    def save(self, path: str | os.PathLike) -> Path:
        levels = [[[" ".join(gram), c] for gram, c in sorted(level.items())] for level in self.counts]
        text = json.dumps({"format": 1, "kind": "word_ngram_kn", "discounts": self.discounts, "counts": levels})
        with _open(path, "wt") as f:
            f.write(text)
        return Path(path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> NgramLm:
        with _open(path, "rt") as f:
            data = json.load(f)
        if data.get("kind") != "word_ngram_kn":
            raise ValueError(f"{path} is not a word n-gram LM (kind {data.get('kind')!r})")
        counts = [Counter({tuple(gram.split(" ")): c for gram, c in level}) for level in data["counts"]]
        return cls(counts, data["discounts"])


def training_sentences(source: str | os.PathLike, split: str = "train") -> list[str]:
    """Distinct sentences in first-seen order: a corpus folder's `<split>.jsonl` texts, or a text file's lines
    normalized as the corpus normalizes (lower case, no punctuation)."""
    from pasu.corpus.text import normalize_text
    from pasu.models.data import load_split

    source = Path(source)
    if source.is_dir():
        texts = [u.text for u in load_split(source, split)]
    else:
        texts = [normalize_text(line) for line in source.read_text().splitlines()]
    return list(dict.fromkeys(t for t in texts if t))


def _open(path: str | os.PathLike, mode: str) -> IO[str]:
    """A text file, gzipped when its name ends in `.gz`; mode "rt" or "wt"."""
    if str(path).endswith(".gz"):  # mtime 0: the same counts give the same bytes
        return io.TextIOWrapper(gzip.GzipFile(path, mode[0] + "b", mtime=0), encoding="utf-8")
    return open(path, mode, encoding="utf-8")


def _discount(level: Counter[tuple[str, ...]]) -> float:
    """Ney's estimate D = n1 / (n1 + 2 n2) from how many n-grams occur once (n1) and twice (n2)."""
    n1 = sum(1 for c in level.values() if c == 1)
    n2 = sum(1 for c in level.values() if c == 2)
    return n1 / (n1 + 2 * n2) if n1 and n2 else 0.5
