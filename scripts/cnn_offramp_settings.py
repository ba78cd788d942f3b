"""How much do the CNN offramp's settings matter? For each setting, out-of-fold scores (5-fold over every dev
replay, as `pasu offramp train` places thresholds) on the calibration utterances, weighed by length as the policy
weighs them: ROC AUC of local WER > 0.1, and the offloading each WER target needs relative to NaiveHybrid.

Reads what `pasu offramp train --fit-all` cached in MODEL/offramp (replays with encoder outputs, the cloud's word
edits of the calibration utterances). Each setting is a JSON object of TrainOptions / CnnConfig fields changed
from the shipped ones; `{}` is the shipped setting. About 40 seconds a setting on 2 cores.

    .venv/bin/python scripts/cnn_offramp_settings.py models/shipped/device '{}' '{"epochs": 60}' '{"seed": 1}'
"""

from __future__ import annotations

import argparse
import json
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import torch

from pasu.device import cnn_offramp
from pasu.device.cnn_offramp import CNN_TRAINING, CnnConfig, CnnOfframp
from pasu.device.offramp_data import load_samples
from pasu.device.offramp_train import (
    OFFRAMP_DIR,
    OfframpTrainOptions,
    calibrate,
    calibration_scores,
    out_of_fold_scores,
    yardsticks,
)
from pasu.device.routing import weigh_by_length


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path, help="packaged device model with offramp/ from `pasu offramp train --fit-all`")
    parser.add_argument("settings", nargs="+", help="JSON objects of changed fields, e.g. '{\"channels\": 64}'")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    folder = args.model / OFFRAMP_DIR
    fit, kept = load_samples(folder / "replays-dev-all.jsonl"), load_samples(folder / "replays-dev.jsonl")
    if fit is None or kept is None or not cnn_offramp.has_encodings(fit):
        raise SystemExit(f"{folder} has no replays with encoder outputs: run `pasu offramp train {args.model} --fit-all "
                         "--limit 300 --cloud-model ...` first")
    cloud_edits = json.loads((folder / "cloud-dev.json").read_text())["edits"]
    sequences, labels = CnnOfframp.training_set(fit)
    seconds = np.array([s.duration for s in kept])
    naive = yardsticks(kept, cloud_edits)["NaiveHybrid"]  # {WER target: NaiveHybrid's offload ratio}
    options = OfframpTrainOptions()
    config_fields = {f.name for f in fields(CnnConfig)}
    for setting in args.settings:
        changed = json.loads(setting)
        config = CnnConfig(input_size=sequences[0].shape[1], **{k: v for k, v in changed.items() if k in config_fields})
        training = replace(CNN_TRAINING, **{k: v for k, v in changed.items() if k not in config_fields})
        fitter = lambda x, y: CnnOfframp.train(x, y, training, config)
        oof = calibration_scores(out_of_fold_scores(sequences, labels, options, fitter), fit, kept)
        report = calibrate("CNN", weigh_by_length(oof, seconds), kept, options.levels, cloud_edits)
        ratios = [c["offload_ratio"] / naive[t] if c else float("nan") for t, c in report["wer_targets"].items()]
        print(f"{setting:32s} ROC AUC {report['selectivity']['roc_auc']:.3f}   "
              + " / ".join(f"{r:.2f}x" for r in ratios), flush=True)


if __name__ == "__main__":
    main()
