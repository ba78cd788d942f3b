"""How far does averaging more seeds take the pilot's BiLSTM? Table 5 priced offline for means of 1 to N networks.

The recipe averages three networks from seeds 0-2 (`offramp_net.TrainOptions.networks`). Two fits of those three
on the same 2,033 `dev` replays, differing only in the order the replays are listed (so each seed shuffles them
differently), needed 0.618x and 0.598x NaiveHybrid at the fourth WER target on the same 2,974 `test` replays: the
fit's own randomness, not the evidence, moves that cell by 0.02x. This fits N networks (seeds 0..N-1) on every `dev`
replay of a `pasu offramp train --fit-all` folder, in the manifest's order (as the recipe lists them) and in the
cached folds' order, and prices the mean of the first k of them for k = 1, 3, 5, ..., N on a `pasu bench hybrid`
run's `test` replays and round trips (or another split's: --split). About a minute a network on 2 cores. A --dev
folder without replays gets every `dev` replay by the shipped agent first (--model; about 12 minutes with 2
processes; its own intent reader, which touches neither the BiLSTM's inputs nor its label).

    .venv/bin/python scripts/bilstm_seeds_check.py --dev exp/offramp77 --run exp/hybrid77 --networks 10
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from offramp_labels import dev_replays  # scripts/ is on sys.path when run as a script
from pilot_doubt_check import test_pricer

from pasu.device.bilstm_offramp import BiLstmOfframp
from pasu.device.offramp_net import TrainOptions
from pasu.models.data import load_split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus-full"), help="for the manifest's order")
    parser.add_argument("--dev", type=Path, default=Path("exp/offramp77"), help="a `pasu offramp train` folder")
    parser.add_argument("--run", type=Path, default=Path("exp/hybrid77"), help="a `pasu bench hybrid` folder")
    parser.add_argument("--profile", default="wifi")
    parser.add_argument("--split", default="test", help="the run's split (test_unseen for a run with --split)")
    parser.add_argument("--networks", type=int, default=10)
    parser.add_argument("--model", type=Path, default=Path("models/shipped/device"), help="replays --dev lacks")
    args = parser.parse_args()
    if not list(args.dev.glob("replays-dev-all*.jsonl")):
        replay_dev(args.model, args.corpus, args.dev)
    torch.set_num_threads(2)
    folds = [s for s in dev_replays(args.dev, "replays-dev-all") if s.early is not None]
    position = {u.id: i for i, u in enumerate(load_split(args.corpus, "dev"))}
    orders = {"manifest order": sorted(folds, key=lambda s: position[s.id]), "folds' order": folds}
    if [s.id for s in orders["manifest order"]] == [s.id for s in folds]:  # replays without folds: one order
        del orders["folds' order"]
    test, price = test_pricer(args.run, args.profile, args.split)
    test_sequences = [BiLstmOfframp.features(s.early) for s in test]
    sizes = sorted({1, *range(3, args.networks + 1, 2), args.networks})
    for name, dev in orders.items():
        start = time.time()
        sequences, labels = BiLstmOfframp.training_set(dev)
        fitted = BiLstmOfframp.train(sequences, labels, replace(TrainOptions(), networks=args.networks))
        alone = np.stack([BiLstmOfframp([net]).probabilities(test_sequences) for net in fitted.nets])
        print(f"{len(dev)} `dev` replays in the {name}, {args.networks} networks [{time.time() - start:.0f} s]")
        for k in sizes:
            print(f"  mean of seeds 0-{k - 1}: {price(alone[:k].mean(0))}")
        print("  each alone, fourth target: "
              + " ".join(price(p).rsplit(" / ", 1)[1] for p in alone), flush=True)


def replay_dev(model_dir: Path, corpus: Path, out: Path) -> None:
    """Every `dev` replay by the agent with its default options, in the manifest's order, into `out`."""
    from pasu.device.offramp_cli import collect_split
    from pasu.device.offramp_train import load_device_model

    torch.set_num_threads(1)  # two processes, one core each
    out.mkdir(parents=True, exist_ok=True)
    collect_split(load_device_model(model_dir), corpus, "dev", load_split(corpus, "dev"),
                  out / "replays-dev-all.jsonl", jobs=2)


if __name__ == "__main__":
    main()
