"""What the cloud server runs: a batch of waveforms in, one SLU result with a confidence per waveform out.

The server only knows the `Recognizer` protocol; `EspnetRecognizer` is the shipped implementation, a PASU
model folder (`pasu package`) decoded with ESPnet's `BatchBeamSearch` (attention decoder + CTC prefix scorer
+ length bonus, the hybrid CTC/attention decoding of ESPnet's `Speech2Text`). `TextIntentPass` wraps a
recognizer with a second pass that re-reads its transcripts with a text intent classifier.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import torch
from scipy.special import softmax

from espnet.nets.scorer_interface import BatchScorerInterface
from pasu.metrics import SluResult

if TYPE_CHECKING:
    from pasu.models.lm import PackagedLm
    from pasu.models.text_intent import TextIntentClassifier


@dataclass(frozen=True)
class Recognition(SluResult):
    """One utterance's SLU result and how sure the model is of it."""

    confidence: float = 0.0  # in [0, 1]; EspnetRecognizer: 1 / perplexity of the decoder over the best hypothesis
    # what the recognizer itself heard of the intent, for a text pass that re-reads the transcript: a weighted
    # log-probability per intent, added to the text classifier's (TextIntentPass); (): nothing to add
    intent_evidence: tuple[tuple[str, float], ...] = ()
    # the transcripts the recognizer weighed, `text` among them, each with its probability, for a text pass
    # that reads them all (TextIntentPass); (): `text` alone
    alternatives: tuple[tuple[str, float], ...] = ()


@runtime_checkable
class Recognizer(Protocol):
    """A model the server can batch requests into. Called from one worker thread at a time."""

    model_id: str  # reported in every response: which model (and weights) answered
    sample_rate: int  # Hz the model expects; the server rejects other rates instead of resampling

    def recognize_batch(self, waveforms: list[np.ndarray]) -> list[Recognition]:
        """One result per 1-D float32 waveform in [-1, 1], in the same order."""
        ...


@dataclass(frozen=True)
class DecodingOptions:
    """Beam search settings; the defaults are the cloud's (wider beam than the device's 5)."""

    beam_size: int = 10  # hypotheses kept per step
    ctc_weight: float = 0.3  # CTC prefix score weight; the attention decoder gets 1 - ctc_weight
    length_bonus: float = 0.0  # added per emitted token (ESPnet's `penalty`); > 0 favours longer outputs
    maxlenratio: float = 0.0  # max output tokens = ratio * encoder frames; 0: up to the frame count, end detection
    minlenratio: float = 0.0  # min output tokens = ratio * encoder frames
    ban_slots_unknown: bool = True  # never emit SLOTS_UNKNOWN: it would skip slot markup (see models/targets.py)
    num_threads: int | None = None  # torch intra-op threads for inference; None keeps torch's setting
    # Shallow fusion: a `pasu lm train` folder whose log-probability of each token, times lm_weight, is added to
    # the search's scores (ESPnet's `lm` scorer); it must read the ASR model's token list. None: no LM.
    lm: str | None = None
    lm_weight: float = 0.3  # the LM's weight next to decoder and CTC (ESPnet's lm_weight); used only with `lm`


