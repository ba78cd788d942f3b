"""Where an utterance is finished: on the device or in the cloud (Wang & Lin, Sec. 5).

A policy decides at end of speech from the last pilot's best hypothesis (the earliest moment offloading can
pay off), a few milliseconds later from the end-of-speech pilot (the CTC's best path over the whole input, which
the local path encodes anyway), or, for the late-decision baseline, from the full local decode's. Offramps score a hypothesis
(higher: less likely right); a threshold turns the score into a decision.

The offramp policy weighs the score by the utterance's length (`weighing_for`: a pilot's by the speech's seconds, a
hypothesis of the whole input's by its tokens): a WER target is a corpus WER, edits summed over utterances, and a
long utterance the device gets wrong carries more of them than a short one.
The intent check is the exception (`intent_policy`): intent accuracy counts utterances.
Per hypothesis, as the paper scores, even a perfect estimate of each utterance's WER would need 0.57-0.80x
NaiveHybrid's offloading at the bench's WER targets (150 test utterances), a perfect count of its edits
0.23-0.50x; the measured offramps, per token and weighed, are in the README's Table 5.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar

import numpy as np

from pasu.device.cloud_client import ClientTls, Encoding
from pasu.device.decoding.search import Hypothesis

if TYPE_CHECKING:
    from pasu.device.offramp_data import HypothesisFeatures

ScoreLike = TypeVar("ScoreLike", float, np.ndarray)  # one score, or many at once (calibration, benchmarks)
# how a policy scales an offramp's per-hypothesis score with the utterance, as its expected word errors grow: by
# the speech's seconds, by the hypothesis's tokens (<eos> included), or not at all (the intent check: intent
# accuracy counts utterances; and the paper's per-hypothesis scores)
Weighing = Literal["seconds", "tokens", "none"]
# which hypothesis a policy judges: the last pilot's (at end of speech), the end-of-speech pilot's (after the whole
# input's encode: BeamSearch.ctc_greedy), or the full local decode's (after it)
Judged = Literal["pilot", "end", "final"]


@dataclass(frozen=True)
class Decision:
    offload: bool
    score: float | None  # the offramp's score (None for policies without one)
    reason: str  # shown in results and logs


class Policy(Protocol):
    name: str
    judges: Judged  # the hypothesis the policy decides on

    def decide(self, hypothesis: Hypothesis | None, speech_seconds: float) -> Decision: ...


class Offramp(Protocol):
    def score(self, hypothesis: Hypothesis) -> float:
        """Higher means the local result is more likely wrong."""
        ...


class PerplexityOfframp:
    """exp(-1/l * sum log p(y_i | y_<i)) of the attention decoder over the hypothesis (<eos> included)."""

    def score(self, hypothesis: Hypothesis) -> float:
        logps = hypothesis.token_att
        if not logps:
            return math.inf
        return math.exp(-sum(logps) / len(logps))


@dataclass(frozen=True)
class LogPerplexityOfframp:
    """-1/l * sum log p(y_i | y_<i) of the attention decoder over the hypothesis (<eos> included unless
    `without_end`): the perplexity in log units, the mean surprisal of a token; weighed by the tokens, the
    hypothesis's total surprisal."""

    # leave the <eos> step out: a pilot's says whether the command sounded finished when the pilot ran, not whether
    # its words are right, and only the pilots that ended before the token cap have one
    without_end: bool = False

    def score(self, hypothesis: Hypothesis) -> float:
        logps = hypothesis.token_att[:len(hypothesis.tokens)] if self.without_end else hypothesis.token_att
        return -sum(logps) / len(logps) if len(logps) else math.inf


def perplexity_offramp(judges: Judged) -> Offramp:
    """The perplexity check of a policy judging `judges`, in log units: a pilot's over its words (`without_end`),
    weighed by the seconds of the whole command it heard part of; a hypothesis of the whole input's, weighed by
    its tokens (`weighing_for`): its total surprisal, which grows with the command as its word errors do. Chosen
    on all 2,033 `dev` replays (the offramp's calibration log), as NaiveHybrid's offloading at the four WER
    targets: the last pilot 0.38 / 0.42 / 0.48 / 0.59x against the paper's perplexity x seconds' 0.35 / 0.42 /
    0.51 / 0.67x; the end-of-speech pilot 0.32 / 0.38 / 0.47 / 0.60x against 0.46 / 0.49 / 0.52 / 0.60x."""
    return LogPerplexityOfframp(without_end=judges == "pilot")


