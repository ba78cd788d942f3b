"""Check or choose the cloud's fusion weights (whisper.yaml) on dev, with the cloud's own pool and scorers.

For each utterance it pools Whisper's and the second opinion's candidates exactly as the served model does
(`WhisperRecognizer.pool`), scores every candidate once (Whisper forced decoding, the second opinion, the LM,
the word count), then grid-searches the four weights over those cached scores, and reports the shipped
weights, the grid's best, and the WER of weights tuned in 2-fold cross-validation (what tuning would
really buy on new data). The LM is the cloud's (`rescore_lm`) or, for a cloud without one, `--lm`; with
neither, the LM's weight stays 0.

    .venv/bin/python scripts/tune_fusion.py --cloud models/shipped/cloud --utterances 300 --cache exp/fusion.json \
        --lm exp/ngram.json.gz   # pasu lm ngram --corpus data/corpus-full --out exp/ngram.json.gz
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from pasu.metrics import word_edits
from pasu.models.data import dev_subset, load_split, read_audio
from pasu.models.ngram_lm import NgramLm
from pasu.models.whisper_recognizer import WINDOW_SAMPLES, WhisperRecognizer, read_weights

GRID = list(itertools.product([0.25, 0.5, 0.75, 1.0], [0.25, 0.5, 0.75, 1.0], [0, 0.25, 0.5, 0.75, 1.0],
                              [0, 1, 2, 3, 4, 5]))  # whisper, second opinion, LM weights, word bonus


def candidate_scores(cloud: Path, corpus: Path, count: int, lm_path: Path | None) -> list[dict]:
    """Per dev utterance: the pooled candidates, their four scores (LM 0 without an LM) and their word edits."""
    recognizer = WhisperRecognizer.from_folder(cloud)
    lm = recognizer.lm or (NgramLm.load(lm_path) if lm_path is not None else None)
    rows = []
    for utt in tqdm(dev_subset(load_split(corpus, "dev"), count), desc="scoring candidates"):
        window = read_audio(utt.audio)[:WINDOW_SAMPLES]  # dev commands are far shorter than one window
        encoded = recognizer._encode(window)
        hypotheses = recognizer._nbest(encoded)
        if not hypotheses:  # Whisper calls it silence: nothing to fuse
            continue
        opinion = recognizer.second.listen(window)
        texts = recognizer.pool(hypotheses, opinion.texts)
        rows.append({"id": utt.id, "ref": utt.text, "candidates": texts,
                     "whisper": recognizer._forced(encoded, texts).tolist(),
                     "second": recognizer.second.scores(opinion, texts).tolist(),
                     "lm": [lm.sentence_logprob(t) if lm is not None else 0.0 for t in texts],
                     "edits": [word_edits(utt.text, t) for t in texts]})
    return rows


class Fusion:
    """Corpus WER of any weights over cached candidate scores."""

    def __init__(self, rows: list[dict]):
        self.scores = [np.stack([np.array(r["whisper"]), np.nan_to_num(np.array(r["second"]), neginf=-1e9),
                                 np.array(r["lm"]), np.array([len(c.split()) for c in r["candidates"]], float)])
                       for r in rows]
        self.edits = [np.array(r["edits"], float) for r in rows]
        self.words = np.array([len(r["ref"].split()) for r in rows], float)

    def wer(self, weights: tuple[float, ...], index: np.ndarray) -> float:
        w = np.array(weights)
        edits = sum(self.edits[i][int(np.argmax(w @ self.scores[i]))] for i in index)
        return float(edits / self.words[index].sum())

    def best(self, index: np.ndarray) -> tuple[float, ...]:
        return min(GRID, key=lambda w: self.wer(w, index))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cloud", type=Path, default=Path("models/shipped/cloud"), help="cloud model folder")
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus-full"))
    parser.add_argument("--utterances", type=int, default=300, help="fixed random dev subset")
    parser.add_argument("--cache", type=Path, required=True, help="JSON of candidate scores (made once, then read)")
    parser.add_argument("--lm", type=Path, default=None, help="word n-gram LM to score with when the cloud has none")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.cache.is_file():
        rows = json.loads(args.cache.read_text())
    else:
        rows = candidate_scores(args.cloud, args.corpus, args.utterances, args.lm)
        args.cache.write_text(json.dumps(rows))
    fusion = Fusion(rows)
    every = np.arange(len(rows))
    w = read_weights(args.cloud)
    shipped = (w.whisper_weight, w.second_opinion_weight, w.lm_weight if w.rescore_lm else 0.0, w.word_bonus)
    print(f"{len(rows)} utterances")
    print(f"shipped weights {shipped}: WER {fusion.wer(shipped, every):.4f}")
    best = fusion.best(every)
    print(f"grid's best {best}: WER {fusion.wer(best, every):.4f} (tuned on these utterances)")
    folds = np.array_split(np.random.default_rng(0).permutation(len(rows)), 2)
    edits = sum(fusion.wer(fusion.best(fit), held) * fusion.words[held].sum() for fit, held in (folds, folds[::-1]))
    print(f"tuned in 2-fold cross-validation: WER {edits / fusion.words.sum():.4f}")


if __name__ == "__main__":
    main()
