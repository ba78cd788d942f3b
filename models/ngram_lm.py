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
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO

BOS, EOS, UNK = "<s>", "</s>", "<unk>"


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
            # the padding predicts nothing: no n-gram ends in <s>, so the model never gives <s> any probability
            counts.insert(0, Counter({gram: len(words) for gram, words in left.items() if gram[-1] != BOS}))
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

    def write_arpa(self, path: str | os.PathLike, keep: Callable[[str], bool] = lambda word: True) -> Path:
        """Write the model in ARPA format, for decoders that read n-gram LMs themselves (pocketsphinx, kenlm).

        Listed n-grams carry this model's interpolated probabilities; each context's backoff weight is set so
        that its distribution sums to one. The model pads a sentence with order-1 `<s>`, ARPA with one: ARPA's
        context `<s> w` is read as this model's `<s> <s> w`. Words `keep` rejects (say, ones a decoder has no
        pronunciation for) are left out with every n-gram holding them."""
        arpa = self._arpa_grams(keep)
        with _open(path, "wt") as f:
            f.write("\\data\\\n")
            f.writelines(f"ngram {n}={len(level)}\n" for n, level in enumerate(arpa, 1))
            for n, level in enumerate(arpa, 1):
                f.write(f"\n\\{n}-grams:\n")
                for gram, (logp, bow) in level.items():
                    f.write(f"{logp:.6f}\t{' '.join(gram)}" + ("" if bow is None else f"\t{bow:.6f}") + "\n")
            f.write("\n\\end\\\n")
        return Path(path)

    def _arpa_grams(self, keep: Callable[[str], bool]) -> list[dict[tuple[str, ...], tuple[float, float | None]]]:
        """ARPA's n-grams by order: gram -> (log10 P, log10 backoff weight or None at the highest order)."""
        def wanted(gram: tuple[str, ...]) -> bool:
            return all(w == BOS and i == 0 or w == EOS or w not in (BOS, UNK) and keep(w)
                       for i, w in enumerate(gram))

        def prob(word: str, context: tuple[str, ...]) -> float:
            if context[:1] == (BOS,):  # ARPA's single <s> stands for this model's padding
                context = (BOS,) * (self.order - len(context)) + context[1:]
            return self._prob(word, context)

        probs: list[dict[tuple[str, ...], float]] = [{(BOS,): 0.0, (UNK,): self._prob(UNK, ())}]
        probs[0].update({g: prob(g[0], ()) for g in self.counts[0] if wanted(g)})
        for level in self.counts[1:]:
            probs.append({g: prob(g[-1], g[:-1]) for g in level if wanted(g)})
        followers: dict[tuple[str, ...], list[str]] = defaultdict(list)
        for level in probs[1:]:
            for gram in level:
                followers[gram[:-1]].append(gram[-1])
        arpa = []
        for n, level in enumerate(probs, 1):
            entries = {}
            for gram, p in level.items():
                bow = None if n == len(probs) else _log10(self._backoff_weight(gram, followers.get(gram, []), prob))
                entries[gram] = (_log10(p), bow)
            arpa.append(entries)
        return arpa

    @staticmethod
    def _backoff_weight(context: tuple[str, ...], seen: list[str],
                        prob: Callable[[str, tuple[str, ...]], float]) -> float:
        """The weight that makes P(. | context) sum to one when the words not seen after it back off."""
        if not seen:
            return 1.0
        left = 1.0 - sum(prob(w, context) for w in seen)
        lower = 1.0 - sum(prob(w, context[1:]) for w in seen)
        return max(left, 1e-12) / max(lower, 1e-12)

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
    """Distinct sentences in first-seen order: a corpus folder's `<split>.jsonl` texts, a sentence file's (`.jsonl`,
    as `pasu corpus swap-slots` and `pasu text-intent pseudo-label` write), or a text file's lines normalized as
    the corpus normalizes (lower case, no punctuation)."""
    from pasu.corpus.text import normalize_text, read_sentences
    from pasu.models.data import load_split

    source = Path(source)
    if source.is_dir():
        texts = [u.text for u in load_split(source, split)]
    elif source.suffix == ".jsonl":
        texts = [s.text for s in read_sentences(source)]
    else:
        texts = [normalize_text(line) for line in source.read_text().splitlines()]
    return list(dict.fromkeys(t for t in texts if t))


def _open(path: str | os.PathLike, mode: str) -> IO[str]:
    """A text file, gzipped when its name ends in `.gz`; mode "rt" or "wt"."""
    if str(path).endswith(".gz"):  # mtime 0: the same counts give the same bytes
        return io.TextIOWrapper(gzip.GzipFile(path, mode[0] + "b", mtime=0), encoding="utf-8")
    return open(path, mode, encoding="utf-8")


def _log10(x: float) -> float:
    return math.log10(x) if x > 0 else -99.0


def _discount(level: Counter[tuple[str, ...]]) -> float:
    """Ney's estimate D = n1 / (n1 + 2 n2) from how many n-grams occur once (n1) and twice (n2)."""
    n1 = sum(1 for c in level.values() if c == 1)
    n2 = sum(1 for c in level.values() if c == 2)
    return n1 / (n1 + 2 * n2) if n1 and n2 else 0.5
