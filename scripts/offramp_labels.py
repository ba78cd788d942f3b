"""Which label should the BiLSTM offramp learn for Table 5? Each label's out-of-fold scores (5-fold over every dev
replay) on the calibration utterances, weighed by length as the policy weighs them, and the offloading each WER
target then needs relative to NaiveHybrid; beside them rankings no offramp has (perfect knowledge of a label).

Reads what `pasu offramp train --fit-all` cached in MODEL/offramp (replays-dev-all.jsonl, replays-dev.jsonl); the
gain label needs the cloud's transcripts of every dev replay (decoded here once, about 20 minutes, cached).

    .venv/bin/python scripts/offramp_labels.py models/shipped/device --cache exp/cloud-dev-all.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from sklearn.model_selection import KFold

from pasu.device.bilstm_offramp import token_features, train
from pasu.device.calibration import for_wer, naive_probability, offload_curve, wer_targets
from pasu.device.offramp_cli import cloud_word_edits
from pasu.device.offramp_data import load_samples
from pasu.device.offramp_train import OFFRAMP_DIR
from pasu.device.routing import weigh_by_length
from pasu.models.data import load_split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path, help="packaged device model with offramp/ from `pasu offramp train --fit-all`")
    parser.add_argument("--cloud-model", type=Path, default=Path("models/shipped/cloud"))
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus-full"))
    parser.add_argument("--cache", type=Path, default=Path("exp/cloud-dev-all.json"), help="cloud edits of every dev replay")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    folder = args.model / OFFRAMP_DIR
    fit = [s for s in load_samples(folder / "replays-dev-all.jsonl") if s.early is not None]
    utterances = {u.id: u for u in load_split(args.corpus, "dev")}
    cloud_all = np.array(cloud_word_edits(args.cloud_model, [utterances[s.id] for s in fit], args.cache), float)
    local_all = np.array([s.local_edits for s in fit], float)
    calibration_ids = {s.id for s in load_samples(folder / "replays-dev.jsonl")}  # the thresholds' 300
    cal = np.array([i for i, s in enumerate(fit) if s.id in calibration_ids])
    local, cloud = local_all[cal], cloud_all[cal]
    words = np.array([fit[i].ref_words for i in cal], float)
    seconds = np.array([fit[i].duration for i in cal])
    targets = wer_targets(local.sum() / words.sum(), cloud.sum() / words.sum())
    naive = [naive_probability(local.sum(), cloud.sum(), words.sum(), t) for t in targets]
    sequences = [token_features(s.early) for s in fit]

    def row(name: str, scores: np.ndarray) -> None:
        curve = offload_curve(weigh_by_length(scores, seconds), local, cloud, words)
        ratios = [c.offload_ratio / n if (c := for_wer(curve, t)) else float("nan") for t, n in zip(targets, naive)]
        print(f"{name:34s}" + "".join(f"{r:8.2f}x" for r in ratios), flush=True)

    def out_of_fold(labels: np.ndarray) -> np.ndarray:
        scores = np.zeros(len(fit))
        for fitted, held in KFold(5, shuffle=True, random_state=0).split(sequences):
            network = train([sequences[i] for i in fitted], labels[fitted])
            scores[held] = network.probabilities([sequences[i] for i in held])
        return scores[cal]

    local_wer = np.array([s.local_wer for s in fit])
    gain = (local_all > cloud_all).astype(np.float32)
    print(f"{len(fit)} dev replays, {len(cal)} calibration utterances; WER targets "
          + " / ".join(f"{100 * t:.1f}%" for t in targets) + f"; the cloud makes fewer edits on {gain.mean():.0%}")
    print(f"{'ranking (offload / NaiveHybrid)':34s}" + "".join(f"{f'{100 * t:.1f}%':>9s}" for t in targets))
    row("known: local WER > 0.1", (local_wer[cal] > 0.1).astype(float))
    row("known: local WER", local_wer[cal])
    row("known: cloud makes fewer edits", gain[cal].astype(float))
    for bar in (0.1, 0.3):
        row(f"BiLSTM on local WER > {bar}", out_of_fold((local_wer > bar).astype(np.float32)))
    row("BiLSTM on cloud makes fewer edits", out_of_fold(gain))


if __name__ == "__main__":
    main()
