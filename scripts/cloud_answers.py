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
from pasu.models.data import Utterance, load_split, read_audio
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
    utterances = {u.id: u for u in load_split(args.corpus, args.split)}
    answers = cloud_answers([utterances[s.id] for s in load_samples(args.replays)], args.out, args.cloud,
                            args.text_intent)
    print(f"{len(answers)} answers in {args.out}")


def cloud_answers(utterances: list[Utterance], cache: Path, cloud_model: Path = Path("models/shipped/cloud"),
                  text_intent: Path = Path("models/shipped/text_intent")) -> dict:
    """id -> the cloud's {intent, text, edits} for each utterance, decoded once and cached in `cache` (resumed)."""
    answers = json.loads(cache.read_text()) if cache.is_file() else {}
    todo = [u for u in utterances if u.id not in answers]
    if not todo:
        return answers
    cloud = TextIntentPass(load_recognizer(cloud_model), TextIntentClassifier.load(text_intent))
    for i, utterance in enumerate(tqdm(todo, desc="cloud answers", unit="utt")):
        result = cloud.recognize_batch([read_audio(utterance.audio)])[0]
        answers[utterance.id] = {"intent": result.intent, "text": result.text,
                                 "edits": word_edits(utterance.text, result.text)}
        if i % 50 == 49:  # resumable
            cache.write_text(json.dumps(answers))
    cache.write_text(json.dumps(answers))
    return answers


if __name__ == "__main__":
    main()
