"""`pasu offramp train`: replay a packaged device model on dev, fit the BiLSTM offramp and the intent reader,
calibrate the offramps; `pasu offramp show`: what a model's calibration says."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from pasu.device.cli import add_replay_flags
from pasu.models.data import Utterance, dev_subset, load_split, read_audio, split_manifest

from pasu.metrics import word_edits

# offramp_net.LABELS, written out: importing it here would load the agent for every `pasu` command
LABELS = ("bad", "wer")

if TYPE_CHECKING:
    from collections.abc import Callable

    from pasu.device.agent import AgentOptions
    from pasu.device.intent_offramp import IntentEvidence
    from pasu.device.offramp_data import OfframpSample
    from pasu.models.intent_reader import IntentReader, ReaderOptions
    from pasu.device.runtime import DeviceModel

DEFAULT_CORPUS = "data/corpus-full"
# what `pasu offramp train` reports on, in this order (each a key of offramp.json; the _end ones judge the
# end-of-speech pilot, the _late ones the full decode, for the policies that decide on them)
OFFRAMPS = ("ppl", "bilstm", "cnn", "intent", "ppl_intent", "bilstm_intent", "ppl_end", "bilstm_end", "ppl_late",
            "bilstm_late")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("offramp",
                            help="train and calibrate the device's offloading offramps; show a calibration",
                            description="Offramps decide at end of speech whether the device offloads.",
                            epilog="Examples:\n  pasu offramp train models/shipped/device --limit 150\n"
                                   "  pasu offramp show models/shipped/device",
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="offramp_command", metavar="COMMAND", required=True)
    train = commands.add_parser(
        "train", help="fit the BiLSTM and CNN offramps on dev replays and calibrate PPL, BiLSTM, CNN and intent "
                      "thresholds",
        description="Replays the agent over a corpus split (cached), fits the BiLSTM (per-token scores) and the CNN\n"
                    "(encoder output) to predict local WER > --bad-wer (--label wer: the local WER) and the intent\n"
                    "reader on the training sentences, and writes bilstm.pt/.json, bilstm_late.pt/.json (the BiLSTM\n"
                    "fitted on full decodes, for --policy bilstm-late), bilstm_end.pt/.json (on end-of-speech\n"
                    "pilots, for --policy bilstm-end), cnn.pt/.json, intent_reader.json/.npz and\n"
                    "offramp.json (thresholds) to MODEL/offramp/.",
        epilog="Example: pasu offramp train models/device --limit 150 --cloud-model models/cloud",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    train.add_argument("model", type=Path, help="packaged device model folder (pasu package)")
    train.add_argument("--corpus", type=Path, default=Path(DEFAULT_CORPUS), help="corpus folder with the manifests")
    train.add_argument("--split", default="dev", help="manifest to train and calibrate on (default: dev)")
    train.add_argument("--limit", type=int, default=0, help="a fixed random subset of this many utterances (0: all)")
    train.add_argument("--out", type=Path, help="output folder (default: MODEL/offramp)")
    train.add_argument("--cache", type=Path, help="replay cache (default: OUT/replays-SPLIT.jsonl)")
    train.add_argument("--cloud-model", type=Path,
                       help="cloud model folder: decode the split with it to calibrate WER targets as well")
    train.add_argument("--fit-all", action="store_true",
                       help="fit the BiLSTM and CNN on every utterance of the split (replayed and cached once), not only on "
                            "the --limit subset the thresholds are calibrated on and the cloud decodes")
    train.add_argument("--reader-corpus", type=Path, action="append", default=[],
                       help="another corpus whose training sentences the intent reader learns too (repeatable; e.g. "
                            "the pseudo-labelled SLURP lm.txt sentences the device model trained on)")
    train.add_argument("--reader-learns-split", action="store_true",
                       help="the intent reader learns the sentences of --split too; each utterance is then replayed and "
                            "judged with a reader that learned every sentence but those of its fold (5 folds by "
                            "sentence), so that the intent check is fitted as on sentences the reader never saw")
    train.add_argument("--epochs", type=int, default=60, help="BiLSTM training epochs")
    train.add_argument("--networks", type=int,
                       help="BiLSTMs of the last pilot's check, fitted from successive seeds, their probabilities "
                            "averaged (default: offramp_net.TrainOptions's, 3)")
    train.add_argument("--bad-wer", type=float,
                       help="the BiLSTM's and CNN's label: local WER above this is wrong (default: the paper's 0.1; a device "
                            "whose WER is far above it may rank better with a higher bar, see the printed yardsticks)")
    train.add_argument("--label", choices=LABELS, default="bad",
                       help="what the BiLSTM and CNN learn to predict: bad, whether local WER is above --bad-wer (the "
                            "paper's label); wer, the local WER itself (clipped to 1) as a soft label")
    add_replay_flags(train, " of the replays, as the agent that will use these offramps fuses it (`pasu device "
                            "run --lm`): the labels are then that decode's errors; the pilots the offramps read do "
                            "not change")
    train.add_argument("--threads", type=int, default=1, help="torch threads (the machine may be shared)")
    train.set_defaults(run=run_train)
    show = commands.add_parser(
        "show", help="print a model's calibration: each offramp's thresholds at Offload-L/M/H, Table 5",
        description="Prints what `pasu offramp train` calibrated for a device model: each offramp's ranking quality,\n"
                    "its thresholds at Offload-L/M/H (what `pasu device run --level` picks) with the share offloaded\n"
                    "and the WER reached on the calibration utterances, and, where the cloud decoded them, the\n"
                    "offload each ranking needs for each WER target against NaiveHybrid's.",
        epilog="Example: pasu offramp show models/shipped/device",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    show.add_argument("model", type=Path, help="packaged device model folder, or an offramp folder itself")
    show.set_defaults(run=run_show)


def run_train(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from pasu.device.cli import replay_options
    from pasu.device.held_out_reader import readers_without
    from pasu.device.offramp_train import (
        OFFRAMP_DIR,
        OfframpTrainOptions,
        answer_intent_accuracy,
        fit_offramps,
        intent_evidence,
        load_device_model,
    )

    logging.getLogger("espnet").setLevel(logging.WARNING)  # its beam search logs every hypothesis at INFO
    torch.set_num_threads(args.threads)
    out = args.out or args.model / OFFRAMP_DIR
    utterances = dev_subset(load_split(args.corpus, args.split), args.limit)
    reader_corpora = reader_training_corpora(args.corpus, args.reader_corpus)
    reader = fit_intent_reader(reader_corpora, also_split=args.split if args.reader_learns_split else None,
                               also_corpus=args.corpus)
    reader.save(out)
    # replays the split answering as the agent will, with the reader as saved (float16 weights), and reads
    # pilots' tokens for the intent check; a reader that learned the split's sentences reads none of them
    model = load_device_model(args.model, out)
    agent = replay_options(model, args)
    held_out = readers_without(reader, args.corpus, args.split) if args.reader_learns_split else None
    replay = Replayer(model, args.corpus, args.split, held_out, agent, args.jobs)
    samples = replay(utterances, args.cache or out / f"replays-{args.split}.jsonl")
    cloud_edits = cloud_word_edits(args.cloud_model, utterances, out / f"cloud-{args.split}.json") \
        if args.cloud_model else None
    options = OfframpTrainOptions()
    bad_wer = options.bilstm.bad_wer if args.bad_wer is None else args.bad_wer
    networks = args.networks or options.bilstm.networks
    options = replace(options, bilstm=replace(options.bilstm, epochs=args.epochs, networks=networks, bad_wer=bad_wer,
                                              label=args.label))
    fit_samples = None
    if args.fit_all:  # more examples for the network; the cloud still decodes only the calibration subset
        fit_samples = replay(load_split(args.corpus, args.split), out / f"replays-{args.split}-all.jsonl")
    trained = fit_offramps(samples, options, cloud_edits, intent_evidence(model), fit_samples, replay.evidence)
    report = trained.report
    report["answers"] = answer_intent_accuracy(fit_samples or samples, model.read)
    report.update({"model": str(args.model), "split": args.split, "utterances": len(utterances),
                   "reader_corpora": [str(c) for c in reader_corpora],
                   "reader_learns_split": args.reader_learns_split,
                   "lm": agent.lm, "lm_weight": agent.final_search.lm_weight, "pilots": agent.pilot.schedule(),
                   "cloud_model": str(args.cloud_model) if args.cloud_model else None})
    trained.save(out)
    print(json.dumps({k: report[k] for k in ("samples", "bad_share")}, indent=None))
    print_report(report)
    print(f"wrote {out}")
    return 0


def run_show(args: argparse.Namespace) -> int:
    from pasu.device.offramp_train import OFFRAMP_DIR, THRESHOLDS, calibrated_pilots, load_thresholds

    folder = args.model if (args.model / THRESHOLDS).is_file() else args.model / OFFRAMP_DIR
    try:
        report = load_thresholds(folder)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    lm = f", LM {report['lm']} at {report['lm_weight']} in the final decode" if report.get("lm") else ""
    print(f"{folder}: calibrated on {report.get('utterances', '?')} {report.get('split', '?')} utterances of "
          f"{report.get('model', '?')}, cloud {report.get('cloud_model') or 'none'}{lm}")
    print(f"pilots: {calibrated_pilots(report).describe()}")
    print_report(report)
    return 0


def print_report(report: dict) -> None:
    """The device's intent accuracy on the replays, each offramp's thresholds and, with a cloud, Table 5."""
    if answers := report.get("answers"):
        print(f"intent accuracy of the device's answers on {answers['utterances']} replays: "
              f"{answers['answers']:.1%} with the intent reader, {answers['decoder']:.1%} the decoder's alone")
    print("\n".join(threshold_lines(report)))
    if "yardsticks" in report:
        print("\n".join(wer_target_table(report)))


def threshold_lines(report: dict) -> list[str]:
    """Each offramp's selectivity and Offload-L/M/H thresholds; a combined offramp's also as its parts' own
    thresholds, the pair the agent's ppl+intent policy takes."""
    from pasu.device.offramp_train import either_thresholds

    lines = []
    for name in (n for n in OFFRAMPS if n in report):
        lines.append(f"{name}{_learned(report[name].get('train'))}: {_selectivity(report[name]['selectivity'])}")
        if "selectivity_intent" in report[name]:  # the intent check, of the device's intent errors
            lines.append(f"  of intent errors: {_selectivity(report[name]['selectivity_intent'])}")
        for level, cal in report[name]["levels"].items():
            parts = ""
            if "scales" in report[name]:
                pairs = either_thresholds(report, name, level).items()
                parts = " (" + " or ".join(f"{part} > {t:.4g}" for part, t in pairs) + ")"
            wer = f", WER {cal['wer']:.1%}" if cal.get("wer") is not None else ""
            lines.append(f"  Offload-{level}: threshold {cal['threshold']:.4g}{parts} -> "
                         f"offload {cal['offload_ratio']:.1%}{wer}")
    return lines


