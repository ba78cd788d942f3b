"""Fine-tune the device model on a lent GPU (models/device_finetune.py): `pack` here, `train` there, `install` here.

    .venv/bin/python scripts/device_finetune.py pack --model models/shipped/device \
        --corpora data/corpus-full data/corpus-full-p4 --out exp/dpack --set train_utterances=24000
    python3 scripts/device_finetune.py train --model models/shipped/device --packs part0 part1 --out $OUT \
        --set minutes=6                                              # on the GPU
    python3 scripts/device_finetune.py fresh --model models/shipped/device --dev-packs part0 \
        --builds /tmp/fresh10 --out $OUT --set minutes=6              # on the GPU, `pasu corpus build` beside it
    .venv/bin/python scripts/device_finetune.py install RUN/avg.pt --model models/shipped/device --out exp/dft-pkg
    pasu eval exp/dft-pkg --corpus data/corpus-full --splits dev --as-agent --threads 1 --jobs 2

The GPU machine has PyTorch but not this project installed: run from a checkout (scripts/gpu_job.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
from pathlib import Path

from gpu_job import add_set_argument, map_checkout, options_from_sets


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = parser.add_subparsers(dest="verb", required=True)
    pack = verbs.add_parser("pack", help="write the parts a GPU call carries")
    pack.add_argument("--model", type=Path, required=True, help="the device package whose features are packed")
    pack.add_argument("--corpora", type=Path, nargs="+", required=True,
                      help="corpus folders whose train is sampled; dev comes from the first")
    pack.add_argument("--out", type=Path, required=True)
    train = verbs.add_parser("train", help="fine-tune on the packs (on the GPU where there is one)")
    train.add_argument("--model", type=Path, required=True, help="the package to start from")
    train.add_argument("--packs", type=Path, nargs="+", required=True)
    train.add_argument("--out", type=Path, required=True)
    fresh = verbs.add_parser("fresh", help="fine-tune on the speech `pasu corpus build` is rendering beside it")
    fresh.add_argument("--model", type=Path, required=True, help="the package to start from")
    fresh.add_argument("--dev-packs", type=Path, nargs="+", required=True, help="part0 of a pack: its dev")
    fresh.add_argument("--builds", type=Path, nargs="+", required=True, help="corpus folders being built")
    fresh.add_argument("--out", type=Path, required=True)
    install = verbs.add_parser("install", help="a package with the trained weights in place of the model's")
    install.add_argument("weights", type=Path, help="best.pt or avg.pt from a run's folder")
    install.add_argument("--model", type=Path, required=True, help="the package the run started from")
    install.add_argument("--out", type=Path, required=True)
    add_set_argument(pack, "PackOptions", "models/device_finetune.py")
    add_set_argument(train, "FinetuneOptions", "models/device_finetune.py")
    add_set_argument(fresh, "FinetuneOptions", "models/device_finetune.py")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    map_checkout()
    if args.verb == "install":
        return _install(args.weights, args.model, args.out)
    from pasu.models import device_finetune as df

    options = options_from_sets(parser, getattr(df, args.options), args.set)
    if args.verb == "pack":
        for part in df.write_pack(args.model, args.corpora, args.out, options):
            size = sum(f.stat().st_size for f in part.iterdir())
            print(f"{part}: {size / 2**20:.1f} MiB")
    elif args.verb == "fresh":
        summary = df.finetune_fresh(args.dev_packs, args.builds, args.model, args.out, options)
        print(json.dumps({k: v for k, v in summary.items() if k != "history"}))
    else:
        summary = df.finetune(args.packs, args.model, args.out, options)
        print(json.dumps({k: v for k, v in summary.items() if k != "history"}))


def _install(weights: Path, model: Path, out: Path) -> None:
    """A copy of the package with `weights` as its model.pt (the run's summary.json beside them is recorded)."""
    shutil.copytree(model, out, dirs_exist_ok=True)
    shutil.copyfile(weights, out / "model.pt")
    summary = weights.parent / "summary.json"
    if summary.exists():
        shutil.copyfile(summary, out / "gpu_finetune.json")
    print(f"wrote {out} with {weights}")


if __name__ == "__main__":
    main()
