"""Does the device's intent reader read its transcripts better when it also learns from training sentences with
the device's own recognition errors put in (`pasu.models.asr_noise`)? Two-fold on the dev replays: the errors
are counted on one half, the reader learns the training sentences plus COPIES noisy copies of each, and the
mixture's answers are scored on the other half; each half once. `--heard-repeats` has the reader learn the
other half's actual transcripts with their right intents instead (or as well). Other replay files (e.g. a bench's `test`
replays) are scored with errors counted on all of dev, not used to choose.

    .venv/bin/python scripts/reader_noise_check.py models/shipped/device data/corpus-full \
        models/shipped/device/offramp/replays-dev-all.jsonl --reader-corpus data/corpus-full-p4 --copies 0 1 2

On the shipped device (stop 46) neither helped; the offramp card has the numbers.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from pasu.device.intent_offramp import DECODER_SHARE, READER_CHAR_NGRAMS, IntentMixture, intent_confidence
from pasu.device.offramp_cli import training_sentences
from pasu.device.offramp_data import OfframpSample, load_samples
from pasu.device.runtime import DeviceModel
from pasu.models.asr_noise import ConfusionModel
from pasu.models.intent_reader import IntentReader, ReaderOptions


def reader_with_noise(sentences: dict[str, str], confusions: ConfusionModel | None, copies: int,
                      heard: list[tuple[str, str]] = (), repeats: int = 0) -> IntentReader:
    """The reader of the sentences, their noisy copies, and `repeats` times each (transcript, intent) `heard`."""
    texts, intents = list(sentences), list(sentences.values())
    for _ in range(repeats):
        texts += [t for t, _ in heard]
        intents += [i for _, i in heard]
    for copy in range(copies if confusions else 0):
        texts += confusions.corrupt(list(sentences), seed=copy)
        intents += list(sentences.values())
    return IntentReader.fit(texts, intents, ReaderOptions(char_ngram_max=READER_CHAR_NGRAMS))


def heard_pairs(samples: list[OfframpSample], model: DeviceModel) -> list[tuple[str, str]]:
    """(reference, the device's transcript) of each replay."""
    return [(s.reference.text, model.read(s.final.tokens).text) for s in samples]


def heard_intents(samples: list[OfframpSample], model: DeviceModel) -> list[tuple[str, str]]:
    """(the device's transcript, the right intent) of each replay."""
    return [(model.read(s.final.tokens).text, s.reference.intent) for s in samples]


def accuracy(reader: IntentReader, samples: list[OfframpSample], model: DeviceModel, share: float) -> float:
    mixture = IntentMixture(reader, share)
    right = [mixture.reading(model.read(s.final.tokens), intent_confidence(s.final.hypothesis()))[0]
             == s.reference.intent for s in samples]
    return float(np.mean(right))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path)
    parser.add_argument("corpus", type=Path)
    parser.add_argument("dev", type=Path, help="dev replays (pasu offramp train --fit-all's replays-dev-all.jsonl)")
    parser.add_argument("others", type=Path, nargs="*", help="replays to score beside them")
    parser.add_argument("--reader-corpus", type=Path, action="append", default=[])
    parser.add_argument("--copies", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--heard-repeats", type=int, nargs="+", default=[0],
                        help="also learn the other half's transcripts with their right intents, this many times")
    parser.add_argument("--shares", type=float, nargs="+", default=[DECODER_SHARE])
    args = parser.parse_args()
    model = DeviceModel.from_folder(args.model)
    sentences = training_sentences([args.corpus, *args.reader_corpus])
    dev = [s for s in load_samples(args.dev) if s.final is not None]
    halves = [dev[0::2], dev[1::2]]
    others = {p.stem: [s for s in load_samples(p) if s.final is not None] for p in args.others}
    rates = ConfusionModel.fit(heard_pairs(dev, model)).rates()
    print(f"{len(sentences)} training sentences, {len(dev)} dev replays; errors counted on all of dev: "
          "replaced / dropped / inserted per word " + " / ".join(f"{r:.3f}" for r in rates))
    for copies, repeats in [(c, r) for c in args.copies for r in args.heard_repeats]:
        cross = {share: [] for share in args.shares}
        for fold in (0, 1):
            reader = reader_with_noise(sentences, ConfusionModel.fit(heard_pairs(halves[1 - fold], model)), copies,
                                       heard_intents(halves[1 - fold], model), repeats)
            for share in args.shares:
                cross[share].append(accuracy(reader, halves[fold], model, share))
        reader = reader_with_noise(sentences, ConfusionModel.fit(heard_pairs(dev, model)), copies,
                                   heard_intents(dev, model), repeats) if others else None
        for share in args.shares:
            cells = [f"dev two-fold {np.mean(cross[share]):.2%}"]
            cells += [f"{name} {accuracy(reader, samples, model, share):.2%}" for name, samples in others.items()]
            print(f"copies {copies} heard x{repeats} share {share:g}: " + ", ".join(cells), flush=True)


if __name__ == "__main__":
    main()
