"""A label the shipped device model never saw, taught by a warm start: what a team adding its own command gets.

Renders commands for a new intent, `iot_thermostat` with a new slot type `room` (nine phrasings x eight rooms for
training, three other phrasings for testing), with the corpus's seen voices for training and its held-out voices
for testing; puts them beside a random sample of the full corpus's training utterances (so the model keeps what it
knew) in a JSONL label file, and then runs exactly what a user runs:

    pasu corpus import-labels LABELS --out CORPUS
    pasu train --config models/configs/device_late_context.yaml --corpus CORPUS --out EXP
               --init-from models/shipped/device --package PKG ...
    pasu eval PKG --corpus CORPUS --splits test              # the new intent, new phrasings, new voices
    pasu eval MODEL --corpus data/corpus-full --splits test --limit N   # what it knew, before and after

and prints intent accuracy, SLU-F1 and WER side by side. About 12 minutes on 2 idle cores for the defaults.
Needs the TTS engines (`make tts`) and the full corpus (`make corpora`).

    .venv/bin/python scripts/new_label_check.py --out exp/new-label
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path

import soundfile as sf
from tqdm import tqdm

from pasu.corpus.build import read_manifest
from pasu.corpus.tts import SAMPLE_RATE, TTSError, render, voice_by_id

INTENT = "iot_thermostat"
ROOMS = ("kitchen", "bedroom", "living room", "bathroom", "office", "hallway", "dining room", "garage")
TRAIN_PHRASINGS = (
    "turn the heating up in the {room}", "make the {room} warmer", "set the thermostat in the {room} to twenty degrees",
    "turn down the heat in the {room}", "i am cold in the {room}", "increase the temperature in the {room}",
    "lower the temperature in the {room}", "switch the heating on in the {room}", "can you warm up the {room}",
)
TEST_PHRASINGS = ("please make it warmer in the {room}", "the {room} is too cold turn up the heat",
                  "decrease the heating in the {room}")
PASU = [sys.executable, "-m", "pasu.cli"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="working folder (labels, corpus, run, results)")
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus-full"), help="the full corpus")
    parser.add_argument("--model", type=Path, default=Path("models/shipped/device"), help="the package to start from")
    parser.add_argument("--keep", type=int, default=600, help="the corpus's training utterances kept beside (0: none)")
    parser.add_argument("--train-voices", type=int, default=3, help="seen voices rendering each training command")
    parser.add_argument("--steps", type=int, default=300, help="training steps")
    parser.add_argument("--limit", type=int, default=300, help="corpus test utterances for before/after")
    args = parser.parse_args()

    labels = write_labels(args)
    corpus, exp, package = args.out / "corpus", args.out / "exp", args.out / "pkg"
    run([*PASU, "corpus", "import-labels", str(labels), "--out", str(corpus)])
    run([*PASU, "train", "--config", "models/configs/device_late_context.yaml", "--corpus", str(corpus),
         "--out", str(exp), "--init-from", str(args.model), "--max-steps", str(args.steps), "--package", str(package),
         "--set", "optim.lr=0.0003", "--set", "optim.scheduler=warmup_linear", "--set", "optim.warmup_steps=30",
         "--set", "train.specaug=false", "--set", "eval.interval_steps=100", "--set", "eval.keep_best=2",
         "--set", "eval.best_metric=loss", "--set", "data.batch_seconds=24"])
    rows = {"new intent, after": evaluate(package, corpus, "test", None, args.out / "new.json"),
            "corpus test, before": evaluate(args.model, args.corpus, "test", args.limit, args.out / "before.json"),
            "corpus test, after": evaluate(package, args.corpus, "test", args.limit, args.out / "after.json")}
    print("\n| read | utterances | intent accuracy | SLU-F1 | WER |\n|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['n']} | {100 * r['intent_accuracy']:.1f}% | {100 * r['slu_f1']:.1f}% | "
              f"{100 * r['wer']:.1f}% |")


def write_labels(args: argparse.Namespace) -> Path:
    """Render the new commands and write the label file (the kept corpus utterances by their absolute paths)."""
    build = json.loads((args.corpus / "build.json").read_text())
    rng = random.Random(0)
    seen = [v for v in build["seen_voices"] if v.startswith("espeak:")]
    held_out = [v for v in build["unseen_voices"] if v.startswith("espeak:")]
    commands = [(p.format(room=room), room, "train") for p in TRAIN_PHRASINGS for room in ROOMS]
    commands += [(p.format(room=room), room, "test") for p in TEST_PHRASINGS for room in ROOMS]
    wav = args.out / "wav"
    wav.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, (text, room, split) in enumerate(tqdm(commands, desc="rendering", unit="command")):
        voices = rng.sample(held_out, 3) if split == "test" else rng.sample(seen, args.train_voices + 1)
        for j, voice in enumerate(voices):
            try:
                audio = render(voice_by_id(voice), text)
            except TTSError:
                continue
            name = f"wav/{i:03d}-{j}.wav"
            sf.write(args.out / name, audio, SAMPLE_RATE)
            row_split = "dev" if split == "train" and j == len(voices) - 1 else split  # one voice each for dev
            rows.append({"audio": name, "text": text, "intent": INTENT, "slots": [["room", room]],
                         "split": row_split, "speaker": voice})
    for split, count in (("train", args.keep), ("dev", args.keep // 6)):
        kept = read_manifest(args.corpus / f"{split}.jsonl")
        for r in rng.sample(kept, min(count, len(kept))):
            rows.append({"audio": str((args.corpus / r["audio"]).resolve()), "text": r["text"], "intent": r["intent"],
                         "slots": r["slots"], "split": split, "speaker": r["voice"], "id": r["id"]})
    path = args.out / "labels.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def evaluate(model: Path, corpus: Path, split: str, limit: int | None, out: Path) -> dict:
    command = [*PASU, "eval", str(model), "--corpus", str(corpus), "--splits", split, "--threads", "2",
               "--out", str(out)]
    run(command + (["--limit", str(limit)] if limit else []))
    return json.loads(out.read_text())[split]


def run(command: list[str]) -> None:
    print("$ pasu", " ".join(command[len(PASU):]), flush=True)
    subprocess.run(command, check=True)


if __name__ == "__main__":
    main()
