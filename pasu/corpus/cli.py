"""`pasu corpus`: build and summarize the synthetic speech corpus; import real SLURP audio."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from pasu.corpus.plan import SPLITS
from pasu.settings import shared_data_dir


def register(sub: argparse._SubParsersAction) -> None:
    corpus = sub.add_parser("corpus", help="build the synthetic SLURP-style speech corpus",
                            description="Build and inspect the synthetic SLURP-style speech corpus.",
                            epilog="Example: pasu corpus build --preset tiny --out data/corpus-tiny")
    csub = corpus.add_subparsers(dest="corpus_command", metavar="ACTION", required=True)

    build = csub.add_parser(
        "build", help="render text with TTS voices, augment, write manifests (resumable)",
        description="Render SLURP/HWU64 sentences with several TTS engines and voices, augment them with noise,\n"
                    "reverberation and speed changes, and write 16 kHz FLAC files and JSONL manifests for the\n"
                    "train, dev, test and test_unseen splits. Re-running with the same --out resumes.",
        epilog="Examples:\n  pasu corpus build --preset tiny --out data/corpus-tiny\n"
               "  pasu corpus build --preset tiny --samples --out /tmp/c   # the project's own sample text\n"
               "  pasu corpus build --preset full --out data/corpus-full",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    build.add_argument("--preset", choices=_preset_names(), default="tiny", help="corpus size (default: tiny)")
    build.add_argument("--out", type=Path, required=True, help="output folder")
    build.add_argument("--data-dir", type=Path, default=None,
                       help="shared data folder with slurp/, slurpfood/, hwu64/, noise/ "
                            "(default: $PASU_SHARED_DATA or ../shared/data)")
    build.add_argument("--samples", action="store_true",
                       help="use the small sample text shipped with PASU instead of the shared SLURP text")
    build.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    build.add_argument("--train-variant", type=int, default=0,
                       help="N > 0: render the training split afresh (voices, prosody, augmentation) keeping the "
                            "held-out voices and evaluation splits of --seed; train on it beside the first with "
                            "--set 'data.extra_corpora=[FOLDER]' (default: 0)")
    build.add_argument("--train-text", type=Path, default=None, metavar="JSONL",
                       help="render these sentences as the training split instead of the labelled training text "
                            "(e.g. `pasu text-intent pseudo-label`'s); use with --train-variant and --splits train")
    build.add_argument("--train-utterances", type=int, default=None, metavar="N",
                       help="training utterances to render (default: the preset's)")
    build.add_argument("--workers", type=int, default=None, help="worker processes (default: one per core)")
    build.add_argument("--voices", type=Path, default=None,
                       help="plan with the voices of this build.json (or a file with one voice id per line) "
                            "instead of the installed ones; voices not installed here are skipped")
    build.add_argument("--splits", default=",".join(SPLITS),
                       help="comma-separated splits to render (default: all); the plan is the same either way")
    build.set_defaults(run=_build)

    slurp = csub.add_parser(
        "import-slurp", help="a corpus folder over real SLURP audio in its official layout (no audio copied)",
        description="Write train/dev/test JSONL manifests (rows as `pasu corpus build` writes them, absolute\n"
                    "audio paths) for SLURP's recordings: train from train.jsonl (and train_synthetic.jsonl with\n"
                    "--synthetic), dev from devel.jsonl, test from test.jsonl, labels and slots from the\n"
                    "annotations. Missing audio files are counted and reported, not fatal. There is no\n"
                    "test_unseen split: use --splits test with `pasu eval` and `pasu bench local`.",
        epilog="Examples:\n  pasu corpus import-slurp --slurp-dir ~/slurp --out data/corpus-slurp\n"
               "  pasu corpus import-slurp --slurp-dir ~/slurp --audio-dir /data/slurp-audio --recordings best "
               "--synthetic --out data/corpus-slurp-best\n"
               "  pasu eval models/shipped/device --corpus data/corpus-slurp --splits test --limit 500",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    slurp.add_argument("--slurp-dir", type=Path, required=True,
                       help="clone of github.com/pswietojanski/slurp (dataset/slurp/*.jsonl)")
    slurp.add_argument("--out", type=Path, required=True, help="corpus folder to write (manifests and import.json)")
    slurp.add_argument("--audio-dir", type=Path, default=None,
                       help="folder with the unpacked slurp_real/ and slurp_synth/ (default: SLURP_DIR/audio)")
    slurp.add_argument("--recordings", choices=("all", "best"), default="all",
                       help="all: one utterance per recording; best: per sentence only the recording with the "
                            "lowest SLURP wer, the next best where its file is missing (default: all)")
    slurp.add_argument("--synthetic", action="store_true",
                       help="also put train_synthetic.jsonl (SLURP's TTS audio in slurp_synth/) into train")
    slurp.add_argument("--splits", default="train,dev,test",
                       help="comma-separated splits to write (default: train,dev,test)")
    slurp.set_defaults(run=_import_slurp)

    labels = csub.add_parser(
        "import-labels", help="a corpus folder over your own recordings and a JSONL label file (no audio copied)",
        description="Write <split>.jsonl manifests (rows as `pasu corpus build` writes them, absolute audio\n"
                    "paths) for the recordings of a label file, one JSON object per line:\n"
                    '  {"audio": "wav/0001.wav", "text": "Wake me up at five AM", "intent": "alarm_set",\n'
                    '   "slots": [["time", "five AM"]], "split": "train", "speaker": "spk03"}\n'
                    "audio relative to the label file or absolute; slots optional (absent: not annotated);\n"
                    "split one of train, dev, test, test_unseen; speaker and id optional. Text and slot values\n"
                    "are normalized as in every PASU corpus. Missing or unreadable audio is counted and left\n"
                    "out; a malformed line stops the import with its line number, before anything is written.",
        epilog="Examples:\n  pasu corpus import-labels data/mine/labels.jsonl --out data/corpus-mine\n"
               "  pasu train --config models/configs/device_late_context.yaml --corpus data/corpus-mine "
               "--out exp/mine \\\n      --init-from models/shipped/device "
               "--package models/mine",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    labels.add_argument("labels", type=Path, help="the JSONL label file")
    labels.add_argument("--out", type=Path, required=True, help="corpus folder to write (manifests and import.json)")
    labels.set_defaults(run=_import_labels)

    swap = csub.add_parser(
        "swap-slots", help="new training sentences: the labelled ones with their slot values swapped",
        description="Write COUNT new training sentences, each a labelled training sentence whose slot values are\n"
                    "replaced by other values of the same slot type from the training text (models/slot_swap.py),\n"
                    "as a sentence file for `pasu corpus build --train-text`. No SLURP devel/test sentence and no\n"
                    "training sentence is written.",
        epilog="Example:\n"
               "  pasu corpus swap-slots --count 9600 --out data/swap-train.jsonl\n"
               "  pasu corpus build --preset full --out data/corpus-full-s5 --train-variant 5 --train-text "
               "data/swap-train.jsonl \\\n      --train-utterances 19200 --voices data/corpus-full/build.json --splits train",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    swap.add_argument("--out", type=Path, required=True, help="sentence file (JSONL) to write")
    swap.add_argument("--count", type=int, required=True, help="new sentences to write")
    swap.add_argument("--also", type=Path, action="append", default=[], metavar="JSONL",
                      help="more carrier sentences and slot values (e.g. `pasu text-intent pseudo-label`'s file); "
                           "repeatable")
    swap.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    swap.add_argument("--data-dir", type=Path, default=None,
                      help="shared data folder with SLURP/HWU64 text (default: $PASU_SHARED_DATA or ../shared/data)")
    swap.set_defaults(run=_swap_slots)

    report = csub.add_parser("report", help="print the report of a built corpus",
                             epilog="Example: pasu corpus report data/corpus-tiny")
    report.add_argument("out", type=Path, help="corpus folder")
    report.set_defaults(run=_report)


def _preset_names() -> list[str]:
    from pasu.corpus.plan import PRESETS

    return list(PRESETS)


def _build(args: argparse.Namespace) -> int:
    import dataclasses
    import os

    from pasu.corpus.build import BuildOptions, build_corpus
    from pasu.corpus.plan import PRESETS
    from pasu.corpus.text import CorpusDataError, LeakageError, samples_dir

    data_dir = samples_dir() if args.samples else shared_data_dir(args.data_dir)
    splits = tuple(s for s in args.splits.split(",") if s)
    if unknown := sorted(set(splits) - set(SPLITS)):
        print(f"pasu corpus build: unknown split(s) {', '.join(unknown)}; choose from {', '.join(SPLITS)}",
              file=sys.stderr)
        return 2
    preset = PRESETS[args.preset]
    if args.train_utterances is not None:
        preset = dataclasses.replace(preset, train_utterances=args.train_utterances)
    opts = BuildOptions(preset=preset, data_dir=data_dir, out_dir=args.out, seed=args.seed,
                        train_variant=args.train_variant, train_text=args.train_text,
                        workers=args.workers or max(1, os.cpu_count() or 1),
                        voices=_voice_list(args.voices) if args.voices else None, splits=splits)
    try:
        report = build_corpus(opts)
    except CorpusDataError as e:
        print(f"pasu corpus build: {e}\n(use --samples to build from the sample text that ships with PASU)",
              file=sys.stderr)
        return 2
    except (LeakageError, OSError) as e:
        print(f"pasu corpus build: {e}", file=sys.stderr)
        return 2
    from pasu.corpus.report import to_markdown

    print(to_markdown(report))
    return 0


def _swap_slots(args: argparse.Namespace) -> int:
    from pasu.corpus.text import CorpusDataError, load_corpus_text, read_sentences, write_sentences
    from pasu.models.slot_swap import SwapOptions, swap_slots

    if args.count < 1:
        print("pasu corpus swap-slots: --count must be at least 1", file=sys.stderr)
        return 2
    try:
        text = load_corpus_text(shared_data_dir(args.data_dir))
        carriers = text.train + tuple(s for path in args.also for s in read_sentences(path))
    except (CorpusDataError, OSError) as e:
        print(f"pasu corpus swap-slots: {e}", file=sys.stderr)
        return 2
    held_out = [s.text for s in text.dev + text.test]
    new = swap_slots(carriers, SwapOptions(count=args.count, seed=args.seed), exclude=held_out)
    write_sentences(args.out, new)
    intents = {s.intent for s in new}
    print(f"{len(new)} new sentences from {len(carriers)} carriers ({len(intents)} intents) -> {args.out}")
    if len(new) < args.count:
        print(f"(asked for {args.count}: the carriers hold no more new combinations within the draw limit)")
    return 0


def _voice_list(path: Path) -> tuple[str, ...]:
    """Voice ids from a corpus's build.json (seen + unseen) or a plain list, one per line."""
    text = path.read_text()
    if path.suffix == ".json":
        info = json.loads(text)
        return tuple(info["seen_voices"]) + tuple(info["unseen_voices"])
    return tuple(line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#"))


def _import_slurp(args: argparse.Namespace) -> int:
    from pasu.corpus.slurp_import import ImportOptions, import_slurp, to_text
    from pasu.corpus.text import CorpusDataError

    opts = ImportOptions(slurp_dir=args.slurp_dir, out_dir=args.out, audio_dir=args.audio_dir,
                         recordings=args.recordings, synthetic=args.synthetic,
                         splits=tuple(s for s in args.splits.split(",") if s))
    try:
        summary = import_slurp(opts)
    except CorpusDataError as e:
        print(f"pasu corpus import-slurp: {e}", file=sys.stderr)
        return 2
    print(to_text(summary))
    return 0


def _import_labels(args: argparse.Namespace) -> int:
    from pasu.corpus.labels_import import LabelsImportOptions, import_labels, to_text
    from pasu.corpus.text import CorpusDataError

    try:
        summary = import_labels(LabelsImportOptions(labels=args.labels, out_dir=args.out))
    except CorpusDataError as e:
        print(f"pasu corpus import-labels: {e}", file=sys.stderr)
        return 2
    print(to_text(summary))
    return 0


def _report(args: argparse.Namespace) -> int:
    path = args.out / "report.json"
    if not path.exists():
        print(f"pasu corpus report: {path} not found; build the corpus first", file=sys.stderr)
        return 2
    from pasu.corpus.report import to_markdown

    print(to_markdown(json.loads(path.read_text())))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m pasu.corpus.cli build ...`: the corpus commands alone, for a machine that has the corpus's
    dependencies but not the rest of PASU's (a lent GPU machine: scripts/device_fresh_gpu.sh)."""
    from pasu.cli import configure_logging

    parser = argparse.ArgumentParser(prog="python -m pasu.corpus.cli")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["corpus", *(sys.argv[1:] if argv is None else argv)])
    configure_logging(verbose=False)
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
