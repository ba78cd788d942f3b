"""Which label should the BiLSTM offramp learn for Table 5? Each label's out-of-fold scores (5-fold over every dev
replay) on the calibration utterances, weighed by length as the policy weighs them, and the offloading each WER
target then needs relative to NaiveHybrid; beside them rankings no offramp has (perfect knowledge of a label).

Reads what `pasu offramp train --fit-all` cached in MODEL/offramp (replays-dev-all.jsonl, replays-dev.jsonl); the
gain label needs the cloud's transcripts of every dev replay (decoded here once, about 20 minutes, cached).

`--evidence` adds rankings by gradient boosting (out-of-fold) over more than the per-token scores: the pilot's
aggregates and perplexity; how plausible its words are (a word trigram LM on the training sentences, unknown
words); the device's CTC posteriors over the whole utterance (frame entropy, low-confidence frames, how far the
CTC-greedy transcript is from the pilot's); and the audio conditions the corpus recorded (TTS engine, noise,
SNR, reverberation: known to no device), each fitted to the local word edits or to the cloud's gain.

`--test-run` also prices each label's BiLSTM, fitted on every dev replay, on a `pasu bench hybrid --out` folder's
`test` replays with the cloud answers its run saved (`calls-PROFILE.jsonl`): Table 5 there, and the intent
accuracy when the top 47% (Offload-M's share) by score x seconds are offloaded, against AllOffload's.

    .venv/bin/python scripts/offramp_labels.py models/shipped/device --cache exp/cloud-dev-all.json [--evidence]
    .venv/bin/python scripts/offramp_labels.py models/shipped/device --folder exp/offramp-wer --test-run exp/hybrid47
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from sklearn.model_selection import KFold

from pasu.device.bilstm_offramp import pilot_features, token_features, train
from pasu.bench.hybrid import saved_offloads
from pasu.bench.hybrid_eval import edit_totals
from pasu.device.calibration import OFFLOAD_LEVELS, for_wer, naive_probability, offload_curve, wer_targets
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
    parser.add_argument("--evidence", action="store_true", help="also rank by gradient boosting over richer evidence")
    parser.add_argument("--folder", type=Path, help="the offramp folder with the dev replays (default: MODEL/offramp)")
    parser.add_argument("--test-run", type=Path, help="a `pasu bench hybrid --out` folder to price the labels on")
    parser.add_argument("--profile", default="wifi", help="whose saved round trips --test-run reads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    folder = args.folder or args.model / OFFRAMP_DIR
    fit = [s for s in dev_replays(folder, "replays-dev-all") if s.early is not None]
    utterances = {u.id: u for u in load_split(args.corpus, "dev")}
    cloud_all = np.array(cloud_word_edits(args.cloud_model, [utterances[s.id] for s in fit], args.cache), float)
    local_all = np.array([s.local_edits for s in fit], float)
    calibration_ids = {s.id for s in dev_replays(folder, "replays-dev")}  # the thresholds' 300
    cal = np.array([i for i, s in enumerate(fit) if s.id in calibration_ids])
    local, cloud = local_all[cal], cloud_all[cal]
    words = np.array([fit[i].ref_words for i in cal], float)
    seconds = np.array([fit[i].duration for i in cal])
    targets = wer_targets(local.sum() / words.sum(), cloud.sum() / words.sum())
    sequences = [pilot_features(s.early) for s in fit]

    def row(name: str, scores: np.ndarray) -> None:
        ratios = table5_ratios(weigh_by_length(scores, seconds), local, cloud, words)
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
    either = np.array([s.local_wer > 0.1 or s.local.intent != s.reference.intent for s in fit], np.float32)
    row("BiLSTM on words or intent wrong", out_of_fold(either))
    if args.test_run:
        labels = {"local WER > 0.1": (local_wer > 0.1).astype(np.float32), "cloud makes fewer edits": gain,
                  "words or intent wrong": either}
        price_on_test(args.test_run, args.profile, sequences, labels)
    if args.evidence:
        evidence = {"pilot": pilot_evidence(fit), "words": word_evidence(fit, args.corpus),
                    "ctc": ctc_evidence(fit, utterances, args.model), "conditions": condition_evidence(fit, args.corpus)}
        edit_gain = local_all - cloud_all
        for names in (("pilot",), ("pilot", "words"), ("pilot", "words", "ctc"), ("conditions",),
                      ("pilot", "words", "ctc", "conditions")):
            features = np.concatenate([evidence[n] for n in names], axis=1)
            # already a count of errors: no weighing by length (row divides it back out)
            row(f"GBM {'+'.join(names)} -> local edits", boosted_out_of_fold(features, local_all)[cal] / seconds)
            row(f"GBM {'+'.join(names)} -> gain", boosted_out_of_fold(features, edit_gain)[cal] / seconds)


def table5_ratios(scores: np.ndarray, local: np.ndarray, cloud: np.ndarray, words: np.ndarray) -> list[float]:
    """Offload / NaiveHybrid's at each WER target between device and cloud, offloading the highest scores first."""
    curve = offload_curve(scores, local, cloud, words)
    ratios = []
    for target in wer_targets(local.sum() / words.sum(), cloud.sum() / words.sum()):
        naive = naive_probability(local.sum(), cloud.sum(), words.sum(), target)
        ratios.append(c.offload_ratio / naive if (c := for_wer(curve, target)) and naive else float("nan"))
    return ratios


