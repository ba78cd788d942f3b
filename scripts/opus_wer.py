"""The cloud's WER on audio sent as 16-bit PCM or as Ogg Opus at several compression levels (bitrates), decoded
offline: how much the lossy upload costs, the measurement behind `device/cloud_client.py`'s Opus level.

    .venv/bin/python scripts/opus_wer.py --utterances 150 --levels default 0.8
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import numpy as np
import soundfile
import torch
from tqdm import tqdm

from pasu.cloud.validation import AudioLimits, decode_audio
from pasu.device.cloud_client import encode_audio
from pasu.metrics import corpus_wer
from pasu.models.data import dev_subset, load_split, read_audio
from pasu.models.whisper_recognizer import WhisperRecognizer
from pasu.protos import slu_pb2

LIMITS = AudioLimits(sample_rate=16000, min_seconds=0.0, max_seconds=60.0)


def through_opus(waveform: np.ndarray, level: float | None) -> tuple[np.ndarray, int]:
    """The waveform as the server decodes it after an Opus upload at `level` (None: libsndfile's default), and
    the file's bytes; the samples are the device's 16-bit ones (`encode_audio`), only the level differs."""
    pcm = np.frombuffer(encode_audio(waveform, "pcm16")[1], "<i2")
    buffer = io.BytesIO()
    soundfile.write(buffer, pcm, 16000, format="OGG", subtype="OPUS", compression_level=level)
    data = buffer.getvalue()
    return decode_audio(slu_pb2.OGG_OPUS, 16000, data, LIMITS), len(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cloud", type=Path, default=Path("models/shipped/cloud"), help="cloud model folder")
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus-full"))
    parser.add_argument("--split", default="test")
    parser.add_argument("--utterances", type=int, default=150, help="the fixed random subset `bench hybrid` uses")
    parser.add_argument("--levels", nargs="+", default=["default", "0.8"],
                        help="Opus compression levels in [0, 1] (0: highest bitrate), or 'default'")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    recognizer = WhisperRecognizer.from_folder(args.cloud)
    utterances = dev_subset(load_split(args.corpus, args.split), args.utterances)
    audio = [read_audio(u.audio) for u in utterances]
    seconds = sum(len(a) for a in audio) / 16000
    refs = [u.text for u in utterances]
    for level in ["pcm", *args.levels]:
        sizes, hyps = [], []
        for waveform in tqdm(audio, desc=f"cloud on {level}", leave=False):
            if level == "pcm":
                heard, size = waveform, 2 * len(waveform)
            else:
                heard, size = through_opus(waveform, None if level == "default" else float(level))
            sizes.append(size)
            hyps.append(recognizer.recognize_batch([heard])[0].text)
        print(f"{level:>8}: {8 * sum(sizes) / seconds / 1000:6.1f} kb/s, WER {100 * corpus_wer(refs, hyps):.1f}%",
              flush=True)


if __name__ == "__main__":
    main()