def _learned(train: dict | None) -> str:
    """What a fitted network learned to predict, for the networks' lines (the BiLSTM's, the CNN's)."""
    if not train:
        return ""
    networks = f"mean of {n} networks, " if (n := train.get("networks", 1)) > 1 else ""
    if train.get("label") == "wer":
        return f" ({networks}learned the local WER)"
    return f" ({networks}learned local WER > {train.get('bad_wer', 0.1):g})"


def _selectivity(scores: dict) -> str:
    """How well an offramp's scores rank the label (calibration.selectivity) in words."""
    if scores["roc_auc"] is None:  # no utterances, or all of one class: nothing to rank
        return "not measurable (one class only)"
    return (f"ROC AUC {scores['roc_auc']:.3f}, average precision {scores['average_precision']:.3f} "
            f"({scores['positives']:.1%} positive)")


def wer_target_table(report: dict) -> list[str]:
    """The split's Table 5: the offload each ranking needs for each WER target, and that as a multiple of
    NaiveHybrid's; the oracles (`yardsticks`) show how much room the offramps leave."""
    naive = report["yardsticks"]["NaiveHybrid"]
    rows = {name: {t: cal and cal["offload_ratio"] for t, cal in report[name]["wer_targets"].items()}
            for name in OFFRAMPS if name in report}
    rows.update({name: row for name, row in report["yardsticks"].items() if name != "NaiveHybrid"})
    lines = ["offload needed for each WER target on these utterances (x NaiveHybrid's):",
             f"  {'WER target':13s}" + "".join(f"{t:>16s}" for t in naive),
             f"  {'NaiveHybrid':13s}" + "".join(f"{'-' if p is None else f'{p:.1%}':>16s}" for p in naive.values())]
    for name, row in rows.items():
        cells = [f"{r:.1%} ({r / naive[t]:.2f}x)" if r is not None and naive[t] else "-" for t, r in row.items()]
        lines.append(f"  {name:13s}" + "".join(f"{c:>16s}" for c in cells))
    return lines


