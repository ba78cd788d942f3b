"""Deterministic build plan: which sentence is rendered by which voice, how, and into which split."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:
    from pasu.corpus.text import CorpusText, Sentence

SPLITS = ("train", "dev", "test", "test_unseen")
DEFAULT_ENGINE_WEIGHTS = {"espeak": 0.3, "mbrola": 0.25, "festival": 0.2, "flite": 0.15, "pico": 0.1}


@dataclass(frozen=True)
class Preset:
    """How big a corpus to build."""

    name: str
    # training utterances to render; sentences are cycled (each rendered by several voices) to reach it
    train_utterances: int
    # caps on the evaluation sentences (None: every SLURP devel/test sentence)
    dev_sentences: int | None
    test_sentences: int | None
    # fraction of the voices held out of train/dev/test for `test_unseen` (at least `min_unseen_voices`)
    unseen_voice_fraction: float = 0.15
    min_unseen_voices: int = 2
    # per-utterance prosody ranges (relative to each engine's default)
    rate_range: tuple[float, float] = (0.85, 1.2)
    pitch_range: tuple[float, float] = (0.85, 1.15)
    # clips rendered once per build and mixed into babble noise
    babble_clips: int = 24
    # share of utterances per engine (relative); the more natural engines get more than their voice count
    engine_weights: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_ENGINE_WEIGHTS))


PRESETS: dict[str, Preset] = {
    "tiny": Preset("tiny", train_utterances=200, dev_sentences=40, test_sentences=40, babble_clips=6),
    "small": Preset("small", train_utterances=3000, dev_sentences=300, test_sentences=500),
    # synthetic commands average ~2.1 s (TTS speaks faster than people): 36k utterances give > 20 h
    "full": Preset("full", train_utterances=36000, dev_sentences=None, test_sentences=None),
}


@dataclass(frozen=True)
class Job:
    """One utterance to render."""

    utt_id: str
    split: str
    sentence: Sentence
    voice_id: str
    rate: float
    pitch: float
    # seeds the augmentation of this utterance alone, so any shard can be rebuilt independently
    seed: int


@dataclass(frozen=True)
class Plan:
    preset: Preset
    seen_voices: tuple[str, ...]
    unseen_voices: tuple[str, ...]
    jobs: tuple[Job, ...] = field(repr=False)

    def jobs_in(self, split: str) -> list[Job]:
        return [j for j in self.jobs if j.split == split]


def split_voices(voice_ids: Sequence[str], preset: Preset, seed: int) -> tuple[list[str], list[str]]:
    """Hold out about `unseen_voice_fraction` of each engine's voices for `test_unseen`.

    Per engine, so training keeps every engine and the held-out set spans them; an engine with fewer than
    three voices keeps them all for training.
    """
    rng = np.random.default_rng(seed)
    unseen: list[str] = []
    for engine, voices in sorted(_by_engine(voice_ids).items()):
        k = round(preset.unseen_voice_fraction * len(voices)) if len(voices) >= 3 else 0
        unseen += [str(v) for v in rng.permutation(voices)[:max(k, 1 if len(voices) >= 3 else 0)]]
    if len(unseen) < preset.min_unseen_voices:
        rest = [v for v in sorted(voice_ids) if v not in unseen]
        unseen += [str(v) for v in rng.permutation(rest)[:preset.min_unseen_voices - len(unseen)]]
    seen = [v for v in sorted(voice_ids) if v not in unseen]
    if not seen:
        raise ValueError(f"{len(voice_ids)} voices are too few to hold some out for test_unseen")
    return seen, sorted(unseen)


def _by_engine(voice_ids: Sequence[str]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for v in sorted(voice_ids):
        groups.setdefault(engine_of(v), []).append(v)
    return groups


def engine_of(voice_id: str) -> str:
    return voice_id.split(":", 1)[0]


def make_plan(text: CorpusText, voice_ids: Sequence[str], preset: Preset, seed: int = 0,
              train_variant: int = 0) -> Plan:
    """Assign every utterance its split, voice, prosody and augmentation seed, reproducibly for `seed`.

    `train_variant` > 0 deals the training split afresh (sentence order, voices, prosody, augmentation) while the
    held-out voices and the evaluation splits stay those of `seed`: more varied speech for the same corpus."""
    seen, unseen = split_voices(voice_ids, preset, seed)
    # one random stream per split: the evaluation splits stay the same whatever the training size
    rng = {split: np.random.default_rng([seed, k + 1]) for k, split in enumerate(SPLITS)}
    if train_variant:
        rng["train"] = np.random.default_rng([seed, 1, train_variant])
    dev = _take(text.dev, preset.dev_sentences, rng["dev"])
    test = _take(text.test, preset.test_sentences, rng["test"])
    train = _cycle(text.train, preset.train_utterances, rng["train"])
    jobs = (
        _jobs("train", train, seen, preset, rng["train"], variant=train_variant)
        + _jobs("dev", dev, seen, preset, rng["dev"])
        + _jobs("test", test, seen, preset, rng["test"])
        + _jobs("test_unseen", test, unseen, preset, rng["test_unseen"])
    )
    return Plan(preset, tuple(seen), tuple(unseen), tuple(jobs))


def _take(sentences: Sequence[Sentence], limit: int | None, rng: np.random.Generator) -> list[Sentence]:
    if limit is None or limit >= len(sentences):
        return list(sentences)
    return [sentences[i] for i in sorted(rng.choice(len(sentences), size=limit, replace=False))]


def _cycle(sentences: Sequence[Sentence], n: int, rng: np.random.Generator) -> list[Sentence]:
    """n sentences drawn as whole shuffled passes over the list, so every sentence gets about n/len renders."""
    if not sentences:
        raise ValueError("no training sentences")
    out: list[Sentence] = []
    while len(out) < n:
        out.extend(sentences[i] for i in rng.permutation(len(sentences)))
    return out[:n]


def _jobs(split: str, sentences: Sequence[Sentence], voices: Sequence[str], preset: Preset,
          rng: np.random.Generator, variant: int = 0) -> list[Job]:
    assigned = _deal_voices(len(sentences), voices, preset.engine_weights, rng)
    jobs = []
    for i, (sentence, voice) in enumerate(zip(sentences, assigned)):
        jobs.append(Job(
            utt_id=_utt_id(f"{split}{variant}" if variant else split, i, sentence, voice),  # ids unique across variants
            split=split,
            sentence=sentence,
            voice_id=voice,
            rate=round(float(rng.uniform(*preset.rate_range)), 3),
            pitch=round(float(rng.uniform(*preset.pitch_range)), 3),
            seed=int(rng.integers(2**31)),
        ))
    return jobs


def _deal_voices(n: int, voices: Sequence[str], engine_weights: dict[str, float],
                 rng: np.random.Generator) -> list[str]:
    """n voices: engines drawn by weight (espeak alone has ~100 variants and would swamp the others), then
    each engine's voices dealt in shuffled rounds so every voice gets an equal share."""
    groups = _by_engine(voices)
    engines = sorted(groups)
    weights = np.array([engine_weights.get(e, 1.0) for e in engines], dtype=float)
    picks = rng.choice(len(engines), size=n, p=weights / weights.sum())
    decks: dict[str, list[str]] = {e: [] for e in engines}
    out = []
    for k in picks:
        engine = engines[k]
        if not decks[engine]:
            decks[engine] = [str(v) for v in rng.permutation(groups[engine])]
        out.append(decks[engine].pop())
    return out


def _utt_id(split: str, index: int, sentence: Sentence, voice: str) -> str:
    digest = hashlib.sha1(f"{sentence.id}|{voice}".encode()).hexdigest()[:8]
    return f"{split}-{index:06d}-{digest}"