class _TokenBan(BatchScorerInterface):
    """Full scorer that gives some tokens a prohibitive score, so beam search never picks them."""

    # A large finite penalty rather than -inf: -inf - -inf in later score arithmetic would be NaN.
    PENALTY = -1.0e10

    def __init__(self, vocab_size: int, banned: Sequence[int]):
        self.row = torch.zeros(vocab_size)
        self.row[list(banned)] = self.PENALTY

    def init_state(self, x: torch.Tensor) -> None:
        return None

    def select_state(self, state: Any, i: int, new_id: int | None = None) -> None:
        return None

    def batch_init_state(self, x: torch.Tensor) -> None:
        return None

    def score(self, y: torch.Tensor, state: Any, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        return self.row.to(x.device, x.dtype), None

    def batch_score(self, ys: torch.Tensor, states: Any, xs: torch.Tensor) -> tuple[torch.Tensor, None]:
        return self.row.to(xs.device, xs.dtype).expand(ys.size(0), -1), None

    def final_score(self, state: Any) -> float:
        return 0.0


class EspnetRecognizer:
    """Hybrid CTC/attention decoding of an ESPnetASRModel whose target is `intent words-with-slot-markup`.

    A batch is encoded in one padded forward pass; the beam search then runs per utterance, because ESPnet's
    BatchBeamSearch batches hypotheses of one utterance, not utterances.
    """

    def __init__(self, model: Any, tokenizer: Any, options: DecodingOptions = DecodingOptions(),
                 model_id: str = "espnet", sample_rate: int = 16000):
        # model: espnet2 ESPnetASRModel in eval mode; tokenizer: pasu.models.tokenizer.Tokenizer (or anything
        # with token_list, decode(ids) and token_id(token)).
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.options = options
        self.model_id = model_id
        self.sample_rate = sample_rate
        self.lm = _load_lm(options, tokenizer.token_list)  # once: every batch builds a new search over it
        if options.num_threads is not None:
            torch.set_num_threads(options.num_threads)

    @classmethod
    def from_folder(cls, folder: str | os.PathLike, options: DecodingOptions = DecodingOptions()) -> EspnetRecognizer:
        """Load a PASU model folder (config.yaml, model.pt, tokenizer.model)."""
        from pasu.models.package import load_packaged

        folder = Path(folder)
        model, tokenizer, config = load_packaged(folder)
        model_id = packaged_weights_id(folder, config)
        rate = int(config["model"].get("frontend_conf", {}).get("fs", 16000))
        recognizer = cls(model, tokenizer, options, model_id=model_id, sample_rate=rate)
        if recognizer.lm is not None:  # the LM is part of what answered
            recognizer.model_id += f"+{recognizer.lm.name}@{weights_digest(recognizer.lm.weights)}"
        return recognizer

    def recognize_batch(self, waveforms: list[np.ndarray]) -> list[Recognition]:
        if not waveforms:
            return []
        with torch.inference_mode():
            encoded, lengths = self._encode(waveforms)
            search = self._beam_search()  # per call: BatchBeamSearch keeps per-search state on itself
            return [self._decode_one(search, encoded[i, : lengths[i]]) for i in range(len(waveforms))]

    def _encode(self, waveforms: list[np.ndarray]) -> tuple[torch.Tensor, list[int]]:
        lengths = torch.tensor([len(w) for w in waveforms])
        speech = torch.zeros(len(waveforms), int(lengths.max()))
        for i, w in enumerate(waveforms):
            speech[i, : len(w)] = torch.from_numpy(np.asarray(w, dtype=np.float32))
        encoded, encoded_lengths = self.model.encode(speech, lengths)
        return encoded, encoded_lengths.tolist()

    def _beam_search(self) -> Any:
        return espnet_beam_search(self.model, self.tokenizer.token_list, self.options, lm=self.lm)

    def _decode_one(self, search: Any, encoded: torch.Tensor) -> Recognition:
        from pasu.models.targets import decode_target

        o = self.options
        maxlenratio = o.maxlenratio
        if maxlenratio < 0:
            # A fixed cap longer than the input crashes ESPnet's CTC prefix scorer (it indexes frame
            # `output length`); a CTC path cannot emit more tokens than frames anyway.
            maxlenratio = -float(min(-maxlenratio, encoded.size(0)))
        hyps = search(x=encoded, maxlenratio=maxlenratio, minlenratio=o.minlenratio)
        if not hyps:  # nothing reached <eos>: an empty answer the client can treat as low confidence
            return Recognition(text="", intent="", slots=(), confidence=0.0)
        best = hyps[0]
        ids = [int(t) for t in best.yseq[1:-1]]  # drop <sos> and <eos>
        slu = decode_target(self.tokenizer.decode(ids))
        return Recognition(text=slu.text, intent=slu.intent, slots=slu.slots, confidence=_confidence(best))


def load_recognizer(folder: str | os.PathLike, options: DecodingOptions = DecodingOptions()) -> Recognizer:
    """The recognizer a model folder holds: a Whisper folder (whisper.yaml) or a PASU/ESPnet package."""
    from pasu.models.whisper_recognizer import WhisperRecognizer, is_whisper_folder

    if is_whisper_folder(folder):
        return WhisperRecognizer.from_folder(folder, options)
    if not (Path(folder) / "config.yaml").is_file():
        raise FileNotFoundError(f"{folder}: no model folder there (a `pasu package` folder holds config.yaml, a "
                                "Whisper folder whisper.yaml)")
    return EspnetRecognizer.from_folder(folder, options)


def is_model_folder(folder: str | os.PathLike) -> bool:
    """Whether `load_recognizer` has something to load there (an LM folder has a config.yaml too, but is none)."""
    import yaml
    from pasu.models.lm import LM_KIND
    from pasu.models.whisper_recognizer import is_whisper_folder

    config = Path(folder) / "config.yaml"
    if config.is_file():
        return (yaml.safe_load(config.read_text()) or {}).get("kind") != LM_KIND
    return is_whisper_folder(folder)


class TextIntentPass:
    """A recognizer whose intents come from a text classifier reading its transcripts (the cloud's second pass).

    The rule: every non-empty transcript takes the intent with the highest log P(intent | words) under the
    classifier (averaged over the recognizer's alternatives under their probabilities, when it gives some,
    `Recognition.alternatives`: a runner-up transcript may have kept the word the intent hangs on) plus the
    recognizer's own evidence on the intent (`Recognition.intent_evidence`, weighed by the recognizer: the cloud's
    SLU model heard the audio, so it can hold on to the intent where the words came out wrong); an empty transcript
    keeps the recognizer's answer, there being nothing to read. The recognizer's intent itself is not weighed in:
    its confidence is a perplexity over the whole hypothesis, not a probability of its intent, while the classifier
    (pretrained sentence encoder and a TF-IDF reader, 8k training sentences) is the more accurate intent reader on
    text (86% on SLURP test gold transcripts, see its model card). The answer's confidence is the product of the
    recognizer's confidence and the intent's posterior: both the words and their reading must be right. The
    transcript stays the recognizer's, and so do its slots; a recognizer that gives none (Whisper writes words only)
    gets the classifier's slot tagger's, when its folder has one.
    """

    def __init__(self, inner: Recognizer, classifier: TextIntentClassifier):
        self.inner = inner
        self.classifier = classifier
        self.model_id = f"{inner.model_id}+{classifier.model_id}"
        self.sample_rate = inner.sample_rate

    def recognize_batch(self, waveforms: list[np.ndarray]) -> list[Recognition]:
        results = list(self.inner.recognize_batch(waveforms))
        readable = [i for i, r in enumerate(results) if r.text.strip()]
        readings = self._readings([results[i] for i in readable])
        for i, p in zip(readable, readings):
            r = results[i]
            posterior = self._posterior(p, dict(r.intent_evidence))
            k = int(posterior.argmax())
            results[i] = dataclasses.replace(r, intent=self.classifier.classes[k],
                                             confidence=r.confidence * float(posterior[k]))
        tagger = self.classifier.slots
        untagged = [i for i in readable if not results[i].slots] if tagger is not None else []
        if untagged:
            for i, slots in zip(untagged, tagger.tag([results[i].text for i in untagged])):
                results[i] = dataclasses.replace(results[i], slots=slots)
        return results

    def _readings(self, results: list[Recognition]) -> list[np.ndarray]:
        """The classifier's intent probabilities for each result: of its transcript, or averaged over its
        alternatives under their weights. One encoder batch for every text of every result."""
        candidates = [r.alternatives or ((r.text, 1.0),) for r in results]
        probabilities = self.classifier.probabilities([text for c in candidates for text, _ in c])
        readings, start = [], 0
        for c in candidates:
            weights = np.array([w for _, w in c])
            readings.append(weights @ probabilities[start : start + len(c)] / weights.sum())
            start += len(c)
        return readings

    def _posterior(self, probabilities: np.ndarray, evidence: dict[str, float]) -> np.ndarray:
        """The classifier's probabilities times exp(evidence), renormalized. An intent the recognizer gave no
        evidence for, while it gave some for others, gets the least it gave: unheard, not ruled out."""
        if not evidence:
            return probabilities
        floor = min(evidence.values())
        added = np.array([evidence.get(c, floor) for c in self.classifier.classes])
        return softmax(np.log(np.maximum(probabilities, 1e-30)) + added)


def banned_token_ids(token_list: Sequence[str], ban_slots_unknown: bool = True) -> list[int]:
    """Tokens the search must never emit: SLOTS_UNKNOWN would skip the slot markup (models/targets.py)."""
    from pasu.models.targets import SLOTS_UNKNOWN

    token_list = list(token_list)
    return [token_list.index(SLOTS_UNKNOWN)] if ban_slots_unknown and SLOTS_UNKNOWN in token_list else []


def espnet_beam_search(model: Any, token_list: Sequence[str], options: DecodingOptions, batch: bool = True,
                       lm: PackagedLm | None = None) -> Any:
    """ESPnet's own hybrid CTC/attention search (`BatchBeamSearch`, or `BeamSearch` when not `batch`) over
    the attention decoder, CTC prefix scorer, length bonus and, when `options.lm` is set, the LM, as ESPnet's
    `Speech2Text` builds it. `lm`: `options.lm` already loaded (load it once for many searches), or an LM loaded
    elsewhere (fused at `options.lm_weight` even without `options.lm`)."""
    from espnet.nets.batch_beam_search import BatchBeamSearch
    from espnet.nets.beam_search import BeamSearch
    from espnet.nets.scorers.ctc import CTCPrefixScorer
    from espnet.nets.scorers.length_bonus import LengthBonus

    vocab = len(token_list)
    scorers: dict[str, Any] = {
        "decoder": model.decoder,
        "ctc": CTCPrefixScorer(ctc=model.ctc, eos=model.eos),
        "length_bonus": LengthBonus(vocab),
    }
    weights = {"decoder": 1.0 - options.ctc_weight, "ctc": options.ctc_weight, "length_bonus": options.length_bonus}
    if options.lm is not None or lm is not None:
        from pasu.models.lm import check_token_list

        lm = lm or _load_lm(options, token_list)
        check_token_list(lm, token_list)  # a preloaded one too
        scorers["lm"] = lm.model.lm  # as Speech2Text: the network inside ESPnetLanguageModel scores
        weights["lm"] = options.lm_weight  # ESPnet's search drops a scorer of weight 0
    banned = banned_token_ids(token_list, options.ban_slots_unknown)
    if banned:
        scorers["ban"] = _TokenBan(vocab, banned)
        weights["ban"] = 1.0
    cls = BatchBeamSearch if batch else BeamSearch
    search = cls(
        scorers=scorers, weights=weights, beam_size=options.beam_size, vocab_size=vocab,
        sos=model.sos, eos=model.eos, token_list=list(token_list), pre_beam_score_key="full",
    )
    return search.eval()


def _load_lm(options: DecodingOptions, token_list: Sequence[str]) -> PackagedLm | None:
    """The LM that `options.lm` names, checked against the ASR model's token list; None without one."""
    from pasu.models.lm import check_token_list, load_lm

    if options.lm is None:
        return None
    lm = load_lm(options.lm)
    check_token_list(lm, token_list)
    return lm


def _confidence(hyp: Any) -> float:
    """exp(mean decoder log-probability per emitted token, <eos> included): 1 / perplexity, in [0, 1]."""
    steps = max(len(hyp.yseq) - 1, 1)
    logp = float(hyp.scores.get("decoder", hyp.score))
    return float(np.exp(min(logp / steps, 0.0)))


def packaged_weights_id(folder: Path, config: dict[str, Any]) -> str:
    """name@digest of a packaged model folder: which model, and exactly which weights (a retrained model keeps
    its name, not its digest)."""
    weights = folder / config.get("weights", "model.pt")
    return f"{config.get('name', folder.name)}@{weights_digest(weights)}"


def weights_digest(path: Path) -> str:
    """The first 12 hex digits of the file's SHA-256: which weights answered, in every model_id."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:12]
