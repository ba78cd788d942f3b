"""Does the BiLSTM offramp rank a split better when it also learns from replays of training utterances? Fits it
on MODEL/offramp's dev replays, on those plus N replayed training utterances, and on those alone (two seeds
each), and prices each on a split's replays with the cloud's answers (`scripts/cloud_answers.py`): the offloading
each of four WER targets needs, relative to NaiveHybrid's (Table 5's measure; its targets sit between the
device's and the offline cloud's WER). Replaying the training utterances is cached beside MODEL/offramp's replays
(about 20 minutes for 4,000 on 2 cores); the rest about 5.

    .venv/bin/python scripts/bilstm_more_data.py models/shipped/device exp/hybrid29/replays-test.jsonl \
        exp/cloud-test1000.json --train 4000
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from pasu.device import bilstm_offramp
from pasu.device.bilstm_offramp import BiLstmOfframp
from pasu.device.offramp_cli import collect_split
from pasu.device.offramp_data import load_samples
from pasu.device.offramp_net import TrainOptions
from pasu.device.offramp_train import OFFRAMP_DIR, calibrate, load_device_model, ppl_scores, yardsticks
from pasu.device.routing import weigh_by_length
from pasu.models.data import dev_subset, load_split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path, help="packaged device model with MODEL/offramp (`pasu offramp train --fit-all`)")
    parser.add_argument("replays", type=Path, help="replays of the split to price on")
    parser.add_argument("answers", type=Path, help="the cloud's answers for them (scripts/cloud_answers.py)")
    parser.add_argument("--train", type=int, default=4000, help="training utterances to replay")
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus-full"))
    args = parser.parse_args()
    torch.set_num_threads(2)
    folder = args.model / OFFRAMP_DIR
    model = load_device_model(args.model)
    train = collect_split(model, args.corpus, "train", dev_subset(load_split(args.corpus, "train"), args.train),
                          folder / f"replays-train{args.train}.jsonl")
    dev = load_samples(folder / "replays-dev-all.jsonl")
    answers = json.loads(args.answers.read_text())
    test = [s for s in load_samples(args.replays) if s.early is not None and s.id in answers]
    print(f"local WER > 0.1: {np.mean([s.bad() for s in dev if s.early]):.1%} of dev replays, "
          f"{np.mean([s.bad() for s in train if s.early]):.1%} of training ones")
    cloud_edits = [answers[s.id]["edits"] for s in test]
    seconds = np.array([s.duration for s in test])
    naive = yardsticks(test, cloud_edits)["NaiveHybrid"]  # {WER target: NaiveHybrid's offload ratio}
    print("WER targets " + " ".join(f"{float(t):.1%}" for t in naive))

    def price(name: str, scores: np.ndarray) -> None:  # weighed by length, as the policy weighs them
        report = calibrate(name, weigh_by_length(scores, seconds), test, (), cloud_edits)
        cells = [f"{c['offload_ratio'] / naive[t]:.2f}x" if c and naive[t] else "-"
                 for t, c in report["wer_targets"].items()]
        print(f"  {name:24s} " + " ".join(cells))

    features = [BiLstmOfframp.features(s.early) for s in test]
    price("PPL", ppl_scores(test))
    price("BiLSTM as shipped", BiLstmOfframp.load(folder).probabilities(features))
    for name, fit in (("dev", dev), ("dev + training", dev + train), ("training", train)):
        sequences, labels = BiLstmOfframp.training_set(fit)
        for seed in (0, 1):
            network = bilstm_offramp.train(sequences, labels, TrainOptions(seed=seed))
            price(f"{name}, seed {seed}", network.probabilities(features))


if __name__ == "__main__":
    main()