def collect_split(model: DeviceModel, corpus: Path, split: str, utterances: Sequence[Utterance], cache: Path,
                  options: AgentOptions | None = None, jobs: int = 1) -> list:
    """Replays of `utterances` by the device model as an agent with `options` (default: the agent's defaults), from
    the cache when it holds exactly these, else made by `jobs` processes; an LM the options name must already be
    in the model (use_lm_of)."""
    from pasu.device.agent import AgentOptions
    from pasu.device.offramp_data import cache_key, collect, load_or_collect

    options = options or AgentOptions()
    reader = model.intent_mixture.digest() if model.intent_mixture else None
    key = cache_key(model.weights_id, split_manifest(corpus, split), [u.id for u in utterances], options, reader)
    return load_or_collect(cache, key, lambda: collect(model, utterances, options, progress_printer(split), jobs))


def reader_training_corpora(corpus: Path, reader_corpora: Sequence[Path]) -> list[Path]:
    """The corpora whose training sentences the intent reader learns: the calibration corpus's, unless it was
    rendered without a training split (then only for calibration), and each `--reader-corpus`'s."""
    if split_manifest(corpus, "train").is_file():
        return [corpus, *reader_corpora]
    if not reader_corpora:
        raise SystemExit(f"{corpus} has no training split for the intent reader to learn: render it "
                         f"(`pasu corpus build --splits train`) or name corpora that have one (--reader-corpus)")
    print(f"intent reader: {corpus} has no training split; it learns those of "
          f"{', '.join(map(str, reader_corpora))}", flush=True)
    return list(reader_corpora)