def dev_replays(folder: Path, stem: str) -> list:
    """The dev replays of `pasu offramp train` (STEM.jsonl, or STEM.foldK.jsonl with --reader-learns-split)."""
    whole = load_samples(folder / f"{stem}.jsonl")
    if whole is not None:
        return whole
    folds = sorted(folder.glob(f"{stem}.fold*.jsonl"))
    if not folds:
        raise SystemExit(f"no {stem}.jsonl in {folder}: run `pasu offramp train --fit-all` first")
    return [s for path in folds for s in load_samples(path)]


def test_run(run: Path, profile: str, split: str = "test") -> tuple[list, list]:
    """A `pasu bench hybrid` run's replays of `split` and the round trips it saved for them on a network profile."""
    calls_path, replays_path = run / f"calls-{profile}.jsonl", run / f"replays-{split}.jsonl"
    ids, calls = saved_offloads(calls_path)
    samples = load_samples(replays_path)
    if samples is None or [s.id for s in samples] != ids:
        raise SystemExit(f"{calls_path} was saved for other utterances than {replays_path}")
    return samples, calls


def price_on_test(run: Path, profile: str, sequences: list[np.ndarray], labels: dict[str, np.ndarray]) -> None:
    """Each label's BiLSTM, fitted on every dev replay, priced on a bench run's `test` replays and saved round
    trips: offload / NaiveHybrid at its four WER targets, and intent accuracy at Offload-M's share."""
    samples, calls = test_run(run, profile)
    kept = [i for i, s in enumerate(samples) if s.early is not None]
    samples, calls = [samples[i] for i in kept], [calls[i] for i in kept]
    local, cloud, words = edit_totals(samples, calls)
    seconds = np.array([s.duration for s in samples])
    targets = wer_targets(local.sum() / words.sum(), cloud.sum() / words.sum())
    local_right = np.array([s.local.intent == s.reference.intent for s in samples])
    cloud_right = np.array([c.result.intent == s.reference.intent if c.ok else r
                            for s, c, r in zip(samples, calls, local_right)])
    print(f"{run}: {len(samples)} `test` replays; WER targets " + " / ".join(f"{100 * t:.1f}%" for t in targets)
          + f"; AllOffload intent {cloud_right.mean():.1%}")
    test_sequences = [pilot_features(s.early) for s in samples]
    for name, labels_ in labels.items():
        scores = weigh_by_length(train(sequences, labels_).probabilities(test_sequences), seconds)
        ratios = table5_ratios(scores, local, cloud, words)
        intent = intent_at_share(scores, local_right, cloud_right)
        print(f"  BiLSTM on {name:24s}" + "".join(f"{r:8.2f}x" for r in ratios)
              + f"   intent at Offload-M's share {intent:.1%} ({100 * (intent - cloud_right.mean()):+.1f})", flush=True)


def intent_at_share(scores: np.ndarray, local_right: np.ndarray, cloud_right: np.ndarray,
                    share: float = OFFLOAD_LEVELS["M"]) -> float:
    """Intent accuracy when the `share` of utterances with the highest scores is offloaded (default Offload-M's)."""
    offloaded = np.zeros(len(scores), bool)
    offloaded[np.argsort(-scores, kind="stable")[:round(share * len(scores))]] = True
    return float(np.where(offloaded, cloud_right, local_right).mean())


