"""Training data: corpus manifests -> duration-bucketed, padded batches for ESPnetASRModel.forward."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from pasu.device.audio import prepare
from pasu.models.frontend import SAMPLE_RATE, compute_global_stats
from pasu.models.targets import encode_target
from pasu.models.tokenizer import Tokenizer
from pasu.slu import Slot

IGNORE_ID = -1  # ESPnetASRModel's ignore_id: text padding


@dataclass(frozen=True)
class Utterance:
    """One manifest row, reduced to what training needs."""

    id: str
    audio: Path  # absolute path of the 16 kHz mono FLAC
    duration: float  # seconds, from the manifest (used for bucketing without opening files)
    target: str  # encode_target() string: intent, words, slot markup
    text: str  # plain transcript (WER reference)
    intent: str
    slots: tuple[Slot, ...] | None  # None: slots unknown for this row


@dataclass(frozen=True)
class Batch:
    """Padded tensors for ESPnetASRModel.forward plus the ids of the utterances in it."""

    ids: list[str]
    speech: torch.Tensor  # (B, N) float32 waveforms, zero padded
    speech_lengths: torch.Tensor  # (B,) samples
    text: torch.Tensor  # (B, L) token ids, padded with IGNORE_ID
    text_lengths: torch.Tensor  # (B,)

    def model_inputs(self, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        """Keyword arguments of ESPnetASRModel.forward."""
        return {
            "speech": self.speech.to(device),
            "speech_lengths": self.speech_lengths.to(device),
            "text": self.text.to(device),
            "text_lengths": self.text_lengths.to(device),
        }


def read_jsonl(path: Path) -> list[dict]:
    """Rows of a JSONL manifest."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


class MissingSplitError(FileNotFoundError):
    """The corpus has no manifest for a split (a partial build, a mistyped name): the CLIs print it, no traceback."""


def split_manifest(corpus_dir: str | Path, split: str) -> Path:
    """Where a corpus keeps a split's manifest (`pasu corpus build` writes `<corpus_dir>/<split>.jsonl`)."""
    return Path(corpus_dir) / f"{split}.jsonl"


def load_split(corpus_dir: str | Path, split: str) -> list[Utterance]:
    """Utterances of `<corpus_dir>/<split>.jsonl` with their targets encoded."""
    corpus_dir = Path(corpus_dir)
    manifest = split_manifest(corpus_dir, split)
    if not manifest.is_file():
        built = sorted(p.stem for p in corpus_dir.glob("*.jsonl")) if corpus_dir.is_dir() else []
        raise MissingSplitError(f"{manifest} not found: the corpus has no {split!r} split (it has: "
                                f"{', '.join(built) or 'none'}); render it with `pasu corpus build --splits {split}`")
    return [utterance_from_row(row, corpus_dir) for row in read_jsonl(manifest)]


def utterance_from_row(row: dict, corpus_dir: Path) -> Utterance:
    """One `pasu corpus build` manifest row as an Utterance (audio paths relative to `corpus_dir`)."""
    slots = None if row.get("slots") is None else tuple(Slot(str(t), str(v)) for t, v in row["slots"])
    return Utterance(
        id=row["id"],
        audio=(corpus_dir / row["audio"]).resolve(),
        duration=float(row["duration"]),
        target=encode_target(row["text"], row["intent"], slots),
        text=row["text"],
        intent=row["intent"],
        slots=slots,
    )


def read_audio(path: Path) -> np.ndarray:
    """Mono float32 waveform at 16 kHz: channels averaged, other rates resampled (on every read, so a corpus
    trained on for many epochs is better resampled once, up front)."""
    wave, sr = sf.read(path, dtype="float32", always_2d=False)
    return prepare(wave, sr, SAMPLE_RATE, source=str(path))


class SpeechDataset(torch.utils.data.Dataset):
    """Index -> (id, waveform, token ids); audio is read on access, so memory stays flat."""

    def __init__(self, utterances: Sequence[Utterance], tokenizer: Tokenizer):
        self.utterances = list(utterances)
        self.tokenizer = tokenizer

    def __len__(self) -> int:
        return len(self.utterances)

    def __getitem__(self, index: int) -> tuple[str, np.ndarray, list[int]]:
        utt = self.utterances[index]
        return utt.id, read_audio(utt.audio), self.tokenizer.encode(utt.target)


def collate(items: Sequence[tuple[str, np.ndarray, list[int]]]) -> Batch:
    """Pad waveforms with zeros and token ids with IGNORE_ID."""
    ids, waves, tokens = zip(*items)
    speech_lengths = torch.tensor([len(w) for w in waves], dtype=torch.long)
    speech = torch.zeros(len(waves), int(speech_lengths.max()))
    for i, w in enumerate(waves):
        speech[i, : len(w)] = torch.from_numpy(w)
    text_lengths = torch.tensor([len(t) for t in tokens], dtype=torch.long)
    text = torch.full((len(tokens), max(int(text_lengths.max()), 1)), IGNORE_ID, dtype=torch.long)
    for i, t in enumerate(tokens):
        text[i, : len(t)] = torch.tensor(t, dtype=torch.long)
    return Batch(list(ids), speech, speech_lengths, text, text_lengths)