def fit_intent_reader(corpora: Sequence[Path], options: ReaderOptions | None = None,
                      also_split: str | None = None, also_corpus: Path | None = None) -> IntentReader:
    """The device's intent reader (`options`, default the device's: READER_CHAR_NGRAMS), on the distinct
    sentences of the corpora's training splits (the first corpus's label wins a sentence two corpora hold) and,
    with `also_split`, those of that split of `also_corpus` (default the first corpus) that they lack."""
    from pasu.device.held_out_reader import learned_sentences
    from pasu.models.intent_reader import IntentReader

    also = [f"{also_corpus or corpora[0]}:{also_split}"] if also_split else []
    learned_from = [f"{corpus}:train" for corpus in corpora] + also
    sentences = learned_sentences(learned_from)
    print(f"intent reader: fitting on {len(sentences)} sentences", flush=True)
    return IntentReader.fit(list(sentences), list(sentences.values()), options or device_reader_options(),
                            learned_from)


def device_reader_options() -> ReaderOptions:
    from pasu.device.intent_offramp import READER_CHAR_NGRAMS
    from pasu.models.intent_reader import ReaderOptions

    return ReaderOptions(char_ngram_max=READER_CHAR_NGRAMS)


def training_sentences(corpora: Sequence[Path], split: str = "train") -> dict[str, str]:
    """sentence -> intent over the distinct sentences of the corpora's `split` (the first corpus's label wins a
    sentence two corpora hold)."""
    from pasu.device.held_out_reader import learned_sentences

    return learned_sentences([f"{corpus}:{split}" for corpus in corpora])


class Replayer:
    """Replays utterances of a split by the device model (cached), each read by the model's own intent reader or,
    given fold readers (`held_out_reader.readers_without`), by the reader of its sentence's fold."""

    def __init__(self, model: DeviceModel, corpus: Path, split: str, readers: Sequence[IntentReader] | None = None,
                 options: AgentOptions | None = None, jobs: int = 1):
        self.model, self.corpus, self.split, self.readers, self.options = model, corpus, split, readers, options
        self.jobs = jobs  # processes replaying at once (offramp_data.collect)

    def __call__(self, utterances: Sequence[Utterance], cache: Path) -> list:
        if not self.readers:
            return collect_split(self.model, self.corpus, self.split, utterances, cache, self.options, self.jobs)
        from pasu.device.held_out_reader import read_by_fold

        def collect_fold(fold: int, positions: list[int]) -> list:
            part = [utterances[i] for i in positions]
            fold_cache = cache.with_name(f"{cache.stem}.fold{fold}{cache.suffix}")
            return collect_split(self.model, self.corpus, self.split, part, fold_cache, self.options, self.jobs)

        return read_by_fold(self.model, self.readers, [u.text for u in utterances], collect_fold)

    @property
    def evidence(self) -> Callable[[OfframpSample], IntentEvidence] | None:
        """replay -> the intent evidence it is judged by (its fold reader's); None: the model's own for all."""
        if not self.readers:
            return None
        from pasu.device.held_out_reader import fold_mixtures, sentence_fold
        from pasu.device.intent_offramp import IntentEvidence

        evidences = [IntentEvidence(m, self.model.read) for m in fold_mixtures(self.model, self.readers)]
        return lambda sample: evidences[sentence_fold(sample.reference.text, len(evidences))]


def cloud_word_edits(folder: Path, utterances: Sequence[Utterance], cache: Path) -> list[int]:
    """Word edits of the cloud model's transcripts (decoded here, offline: accuracy needs no network), from
    `cache` when it holds these utterances decoded by the same cloud weights."""
    from pasu.models.recognizer import load_recognizer

    recognizer = load_recognizer(folder)
    key = {"cloud": recognizer.model_id, "ids": [u.id for u in utterances]}
    if cache.is_file() and (cached := json.loads(cache.read_text()))["key"] == key:
        print(f"cloud decode: {len(utterances)} transcripts from {cache}", file=sys.stderr)
        return cached["edits"]
    progress = progress_printer("cloud decode")
    edits = []
    for i, utt in enumerate(utterances):
        edits.append(word_edits(utt.text, recognizer.recognize_batch([read_audio(utt.audio)])[0].text))
        progress(i + 1, len(utterances))
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"key": key, "edits": edits}))
    return edits


def progress_printer(label: str):
    """A progress callback that prints every 25 items to stderr."""

    def report(done: int, total: int) -> None:
        if done == total or done % 25 == 0:
            print(f"{label}: {done}/{total}", file=sys.stderr, flush=True)

    return report
