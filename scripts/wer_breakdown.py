"""Where the device's word errors are, with the cloud's beside them: by TTS engine, by noise level, and on the
reference words that no training sentence holds. The measurement behind the device card's "Where the word
errors are" (issue 3's 12% WER bar).

Reads the device's answers from a replay file (`pasu bench hybrid --out`) and, when given, the cloud's answers
for the same utterances (`scripts/cloud_answers.py`, or the round trips `pasu bench hybrid` saved beside the
replays); no decoding, a few seconds.

    .venv/bin/python scripts/wer_breakdown.py exp/hybrid45/replays-test.jsonl --cloud-answers exp/cloud-test1000-14.json
    .venv/bin/python scripts/wer_breakdown.py exp/hybrid83/replays-test.jsonl --cloud-calls exp/hybrid83/calls-wifi.jsonl
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from pasu.bench.hybrid import saved_offloads
from pasu.device.offramp_cli import training_sentences
from pasu.device.offramp_data import load_samples
from pasu.metrics import word_edits
from pasu.models.asr_noise import aligned_words
from pasu.models.data import read_jsonl, split_manifest
from pasu.settings import shipped_model


def shipped_training_corpora() -> list[str]:
    """The corpora the shipped device's last run trained on, as its package records them: fresh renderings of every
    sentence its runs learned (SLURP's labelled training sentences and the pseudo-labelled ones; the slot swaps
    recombine their words)."""
    training = yaml.safe_load((shipped_model("device") / "config.yaml").read_text())["training"]
    return [training["corpus"], *training.get("extra_corpora", {})]


@dataclass
class Tally:
    """Word edits of each recognizer over a group of utterances."""

    utterances: int = 0
    words: int = 0
    edits: Counter = field(default_factory=Counter)  # recognizer -> word edits

    def wer(self, recognizer: str) -> float:
        return self.edits[recognizer] / self.words if self.words else 0.0


def cloud_transcripts(args: argparse.Namespace) -> dict[str, str] | None:
    """id -> the cloud's transcript, from --cloud-answers or --cloud-calls (None: neither given)."""
    if args.cloud_answers:
        return {uid: answer["text"] for uid, answer in json.loads(args.cloud_answers.read_text()).items()}
    if args.cloud_calls:
        ids, calls = saved_offloads(args.cloud_calls)
        # a failed round trip has no answer: the cloud heard nothing
        return {uid: call.result.text if call.result else "" for uid, call in zip(ids, calls)}
    return None


def training_words(corpora: Iterable[str]) -> set[str]:
    """Every word of the corpora's training sentences."""
    return {word for sentence in training_sentences([Path(c) for c in corpora]) for word in sentence.split()}


def condition_of(row: dict, by: str) -> str:
    """The utterance's TTS engine, or its SNR in 5-dB bins ('clean': no noise added)."""
    if by == "engine":
        return row["engine"]
    snr = row["augmentation"]["snr_db"]
    if snr is None:
        return "clean"
    low = int(snr // 5) * 5
    return f"{low}-{low + 5} dB"


def absent_word_misses(ref: str, hyp: str, known: set[str]) -> int:
    """How many reference words that no training sentence holds the transcript does not have in their place."""
    pairs, _ = aligned_words(ref, hyp)
    return sum(word != heard for word, heard in pairs if word not in known)


def group_order(label: str) -> tuple[bool, float, str]:
    """Engines by name; SNR bins from the noisiest, 'clean' last."""
    low = label.split("-")[0]
    return label == "clean", float(low) if low.isdigit() else 0.0, label


def print_table(title: str, tallies: dict[str, Tally], recognizers: list[str]) -> None:
    total = {name: sum(t.edits[name] for t in tallies.values()) for name in recognizers}
    print(f"\n{title}\n")
    print("| group | utterances | words | " + " | ".join(f"{n} WER | share of {n}'s edits" for n in recognizers) + " |")
    print("|---" * (3 + 2 * len(recognizers)) + "|")
    for group, tally in sorted(tallies.items(), key=lambda item: group_order(item[0])):
        cells = [f"{tally.wer(n):.1%} | {tally.edits[n] / max(total[n], 1):.1%}" for n in recognizers]
        print(f"| {group} | {tally.utterances} | {tally.words} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("replays", type=Path, help="a replay file of the device's answers")
    cloud = parser.add_mutually_exclusive_group()
    cloud.add_argument("--cloud-answers", type=Path, default=None, help="scripts/cloud_answers.py's JSON")
    cloud.add_argument("--cloud-calls", type=Path, default=None,
                       help="the round trips of a `pasu bench hybrid --out` folder (calls-PROFILE.jsonl)")
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus-full"))
    parser.add_argument("--split", default="test", help="the corpus split the replays are of")
    parser.add_argument("--training-corpora", nargs="+", default=None,
                        help="corpora whose training sentences count as known text (default: the shipped device's)")
    args = parser.parse_args()

    samples = load_samples(args.replays)
    if not samples:
        raise SystemExit(f"{args.replays}: no replays")
    manifest = {row["id"]: row for row in read_jsonl(split_manifest(args.corpus, args.split))}
    transcripts: dict[str, Callable[[str], str]] = {"device": {s.id: s.local.text for s in samples}.__getitem__}
    cloud = cloud_transcripts(args)
    if cloud is not None:
        transcripts["cloud"] = cloud.__getitem__
    known = training_words(args.training_corpora or shipped_training_corpora())

    groups: dict[str, dict[str, Tally]] = {"engine": defaultdict(Tally), "snr": defaultdict(Tally)}
    overall, absent, missed = Tally(), 0, Counter()
    for sample in samples:
        ref = sample.reference.text
        tallies = [overall, *(g[condition_of(manifest[sample.id], by)] for by, g in groups.items())]
        for tally in tallies:
            tally.utterances += 1
            tally.words += len(ref.split())
        for name, transcript in transcripts.items():
            hyp = transcript(sample.id)
            for tally in tallies:
                tally.edits[name] += word_edits(ref, hyp)
            missed[name] += absent_word_misses(ref, hyp, known)
        absent += sum(word not in known for word in ref.split())

    names = list(transcripts)
    print(f"{overall.utterances} `{args.split}` utterances, {overall.words} reference words; "
          + ", ".join(f"{n} WER {overall.wer(n):.1%}" for n in names))
    print_table("By TTS engine", groups["engine"], names)
    print_table("By noise (SNR of the added noise)", groups["snr"], names)
    print(f"\nReference words that no training sentence holds ({len(known):,} known word types): {absent} "
          f"({absent / overall.words:.1%} of the words)")
    for name in names:
        print(f"- {name}: {missed[name]} of them not recognized ({missed[name] / max(absent, 1):.0%}); WER with them "
              f"all right and nothing else changed {(overall.edits[name] - missed[name]) / overall.words:.1%}")


if __name__ == "__main__":
    main()
