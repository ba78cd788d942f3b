"""What offramps learn from and benchmarks combine: one replay of the agent per utterance, cached as JSONL.

For each utterance the agent runs on the virtual clock with a probe policy that never offloads. The probe sees
exactly the hypothesis an early offloading decision judges (the last pilot's best, or the full decode's when no
pilot finished), and when; a recorder around the model's search keeps the full decode's best hypothesis (what
a late decision judges) and the encoding it searched, on which the end-of-speech pilot is then made and timed
(what a decision after the encode judges). With the final local answer scored against the reference, this is everything needed
to train an offramp and to price any policy and threshold without replaying again (Wang & Lin, Sec. 6/7.4).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pasu.device.agent import AgentOptions, replay
from pasu.device.decoding.search import Hypothesis
from pasu.device.routing import Decision, Judged
from pasu.device.runtime import DeviceModel
from pasu.files import write_text_atomic
from pasu.models.data import Utterance, read_audio
from pasu.processes import map_in_processes

from pasu.metrics import SluResult, utterance_wer, word_edits
from pasu.slu import Slot

log = logging.getLogger(__name__)

BAD_WER = 0.1  # the paper's offramp label: local WER above this is "wrong"
DEFAULT_OPTIONS = AgentOptions()  # the agent as it ships


@dataclass(frozen=True)
class HypothesisFeatures:
    """The per-token evidence an offramp reads, detached from the search's tensors."""

    tokens: tuple[int, ...]  # without <sos>/<eos>
    token_att: tuple[float, ...]  # attention-decoder log-probability per token (<eos> included when ended)
    token_ctc: tuple[float, ...]  # CTC prefix-score increment per token
    ended: bool  # reached <eos> (pilots stopped by the token cap have not)
    # (T, D) float16: the encoder output the hypothesis was searched on (kept for the early decision's, which
    # the CNN offramp judges; cached beside the JSONL, see save_samples); None: not kept
    encoded: np.ndarray | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, hypothesis: Hypothesis, keep_encoded: bool = False) -> HypothesisFeatures:
        encoded = hypothesis.encoded
        kept = encoded.numpy().astype(np.float16) if keep_encoded and encoded is not None else None
        return cls(tuple(hypothesis.tokens), tuple(map(float, hypothesis.token_att)),
                   tuple(map(float, hypothesis.token_ctc)), bool(hypothesis.ended), kept)

    def hypothesis(self) -> Hypothesis:
        """A Hypothesis carrying these features, for any `Offramp.score`."""
        encoded = torch.from_numpy(self.encoded.astype(np.float32)) if self.encoded is not None else None
        return Hypothesis(self.tokens, 0.0, self.ended, self.token_att, self.token_ctc, encoded=encoded)


@dataclass(frozen=True)
class OfframpSample:
    """One utterance: its reference, the device's answer and timing, and the hypotheses a policy judges."""

    id: str
    duration: float  # audio seconds
    reference: SluResult  # gold transcript, intent, slots
    local: SluResult  # the device's final answer
    local_edits: int  # word edits of the local transcript against the reference
    ref_words: int  # reference words (corpus WER denominators)
    local_latency: float  # seconds from end of speech to the local answer
    decision_at: float  # seconds from end of speech to the end of the early decision (offload starts here)
    pilots: int  # pilots that finished before end of speech
    early: HypothesisFeatures | None  # what the early decision judged (None: nothing to judge)
    final: HypothesisFeatures | None  # the full local decode's best hypothesis (what a late decision judges)
    pilot_text: str = ""  # the last pilot's transcript, for reading reports
    # the end-of-speech pilot (BeamSearch.ctc_greedy on the encoding the full decode searched; None: the CTC
    # heard only blanks, or a replay from before stop 68) and the seconds from end of speech to its decision
    end: HypothesisFeatures | None = None
    end_decision_at: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # stage timings etc.

    def judged(self, judges: Judged) -> HypothesisFeatures | None:
        """The hypothesis a policy judging `judges` decides on (routing.Judged)."""
        return {"pilot": self.early, "end": self.end, "final": self.final}[judges]

    @property
    def local_wer(self) -> float:
        return utterance_wer(self.reference.text, self.local.text)

    def bad(self, bad_wer: float = BAD_WER) -> bool:
        """The BiLSTM offramp's training label: local WER above `bad_wer`."""
        return self.local_wer > bad_wer


