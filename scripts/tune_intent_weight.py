"""Check or choose the cloud's intent_weight (whisper.yaml) on dev: how much the second opinion's reading of the
intent counts next to the text pass's.

For each dev utterance it runs the served recognizer with intent_weight 1, so the answer carries the second
opinion's log P(intent | audio, chosen words) unweighed, reads the chosen transcript with the text classifier,
then scores every weight of a grid over those cached numbers: intent accuracy of argmax log P_text + w x
evidence, which is `TextIntentPass`'s rule. Reports the shipped weight, the grid's best, and the accuracy of a
weight tuned in 2-fold cross-validation (what tuning would really buy on new data).

    .venv/bin/python scripts/tune_intent_weight.py --utterances 300 --cache exp/intent_weight.json
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from pasu.models.data import dev_subset, load_split, read_audio
from pasu.models.text_intent import TextIntentClassifier
from pasu.models.whisper_recognizer import WhisperRecognizer, read_weights

GRID = [0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0, 1.5, 2.0]


def intent_scores(cloud: Path, text_intent: Path, corpus: Path, count: int) -> dict:
    """Per dev utterance: the gold intent, the text pass's and the second opinion's log-probability per intent."""
    recognizer = WhisperRecognizer.from_folder(cloud)
    recognizer.weights = replace(recognizer.weights, intent_weight=1.0)
    classifier = TextIntentClassifier.load(text_intent)
    rows = []
    for utt in tqdm(dev_subset(load_split(corpus, "dev"), count), desc="reading intents"):
        [heard] = recognizer.recognize_batch([read_audio(utt.audio)])
        if heard.text.strip():  # an empty transcript keeps the recognizer's answer: nothing to weigh
            rows.append({"id": utt.id, "gold": utt.intent, "text": heard.text,
                         "evidence": dict(heard.intent_evidence)})
    probabilities = classifier.probabilities([r["text"] for r in rows])
    for row, p in zip(rows, probabilities):
        row["text_logprob"] = np.log(np.maximum(p, 1e-30)).tolist()
    return {"classes": list(classifier.classes), "rows": rows}


class IntentFusion:
    """Intent accuracy of any weight over cached log-probabilities."""

    def __init__(self, cache: dict):
        classes = cache["classes"]
        rows = cache["rows"]
        self.text = np.array([r["text_logprob"] for r in rows])
        # an intent without evidence gets the least given, as TextIntentPass does
        self.evidence = np.array([[r["evidence"].get(c, min(r["evidence"].values(), default=0.0)) for c in classes]
                                  for r in rows])
        self.gold = np.array([classes.index(r["gold"]) if r["gold"] in classes else -1 for r in rows])

    def accuracy(self, weight: float, index: np.ndarray) -> float:
        chosen = (self.text[index] + weight * self.evidence[index]).argmax(axis=1)
        return float((chosen == self.gold[index]).mean())

    def best(self, index: np.ndarray) -> float:
        return max(GRID, key=lambda w: self.accuracy(w, index))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cloud", type=Path, default=Path("models/shipped/cloud"), help="cloud model folder")
    parser.add_argument("--text-intent", type=Path, default=Path("models/shipped/text_intent"))
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus-full"))
    parser.add_argument("--utterances", type=int, default=300, help="fixed random dev subset")
    parser.add_argument("--cache", type=Path, required=True, help="JSON of intent scores (made once, then read)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.cache.is_file():
        cache = json.loads(args.cache.read_text())
    else:
        cache = intent_scores(args.cloud, args.text_intent, args.corpus, args.utterances)
        args.cache.write_text(json.dumps(cache))
    fusion = IntentFusion(cache)
    every = np.arange(len(fusion.gold))
    shipped = read_weights(args.cloud).intent_weight
    print(f"{len(every)} utterances with a transcript")
    print("intent accuracy by weight: " + ", ".join(f"{w}: {fusion.accuracy(w, every):.4f}" for w in GRID))
    print(f"shipped intent_weight {shipped}: {fusion.accuracy(shipped, every):.4f}")
    best = fusion.best(every)
    print(f"grid's best {best}: {fusion.accuracy(best, every):.4f} (tuned on these utterances)")
    folds = np.array_split(np.random.default_rng(0).permutation(len(every)), 2)
    right = sum(fusion.accuracy(fusion.best(fit), held) * len(held) for fit, held in (folds, folds[::-1]))
    print(f"tuned in 2-fold cross-validation: {right / len(every):.4f}")


if __name__ == "__main__":
    main()
