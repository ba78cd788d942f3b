"""Would the offramps decide better on a pilot made at end of speech? Table 5 and Offload-M's intent, priced offline.

At end of speech the last pilot has heard about 85% of a command. The local path encodes the whole input anyway;
the CTC's best path over it, scored by one teacher-forced decoder pass (`BeamSearch.ctc_greedy`), is a pilot of
the whole input that costs a few milliseconds more, where the full decode (what Late-BiLSTM waits for) costs tens.
For each of three hypotheses, the last pilot's, this end-of-speech pilot's and the full decode's, the check
prices the perplexity offramp and a BiLSTM fitted on every `dev` replay's hypothesis of that kind (local WER >
0.1, as shipped; a few seeds) on `test` replays with the cloud's answers decoded offline: offload / NaiveHybrid
at the four WER targets, and intent accuracy when Offload-M's share (47%) is offloaded, against AllOffload's.

Every score here is weighed by the speech's seconds, as stop 67 priced them; since stop 68 the agent runs these
decisions (`--policy ppl-end`, `bilstm-end`) with hypotheses of the whole input weighed by their tokens instead
(routing.weighing_for), priced by `pasu bench hybrid` (the offramp's calibration log).

Replays, cloud answers and end-of-speech pilots are cached in --work (all of `test`: about 15 minutes of replays
and 50 of cloud decoding on 2 cores, the first time).

    .venv/bin/python scripts/end_pilot_check.py --test-size 0 --work exp/end-pilot
"""

from __future__ import annotations

import argparse
import pickle
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from cloud_answers import cloud_answers  # scripts/ is on sys.path when run as a script
from offramp_labels import intent_at_share, table5_ratios
from tqdm import tqdm

from pasu.device.bilstm_offramp import token_features, train
from pasu.device.offramp_cli import collect_split
from pasu.device.offramp_data import HypothesisFeatures, OfframpSample
from pasu.device.offramp_net import TrainOptions
from pasu.device.offramp_train import load_device_model
from pasu.device.routing import PerplexityOfframp, weigh_by_length
from pasu.device.runtime import DeviceModel
from pasu.models.data import Utterance, dev_subset, load_split, read_audio

JUDGED = ("pilot", "end", "final")  # the last pilot, the end-of-speech pilot, the full decode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("models/shipped/device"))
    parser.add_argument("--cloud-model", type=Path, default=Path("models/shipped/cloud"))
    parser.add_argument("--text-intent", type=Path, default=Path("models/shipped/text_intent"))
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus-full"))
    parser.add_argument("--test-size", type=int, default=1000, help="a fixed random subset of `test` (0: all)")
    parser.add_argument("--seeds", type=int, default=2, help="BiLSTMs fitted per hypothesis kind")
    parser.add_argument("--jobs", type=int, default=2, help="processes replaying at once")
    parser.add_argument("--work", type=Path, default=Path("exp/end-pilot"), help="caches")
    args = parser.parse_args()
    torch.set_num_threads(1)
    args.work.mkdir(parents=True, exist_ok=True)
    model = load_device_model(args.model)

    dev = replays(model, args, "dev", load_split(args.corpus, "dev"))
    test_utterances = dev_subset(load_split(args.corpus, "test"), args.test_size, seed=1)
    test = replays(model, args, "test", test_utterances)
    by_id = {u.id: u for u in test_utterances}
    torch.set_num_threads(2)  # the cloud decodes with both cores; the device's parts run on one, as on a board
    answers = cloud_answers([by_id[s.id] for s in test], args.work / "cloud-test.json", args.cloud_model,
                            args.text_intent)
    torch.set_num_threads(1)
    end_dev = end_pilots(model, args.corpus, "dev", dev, args.work / "end-dev.pkl")
    end_test = end_pilots(model, args.corpus, "test", test, args.work / "end-test.pkl")

    took = 1000 * np.array([end_test[s.id][1] for s in test])
    print(f"end-of-speech pilot after the encode (1 thread): mean {took.mean():.1f} ms, p50 {np.median(took):.1f}, "
          f"p90 {np.percentile(took, 90):.1f}")
    local = np.array([s.local_edits for s in test], float)
    cloud = np.array([answers[s.id]["edits"] for s in test], float)
    words = np.array([s.ref_words for s in test], float)
    seconds = np.array([s.duration for s in test])
    local_right = np.array([s.local.intent == s.reference.intent for s in test])
    cloud_right = np.array([answers[s.id]["intent"] == s.reference.intent for s in test])
    print(f"{len(dev)} dev replays, {len(test)} test; WER local {local.sum() / words.sum():.1%}, cloud "
          f"{cloud.sum() / words.sum():.1%}; intent local {local_right.mean():.1%}, AllOffload {cloud_right.mean():.1%}")

    def report(name: str, scores: np.ndarray) -> None:
        weighed = weigh_by_length(scores, seconds)
        intent = intent_at_share(weighed, local_right, cloud_right)
        print(f"{name:22s}" + "".join(f"{r:7.2f}x" for r in table5_ratios(weighed, local, cloud, words))
              + f"   intent at Offload-M's share {intent:.1%} ({100 * (intent - cloud_right.mean()):+.1f})", flush=True)

    labels = np.array([s.bad() for s in dev], np.float32)
    for kind in JUDGED:
        fit = [token_features(f) if (f := judged(kind, s, end_dev)) else token_features(EMPTY) for s in dev]
        scored = [judged(kind, s, end_test) for s in test]
        report(f"PPL, {kind}", np.array([perplexity(f) for f in scored]))
        features = [token_features(f) if f else token_features(EMPTY) for f in scored]
        for seed in range(args.seeds):
            network = train(fit, labels, replace(TrainOptions(), seed=seed))
            report(f"BiLSTM, {kind}, seed {seed}", network.probabilities(features))


EMPTY = HypothesisFeatures((), (), (), False)  # nothing to judge: one blank step for the networks


def judged(kind: str, sample: OfframpSample, end: dict) -> HypothesisFeatures | None:
    return {"pilot": sample.early, "end": end[sample.id][0], "final": sample.final}[kind]


def perplexity(features: HypothesisFeatures | None) -> float:
    return PerplexityOfframp().score(features.hypothesis()) if features else float("inf")


def replays(model: DeviceModel, args: argparse.Namespace, split: str, utterances: list[Utterance]) -> list[OfframpSample]:
    """The agent's replays (`pasu offramp train`'s), those with a hypothesis to judge at end of speech."""
    samples = collect_split(model, args.corpus, split, utterances, args.work / f"replays-{split}.jsonl",
                            jobs=args.jobs)
    return [s for s in samples if s.early is not None]


def end_pilots(model: DeviceModel, corpus: Path, split: str, samples: list[OfframpSample], cache: Path) -> dict:
    """id -> (the end-of-speech pilot's features or None, seconds it took after the encode)."""
    found = pickle.loads(cache.read_bytes()) if cache.is_file() else {}
    utterances = {u.id: u for u in load_split(corpus, split)}
    for sample in tqdm([s for s in samples if s.id not in found], desc=f"end-of-speech pilots, {split}"):
        with torch.inference_mode():
            stream = model.open_stream()
            stream.accept(read_audio(utterances[sample.id].audio))
            encoded = stream.encode()
            start = time.perf_counter()
            pilot = model.search.ctc_greedy(encoded)
            found[sample.id] = (HypothesisFeatures.of(pilot) if pilot else None, time.perf_counter() - start)
    cache.write_bytes(pickle.dumps(found))
    return found


if __name__ == "__main__":
    main()