def weighing_for(judges: Judged) -> Weighing:
    """How a word check judging `judges` is weighed: a pilot by the seconds of the whole command (it heard part of
    it), a hypothesis of the whole input by its own tokens."""
    return "seconds" if judges == "pilot" else "tokens"


def token_count(hypothesis: Hypothesis | HypothesisFeatures) -> int:
    """The tokens a hypothesis is weighed by (`weigh`): those scored, <eos> included; at least one."""
    return max(len(hypothesis.token_att), 1)


def weigh(score: ScoreLike, weighing: Weighing, speech_seconds: ScoreLike, tokens: ScoreLike) -> ScoreLike:
    """A per-hypothesis offramp score scaled to the utterance as `weighing` says (`tokens`: the hypothesis's)."""
    if weighing == "seconds":
        return weigh_by_length(score, speech_seconds)
    return score * tokens if weighing == "tokens" else score


def weigh_by_length(score: ScoreLike, speech_seconds: ScoreLike) -> ScoreLike:
    """A per-token offramp score scaled to grow with the utterance, as its expected word errors do."""
    return score * speech_seconds


@dataclass(frozen=True)
class OnDevice:
    name: str = "OnDevice"
    judges: Judged = "pilot"

    def decide(self, hypothesis: Hypothesis | None, speech_seconds: float) -> Decision:
        return Decision(False, None, "on-device policy")


@dataclass(frozen=True)
class AllOffload:
    name: str = "AllOffload"
    judges: Judged = "pilot"

    def decide(self, hypothesis: Hypothesis | None, speech_seconds: float) -> Decision:
        return Decision(True, None, "all-offload policy")


class NaiveHybrid:
    """Offloads each utterance with a fixed probability, whatever the device thinks."""

    judges: Judged = "pilot"

    def __init__(self, probability: float, seed: int = 0):
        self.probability = probability
        self.name = f"NaiveHybrid(p={probability:.2f})"
        self._rng = random.Random(seed)

    def decide(self, hypothesis: Hypothesis | None, speech_seconds: float) -> Decision:
        draw = self._rng.random()
        return Decision(draw < self.probability, draw, f"random draw {draw:.2f} vs {self.probability:.2f}")


@dataclass(frozen=True)
class OfframpPolicy:
    """Offload when the offramp's score, weighed by the utterance's length (`weighing`), exceeds the threshold."""

    offramp: Offramp
    threshold: float  # in the offramp's units times seconds or tokens (`weighing`)
    name: str = "Ours-PPL"
    judges: Judged = "pilot"
    # "none": the offramp's score as it is, whatever the utterance's length (the paper's rule; an intent check)
    weighing: Weighing = "seconds"

    def score(self, hypothesis: Hypothesis, speech_seconds: float) -> float:
        """What is compared with the threshold."""
        return weigh(self.offramp.score(hypothesis), self.weighing, speech_seconds, token_count(hypothesis))

    def decide(self, hypothesis: Hypothesis | None, speech_seconds: float) -> Decision:
        return decide_by_score(self, hypothesis, speech_seconds)


@dataclass(frozen=True)
class EitherPolicy:
    """Offload when any part would: each part's score over its own threshold, the largest against `threshold`
    (1: exactly the parts' own decisions; calibration moves the parts' thresholds together by it).

    Words and intent go wrong apart: a perplexity check keeps right words under a wrong intent, the intent check
    wrong words under a right intent. A device answering both needs both checks, each scored as it ranks best
    (the word check weighed by the speech's length, the intent check not).
    """

    parts: tuple[OfframpPolicy, ...]  # each at the threshold that counts as 1
    threshold: float = 1.0
    name: str = "Ours-PPL+Intent"
    judges: Judged = "pilot"

    def score(self, hypothesis: Hypothesis, speech_seconds: float) -> float:
        """What is compared with the threshold."""
        return max(part.score(hypothesis, speech_seconds) / part.threshold for part in self.parts)

    def decide(self, hypothesis: Hypothesis | None, speech_seconds: float) -> Decision:
        return decide_by_score(self, hypothesis, speech_seconds)

    @staticmethod
    def combine(scores: Sequence[ScoreLike], scales: Sequence[float]) -> ScoreLike:
        """The parts' scores (one each, or arrays of many; as their policies score them) combined as `score`
        combines them at these part thresholds."""
        return functools.reduce(np.maximum, (np.divide(s, scale) for s, scale in zip(scores, scales)))


