"""Does the device's intent reader read its transcripts better when it also learns from training sentences with
the device's own recognition errors put in (`pasu.models.asr_noise`)? Two-fold on the dev replays: the errors
are counted on one half, the reader learns the training sentences plus COPIES noisy copies of each, and the
mixture's answers are scored on the other half; each half once. `--heard-repeats` has the reader learn the
other half's actual transcripts with their right intents instead (or as well). Other replay files (e.g. a bench's `test`
replays) are scored with errors counted on all of dev, not used to choose.

    .venv/bin/python scripts/reader_noise_check.py models/shipped/device data/corpus-full \
        models/shipped/device/offramp/replays-dev-all.jsonl --reader-corpus data/corpus-full-p4 --copies 0 1 2

On the shipped device (stop 46) neither helped; the offramp's calibration log has the numbers.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NamedTuple

import numpy as np

from pasu.device.intent_offramp import DECODER_SHARE, READER_CHAR_NGRAMS, IntentMixture, intent_confidence
from pasu.device.offramp_cli import training_sentences
from pasu.device.offramp_data import OfframpSample, load_samples
from pasu.device.runtime import DeviceModel
from pasu.metrics import SluResult
from pasu.models.asr_noise import ConfusionModel
from pasu.models.intent_reader import IntentReader, ReaderOptions


class Decoded(NamedTuple):
    """A replay's full decode as the mixture reads it."""

    reference: str  # the right transcript
    intent: str  # the right intent
    slu: SluResult  # what the device's decoder read off its tokens
    confidence: float  # the decoder's probability of its intent


def decoded(samples: list[OfframpSample], model: DeviceModel) -> list[Decoded]:
    """Each replay with a full decode, read once."""
    return [Decoded(s.reference.text, s.reference.intent, model.read(s.final.tokens),
                    intent_confidence(s.final.hypothesis())) for s in samples if s.final is not None]


def reader_with_noise(sentences: dict[str, str], confusions: ConfusionModel, copies: int,
                      heard: list[Decoded] = (), repeats: int = 0) -> IntentReader:
    """The reader of the sentences, `copies` noisy copies of them, and `repeats` times each transcript `heard`
    with its right intent."""
    texts, intents = list(sentences), list(sentences.values())
    for _ in range(repeats):
        texts += [d.slu.text for d in heard]
        intents += [d.intent for d in heard]
    for copy in range(copies):
        texts += confusions.corrupt(list(sentences), seed=copy)
        intents += list(sentences.values())
    return IntentReader.fit(texts, intents, ReaderOptions(char_ngram_max=READER_CHAR_NGRAMS))


def confusions_of(rows: list[Decoded]) -> ConfusionModel:
    return ConfusionModel.fit([(d.reference, d.slu.text) for d in rows])


def accuracy(reader: IntentReader, rows: list[Decoded], share: float) -> float:
    mixture = IntentMixture(reader, share)
    return float(np.mean([mixture.reading(d.slu, d.confidence)[0] == d.intent for d in rows]))


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
    dev = decoded(load_samples(args.dev), model)
    halves = [dev[0::2], dev[1::2]]
    others = {path.stem: decoded(load_samples(path), model) for path in args.others}
    all_dev = confusions_of(dev)
    print(f"{len(sentences)} training sentences, {len(dev)} dev replays; errors counted on all of dev: "
          "replaced / dropped / inserted per word " + " / ".join(f"{r:.3f}" for r in all_dev.rates()))
    for copies, repeats in [(c, r) for c in args.copies for r in args.heard_repeats]:
        cross = {share: [] for share in args.shares}
        for fold in (0, 1):
            other_half = halves[1 - fold]
            reader = reader_with_noise(sentences, confusions_of(other_half), copies, other_half, repeats)
            for share in args.shares:
                cross[share].append(accuracy(reader, halves[fold], share))
        reader = reader_with_noise(sentences, all_dev, copies, dev, repeats) if others else None
        for share in args.shares:
            cells = [f"dev two-fold {np.mean(cross[share]):.2%}"]
            cells += [f"{name} {accuracy(reader, rows, share):.2%}" for name, rows in others.items()]
            print(f"copies {copies} heard x{repeats} share {share:g}: " + ", ".join(cells), flush=True)

if __name__ == "__main__":
    main()