def bucket_batches(
    durations: Sequence[float], max_seconds: float, seed: int | None = None, epoch: int = 0
) -> list[list[int]]:
    """Index batches of similar duration whose PADDED audio (size x longest) is <= max_seconds.

    With a seed, durations get a +-10% jitter before sorting (so batch membership changes from epoch to
    epoch) and the batch order is shuffled, both from (seed, epoch) alone: resuming at batch k of an epoch
    sees exactly the batches an uninterrupted run would. Without a seed the order is by duration (eval).
    An utterance longer than max_seconds gets a batch of its own.
    """
    rng = random.Random(f"{seed}-{epoch}") if seed is not None else None
    keys = [d * (1 + 0.1 * (2 * rng.random() - 1)) if rng else d for d in durations]
    order = sorted(range(len(durations)), key=lambda i: (keys[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0.0
    for i in order:
        candidate = max(longest, durations[i])
        if current and candidate * (len(current) + 1) > max_seconds:
            batches.append(current)
            current, candidate = [], durations[i]
        current.append(i)
        longest = candidate
    if current:
        batches.append(current)
    if rng:
        rng.shuffle(batches)
    return batches


def batch_loader(
    dataset: SpeechDataset, batches: Sequence[Sequence[int]], num_workers: int = 0
) -> Iterator[Batch]:
    """Batches in the given order (a DataLoader so audio decoding can overlap the training step)."""
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_sampler=[list(b) for b in batches],
        collate_fn=collate,
        num_workers=num_workers,
        # Its own generator: a DataLoader draws a worker seed from the global RNG per iterator, which would
        # make dropout/SpecAugment depend on how often evaluation ran (and break exact resumes).
        generator=torch.Generator(),
    )
    return iter(loader)


def dev_subset(utterances: Sequence[Utterance], size: int, seed: int = 0) -> list[Utterance]:
    """A fixed random subset (same for every evaluation and every resume), in manifest order."""
    if size <= 0 or size >= len(utterances):
        return list(utterances)
    chosen = sorted(random.Random(seed).sample(range(len(utterances)), size))
    return [utterances[i] for i in chosen]


def sample_global_stats(
    utterances: Sequence[Utterance], num_utterances: int = 500, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Global log-mel mean/std (compute_global_stats) over a random sample of training audio."""
    sample = dev_subset(utterances, num_utterances, seed)
    return compute_global_stats(read_audio(u.audio) for u in sample)


# --- A synthetic corpus for tests and smoke runs ---------------------------------------------------------

_SYNTHETIC_ROWS: tuple[tuple[str, str, tuple[tuple[str, str], ...] | None], ...] = (
    ("wake me up at five am", "alarm_set", (("time", "five am"),)),
    ("set an alarm for six thirty", "alarm_set", (("time", "six thirty"),)),
    ("what's the weather in paris", "weather_query", (("place_name", "paris"),)),
    ("will it rain tomorrow", "weather_query", (("weather_descriptor", "rain"), ("date", "tomorrow"))),
    ("play some jazz", "play_music", (("music_genre", "jazz"),)),
    ("turn off the lights", "iot_hue_lightoff", ()),
    ("remind me to call mum tomorrow", "calendar_set", None),  # slots unknown, as slurpfood-only rows
    ("good afternoon how are you", "general_greet", None),
)


def write_synthetic_corpus(
    out_dir: str | Path, n_train: int = 16, n_dev: int = 8, seed: int = 0
) -> Path:
    """A tiny corpus folder (train.jsonl, dev.jsonl, FLAC files) in the manifest format of `pasu corpus`.

    Each word is a 0.15 s tone whose pitch depends on the word, plus noise: learnable, so a few training
    steps show the loss falling. For tests and smoke runs only.
    """
    out_dir = Path(out_dir)
    (out_dir / "audio").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for split, n in (("train", n_train), ("dev", n_dev)):
        rows = []
        for i in range(n):
            text, intent, slots = _SYNTHETIC_ROWS[(i + (split == "dev")) % len(_SYNTHETIC_ROWS)]
            wave = _tones(text, rng)
            rel = f"audio/{split}-{i:04d}.flac"
            sf.write(out_dir / rel, wave, SAMPLE_RATE, subtype="PCM_16")
            scenario, action = intent.split("_", 1)
            rows.append({
                "id": f"{split}-{i:04d}", "audio": rel, "duration": len(wave) / SAMPLE_RATE, "engine": "synthetic",
                "voice": "tone", "augmentation": "none", "text": text, "scenario": scenario, "action": action,
                "intent": intent, "slots": None if slots is None else [list(s) for s in slots],
                "sentence_id": f"s{i % len(_SYNTHETIC_ROWS)}", "source": "synthetic",
            })
        (out_dir / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out_dir


def _tones(text: str, rng: np.random.Generator, word_seconds: float = 0.15) -> np.ndarray:
    t = np.arange(int(word_seconds * SAMPLE_RATE)) / SAMPLE_RATE
    parts = [np.zeros(1600)]
    for word in text.split():
        freq = 200 + 60 * (sum(map(ord, word)) % 40)
        parts.append(0.3 * np.sin(2 * np.pi * freq * t))
    wave = np.concatenate(parts + [np.zeros(1600)])
    return (wave + 0.01 * rng.standard_normal(len(wave))).astype(np.float32)
