"""Check or choose the cloud's fusion weights (whisper.yaml) on dev, with the cloud's own pool and scorers.

For each utterance it pools Whisper's and the second opinion's candidates exactly as the served model does
(`WhisperRecognizer.pool`), scores every candidate once (Whisper forced decoding, the second opinion, the LM,
the word count), then grid-searches the four weights over those cached scores, and reports the shipped
weights, the grid's best, and the WER of weights tuned in 2-fold cross-validation (what tuning would
really buy on new data). The LM is the cloud's (`rescore_lm`) or, for a cloud without one, `--lm`; with
neither, the LM's weight stays 0.

`--third-opinion MODEL` asks whether a third SLU model (e.g. the device model) would help: its best distinct
transcripts join the pool and it scores every candidate too, with its own weight in the grid; the shipped
weights are then scored on the cloud's own pool (the third's weight 0, its candidates left out).

    .venv/bin/python scripts/tune_fusion.py --cloud models/shipped/cloud --utterances 300 --cache exp/fusion.json \
        --lm exp/ngram.json.gz   # pasu lm ngram --corpus data/corpus-full --out exp/ngram.json.gz
    .venv/bin/python scripts/tune_fusion.py --utterances 300 --cache exp/fusion3.json --third-opinion models/shipped/device
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
from pasu.models.second_opinion import SecondOpinion
from pasu.models.whisper_recognizer import WINDOW_SAMPLES, WhisperRecognizer, read_weights

GRID = list(itertools.product([0.25, 0.5, 0.75, 1.0], [0.25, 0.5, 0.75, 1.0], [0, 0.25, 0.5, 0.75, 1.0],
                              [0, 1, 2, 3, 4, 5]))  # whisper, second opinion, LM weights, word bonus
THIRD_WEIGHTS = [0.0, 0.25, 0.5, 0.75, 1.0]  # the third opinion's, with --third-opinion


def candidate_scores(cloud: Path, corpus: Path, count: int, lm_path: Path | None,
                     third_folder: Path | None = None) -> list[dict]:
    """Per dev utterance: the pooled candidates, their scores (LM 0 without an LM; the third opinion's with
    one), their word edits, and which come from the cloud's own pool."""
    recognizer = WhisperRecognizer.from_folder(cloud)
    lm = recognizer.lm or (NgramLm.load(lm_path) if lm_path is not None else None)
    third = SecondOpinion.from_folder(third_folder, recognizer.weights.second_opinion_beam) if third_folder else None
    rows = []
    for utt in tqdm(dev_subset(load_split(corpus, "dev"), count), desc="scoring candidates"):
        window = read_audio(utt.audio)[:WINDOW_SAMPLES]  # dev commands are far shorter than one window
        encoded = recognizer.encode(window)
        hypotheses = recognizer.nbest_encoded(encoded)
        if not hypotheses:  # Whisper calls it silence: nothing to fuse
            continue
        opinion = recognizer.second.listen(window)
        texts = recognizer.pool(hypotheses, opinion.texts)
        row = {"id": utt.id, "ref": utt.text}
        if third is not None:
            heard = third.listen(window)
            row["in_pool"] = [True] * len(texts)
            extra = [t for t in heard.texts[: recognizer.weights.second_opinion_candidates] if t not in texts]
            texts = texts + extra
            row["in_pool"] += [False] * len(extra)
            row["third"] = third.scores(heard, texts).tolist()
        row.update({"candidates": texts, "whisper": recognizer.forced_logprobs_encoded(encoded, texts).tolist(),
                    "second": recognizer.second.scores(opinion, texts).tolist(),
                    "lm": [lm.sentence_logprob(t) if lm is not None else 0.0 for t in texts],
                    "edits": [word_edits(utt.text, t) for t in texts]})
        rows.append(row)
    return rows


class Fusion:
    """Corpus WER of any weights over cached candidate scores."""

    def __init__(self, rows: list[dict]):
        self.has_third = all("third" in r for r in rows)
        # weights (whisper, second, LM, word bonus[, third]); a third opinion's weight 0 means the cloud's own
        # pool: its extra candidates are left out
        self.grid = ([w + (t,) for w in GRID for t in THIRD_WEIGHTS] if self.has_third else GRID)
        self.scores, self.pools = [], []
        for r in rows:
            rows_of_scores = [np.array(r["whisper"]), np.nan_to_num(np.array(r["second"]), neginf=-1e9),
                              np.array(r["lm"]), np.array([len(c.split()) for c in r["candidates"]], float)]
            if self.has_third:
                rows_of_scores.append(np.nan_to_num(np.array(r["third"]), neginf=-1e9))
            self.scores.append(np.stack(rows_of_scores))
            self.pools.append(np.array(r.get("in_pool", [True] * len(r["candidates"]))))
        self.edits = [np.array(r["edits"], float) for r in rows]
        self.words = np.array([len(r["ref"].split()) for r in rows], float)

    def wer(self, weights: tuple[float, ...], index: np.ndarray) -> float:
        w = np.array(weights)
        with_third = self.has_third and w[-1] > 0
        edits = 0.0
        for i in index:
            total = w @ self.scores[i]
            if not with_third:
                total = np.where(self.pools[i], total, -np.inf)
            edits += self.edits[i][int(np.argmax(total))]
        return float(edits / self.words[index].sum())

    def best(self, index: np.ndarray) -> tuple[float, ...]:
        return min(self.grid, key=lambda w: self.wer(w, index))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cloud", type=Path, default=Path("models/shipped/cloud"), help="cloud model folder")
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus-full"))
    parser.add_argument("--utterances", type=int, default=300, help="fixed random dev subset")
    parser.add_argument("--cache", type=Path, required=True, help="JSON of candidate scores (made once, then read)")
    parser.add_argument("--lm", type=Path, default=None, help="word n-gram LM to score with when the cloud has none")
    parser.add_argument("--third-opinion", type=Path, default=None,
                        help="a PASU model folder to try as a third opinion (pool and scorer)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.cache.is_file():
        rows = json.loads(args.cache.read_text())
    else:
        rows = candidate_scores(args.cloud, args.corpus, args.utterances, args.lm, args.third_opinion)
        args.cache.write_text(json.dumps(rows))
    fusion = Fusion(rows)
    every = np.arange(len(rows))
    w = read_weights(args.cloud)
    shipped = (w.whisper_weight, w.second_opinion_weight, w.lm_weight if w.rescore_lm else 0.0, w.word_bonus)
    shipped += (0.0,) if fusion.has_third else ()
    print(f"{len(rows)} utterances")
    print(f"shipped weights {shipped}: WER {fusion.wer(shipped, every):.4f}")
    best = fusion.best(every)
    print(f"grid's best {best}: WER {fusion.wer(best, every):.4f} (tuned on these utterances)")
    if fusion.has_third:
        own = min((w for w in fusion.grid if w[-1] == 0), key=lambda w: fusion.wer(w, every))
        print(f"grid's best without the third opinion {own}: WER {fusion.wer(own, every):.4f}")
    folds = np.array_split(np.random.default_rng(0).permutation(len(rows)), 2)
    edits = sum(fusion.wer(fusion.best(fit), held) * fusion.words[held].sum() for fit, held in (folds, folds[::-1]))
    print(f"tuned in 2-fold cross-validation: WER {edits / fusion.words.sum():.4f}")


if __name__ == "__main__":
    main()