def boosted_out_of_fold(features: np.ndarray, target: np.ndarray) -> np.ndarray:
    """5-fold out-of-fold predictions of a gradient-boosted regressor."""
    from sklearn.ensemble import HistGradientBoostingRegressor

    predictions = np.zeros(len(target))
    for fitted, held in KFold(5, shuffle=True, random_state=0).split(features):
        model = HistGradientBoostingRegressor(max_iter=200, learning_rate=0.05, max_leaf_nodes=15, random_state=0)
        predictions[held] = model.fit(features[fitted], target[fitted]).predict(features[held])
    return predictions


def pilot_evidence(samples: list) -> np.ndarray:
    """The pilot's per-token scores summed up: mean / min attention and CTC log-probs, length, ended, log PPL."""
    from pasu.device.offramp_train import ppl_scores

    rows = []
    for s in samples:
        f = token_features(s.early)
        rows.append([f[:, 0].mean(), f[:, 0].min(), f[:, 1].mean(), f[:, 1].min(), len(f), s.duration, s.early.ended])
    return np.c_[np.array(rows, float), np.minimum(ppl_scores(samples), np.log(1e6))]  # already in log units


def word_evidence(samples: list, corpus: Path) -> np.ndarray:
    """How plausible the pilot's words are: trigram log-prob per word and in all, unknown words, words."""
    from pasu.models.ngram_lm import NgramLm, training_sentences

    sentences = training_sentences(corpus)
    lm, vocabulary = NgramLm.train(sentences, 3), {w for s in sentences for w in s.split()}
    rows = []
    for s in samples:
        words = s.pilot_text.split()
        logprob = lm.sentence_logprob(" ".join(words))
        rows.append([logprob / (len(words) + 1), logprob, sum(w not in vocabulary for w in words), len(words)])
    return np.array(rows, float)


@torch.inference_mode()
def ctc_evidence(samples: list, utterances: dict, model_folder: Path) -> np.ndarray:
    """The device's CTC posteriors over the whole utterance, and the CTC-greedy transcript against the pilot's."""
    from pasu.device.decoding.ctc_prefix import collapse_path
    from pasu.device.runtime import DeviceModel
    from pasu.metrics import word_edits
    from pasu.models.data import read_audio

    model = DeviceModel.from_folder(model_folder)
    rows = []
    for s in samples:
        stream = model.open_stream()
        stream.accept(read_audio(utterances[s.id].audio))
        logp = model.model.ctc.log_softmax(stream.encode().unsqueeze(0))[0]  # encode() gives (T, D)
        probs = logp.exp()
        top, best = probs.max(-1)
        entropy = -(probs * logp).sum(-1)
        speech = top[best != 0] if (best != 0).any() else torch.zeros(1)
        greedy = model.read(collapse_path(best)).text
        rows.append([entropy.mean(), entropy.max(), (top < 0.5).float().mean(), speech.mean(), speech.min(),
                     (speech < 0.5).float().sum(), word_edits(s.pilot_text, greedy), len(greedy.split())])
    return np.array(rows, float)


def condition_evidence(samples: list, corpus: Path) -> np.ndarray:
    """What the corpus recorded about each utterance's audio (no device knows it): engine, noise, SNR, room."""
    from pasu.models.data import read_jsonl

    rows = {r["id"]: r for r in read_jsonl(corpus / "dev.jsonl")}
    engines = sorted({r["engine"] for r in rows.values()})
    noises = sorted({r["augmentation"]["noise"].split(":")[0] for r in rows.values()})
    out = []
    for s in samples:
        row, augmentation = rows[s.id], rows[s.id]["augmentation"]
        snr = augmentation["snr_db"] if augmentation["snr_db"] is not None else 60.0  # clean: far above any SNR
        out.append([engines.index(row["engine"]), noises.index(augmentation["noise"].split(":")[0]), snr,
                    augmentation["rir"] != "none", augmentation.get("speed", 1.0), row.get("rate", 1.0)])
    return np.array(out, float)


if __name__ == "__main__":
    main()
