"""Do the offramps rank better when pilots are not cut at 15 tokens? Table 5 priced offline, one cap beside another.

The paper caps pilots at 15 tokens. Our targets hold an intent token and slot markup besides the word pieces, so a
full decode is 16 tokens at the median and most last pilots stopped at the cap: the offramps judged a prefix. For
each cap this replays the same utterances of a split as the agent would (with the shipped device model and its
intent reader), then prices the last pilot's perplexity check and a BiLSTM fitted out of fold on those replays (two
seeds) against NaiveHybrid at the four WER targets, with the cloud's answers decoded offline; and it prints what the
cap changes on the device: how many last pilots ended, their tokens, pilots per utterance, when the early
decision is taken and the local latency. Give the replays an idle machine: their pilots run on the virtual clock,
and beside other work fewer of them finish before the end of speech.

Replays and the cloud's answers are cached in --work (1,000 `dev` utterances: about 2 minutes of replays a cap
with --jobs 2 and 14 minutes of cloud decoding on one core, the first time).

    .venv/bin/python scripts/pilot_cap_check.py --split dev --size 1000 --caps 15,30 --work exp/cap
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from cloud_answers import cloud_answers

from pasu.device import bilstm_offramp
from pasu.device.agent import AgentOptions, PilotOptions
from pasu.device.bilstm_offramp import BiLstmOfframp
from pasu.device.offramp_cli import collect_split
from pasu.device.offramp_data import OfframpSample
from pasu.device.offramp_net import TrainOptions
from pasu.device.offramp_train import (
    OfframpTrainOptions,
    calibrate,
    load_device_model,
    out_of_fold_scores,
    ppl_scores,
    weighed_scores,
    yardsticks,
)
from pasu.models.data import dev_subset, load_split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("models/shipped/device"))
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus-full"))
    parser.add_argument("--split", default="dev")
    parser.add_argument("--size", type=int, default=1000, help="utterances (a fixed random subset; 0: all)")
    parser.add_argument("--caps", default="15,30", help="pilot token caps to compare, comma-separated")
    parser.add_argument("--jobs", type=int, default=2, help="replay processes, one torch thread each")
    parser.add_argument("--work", type=Path, default=Path("exp/cap"), help="cache folder")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = load_device_model(args.model)
    utterances = dev_subset(load_split(args.corpus, args.split), args.size)
    answers = None
    for cap in (int(c) for c in args.caps.split(",")):
        pilot = PilotOptions()
        options = replace(AgentOptions(), pilot=replace(pilot, search=replace(pilot.search, max_tokens=cap)))
        samples = collect_split(model, args.corpus, args.split, utterances,
                                args.work / f"{args.split}{args.size}-cap{cap}.jsonl", options, args.jobs)
        answers = answers or cloud_answers(utterances, args.work / f"cloud-{args.split}{args.size}.json")
        kept = [s for s in samples if s.early is not None]
        report(cap, kept, [answers[s.id]["edits"] for s in kept])


def report(cap: int, kept: list[OfframpSample], cloud_edits: list[int]) -> None:
    """What the cap changes on the device, then offload / NaiveHybrid at the four WER targets."""
    piloted = [s for s in kept if s.pilots]
    print(f"cap {cap}: {len(kept)} replays, {len(piloted) / len(kept):.1%} with a pilot; last pilot ended "
          f"{np.mean([s.early.ended for s in piloted]):.1%}, {np.mean([len(s.early.tokens) for s in piloted]):.1f} "
          f"tokens; {np.mean([s.pilots for s in kept]):.2f} pilots an utterance; early decision at "
          f"{np.mean([s.decision_at for s in kept]) * 1000:.0f} ms mean, local answer at "
          f"{np.median([s.local_latency for s in kept]) * 1000:.0f} ms median after end of speech; local WER "
          f"{sum(s.local_edits for s in kept) / sum(s.ref_words for s in kept):.1%}", flush=True)
    naive = yardsticks(kept, cloud_edits)["NaiveHybrid"]
    print("  WER targets " + " ".join(f"{float(t):.1%}" for t in naive))

    def price(name: str, scores: np.ndarray) -> None:
        result = calibrate(name, weighed_scores(scores, kept, "pilot"), kept, (), cloud_edits)
        cells = [f"{c['offload_ratio'] / naive[t]:.2f}x" if c and naive[t] else "-"
                 for t, c in result["wer_targets"].items()]
        print(f"  {name:22s} " + " ".join(cells), flush=True)

    price("PPL", ppl_scores(kept))
    sequences, labels = BiLstmOfframp.training_set(kept)
    for seed in (0, 1):
        fitting = replace(TrainOptions(), seed=seed)
        price(f"BiLSTM out of fold, {seed}",
              out_of_fold_scores(sequences, labels, OfframpTrainOptions(bilstm=fitting),
                                 lambda x, y: bilstm_offramp.train(x, y, fitting)))


if __name__ == "__main__":
    main()