def decide_by_score(policy: OfframpPolicy | EitherPolicy, hypothesis: Hypothesis | None,
                    speech_seconds: float) -> Decision:
    """Offload when the policy's score exceeds its threshold; with nothing to judge, offload."""
    if hypothesis is None:
        return Decision(True, None, "no hypothesis to judge")
    score = policy.score(hypothesis, speech_seconds)
    verdict = ">" if score > policy.threshold else "<="
    return Decision(score > policy.threshold, score,
                    f"{policy.name} score {score:.3g} {verdict} {policy.threshold:.3g}")


def intent_policy(offramp: Offramp, threshold: float, name: str = "Ours-Intent") -> OfframpPolicy:
    """The intent check as a policy: its P(intent wrong) as it is, since intent accuracy counts utterances, not
    words (weighed by length it offloads long right commands before short wrong ones)."""
    return OfframpPolicy(offramp, threshold, name, weighing="none")


PolicyName = Literal["on-device", "all", "naive", "ppl", "ppl-end", "ppl-late", "bilstm", "bilstm-end",
                     "bilstm-late", "intent", "ppl+intent", "bilstm+intent"]
OffloadLevel = Literal["L", "M", "H"]  # the paper's Offload-L / -M / -H (calibration.OFFLOAD_LEVELS)
# the parts of a policy that check the words, with their design names; "-end": on the end-of-speech pilot,
# "-late": on the full local decode
WORD_CHECKS = {"ppl": "Ours-PPL", "bilstm": "Ours-BiLSTM", "ppl-end": "End-PPL", "bilstm-end": "End-BiLSTM",
               "ppl-late": "Late-PPL", "bilstm-late": "Late-BiLSTM"}
JUDGED_BY_SUFFIX: dict[str, Judged] = {"-end": "end", "-late": "final"}  # no suffix: the last pilot


