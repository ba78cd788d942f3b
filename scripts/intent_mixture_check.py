"""How the device should mix its decoder's intent with the intent reader's: the accuracy of the answers the
mixture gives on replays' full decodes, for readers with and without character n-grams and for a range of the
decoder's share (`device/intent_offramp.py`: READER_CHAR_NGRAMS, DECODER_SHARE). The settings are chosen on the
dev replays; a second replay file (e.g. a bench's `test` replays) is printed beside them, not used to choose.
About a minute for 3,000 replays (the readers are fitted here, on the training sentences of the corpus and
of each --reader-corpus, as `pasu offramp train` fits the device's).

    .venv/bin/python scripts/intent_mixture_check.py models/shipped/device data/corpus-full \
        models/shipped/device/offramp/replays-dev-all.jsonl exp/hybrid34/replays-test.jsonl \
        --reader-corpus data/corpus-full-p4
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from pasu.device.intent_offramp import IntentMixture, intent_confidence
from pasu.device.offramp_cli import fit_intent_reader
from pasu.device.offramp_data import OfframpSample, load_samples
from pasu.device.runtime import DeviceModel
from pasu.metrics import SluResult
from pasu.models.intent_reader import ReaderOptions

READERS = {"words": ReaderOptions(), "words + chars 2-4": ReaderOptions(char_ngram_max=4),
           "words + chars 2-5": ReaderOptions(char_ngram_max=5)}
SHARES = (0.2, 0.35, 0.5, 0.7, 1.0)


def decoded(samples: list[OfframpSample], model: DeviceModel) -> list[tuple[SluResult, float, str]]:
    """Each replay's full decode as the mixture reads it: the decoder's reading, its confidence, the right intent."""
    return [(model.read(s.final.tokens), intent_confidence(s.final.hypothesis()), s.reference.intent)
            for s in samples]


def accuracy(mixture: IntentMixture, rows: list[tuple[SluResult, float, str]], words: np.ndarray) -> float:
    """Share of the decodes the mixture answers with the right intent; `words`: the reader's distribution of each."""
    right = [mixture.most_probable(slu, *mixture.distribution(slu, confidence, words[i].copy()))[0] == intent
             for i, (slu, confidence, intent) in enumerate(rows)]
    return float(np.mean(right))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path, help="packaged device model")
    parser.add_argument("corpus", type=Path, help="corpus whose training sentences the readers learn")
    parser.add_argument("dev", type=Path, help="replays to choose on (pasu offramp train's replays-dev-all.jsonl)")
    parser.add_argument("others", type=Path, nargs="*", help="replays to show beside them")
    parser.add_argument("--reader-corpus", type=Path, action="append", default=[],
                        help="another corpus whose training sentences the readers learn too (as pasu offramp train's)")
    args = parser.parse_args()
    model = DeviceModel.from_folder(args.model)
    rows = {path.stem: decoded([s for s in load_samples(path) if s.final is not None], model)
            for path in [args.dev, *args.others]}
    print("decoder alone: " + ", ".join(f"{name} {np.mean([slu.intent == intent for slu, _, intent in r]):.1%}"
                                        for name, r in rows.items()))
    print(f"{'reader':20s} {'share':>6s} " + " ".join(f"{name[:22]:>22s}" for name in rows))
    for name, options in READERS.items():
        reader = fit_intent_reader([args.corpus, *args.reader_corpus], options)
        words = {name: reader.distribution([slu.text for slu, _, _ in r], reader.classes) for name, r in rows.items()}
        for share in SHARES:
            mixture = IntentMixture(reader, share)
            cells = [f"{accuracy(mixture, r, words[name]):>22.1%}" for name, r in rows.items()]
            print(f"{name:20s} {share:>6g} " + " ".join(cells), flush=True)


if __name__ == "__main__":
    main()