class _Probe:
    """A policy that records what it is asked to judge and when, and never offloads."""

    name = "probe"
    judges = "pilot"

    def __init__(self) -> None:
        self.seen: list[Hypothesis | None] = []

    def decide(self, hypothesis: Hypothesis | None, speech_seconds: float) -> Decision:
        self.seen.append(hypothesis)
        return Decision(False, None, "probe: recording the offramp's input")


class _RecordingSearch:
    """Wraps the model's beam search and keeps the best hypothesis of the last search that finished, and the
    encoding it searched."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.last: Hypothesis | None = None
        self.encoded: torch.Tensor | None = None

    def search(self, encoded: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        result = self.inner.search(encoded, *args, **kwargs)
        self.last, self.encoded = result.best, encoded
        return result

    def __getattr__(self, name: str) -> Any:  # the rest of the search (ctc_greedy, token_scores) as it is
        return getattr(self.inner, name)


@contextmanager
def _recording(model: DeviceModel) -> Iterator[_RecordingSearch]:
    recorder = _RecordingSearch(model.search)
    model.search = recorder
    try:
        yield recorder
    finally:
        model.search = recorder.inner


def replay_sample(model: DeviceModel, utterance: Utterance, options: AgentOptions = DEFAULT_OPTIONS) -> OfframpSample:
    """Replay one utterance locally and record what every policy needs."""
    audio = read_audio(utterance.audio)
    probe = _Probe()
    with _recording(model) as recorder:
        result = replay(model, audio, options, policy=probe, utterance_id=utterance.id)
    decision_at = _event_end(result, "offramp")
    reference = SluResult(utterance.text, utterance.intent, tuple(utterance.slots or ()))
    local = SluResult(result.text, result.intent, tuple(result.slots))
    early = probe.seen[0] if probe.seen else None
    searched = recorder.encoded if options.decoder == "pilot" else None  # the ESPnet decoders search elsewhere
    end, end_seconds = _end_pilot(model, searched)
    encoded_at = _event_end(result, "encode")
    end_decision_at = encoded_at + end_seconds if encoded_at is not None and searched is not None else None
    return OfframpSample(
        id=utterance.id, duration=utterance.duration, reference=reference, local=local,
        local_edits=word_edits(reference.text, local.text), ref_words=max(len(reference.text.split()), 1),
        local_latency=result.latency, decision_at=decision_at if decision_at is not None else result.latency,
        pilots=result.pilots, early=HypothesisFeatures.of(early, keep_encoded=True) if early else None,
        final=HypothesisFeatures.of(recorder.last) if recorder.last else None, pilot_text=result.pilot_text,
        end=HypothesisFeatures.of(end) if end else None, end_decision_at=end_decision_at,
        extra={"timings": result.timings})


def _end_pilot(model: DeviceModel, encoded: torch.Tensor | None) -> tuple[Hypothesis | None, float]:
    """The end-of-speech pilot of the encoding the full decode searched, and the seconds it took (as the agent's
    `end_pilot` event would: the replay's policy judged the last pilot instead)."""
    if encoded is None:
        return None, 0.0
    start = time.perf_counter()
    with torch.inference_mode():
        pilot = model.search.ctc_greedy(encoded)
    return pilot, time.perf_counter() - start


def _event_end(result: Any, kind: str) -> float | None:
    """Seconds after end of speech at which the agent's first event of `kind` ended (the first "offramp": the
    early decision)."""
    timeline = result.timeline
    for event in timeline.events:
        if event.kind == kind:
            return max(event.end - timeline.end_of_speech, 0.0)
    return None


def collect(model: DeviceModel, utterances: Sequence[Utterance], options: AgentOptions = DEFAULT_OPTIONS,
            progress: Callable[[int, int], None] | None = None, jobs: int = 1) -> list[OfframpSample]:
    """Replay every utterance, each alone as a device would; `jobs` > 1 spreads them over that many processes
    with one core and one torch thread each (pasu.processes)."""
    return map_in_processes(_replay, (model, options), utterances, jobs, progress)


def _replay(shared: tuple[DeviceModel, AgentOptions], utterance: Utterance) -> OfframpSample:
    return replay_sample(shared[0], utterance, shared[1])


# ---- cache ---------------------------------------------------------------------------------------------


def save_samples(path: str | Path, samples: Sequence[OfframpSample], key: dict[str, Any]) -> Path:
    """JSONL: a header line with the cache key, then one sample per line; the early hypotheses' encoder outputs
    beside it (`encodings_path`: float16 arrays by utterance id; JSON would be ten times the size)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    encodings = {s.id: s.early.encoded for s in samples if s.early is not None and s.early.encoded is not None}
    with open(encodings_path(path), "wb") as f:  # a file object: np.savez would append .npz to a str path
        np.savez(f, **encodings)
    lines = [json.dumps({"key": key})] + [json.dumps(_sample_to_dict(s)) for s in samples]
    return write_text_atomic(path, "\n".join(lines) + "\n")  # last: a killed run never leaves half a cache


def encodings_path(path: str | Path) -> Path:
    """Where the encoder outputs of the replays cached at `path` are kept."""
    path = Path(path)
    return path.with_name(path.stem + ".encoded.npz")


def load_samples(path: str | Path, key: dict[str, Any] | None = None) -> list[OfframpSample] | None:
    """The cached samples (with their encoder outputs when kept), or None when the file is missing, was made for
    another key, or lost the encoder outputs its key says it holds."""
    path = Path(path)
    if not path.is_file():
        return None
    lines = path.read_text().splitlines()
    if not lines or (key is not None and json.loads(lines[0]).get("key") != key):
        return None
    samples = [_sample_from_dict(json.loads(line)) for line in lines[1:] if line.strip()]
    if not encodings_path(path).is_file():
        return None if (key or {}).get("encoded") else samples
    with np.load(encodings_path(path)) as encodings:
        held = set(encodings.files)
        return [replace(s, early=replace(s.early, encoded=encodings[s.id])) if s.early is not None and s.id in held
                else s for s in samples]


def load_or_collect(path: str | Path, key: dict[str, Any], make: Callable[[], list[OfframpSample]]) -> list[OfframpSample]:
    """Samples from the cache when its key matches, else made and cached."""
    cached = load_samples(path, key)
    if cached is not None:
        log.info("offramp data: %d utterances from %s", len(cached), path)
        return cached
    samples = make()
    save_samples(path, samples, key)
    return samples


def cache_key(model_id: str, manifest: str | Path, ids: Sequence[str], options: AgentOptions,
              intent_reader: str | None = None) -> dict[str, Any]:
    """What makes two collections interchangeable: the model, the intent mixture its answers come from
    (`intent_reader`: IntentMixture.digest, the reader's weights and the decoder's share; None: none), the
    utterances and the agent's settings; `encoded`: the early hypotheses' encoder outputs are kept, `end_pilot`:
    the end-of-speech pilots are (caches from before either have no such key, and are made again)."""
    settings = json.loads(json.dumps(asdict(options), default=str))
    if not options.pilot.at_pause:  # without the pause pilot its settings change nothing: older caches stay valid
        for name in ("at_pause", "pause_seconds"):
            del settings["pilot"][name]
    return {"model": model_id, "intent_reader": intent_reader, "manifest": str(Path(manifest).resolve()),
            "ids": list(ids), "options": settings, "encoded": True, "end_pilot": True}


def slu_from_dict(raw: dict[str, Any]) -> SluResult:
    """An SluResult from its `asdict` form."""
    return SluResult(raw["text"], raw["intent"], tuple(Slot(*s) for s in raw["slots"]))


def _sample_to_dict(sample: OfframpSample) -> dict[str, Any]:
    """The sample as JSON holds it: without the encoder output (kept beside, see save_samples)."""
    raw = asdict(sample)
    for name in ("early", "final", "end"):
        if raw[name] is not None:
            raw[name].pop("encoded")
    return raw


def _features(raw: dict[str, Any] | None) -> HypothesisFeatures | None:
    if raw is None:
        return None
    return HypothesisFeatures(tuple(raw["tokens"]), tuple(raw["token_att"]), tuple(raw["token_ctc"]), raw["ended"])


def _sample_from_dict(raw: dict[str, Any]) -> OfframpSample:
    return OfframpSample(**{**raw, "reference": slu_from_dict(raw["reference"]), "local": slu_from_dict(raw["local"]),
                            "early": _features(raw["early"]), "final": _features(raw["final"]),
                            "end": _features(raw.get("end"))})