@dataclass(frozen=True)
class RoutingOptions:
    """Whether and where `pasu device run` offloads (the `routing` section of device/agent.yaml)."""

    cloud: tuple[str, ...] = ()  # cloud server addresses (host:port; several: replicas, round robin); (): local
    # with a cloud: on-device (never offload), all (always), naive (a random naive_share, NaiveHybrid), ppl or
    # bilstm (the word check above threshold), ppl-end or bilstm-end (the word check of the end-of-speech pilot,
    # a few ms after end of speech: BeamSearch.ctc_greedy on the whole input's encoding), ppl-late (perplexity of
    # the full local decode, not of the last pilot: the paper's deciding-late baseline, which offloads only after
    # decoding), bilstm-late (a BiLSTM fitted on full local decodes, judging the full decode: the most selective of
    # them, at the wait for that decode), intent (above intent_threshold), ppl+intent or bilstm+intent (above either: at Offload-M they
    # offload less than the word check alone and lose less intent accuracy against offloading everything; the
    # latest `pasu bench hybrid` numbers are in README.md)
    policy: PolicyName = "ppl+intent"
    # the word check's score times the speech's seconds above which the utterance is offloaded: the last pilot's
    # perplexity (ppl, ppl+intent) or the BiLSTM's P(local WER > 0.1) (bilstm, bilstm+intent); for the -end and
    # -late policies the score times the hypothesis's tokens, the perplexity's in log units (`weighing_for`,
    # `perplexity_offramp`); None: the model's threshold calibrated for the policy at `level`
    # (`calibrated_routing`, MODEL/offramp)
    threshold: float | None = None
    # intent and the +intent policies: the intent offramp's P(the device's intent is wrong) for the last pilot
    # (intent_offramp.IntentOfframp; not weighed by length) above which the utterance is offloaded; None: the
    # model's threshold calibrated at `level`, as above
    intent_threshold: float | None = None
    # the calibrated operating point that the thresholds left None take: the paper's Offload-L, -M or -H, where
    # the policy offloaded 25%, 47% or 63% of the model's dev calibration utterances
    level: OffloadLevel = "M"
    # naive: the share of utterances offloaded at random, whatever the device thinks (NaiveHybrid's alpha)
    naive_share: float = 0.47
    token_file: str | None = None  # file whose first non-comment line is the cloud's bearer token; None: no token
    # TLS towards the cloud, mutual when the client certificate and key are given; None: plaintext
    tls: ClientTls | None = None
    # how the waveform travels: pcm16, flac (lossless, about 2/3 the bytes) or opus (lossy, about 1/4: for slow
    # uplinks; costs a little accuracy and tens of ms of encoding)
    encoding: Encoding = "pcm16"

    def make_policy(self, intent: Offramp | None = None, bilstm: Offramp | None = None) -> Policy:
        """The policy object `policy` names; `intent`: the model's intent-agreement offramp, `bilstm`: its BiLSTM
        offramp, for the policies that read them."""
        if self.policy in ("on-device", "all"):
            return AllOffload() if self.policy == "all" else OnDevice()
        if self.policy == "naive":
            if not 0.0 <= self.naive_share <= 1.0:
                raise ValueError(f"routing.naive_share {self.naive_share} is not a share between 0 and 1")
            return NaiveHybrid(self.naive_share)
        self._check_thresholds()
        words = self._word_offramp(bilstm)
        if self.policy in WORD_CHECKS:
            return OfframpPolicy(words, self.threshold, WORD_CHECKS[self.policy], self.judges,
                                 weighing_for(self.judges))
        if intent is None:
            raise ValueError(f"the {self.policy} policy needs the model's intent reader (MODEL/offramp: "
                             "`pasu offramp train`)")
        if self.policy == "intent":
            return intent_policy(intent, self.intent_threshold)
        name = WORD_CHECKS[self.word_part]
        parts = (OfframpPolicy(words, self.threshold, name), intent_policy(intent, self.intent_threshold))
        return EitherPolicy(parts, name=f"{name}+Intent")

    def _word_offramp(self, bilstm: Offramp | None) -> Offramp | None:
        if self.word_check == "bilstm" and bilstm is None:
            raise ValueError(f"the {self.policy} policy needs the model's BiLSTM offramp (MODEL/offramp: "
                             "`pasu offramp train`)")
        return perplexity_offramp(self.judges) if self.word_check == "ppl" else bilstm

    @property
    def word_part(self) -> str | None:
        """The part of the named policy that checks the words ("ppl", "ppl-end", "bilstm-late", ...), or None."""
        return next((part for part in self.policy.split("+") if part in WORD_CHECKS), None)

    @property
    def judges(self) -> Judged:
        """The hypothesis the named policy's word check judges (the last pilot's for the other policies)."""
        suffix = next((s for s in JUDGED_BY_SUFFIX if self.word_part and self.word_part.endswith(s)), None)
        return JUDGED_BY_SUFFIX[suffix] if suffix else "pilot"

    @property
    def word_check(self) -> str | None:
        """The word-error offramp the named policy reads ("ppl", "bilstm"), or None."""
        return self.word_part.split("-")[0] if self.word_part else None

    def _check_thresholds(self) -> None:
        """ValueError naming each threshold the policy reads that is still unset."""
        if unset := self.unset_thresholds:
            raise ValueError(f"the {self.policy} policy needs routing.{' and routing.'.join(unset)}: calibrate the "
                             "model (`pasu offramp train`) or set them (--threshold, --intent-threshold)")

    @property
    def unset_thresholds(self) -> list[str]:
        """The threshold fields the named policy compares with that are still None."""
        read = {"threshold": self.word_check is not None, "intent_threshold": self.reads_intent}
        return [name for name, used in read.items() if used and getattr(self, name) is None]

    @property
    def reads_intent(self) -> bool:
        """Whether the named policy needs the model's intent reader."""
        return "intent" in self.policy.split("+")

    def with_policy_threshold(self, value: float) -> RoutingOptions:
        """These options with the named policy's threshold set to `value`."""
        return replace(self, **{"intent_threshold" if self.policy == "intent" else "threshold": value})

    def token(self) -> str | None:
        """The bearer token read from `token_file` (tokens are never written in the YAML itself)."""
        if self.token_file is None:
            return None
        lines = (line.strip() for line in Path(self.token_file).read_text().splitlines())
        return next((line for line in lines if line and not line.startswith("#")), None)
