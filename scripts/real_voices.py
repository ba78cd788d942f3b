"""Real voices beside synthetic ones: how the device and the cloud recognize recorded speech of the same words.

Every corpus utterance is TTS; this is the one check on recorded human speech that the shared data allows. The
Free Spoken Digit Dataset (`real_speech/fsdd` in the shared data folder: "zero" ... "nine", 6 speakers, 8 kHz,
the digit in the file name) gives the recordings: a fixed random sample per speaker, resampled to 16 kHz. The
same digits, in the same order, are rendered by the corpus's TTS voices (round robin over the usable voices of
`pasu/corpus/voices.json`) and passed through 8 kHz as the recordings were, so that the two sides differ in the
voice, not in the band. Both sides are then levelled alike, as a device's gain control would (peak 0.9, the TTS
renders' own), with 0.25 s of near-silence on each side: the recordings are cut tight (about 0.3 s, some with a
peak of 0.02), where the corpus's commands start and end with room noise.

Each recognizer decodes both sides (the device with the paper's full decode, beam 5 and CTC weight 0.3, as
`pasu eval` does; the cloud as it serves) and the script prints the word error rate and the share of words
heard right (the digit and nothing else) side by side. No intent: a lone digit is no command, and the models
learned commands, so both sides are hard; the gap between them is what the voices cost. About 8 minutes for
50 per speaker on 2 idle cores, mostly the cloud.

    .venv/bin/python scripts/real_voices.py --per-speaker 50 --out exp/real-voices.json
"""

from __future__ import annotations

import argparse
import json
import random
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from pasu.corpus.tts import PEAK_LEVEL, render, usable_voice_ids, voice_by_id
from pasu.device.audio import SAMPLE_RATE as RATE
from pasu.device.audio import prepare
from pasu.metrics import corpus_wer
from pasu.models.evaluate import EvalOptions
from pasu.models.data import read_audio
from pasu.models.recognizer import load_recognizer
from pasu.settings import shared_data_dir, shipped_model

DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
RECORDED_RATE = 8000  # FSDD's
PAD_SECONDS = 0.25  # near-silence added before and after each word


def sample_recordings(folder: Path, per_speaker: int, seed: int) -> list[tuple[Path, str, str]]:
    """[(file, speaker, word)]: `per_speaker` recordings of each speaker, a fixed random choice."""
    by_speaker: dict[str, list[Path]] = defaultdict(list)
    for path in sorted(folder.glob("*.wav")):
        by_speaker[path.stem.split("_")[1]].append(path)
    rng = random.Random(seed)
    chosen = [(path, speaker) for speaker, paths in sorted(by_speaker.items())
              for path in rng.sample(paths, min(per_speaker, len(paths)))]
    return [(path, speaker, DIGITS[int(path.stem.split("_")[0])]) for path, speaker in chosen]


def synthetic(word: str, voice_id: str) -> np.ndarray:
    """The word in a TTS voice, band-limited through 8 kHz like the recordings."""
    narrow = prepare(render(voice_by_id(voice_id), word), RATE, RECORDED_RATE)
    return prepare(narrow, RECORDED_RATE, RATE)


def levelled(audio: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """At the TTS renders' peak level, between 0.25 s of faint noise on each side (no digital silence)."""
    pad = int(PAD_SECONDS * RATE)
    speech = audio * (PEAK_LEVEL / max(float(np.max(np.abs(audio))), 1e-6))
    padded = np.concatenate([np.zeros(pad), speech, np.zeros(pad)])
    return (padded + 1e-4 * rng.standard_normal(len(padded))).astype(np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=None, help="shared data folder (default: ../shared/data)")
    parser.add_argument("--per-speaker", type=int, default=50, help="recordings per speaker (6 speakers)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", type=Path, default=shipped_model("device"),
                        help="device model folder, decoded as `pasu eval` does (beam 5)")
    parser.add_argument("--cloud", type=Path, default=shipped_model("cloud"),
                        help="cloud model folder, decoded as `pasu cloud serve` does")
    parser.add_argument("--out", type=Path, default=None, help="JSON with every answer")
    args = parser.parse_args()
    torch.set_num_threads(2)
    folder = shared_data_dir(args.data_dir) / "real_speech" / "fsdd" / "recordings"
    if not folder.is_dir():
        raise SystemExit(f"no FSDD recordings at {folder}: set --data-dir or $PASU_SHARED_DATA")
    rows = sample_recordings(folder, args.per_speaker, args.seed)
    voices = usable_voice_ids()
    words = [word for _, _, word in rows]
    rng = np.random.default_rng(args.seed)
    real = [levelled(read_audio(path), rng) for path, _, _ in rows]
    tts = [levelled(synthetic(word, voices[i % len(voices)]), rng)
           for i, word in enumerate(tqdm(words, desc="TTS", unit="word"))]
    report = {"utterances": len(rows), "speakers": sorted({s for _, s, _ in rows}), "voices": len(voices), "models": {}}
    print(f"{len(rows)} recordings of {len(report['speakers'])} speakers; the same words by {len(voices)} TTS voices")
    print("| model | real voices WER % | TTS voices WER % | real voices right % | TTS voices right % |\n"
          "|---|---|---|---|---|")
    for name, recognizer in (("device", load_recognizer(args.device, EvalOptions().decoding)),
                             ("cloud", load_recognizer(args.cloud))):
        heard = {side: [recognizer.recognize_batch([audio])[0].text for audio in tqdm(audios, desc=f"{name} {side}")]
                 for side, audios in (("real", real), ("tts", tts))}
        wer = {side: corpus_wer(words, texts) for side, texts in heard.items()}
        right = {side: sum(text.strip() == word for word, text in zip(words, texts)) / len(words)
                 for side, texts in heard.items()}  # the digit and nothing else
        by_speaker = {s: corpus_wer([w for (_, sp, w) in rows if sp == s],
                                         [t for (_, sp, _), t in zip(rows, heard["real"]) if sp == s])
                      for s in report["speakers"]}
        report["models"][name] = {"wer": wer, "right": right, "real_wer_by_speaker": by_speaker, "heard": heard}
        print(f"| {name} | {100 * wer['real']:.1f} | {100 * wer['tts']:.1f} | {100 * right['real']:.1f} "
              f"| {100 * right['tts']:.1f} |")
        print("  real voices by speaker: " + ", ".join(f"{s} {100 * w:.0f}%" for s, w in by_speaker.items()))
    if args.out:
        report["files"] = [str(path.relative_to(folder)) for path, _, _ in rows]
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
