"""The intent check's design, checked offline: hybrid intent accuracy and WER on a split's replays when offloading
at Offload-M (thresholds from dev's calibration replays, as `pasu offramp train` places them) by the learned check as shipped or
weighed by the speech's seconds, and by the doubt it replaced (1 - the decoder/reader mixture's probability of
its intent) as it is or weighed, with the cloud's answers from `scripts/cloud_answers.py`. About a minute.

    .venv/bin/python scripts/intent_offramp_check.py models/shipped/device exp/hybrid29/replays-test.jsonl \
        exp/cloud-test1000.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from pasu.device.calibration import OFFLOAD_LEVELS, for_ratio, offload_curve
from pasu.device.offramp_data import load_samples
from pasu.device.offramp_train import OFFRAMP_DIR, intent_evidence, intent_offramp, load_device_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path, help="packaged device model with MODEL/offramp from `pasu offramp train`")
    parser.add_argument("replays", type=Path, help="replays of the split to price on")
    parser.add_argument("answers", type=Path, help="the cloud's answers for them (scripts/cloud_answers.py)")
    args = parser.parse_args()
    folder = args.model / OFFRAMP_DIR
    model = load_device_model(args.model)
    learned, evidence = intent_offramp(model, folder), intent_evidence(model)
    answers = json.loads(args.answers.read_text())
    dev = [s for s in load_samples(folder / "replays-dev.jsonl") if s.early is not None]
    test = [s for s in load_samples(args.replays) if s.early is not None and s.id in answers]

    def scores(samples):
        hypotheses = [s.early.hypothesis() for s in samples]
        seconds = np.array([s.duration for s in samples])
        p = np.array([learned.score(h) for h in hypotheses])
        doubt = np.array([evidence(h)[0] for h in hypotheses])
        return {"learned (shipped)": p, "learned x seconds": p * seconds, "doubt": doubt,
                "doubt x seconds (before)": doubt * seconds}

    local_right = np.array([s.local.intent == s.reference.intent for s in test])
    cloud_right = np.array([answers[s.id]["intent"] == s.reference.intent for s in test])
    local_edits = np.array([s.local_edits for s in test], float)
    cloud_edits = np.array([answers[s.id]["edits"] for s in test], float)
    words = np.array([s.ref_words for s in test], float).sum()
    print(f"{len(test)} utterances: device {local_edits.sum() / words:.1%} WER / {local_right.mean():.1%} intent; "
          f"all offloaded {cloud_edits.sum() / words:.1%} / {cloud_right.mean():.1%}")
    on_dev, on_test = scores(dev), scores(test)
    for name, dev_scores in on_dev.items():  # each at its Offload-M on dev, as `pasu offramp train` places it
        offload = on_test[name] > for_ratio(offload_curve(dev_scores), OFFLOAD_LEVELS["M"]).threshold
        intent = np.where(offload, cloud_right, local_right).mean()
        wer = np.where(offload, cloud_edits, local_edits).sum() / words
        print(f"  {name:26s} offloads {offload.mean():.1%}: WER {wer:.1%}, intent {intent:.1%} "
              f"({100 * (intent - cloud_right.mean()):+.1f} against all offloaded)")


if __name__ == "__main__":
    main()
