"""Fine-tune all of Whisper on our commands on a lent GPU (models/whisper_finetune.py): `pack` here, `train` there.

    pasu whisper adapt --model models/shipped/cloud --corpus data/corpus-full --exp exp/whisper-adapt \
        --out exp/whisper_decoder.npz --train-utterances 4000 --max-steps 800     # the decoder first, on the CPU
    .venv/bin/python scripts/whisper_finetune.py pack --cloud models/shipped/cloud --corpus data/corpus-full \
        --start-from exp/whisper_decoder.npz --out exp/wpack --set train_utterances=28000 --set part_mib=59
    python3 scripts/whisper_finetune.py train --packs part0 part1 --out $OUT --set minutes=7   # on the GPU
    .venv/bin/python scripts/whisper_finetune.py report RUN        # RUN: what train wrote; WER before and after
    .venv/bin/python scripts/whisper_finetune.py install RUN --out models/shipped/cloud/whisper_adaptation.npz

The GPU machine has PyTorch but not this project installed: run from a checkout (scripts/gpu_job.py).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from gpu_job import add_set_argument, map_checkout, options_from_sets


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = parser.add_subparsers(dest="verb", required=True)
    pack = verbs.add_parser("pack", help="write the parts a GPU call carries")
    pack.add_argument("--cloud", type=Path, required=True, help="the cloud model folder (whisper.yaml)")
    pack.add_argument("--corpus", type=Path, required=True)
    pack.add_argument("--out", type=Path, required=True)
    pack.add_argument("--start-from", type=Path, default=None,
                      help="an adaptation .npz to start from (default: the one the cloud's whisper.yaml names)")
    train = verbs.add_parser("train", help="fine-tune on the packs (on the GPU where there is one)")
    train.add_argument("--packs", type=Path, nargs="+", required=True)
    train.add_argument("--out", type=Path, required=True)
    report = verbs.add_parser("report", help="dev WER of greedy decoding before and after, from a run's folder")
    report.add_argument("run", type=Path)
    install = verbs.add_parser("install", help="one adaptation file (encoder and decoder) from a run's folder")
    install.add_argument("run", type=Path)
    install.add_argument("--out", type=Path, required=True, help="the .npz whisper.yaml's `adaptation` names")
    for verb, options in ((pack, "PackOptions"), (train, "FinetuneOptions")):
        add_set_argument(verb, options, "models/whisper_finetune.py")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    map_checkout()
    if args.verb in ("report", "install"):
        return _report(args.run) if args.verb == "report" else _install(args.run, args.out)
    from pasu.models import whisper_finetune as wf

    options = options_from_sets(parser, getattr(wf, args.options), args.set)
    if args.verb == "pack":
        for part in wf.write_pack(args.cloud, args.corpus, args.out, options, args.start_from):
            size = sum(f.stat().st_size for f in part.iterdir())
            print(f"{part}: {size / 2**20:.1f} MiB")
    else:
        summary = wf.finetune(args.packs, args.out, options)
        print({k: v for k, v in summary.items() if k != "history"})


def _report(run: Path) -> None:
    import json

    from pasu.metrics import corpus_wer
    from pasu.models.whisper_recognizer import spoken_form

    summary = json.loads((run / "summary.json").read_text())
    rows = json.loads((run / "dev-hypotheses.json").read_text())
    refs = [r["text"] for r in rows]
    print(f"{summary['steps']} steps on {summary['train_utterances']} utterances ({summary['device']}); "
          f"teacher-forced dev loss {summary['initial_dev_loss']:.3f} -> {summary['best_dev_loss']:.3f}")
    for when in ("before", "after"):
        wer = corpus_wer(refs, [spoken_form(r[when]) for r in rows])
        print(f"greedy WER on {len(rows)} dev utterances {when}: {100 * wer:.1f}%")


def _install(run: Path, out: Path) -> None:
    import numpy as np

    with np.load(run / "encoder.npz") as encoder, np.load(run / "decoder.npz") as decoder:
        np.savez(out, **encoder, **decoder)
    print(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
