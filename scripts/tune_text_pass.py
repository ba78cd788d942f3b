"""Check or choose the cloud's two text-pass knobs (whisper.yaml) on dev: `candidate_temperature`, how evenly the
text pass reads the pooled candidates besides the chosen transcript, and `intent_weight`, how much the second
opinion's reading of the intent counts next to the text pass's.

For each dev utterance it runs the served recognizer with both at 1, so the answer carries the candidates'
probabilities softmax(fused score) (those of at least MIN_ALTERNATIVE_WEIGHT: other temperatures are scored
over these) and the second opinion's log P(intent | audio, chosen words) unweighed, and reads every candidate
with the text classifier. Every pair of a grid is then scored over those cached numbers
with `TextIntentPass`'s rule (intent accuracy of argmax log(sum over candidates of softmax(log weight / T) x
P_text) + w x evidence; T = 0: the chosen transcript alone). Reports the shipped pair, the grid's best, and the
accuracy of a pair tuned in 2-fold cross-validation (what tuning would really buy on new data).

With `--reread`, the cached candidates are read again by `--text-intent` before scoring, so two text passes
are compared on the same recognizer output without running the recognizer again.

    .venv/bin/python scripts/tune_text_pass.py --utterances 300 --cache exp/text_pass.json
    .venv/bin/python scripts/tune_text_pass.py --cache exp/text_pass.json --reread --text-intent exp/other
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from scipy.special import softmax
from tqdm import tqdm

from pasu.models.data import dev_subset, load_split, read_audio
from pasu.models.text_intent import TextIntentClassifier
from pasu.models.whisper_recognizer import WhisperRecognizer, read_weights

TEMPERATURES = [0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0]
WEIGHTS = [0.0, 0.1, 0.2, 0.3, 0.5, 1.0]


def intent_scores(cloud: Path, text_intent: Path, corpus: Path, count: int) -> dict:
    """Per dev utterance: the gold intent, the candidates' log weights and text-pass log-probabilities (the
    chosen transcript's first) and the second opinion's log-probability per intent."""
    recognizer = WhisperRecognizer.from_folder(cloud)
    recognizer.weights = replace(recognizer.weights, intent_weight=1.0, candidate_temperature=1.0)
    classifier = TextIntentClassifier.load(text_intent)
    rows = []
    for utt in tqdm(dev_subset(load_split(corpus, "dev"), count), desc="reading intents"):
        [heard] = recognizer.recognize_batch([read_audio(utt.audio)])
        if not heard.text.strip():  # an empty transcript keeps the recognizer's answer: nothing to weigh
            continue
        others = [(t, w) for t, w in heard.alternatives if t != heard.text]
        chosen = dict(heard.alternatives).get(heard.text, 1.0)
        texts = [heard.text] + [t for t, _ in others]
        rows.append({"id": utt.id, "gold": utt.intent, "texts": texts,
                     "log_weights": np.log(np.maximum([chosen] + [w for _, w in others], 1e-300)).tolist(),
                     "text_logprobs": _text_logprobs(classifier, texts),
                     "evidence": dict(heard.intent_evidence)})
    return {"classes": list(classifier.classes), "rows": rows}


def reread(cache: dict, text_intent: Path) -> dict:
    """The cache with every row's candidates read by another text pass (same intents, same order)."""
    classifier = TextIntentClassifier.load(text_intent)
    if list(classifier.classes) != cache["classes"]:
        raise ValueError(f"{text_intent} answers other intents than the cache's text pass")
    rows = [dict(r, text_logprobs=_text_logprobs(classifier, r["texts"]))
            for r in tqdm(cache["rows"], desc="re-reading")]
    return dict(cache, rows=rows)


def _text_logprobs(classifier: TextIntentClassifier, texts: list[str]) -> list[list[float]]:
    return np.log(np.maximum(classifier.probabilities(texts), 1e-30)).tolist()


class TextPassTuning:
    """Intent accuracy of any (temperature, weight) pair over cached log-probabilities."""

    def __init__(self, cache: dict):
        classes = cache["classes"]
        self.rows = cache["rows"]
        # an intent without evidence gets the least given, as TextIntentPass does
        self.evidence = np.array([[r["evidence"].get(c, min(r["evidence"].values(), default=0.0)) for c in classes]
                                  for r in self.rows])
        self.gold = np.array([classes.index(r["gold"]) if r["gold"] in classes else -1 for r in self.rows])

    @functools.cache  # noqa: B019 (one tuning object per run): each temperature is read once, not per weight
    def reading(self, temperature: float) -> np.ndarray:
        """(rows, classes) log-probabilities of the text pass for a candidate temperature."""
        out = []
        for r in self.rows:
            p = np.exp(np.array(r["text_logprobs"]))
            if temperature > 0:
                out.append(np.log(softmax(np.array(r["log_weights"]) / temperature) @ p))
            else:
                out.append(np.log(p[0]))
        return np.array(out)

    def accuracy(self, pair: tuple[float, float], index: np.ndarray) -> float:
        temperature, weight = pair
        chosen = (self.reading(temperature)[index] + weight * self.evidence[index]).argmax(axis=1)
        return float((chosen == self.gold[index]).mean())

    def best(self, index: np.ndarray) -> tuple[float, float]:
        return max(itertools.product(TEMPERATURES, WEIGHTS), key=lambda pair: self.accuracy(pair, index))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cloud", type=Path, default=Path("models/shipped/cloud"), help="cloud model folder")
    parser.add_argument("--text-intent", type=Path, default=Path("models/shipped/text_intent"))
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus-full"))
    parser.add_argument("--utterances", type=int, default=300, help="fixed random dev subset")
    parser.add_argument("--cache", type=Path, required=True, help="JSON of intent scores (made once, then read)")
    parser.add_argument("--reread", action="store_true",
                        help="read the cached candidates again with --text-intent (the cache file is left as it is)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.cache.is_file():
        cache = json.loads(args.cache.read_text())
    else:
        cache = intent_scores(args.cloud, args.text_intent, args.corpus, args.utterances)
        args.cache.write_text(json.dumps(cache))
    if args.reread:
        cache = reread(cache, args.text_intent)
    tuning = TextPassTuning(cache)
    every = np.arange(len(tuning.gold))
    print(f"{len(every)} utterances with a transcript; intent accuracy by candidate temperature (rows) and "
          f"intent weight (columns {WEIGHTS}):")
    for t in TEMPERATURES:
        print(f"  {t:>5}: " + "  ".join(f"{tuning.accuracy((t, w), every):.4f}" for w in WEIGHTS))
    shipped = read_weights(args.cloud)
    pair = (shipped.candidate_temperature, shipped.intent_weight)
    print(f"shipped (temperature, weight) {pair}: {tuning.accuracy(pair, every):.4f}")
    best = tuning.best(every)
    print(f"grid's best {best}: {tuning.accuracy(best, every):.4f} (tuned on these utterances)")
    folds = np.array_split(np.random.default_rng(0).permutation(len(every)), 2)
    right = sum(tuning.accuracy(tuning.best(fit), held) * len(held) for fit, held in (folds, folds[::-1]))
    print(f"tuned in 2-fold cross-validation: {right / len(every):.4f}")


if __name__ == "__main__":
    main()
