"""Would another SLU model's reading of the intent raise the cloud's intent accuracy? Over the dev rows cached by
`scripts/tune_text_pass.py` (the served cloud's candidates, their text-pass readings and the second opinion's
evidence), adds MODEL's log P(intent | audio, chosen words) at a range of weights, and reports the shipped rule's
accuracy, each weight's, MODEL's reading alone, and a weight tuned in 2-fold cross-validation (five random
splits). Also how often the right intent is among the shipped rule's top k. About 15 seconds for 300 rows.

    .venv/bin/python scripts/third_opinion.py exp/textpass-shipped.json models/shipped/baseline_branchformer
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from tune_text_pass import TextPassTuning  # scripts/ is on sys.path when run as a script

from pasu.models.data import load_split, read_audio
from pasu.models.second_opinion import Opinion, SecondOpinion

WEIGHTS = (0.0, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0)
SHIPPED = (1.0, 0.5)  # candidate_temperature, intent_weight in models/shipped/cloud/whisper.yaml


def third_readings(cache: dict, model: Path, corpus: Path) -> np.ndarray:
    """(rows, classes) log P(intent | audio, the chosen transcript) under `model`."""
    third = SecondOpinion.from_folder(model)
    audio = {u.id: u.audio for u in load_split(corpus, "dev")}
    rows = []
    for row in tqdm(cache["rows"], desc="third opinion", unit="utt"):
        chosen = row["texts"][int(np.argmax(row["log_weights"]))]
        speech = torch.from_numpy(read_audio(audio[row["id"]]).astype(np.float32))[None]
        with torch.inference_mode():
            encoded = third.model.encode(speech, torch.tensor([speech.size(1)]))[0][0]
        reading = third.intent_logprobs(Opinion([], [], encoded), chosen)
        rows.append([reading.get(c, min(reading.values())) for c in cache["classes"]])
    return np.array(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cache", type=Path, help="scripts/tune_text_pass.py's --cache")
    parser.add_argument("model", type=Path, help="a packaged PASU SLU model trained with SLOTS_UNKNOWN targets")
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus-full"))
    args = parser.parse_args()
    torch.set_num_threads(2)
    cache = json.loads(args.cache.read_text())
    tuning = TextPassTuning(cache)
    gold = tuning.gold
    shipped = tuning.reading(SHIPPED[0]) + SHIPPED[1] * tuning.evidence
    third = third_readings(cache, args.model, args.corpus)
    accuracy = lambda scores, rows: float(np.mean(scores[rows].argmax(1) == gold[rows]))
    everything = np.arange(len(gold))
    order = np.argsort(-shipped, axis=1)
    print(f"{len(gold)} rows; shipped rule: " + ", ".join(
        f"top {k} {np.mean([g in o[:k] for g, o in zip(gold, order)]):.1%}" for k in (1, 2, 3)))
    print(f"{args.model} alone: {accuracy(third, everything):.1%}")
    for weight in WEIGHTS:
        print(f"  + {weight:4.2f} x its reading: {accuracy(shipped + weight * third, everything):.1%}")
    rng, held_out = np.random.default_rng(0), []
    for _ in range(5):
        order_ = rng.permutation(len(gold))
        for fit, test in ((order_[::2], order_[1::2]), (order_[1::2], order_[::2])):
            weight = max(WEIGHTS, key=lambda w: accuracy(shipped + w * third, fit))
            held_out.append(accuracy(shipped + weight * third, test))
    print(f"weight tuned in 2-fold cross-validation: {np.mean(held_out):.1%} (shipped {accuracy(shipped, everything):.1%})")


if __name__ == "__main__":
    main()
