"""The device agent: ingest audio as it arrives, run pilots while the user speaks, answer at end of speech.

`Session` is one utterance's work (ingestion, pilots, the offloading decision, the final decode), written
against a clock so that the same code runs in two drivers:

- `DeviceAgent`: the live API. `feed(chunk)` hands audio to a worker thread; `end()` marks end of speech
  and returns the result. A pilot still running at end of speech is abandoned at its next step.
- `replay()`: a virtual clock for benchmarks. Chunk k is due at (k+1) x chunk seconds; each piece of work
  advances the clock by its measured compute time; no pilot starts before its audio is due, and work is
  serialized as on the device's cores. The wait for the last chunk is idled for real (at most one chunk),
  because a core that has just idled computes slower and that is what the user waits on (see
  `VirtualClock.idle_until`). `pasu bench local --check-clock` compares it with real-time pacing.

End of speech is what the endpointer declares. A replay's audio ends where the speech does (the corpus's files
do), and without the pause pilot the replay's endpointer is an oracle: it declares the end there. With the pause
pilot (`PilotOptions.at_pause`) it is the shipped VAD's (`pasu.device.vad`): it hears the pause `pause_seconds`
after the audio's end and declares the end `VadOptions.trailing_silence_s` after it, as a live agent's would.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
import torch
from pasu.device.audio import (
    SAMPLE_RATE,
    AudioError,
    check_finite,
    check_length,
    chunks,
)
from pasu.device.decoding.search import (
    Hypothesis,
    SearchAborted,
    SearchOptions,
    SearchResult,
)
from pasu.device.routing import Decision, Policy
from pasu.device.runtime import DeviceModel
from pasu.device.timeline import Timeline
from pasu.device.vad import VadOptions

from pasu.config import given
from pasu.metrics import SluResult
from pasu.models.recognizer import Recognition
from pasu.settings import SHIPPED_LM_WEIGHT
from pasu.torch_threads import adopt_torch_threads

Decoder = Literal["pilot", "espnet_batch", "espnet_beam"]

# DeviceAgent's queue: the endpointer heard a pause (a marker, not audio)
_PAUSED = np.zeros(0, dtype=np.float32)


@dataclass(frozen=True)
class PilotOptions:
    """When pilots run during ingestion and how they search (the paper's defaults)."""

    enabled: bool = True  # run pilot inference at all
    start_seconds: float = 1.5  # T_s: no scheduled pilot on less audio than this (the pause pilot runs on any)
    interval_seconds: float = 1.0  # tau: audio seconds between pilots
    incremental: bool = True  # each pilot follows the previous one's hypothesis and reuses its CTC state
    # The paper caps pilots at 15 tokens; ours count an intent token and slot markup besides word pieces (full
    # decodes: median 16, 55% over 15), so at 15 most last pilots (60% on 1,000 `dev`) were cut short and the
    # offramps judged a prefix. At 30, 91% end, as many pilots finish before the end of speech, and the offramps
    # rank better (stop 73, models/shipped/device/offramp/CALIBRATION_LOG.md).
    search: SearchOptions = SearchOptions(beam_size=3, max_tokens=30, pre_beam_size=10, record_ctc=True,
                                          beam_collapse=True, ctc_leap=True, stop_when_decided=True)
    # One more pilot, on everything heard, when the endpointer hears the speaker pause: it runs inside the
    # silence the endpointer waits before it declares the end of speech (the shipped VAD's 0.6 s), so that the
    # last pilot, which the offramps judge at end of speech, has heard the whole command at no cost after it.
    # The scheduled pilots' last one starts up to tau before the end and judges a prefix: with it, the shipped
    # offramps' Table 5 offload at the hardest WER target went from 0.60x / 0.62x NaiveHybrid's (PPL / BiLSTM)
    # to 0.57x / 0.58x on all 2,974 `test` (stop 79, models/shipped/device/offramp/CALIBRATION_LOG.md). Off:
    # the paper's schedule, and replays end at an oracle endpointer (the module doc)
    at_pause: bool = True
    pause_seconds: float = 0.2  # silence after speech that counts as a pause (triggers the pause pilot)

    def schedule(self) -> dict[str, Any]:
        """When pilots run, for reports (results JSON, offramp.json); the pause pilot's keys only when it is on,
        so that the reports and caches of schedules without it stay as they were."""
        schedule = {"enabled": self.enabled, "start_seconds": self.start_seconds,
                    "interval_seconds": self.interval_seconds}
        if self.at_pause:
            schedule.update(at_pause=True, pause_seconds=self.pause_seconds)
        return schedule

    def describe(self) -> str:
        """The schedule in words."""
        if not self.enabled:
            return "none (the offramps judge the full decode)"
        pause = f", and one on all of it after {self.pause_seconds:g} s of silence" if self.at_pause else ""
        return f"every {self.interval_seconds:g} s of audio from {self.start_seconds:g} s{pause}"


@dataclass(frozen=True)
class AgentOptions:
    chunk_seconds: float = 0.1  # audio per ingestion step (what a microphone callback delivers)
    pilot: PilotOptions = PilotOptions()
    decoder: Decoder = "pilot"  # "pilot": our search (the last pilot helps it when final_search turns the
    # shortcuts on); "espnet_batch"/"espnet_beam": ESPnet's own BatchBeamSearch / BeamSearch on the full
    # input (the vanilla baselines; pilots still run when enabled, e.g. for the offloading decision)
    # The decided stop alone: exact for the best hypothesis, and as fast as adding the reference-based
    # shortcuts (beam collapse, early termination, CTC leap, first-token rescoring), which cost accuracy on top
    # of it (dev 300, `pasu bench local` rules: ESPnet BatchBeamSearch 41.8% WER / 60.7% IC at 100 ms p50;
    # decided stop 41.8 / 60.7 at 36 ms; + beam collapse, early termination and rescoring 42.5 / 60.0 at 40 ms).
    # Each shortcut stays available; pilots keep them (their reference is the previous pilot).
    final_search: SearchOptions = SearchOptions(beam_size=5, ctc_weight=0.3, stop_when_decided=True)
    cloud_deadline_s: float = 2.0  # budget of one offload, retries included; then the local result is used
    lm: str = ""  # a `pasu lm train` folder fused into the searches with lm_weight > 0 (use_lm_of); "": none
    # torch threads of the agent's process, set by `pasu device run` and `pasu demo`. One, as the benchmarks
    # measure: on a 2-core board a second thread per operator waits on the core ingestion uses, and at real-time
    # pace made answers 1.7x slower (40 `test` utterances, `pasu bench local --check-clock 40 --threads 2` vs
    # `--threads 1`: mean 117 vs 68 ms after end of speech)
    threads: int = 1


@dataclass(frozen=True)
class AgentResult(SluResult):
    """One utterance's answer and how it was reached."""

    confidence: float = 0.0  # 1 / perplexity of the answering model over its hypothesis
    route: str = "local"  # local | cloud | fallback (the cloud failed; the local result is returned)
    reason: str = ""  # why this route (the offramp's score and threshold, the cloud's failure, ...)
    latency: float = 0.0  # seconds from end of speech to the result
    audio_seconds: float = 0.0
    pilots: int = 0  # pilots that completed
    timings: dict[str, float] = field(default_factory=dict)  # seconds per stage (see Session.timings)
    timeline: Timeline = field(default_factory=Timeline, repr=False, compare=False)
    tokens: tuple[int, ...] = ()  # the answering hypothesis (local route)
    pilot_text: str = ""  # the last pilot's transcript (what the offramp judged)
    # what the policy compared with its threshold (e.g. perplexity x seconds); None: no policy, or one without a
    # score (OnDevice, AllOffload). Logged from live runs, it is what a threshold is chosen on
    offramp_score: float | None = None


class Clock:
    """Seconds since the utterance's first sample was due."""

    def __init__(self) -> None:
        self._t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self._t0


class VirtualClock(Clock):
    """Advances with measured compute time, and jumps forward (never back) when waiting for audio."""

    def __init__(self) -> None:
        self._virtual = 0.0
        self._mark = time.perf_counter()

    def now(self) -> float:
        return self._virtual + (time.perf_counter() - self._mark)

    def wait_until(self, t: float) -> None:
        self._virtual = max(self.now(), t)
        self._mark = time.perf_counter()

    def idle_until(self, t: float) -> None:
        """wait_until(t), really sleeping the gap: work after an idle gap runs slower than back-to-back work
        (on this 2-core VM, a decode after a 100 ms sleep took ~7% longer and a chunk's ingestion ~45%),
        and a device waiting for its microphone idles."""
        gap = t - self.now()
        if gap > 0:
            time.sleep(gap)
        self.wait_until(t)


class Session:
    """One utterance on the device."""

    def __init__(self, model: DeviceModel, options: AgentOptions, clock: Clock,
                 policy: Policy | None = None, cloud: Any = None, espnet_search: Any = None,
                 utterance_id: str = ""):
        # cloud: a pasu.device.cloud_client.CloudClient (or None: never offload); espnet_search: the ESPnet
        # search object for options.decoder != "pilot" (built once per agent, it is reusable)
        self.model = model
        self.options = options
        self.clock = clock
        self.policy = policy
        self.cloud = cloud
        self.espnet_search = espnet_search
        self.utterance_id = utterance_id
        self.stream = model.open_stream()
        self.audio: list[np.ndarray] = []
        self.timeline = Timeline()
        self.last_pilot: SearchResult | None = None
        self.decision: Decision | None = None  # the policy's, once made
        self.pilots = 0
        self.next_pilot_at = options.pilot.start_seconds
        self.pilot_audio = 0.0  # audio seconds the last pilot heard
        self.paused = False  # the endpointer heard a pause that no pilot has judged yet (PilotOptions.at_pause)

    @property
    def seconds(self) -> float:
        return self.stream.num_samples / SAMPLE_RATE

    # ---- during ingestion -----------------------------------------------------------------------------
    def ingest(self, samples: np.ndarray) -> None:
        check_finite(samples, "chunk")
        start = self.clock.now()
        self.audio.append(samples)
        self.stream.accept(samples)
        self.timeline.add("ingest", start, self.clock.now(), audio=round(self.seconds, 3))

    def pause(self) -> None:
        """The endpointer heard the speaker pause: a pilot is due on everything heard (when at_pause is on)."""
        self.paused = self.options.pilot.at_pause

    def pilot_due(self) -> bool:
        # a pause asks for a pilot on more than the last one heard (a live agent may not have ingested it yet)
        paused = self.paused and self.seconds > self.pilot_audio
        return self.options.pilot.enabled and (paused or self.seconds >= self.next_pilot_at)

    def run_pilot(self, should_abort: Any) -> None:
        """Encode what has arrived and search it; abandoned (no state change) when `should_abort()`."""
        pilot = self.options.pilot
        self.paused = False
        while self.next_pilot_at <= self.seconds:
            self.next_pilot_at += pilot.interval_seconds
        start, audio = self.clock.now(), self.seconds
        try:
            encoded = self.stream.encode()
            if encoded.size(0) == 0:
                return
            reference = self.last_pilot.as_reference() if (pilot.incremental and self.last_pilot) else None
            options = pilot.search if pilot.incremental else replace(pilot.search, beam_collapse=False,
                                                                     ctc_leap=False)
            result = self.model.search.search(encoded, options, reference, should_abort)
        except SearchAborted:
            self.timeline.add("pilot_abandoned", start, self.clock.now(), audio=round(audio, 3))
            return
        self.last_pilot, self.pilot_audio = result, audio
        self.pilots += 1
        text = self.model.read(result.best.tokens).text if result.best else ""
        self.timeline.add("pilot", start, self.clock.now(), audio=round(audio, 3), text=text,
                          tokens=len(result.best.tokens) if result.best else 0, steps=result.stats.steps)

    # ---- at end of speech -----------------------------------------------------------------------------
    def finish(self, end_of_speech: float) -> AgentResult:
        """Decide where to finish, finish there, and return the result; latency counts from `end_of_speech`."""
        check_length(self.stream.num_samples, source=self.utterance_id or "utterance")
        eos = self.timeline.end_of_speech = end_of_speech
        judges = self.policy.judges if self.policy is not None else None
        pilot_hyp = self.last_pilot.best if self.last_pilot else None
        decision, answer = None, ""  # answer: the cloud's result, or why the cloud did not give one
        if judges == "pilot" and pilot_hyp is not None:
            decision, answer = self._decide_and_offload(pilot_hyp)
        if isinstance(answer, AgentResult):
            return self._done(answer, eos)
        encoded = self._encode()
        if judges == "end":  # nothing heard (no end-of-speech pilot) offloads, as the bench prices it
            decision, answer = self._decide_and_offload(self._end_pilot(encoded))
        if isinstance(answer, AgentResult):
            return self._done(answer, eos)
        tokens, hyp, confidence = self._decode_local(encoded)
        if self.policy is not None and decision is None:  # late decision, or no pilot to judge
            decision, answer = self._decide_and_offload(hyp)
        if isinstance(answer, AgentResult):
            return self._done(answer, eos)
        cloud_failure = answer
        route = "fallback" if cloud_failure else "local"
        # a fallback says both why it offloaded and why the cloud did not answer, as a cloud answer says both
        reason = "; ".join(part for part in (decision.reason if decision else "local decode", cloud_failure) if part)
        slu = self.model.answer(tokens, hyp)
        result = AgentResult(slu.text, slu.intent, slu.slots, confidence, route, reason, tokens=tuple(tokens))
        return self._done(result, eos)

    def _decide_and_offload(self, hypothesis: Hypothesis | None) -> tuple[Decision, AgentResult | str]:
        """The policy's decision on `hypothesis`, and the cloud's result or why there is none ('' when kept)."""
        decision = self._decide(hypothesis)
        return decision, self._offload(decision) if decision.offload else ""

    def _decide(self, hypothesis: Hypothesis | None) -> Decision:
        start = self.clock.now()
        speech_seconds = sum(len(chunk) for chunk in self.audio) / SAMPLE_RATE
        decision = self.decision = self.policy.decide(hypothesis, speech_seconds)
        self.timeline.add("offramp", start, self.clock.now(), offload=decision.offload, reason=decision.reason)
        return decision

    def _offload(self, decision: Decision) -> AgentResult | str:
        """The cloud's result, or why there is none (the caller falls back to the local decode)."""
        if self.cloud is None:
            return "offload wanted, but no cloud is configured"
        start = self.clock.now()
        waveform = np.concatenate(self.audio)
        pilot_slu = self.model.read(self.last_pilot.best.tokens) if self.last_pilot and self.last_pilot.best else None
        outcome = self.cloud.understand(waveform, SAMPLE_RATE, self.utterance_id, pilot=pilot_slu,
                                        deadline_s=self.options.cloud_deadline_s)
        self.timeline.add("cloud", start, self.clock.now(), ok=outcome.ok, attempts=outcome.attempts,
                          fallback=outcome.fallback.value if outcome.fallback else "")
        if not outcome.ok:
            return f"cloud failed ({outcome.fallback.value}: {outcome.detail})"
        c = outcome.cloud
        return AgentResult(c.result.text, c.result.intent, c.result.slots, c.confidence, "cloud",
                           f"{decision.reason}; answered by {c.model_id}")

    def _encode(self) -> torch.Tensor:
        """The whole input's encoder output, which the local decode and the end-of-speech pilot share."""
        start = self.clock.now()
        encoded = self.stream.encode()
        self.timeline.add("encode", start, self.clock.now(), frames=int(encoded.size(0)))
        return encoded

    def _end_pilot(self, encoded: torch.Tensor) -> Hypothesis | None:
        """The CTC's best path over the whole input, scored for the offramps (None: the CTC hears only blanks)."""
        start = self.clock.now()
        pilot = self.model.search.ctc_greedy(encoded)
        self.timeline.add("end_pilot", start, self.clock.now(), tokens=len(pilot.tokens) if pilot else 0)
        return pilot

    def _decode_local(self, encoded: torch.Tensor) -> tuple[list[int], Hypothesis | None, float]:
        start = self.clock.now()
        if self.options.decoder == "pilot":
            reference = self.last_pilot.as_reference() if self.last_pilot else None
            result = self.model.search.search(encoded, self.options.final_search, reference)
            best = result.best
            tokens = list(best.tokens) if best else []
            confidence = _confidence(best)
            info = {"steps": result.stats.steps, "collapsed": result.stats.collapsed_steps,
                    "leaps": result.stats.leap_scorings, "early_stop": result.stats.early_stop,
                    "decided_stop": result.stats.decided_stop}
        else:
            tokens, confidence = self.model.espnet_decode(self.espnet_search, encoded)
            best, info = None, {}
        self.timeline.add("decode", start, self.clock.now(), tokens=len(tokens), **info)
        return tokens, best, confidence

    def _done(self, result: AgentResult, eos: float) -> AgentResult:
        now = self.timeline.result_at = self.clock.now()
        pilot_text = self.model.read(self.last_pilot.best.tokens).text if self.last_pilot and self.last_pilot.best else ""
        score = self.decision.score if self.decision else None
        return replace(result, latency=now - eos, audio_seconds=self.seconds, pilots=self.pilots,
                       timings=self.timings(eos), timeline=self.timeline, pilot_text=pilot_text,
                       offramp_score=None if score is None else float(score))

    def timings(self, eos: float) -> dict[str, float]:
        t = self.timeline
        return {
            "ingest": t.busy("ingest"),  # all chunk work (frontend + streaming encoder blocks)
            "pilots": t.busy("pilot") + t.busy("pilot_abandoned"),
            "ingest_after_eos": t.busy("ingest", eos),  # chunks still queued at end of speech
            "pilot_after_eos": t.busy("pilot_abandoned", eos) + t.busy("pilot", eos),  # until abandoned
            "offramp": t.busy("offramp"),
            "encode_after_eos": t.busy("encode", eos),
            "decode_after_eos": t.busy("decode", eos),
            "cloud": t.busy("cloud"),
        }


def _confidence(hypothesis: Hypothesis | None) -> float:
    if hypothesis is None or not hypothesis.token_att:
        return 0.0
    return math.exp(sum(hypothesis.token_att) / len(hypothesis.token_att))


class DeviceAgent:
    """The live agent: feed chunks as they arrive, call end() at end of speech (`assemble.open_agent` builds one
    from a model folder and a config, as `pasu device run` does).

    >>> agent = DeviceAgent(load_device_model("models/shipped/device"))
    >>> for chunk in microphone_chunks(): agent.feed(chunk)
    >>> result = agent.end()
    """

    def __init__(self, model: DeviceModel, options: AgentOptions = AgentOptions(),
                 policy: Policy | None = None, cloud: Any = None):
        self.model = model
        self.options = options
        self.policy = policy
        self.cloud = cloud
        self.espnet_search = espnet_search_for(model, options)
        self._session: Session | None = None

    def start(self, utterance_id: str = "") -> None:
        """Begin an utterance (feed() starts one by itself)."""
        self._session = Session(self.model, self.options, Clock(), self.policy, self.cloud,
                                self.espnet_search, utterance_id)
        self._queue: queue.Queue = queue.Queue()
        self._ended = threading.Event()
        self._result: AgentResult | BaseException | None = None
        self._worker = threading.Thread(target=self._work, name="pasu-agent", daemon=True)
        self._worker.start()

    def feed(self, chunk: np.ndarray) -> None:
        """Queue 16 kHz mono float32 audio; raises AudioError at once for NaN/Inf samples."""
        chunk = np.asarray(chunk, dtype=np.float32).reshape(-1)
        check_finite(chunk, "chunk")
        if self._session is None:
            self.start()
        self._queue.put(chunk)

    @property
    def seconds(self) -> float:
        """Audio seconds ingested so far in this utterance."""
        return self._session.seconds if self._session else 0.0

    def partial(self) -> str:
        """The latest pilot's transcript ('' before the first pilot)."""
        s = self._session
        return s.model.read(s.last_pilot.best.tokens).text if s and s.last_pilot and s.last_pilot.best else ""

    def pause(self) -> None:
        """The endpointer heard the speaker pause: with PilotOptions.at_pause, a pilot on everything fed so far runs
        next. Queued behind the audio, so that the pilot hears it all and needs no further chunk."""
        if self._session is not None:
            self._queue.put(_PAUSED)

    def end(self) -> AgentResult:
        """End of speech: finish the utterance and return its one result."""
        if self._session is None:
            raise AudioError("end() before any audio was fed")
        self._end_of_speech = self._session.clock.now()
        self._ended.set()
        self._queue.put(None)
        self._worker.join()
        result, self._session = self._result, None
        if isinstance(result, BaseException):
            raise result
        return result

    def close(self) -> None:
        """Close the cloud client the agent was given; no more offloading after this."""
        if self.cloud is not None:
            self.cloud.close()

    def __enter__(self) -> DeviceAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _work(self) -> None:
        adopt_torch_threads()
        session = self._session
        try:
            while (chunk := self._queue.get()) is not None:
                if chunk is _PAUSED:
                    session.pause()
                else:
                    session.ingest(chunk)
                while self._queue.empty() and not self._ended.is_set() and session.pilot_due():
                    session.run_pilot(self._ended.is_set)
            self._result = session.finish(self._end_of_speech)
        except BaseException as error:  # handed to end(), which raises it in the caller's thread
            self._result = error


def replay(model: DeviceModel, audio: np.ndarray, options: AgentOptions = AgentOptions(),
           policy: Policy | None = None, cloud: Any = None, espnet_search: Any = None,
           utterance_id: str = "") -> AgentResult:
    """Run one utterance on the virtual clock (see the module doc); the speech ends where `audio` does."""
    if espnet_search is None:
        espnet_search = espnet_search_for(model, options)
    clock = VirtualClock()
    session = Session(model, options, clock, policy, cloud, espnet_search, utterance_id)
    pieces = chunks(np.asarray(audio, dtype=np.float32), options.chunk_seconds)
    due = np.cumsum([len(p) for p in pieces]) / SAMPLE_RATE
    speech_end = float(due[-1]) if len(due) else 0.0
    pause_at, end_of_speech = modelled_endpointer(options.pilot, speech_end)
    k = 0
    while k < len(pieces):
        wait = clock.idle_until if k == len(pieces) - 1 else clock.wait_until  # see the module doc
        wait(due[k])
        while k < len(pieces) and due[k] <= clock.now():
            session.ingest(pieces[k])
            k += 1
        if k < len(pieces) and due[k] > clock.now() and session.pilot_due():
            session.run_pilot(lambda: clock.now() > end_of_speech)
    if pause_at is not None:
        clock.idle_until(pause_at)
        session.pause()
        if session.pilot_due():  # abandoned, as any pilot, should it outlast the endpointer's silence
            session.run_pilot(lambda: clock.now() > end_of_speech)
    clock.wait_until(end_of_speech)
    return session.finish(end_of_speech)


class LocalAnswers:
    """The agent's answers on its local route as a `Recognizer` (`pasu eval --as-agent`): each waveform ingested
    whole, then `Session.finish` without a policy: the final search and `DeviceModel.answer`, the intent reader
    weighed in when the model has one (`offramp_train.load_device_model`). Pilots are off: with the final
    search's default (the decided stop alone, exact for the best hypothesis) they change when it answers, not what.
    """

    sample_rate = SAMPLE_RATE

    def __init__(self, model: DeviceModel, options: AgentOptions = AgentOptions()):
        self.model = model
        self.options = replace(options, pilot=replace(options.pilot, enabled=False))
        self.espnet_search = espnet_search_for(model, options)
        mixture = model.intent_mixture
        self.model_id = model.weights_id + (f"+intent-reader@{mixture.digest()}" if mixture is not None else "")

    def recognize_batch(self, waveforms: list[np.ndarray]) -> list[Recognition]:
        return [self._answer(np.asarray(w, dtype=np.float32)) for w in waveforms]

    def _answer(self, waveform: np.ndarray) -> Recognition:
        clock = Clock()
        session = Session(self.model, self.options, clock, None, None, self.espnet_search)
        session.ingest(waveform)
        r = session.finish(clock.now())
        return Recognition(r.text, r.intent, r.slots, confidence=r.confidence)


def play_realtime(agent: DeviceAgent, audio: np.ndarray, utterance_id: str = "") -> AgentResult:
    """Feed `audio` at real-time pace (chunk k at its due time), then end(): what a microphone would do. The speech
    ends where `audio` does, and the endpointer is the one `replay` models: with the pause pilot, the pause is heard
    `pause_seconds` after the audio and the end declared `VadOptions.trailing_silence_s` after it."""
    agent.start(utterance_id)
    t0 = time.perf_counter()

    def sleep_until(elapsed: float) -> None:
        if (delay := t0 + elapsed - time.perf_counter()) > 0:
            time.sleep(delay)

    speech_end = 0.0
    for piece in chunks(np.asarray(audio, dtype=np.float32), agent.options.chunk_seconds):
        speech_end += len(piece) / SAMPLE_RATE
        sleep_until(speech_end)
        agent.feed(piece)
    pause_at, end_of_speech = modelled_endpointer(agent.options.pilot, speech_end)
    if pause_at is not None:
        sleep_until(pause_at)
        agent.pause()
        sleep_until(end_of_speech)
    return agent.end()


def modelled_endpointer(pilot: PilotOptions, speech_end: float) -> tuple[float | None, float]:
    """When the endpointer modelled after a file's speech hears the pause (None: no pause pilot) and when it
    declares the end: without the pause pilot an oracle, at the speech's end (the module doc)."""
    if not (pilot.enabled and pilot.at_pause):
        return None, speech_end
    return speech_end + pilot.pause_seconds, speech_end + VadOptions().trailing_silence_s


def espnet_search_for(model: DeviceModel, options: AgentOptions) -> Any:
    """The ESPnet search object options.decoder asks for, reusable across utterances (None: our own decoder)."""
    if options.decoder == "pilot":
        return None
    o = options.final_search
    return model.espnet_search(o.beam_size, o.ctc_weight, batch=options.decoder == "espnet_batch",
                               lm_weight=o.lm_weight, length_bonus=o.length_bonus)


def fusing_lm(options: AgentOptions, lm: str | None, weight: float | None = None) -> AgentOptions:
    """`options` with the LM folder `lm` (None or "": the options' own) in the final decode at `weight`; None: the
    options' own weight, or the shipped LM's when they have none and `lm` is given (asking for an LM means fusing
    it, not loading it to weigh 0)."""
    if weight is None and lm and not options.final_search.lm_weight:
        weight = SHIPPED_LM_WEIGHT
    final = options.final_search if weight is None else replace(options.final_search, lm_weight=weight)
    return replace(options, lm=lm or options.lm, final_search=final)


def with_pilots(options: AgentOptions, enabled: bool | None = None, interval_seconds: float | None = None,
                at_pause: bool | None = None) -> AgentOptions:
    """`options` with the pilots switched on or off, their interval (tau) and the pause pilot set, where given
    (None: as they are)."""
    changes = given(enabled=enabled, interval_seconds=interval_seconds, at_pause=at_pause)
    return replace(options, pilot=replace(options.pilot, **changes))


def agent_with_lm(model: DeviceModel, lm: str | None, weight: float | None = None) -> AgentOptions:
    """The agent's default options with the LM folder `lm` fused as fusing_lm resolves it (None: no LM), the LM
    loaded into `model` (use_lm_of's errors)."""
    options = fusing_lm(AgentOptions(), lm, weight)
    use_lm_of(model, options)
    return options


def use_lm_of(model: DeviceModel, options: AgentOptions) -> None:
    """Load `options.lm` into the model's searches (nothing without one); OSError / ValueError when it is not
    an LM folder or reads other tokens, ValueError when a search's lm_weight asks for an LM the model lacks."""
    if options.lm:
        from pasu.models.lm import load_lm

        model.use_lm(load_lm(options.lm))
    if (options.final_search.lm_weight or options.pilot.search.lm_weight) and model.lm is None:
        raise ValueError("an lm_weight above 0 needs an LM (agent.lm or --lm)")
