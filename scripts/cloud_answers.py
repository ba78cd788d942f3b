"""The cloud's answers (intent, transcript, word edits) for the utterances of a replay file, decoded offline once
and cached: what the offline offload checks (`scripts/intent_offramp_check.py`, `scripts/bilstm_more_data.py`)
price offloading with. Accuracy needs no network; about 0.9 s an utterance on 2 cores (15 minutes for 1,000).

    .venv/bin/python scripts/cloud_answers.py exp/hybrid29/replays-test.jsonl --split test --out exp/cloud-test1000.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from tqdm import tqdm

from pasu.device.offramp_data import load_samples
from pasu.metrics import word_edits
from pasu.models.data import load_split, read_audio
from pasu.models.recognizer import TextIntentPass, load_recognizer
from pasu.models.text_intent import TextIntentClassifier


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("replays", type=Path, help="a replay file (`pasu bench hybrid --out` or MODEL/offramp)")
    parser.add_argument("--split", default="test", help="the corpus split the replays are of")
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus-full"))
    parser.add_argument("--cloud", type=Path, default=Path("models/shipped/cloud"))
    parser.add_argument("--text-intent", type=Path, default=Path("models/shipped/text_intent"))
    parser.add_argument("--out", type=Path, required=True, help="JSON cache {id: {intent, text, edits}}; resumed")
    args = parser.parse_args()
    torch.set_num_threads(2)
    answers = json.loads(args.out.read_text()) if args.out.is_file() else {}
    utterances = {u.id: u for u in load_split(args.corpus, args.split)}
    todo = [s.id for s in load_samples(args.replays) if s.id not in answers]
    cloud = TextIntentPass(load_recognizer(args.cloud), TextIntentClassifier.load(args.text_intent))
    for i, uid in enumerate(tqdm(todo, desc="cloud answers", unit="utt")):
        utterance = utterances[uid]
        result = cloud.recognize_batch([read_audio(utterance.audio)])[0]
        answers[uid] = {"intent": result.intent, "text": result.text, "edits": word_edits(utterance.text, result.text)}
        if i % 50 == 49:  # resumable
            args.out.write_text(json.dumps(answers))
    args.out.write_text(json.dumps(answers))
    print(f"{len(answers)} answers in {args.out}")


if __name__ == "__main__":
    main()
