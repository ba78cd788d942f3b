"""Would the pilot's BiLSTM rank better if it saw the decoder's doubt at each token? Table 5 priced offline.

The shipped network reads, per token of the last pilot, the attention decoder's log-probability of the chosen token
and its CTC increment: how sure the model was of what it wrote, not whether another token was close. This check
adds, per token, the entropy of the decoder's whole distribution and the best other token's log-probability (a
margin), recomputed by one teacher-forced decoder pass over each pilot's cached encoder output (the replays keep
it, float16: the chosen tokens' log-probabilities come back within 0.005 of the search's). For each input set it
fits the shipped recipe (three seeds averaged) on every `dev` replay of a `pasu offramp train --fit-all` folder,
and prints the label's ROC AUC out of fold on `dev` (five folds, one seed: where a choice would be made) and
offload / NaiveHybrid at the four WER targets on a `pasu bench hybrid` run's `test` replays and round trips (the
mean of the three networks, then each alone). About 8 minutes an input set on 2 cores.

    .venv/bin/python scripts/pilot_doubt_check.py --dev exp/offramp77 --run exp/hybrid77
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from offramp_labels import dev_replays, table5_ratios, test_run  # scripts/ is on sys.path when run as a script

from pasu.bench.hybrid_eval import edit_totals
from pasu.device.bilstm_offramp import LOGP_FLOOR, BiLstmConfig, BiLstmOfframp, pilot_features
from pasu.device.calibration import selectivity
from pasu.device.decoding.search import BeamSearch
from pasu.device.offramp_data import OfframpSample
from pasu.device.offramp_net import TrainOptions
from pasu.device.offramp_train import OfframpTrainOptions, load_device_model, out_of_fold_scores

# input set -> (columns of the doubt features appended to the shipped two, LSTM hidden size for about 11k parameters)
INPUTS: dict[str, tuple[list[int], int]] = {
    "shipped [att, ctc]": ([], 35),
    "+ entropy": ([0], 34),
    "+ best other": ([1], 34),
    "+ entropy + best other": ([0, 1], 34),
}


@torch.inference_mode()
def doubt(search: BeamSearch, sample: OfframpSample) -> np.ndarray:
    """(L, 2) per token of the last pilot: entropy of the decoder's distribution where it chose the token, and the
    best other token's log-probability (clipped as the network's inputs are)."""
    pilot = sample.early
    n = len(pilot.tokens)
    if n == 0 or pilot.encoded is None:
        return np.zeros((max(n, 1), 2), np.float32)
    memory = torch.from_numpy(pilot.encoded.astype(np.float32)).unsqueeze(0)
    tokens = torch.tensor([pilot.tokens])
    read = torch.cat((torch.tensor([[search.sos]]), tokens), 1)  # a teacher-forced pass reads <sos> first
    logits, _ = search.decoder(memory, torch.tensor([memory.size(1)]), read, torch.tensor([n + 1]))
    logp = torch.log_softmax(logits[0, :n], -1)
    entropy = -(logp.exp() * logp).sum(-1)
    other = logp.scatter(1, tokens[0].unsqueeze(1), -1e9).max(-1).values
    return np.stack([entropy.numpy(), np.clip(other.numpy(), LOGP_FLOOR, 0.0)], 1).astype(np.float32)


def inputs(sample: OfframpSample, doubts: np.ndarray, columns: list[int]) -> np.ndarray:
    """The shipped features of the pilot with the chosen doubt columns beside them."""
    base = pilot_features(sample.early)
    return np.concatenate([base, doubts[:len(base), columns]], 1) if columns else base


def test_pricer(run: Path, profile: str,
                split: str = "test") -> tuple[list[OfframpSample], Callable[[np.ndarray], str]]:
    """The run's replays of `split`, and a function from their P(bad) (inf: no pilot, offloaded first, as the bench
    does) to the four targets' offload / NaiveHybrid."""
    samples, calls = test_run(run, profile, split)
    local, cloud, words = edit_totals(samples, calls)
    seconds = np.array([s.duration for s in samples])

    def price(probabilities: np.ndarray) -> str:
        return " / ".join(f"{r:.3f}" for r in table5_ratios(probabilities * seconds, local, cloud, words))

    return samples, price


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("models/shipped/device"))
    parser.add_argument("--dev", type=Path, default=Path("exp/offramp77"), help="a `pasu offramp train` folder")
    parser.add_argument("--run", type=Path, default=Path("exp/hybrid77"), help="a `pasu bench hybrid` folder")
    parser.add_argument("--profile", default="wifi")
    args = parser.parse_args()
    torch.set_num_threads(2)
    search = load_device_model(args.model).search
    dev = [s for s in dev_replays(args.dev, "replays-dev-all") if s.early is not None]
    test, price = test_pricer(args.run, args.profile)
    piloted = [i for i, s in enumerate(test) if s.early is not None]
    dev_doubts = [doubt(search, s) for s in dev]
    test_doubts = {i: doubt(search, test[i]) for i in piloted}
    labels = np.array([float(s.bad()) for s in dev], np.float32)
    print(f"{len(dev)} `dev` replays, {len(test)} `test` ({len(piloted)} with a pilot)", flush=True)
    for name, (columns, hidden) in INPUTS.items():
        start = time.time()
        config = BiLstmConfig(hidden_size=hidden, input_size=2 + len(columns))
        sequences = [inputs(s, d, columns) for s, d in zip(dev, dev_doubts)]
        one = replace(TrainOptions(), networks=1)
        oof = out_of_fold_scores(sequences, labels, OfframpTrainOptions(bilstm=one),
                                 lambda x, y: BiLstmOfframp.train(x, y, one, config))
        offramp = BiLstmOfframp.train(sequences, labels, TrainOptions(), config)
        test_sequences = [inputs(test[i], test_doubts[i], columns) for i in piloted]

        def probabilities(nets: list) -> np.ndarray:
            p = np.full(len(test), np.inf)
            p[piloted] = BiLstmOfframp(nets).probabilities(test_sequences)
            return p

        seeds = "; ".join(price(probabilities([net])) for net in offramp.nets)
        print(f"{name:24s} dev out of fold ROC AUC {selectivity(oof, labels > 0.5)['roc_auc']:.3f}; `test` x "
              f"NaiveHybrid: mean of {len(offramp.nets)} {price(probabilities(offramp.nets))} (alone: {seeds}) "
              f"[{time.time() - start:.0f} s]", flush=True)


if __name__ == "__main__":
    main()
