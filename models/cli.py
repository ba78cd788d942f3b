"""`pasu train` and `pasu package`: train an SLU model on a PASU corpus and ship it as a model folder."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    train = sub.add_parser(
        "train", help="train an SLU model (intent + words + slots) on a corpus (resumable)",
        description="Train an ESPnet hybrid CTC/attention model whose target is the intent, then the words with "
                    "inline slot markup, on a PASU corpus's train.jsonl, evaluating on a fixed dev subset. "
                    "Running the same command again resumes from EXPDIR/checkpoint.pt; at the end the best "
                    "snapshots are averaged into EXPDIR/model_avg.pt.",
        epilog="Examples:\n"
               "  pasu train --config models/configs/device_late_context.yaml --corpus data/corpus-tiny "
               "--out exp/device\n"
               "  pasu train --config models/configs/baseline_conformer.yaml --corpus data/corpus-full "
               "--out exp/conformer --num-threads 1   # two trainings side by side on 2 cores",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    train.add_argument("--config", type=Path, required=True, help="experiment YAML (see models/configs/)")
    train.add_argument("--corpus", type=Path, required=True, help="corpus folder with train.jsonl and dev.jsonl")
    train.add_argument("--out", type=Path, required=True, help="experiment folder (EXPDIR); reused to resume")
    train.add_argument("--max-steps", type=int, default=None, help="override train.max_steps")
    train.add_argument("--max-epochs", type=int, default=None, help="override train.max_epochs")
    train.add_argument("--num-threads", type=int, default=None, help="override train.num_threads")
    train.add_argument("--device", default=None, help="override train.device (cpu, cuda, auto)")
    train.add_argument("--init-from", type=Path, default=None,
                       help="override train.init_from: start from a packaged model folder (e.g. models/shipped/device)")
    train.add_argument("--max-minutes", type=float, default=None, help="override train.max_minutes (time box)")
    train.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                       help="override any config field, e.g. --set optim.lr=0.002 --set data.batch_seconds=400")
    train.set_defaults(run=_train)

    package = sub.add_parser(
        "package", help="write a model folder (config, float16 weights, tokenizer, model card) from EXPDIR",
        epilog="Example: pasu package exp/device --out models/shipped/device --eval exp/device/test_eval.json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    package.add_argument("exp_dir", type=Path, help="a `pasu train` EXPDIR")
    package.add_argument("--out", type=Path, required=True, help="model folder to write")
    package.add_argument("--weights", default="model_avg.pt", help="weights file in EXPDIR (default: model_avg.pt)")
    package.add_argument("--eval", type=Path, default=None, help="evaluation JSON for the model card's results")
    package.add_argument("--name", default=None, help="model name in the card (default: EXPDIR's name)")
    package.set_defaults(run=_package)

    evaluate = sub.add_parser(
        "eval", help="decode corpus splits with a model folder; print and save WER, intent accuracy, SLU-F1",
        epilog="Example: pasu eval models/device --corpus data/corpus-full --limit 500 --out exp/device/eval.json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    evaluate.add_argument("model_dir", type=Path, help="a packaged model folder")
    evaluate.add_argument("--corpus", type=Path, required=True, help="corpus folder with <split>.jsonl")
    evaluate.add_argument("--splits", default="test,test_unseen", help="comma-separated (default: test,test_unseen)")
    evaluate.add_argument("--limit", type=int, default=0, help="fixed random subset per split (default: all)")
    evaluate.add_argument("--beam", type=int, default=5, help="beam size (default: 5, the paper's full decode)")
    evaluate.add_argument("--ctc-weight", type=float, default=0.3, help="CTC weight (default: 0.3)")
    evaluate.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    evaluate.add_argument("--out", type=Path, default=None, help="write the results JSON here")
    evaluate.set_defaults(run=_evaluate)


def _train(args: argparse.Namespace) -> int:
    import warnings

    from pasu.models.train import load_config, train

    # ESPnetASRModel.encode calls the deprecated torch.cuda.amp.autocast on every batch: one warning per run
    # would be fine, but it is not ours to fix and it garbles the progress bar.
    warnings.filterwarnings("ignore", category=FutureWarning, module="espnet2.asr.espnet_model")

    config = load_config(args.config, args.overrides)
    overrides = {k: v for k, v in {"max_steps": args.max_steps, "max_epochs": args.max_epochs,
                                   "num_threads": args.num_threads, "device": args.device,
                                   "max_minutes": args.max_minutes,
                                   "init_from": str(args.init_from) if args.init_from else None}.items()
                 if v is not None}
    if overrides:
        config = dataclasses.replace(config, train=dataclasses.replace(config.train, **overrides))
    flags = [("--config", args.config), ("--corpus", args.corpus), ("--out", args.out)] + [
        ("--" + k.replace("_", "-"), v) for k, v in overrides.items()] + [("--set", o) for o in args.overrides]
    command = "pasu train " + " ".join(f"{flag} {shlex.quote(str(v))}" for flag, v in flags)
    train(config, args.corpus, args.out, command=command)
    return 0


def _package(args: argparse.Namespace) -> int:
    from pasu.models.package import package_model

    out = package_model(args.exp_dir, args.out, weights=args.weights, evaluation=args.eval, name=args.name)
    print(f"wrote {out}")
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    import json

    from pasu.models.evaluate import EvalOptions, evaluate_model, write_results
    from pasu.models.recognizer import DecodingOptions

    opts = EvalOptions(splits=tuple(s for s in args.splits.split(",") if s), limit=args.limit,
                       decoding=DecodingOptions(beam_size=args.beam, ctc_weight=args.ctc_weight,
                                                num_threads=args.threads))
    results = evaluate_model(args.model_dir, args.corpus, opts)
    if args.out:
        write_results(results, args.out)
    print(json.dumps({k: v for k, v in results.items() if k in opts.splits}, indent=2))
    return 0
