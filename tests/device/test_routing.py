"""Routing options: the policy they name and the token they read."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pasu.device.decoding.search import Hypothesis
from pasu.device.routing import (
    AllOffload,
    EitherPolicy,
    NaiveHybrid,
    OfframpPolicy,
    OnDevice,
    PerplexityOfframp,
    RoutingOptions,
    LogPerplexityOfframp,
)


def test_policy_names():
    assert isinstance(RoutingOptions(policy="on-device").make_policy(), OnDevice)
    assert isinstance(RoutingOptions(policy="all").make_policy(), AllOffload)
    ppl = RoutingOptions(policy="ppl", threshold=2.5).make_policy()
    assert isinstance(ppl, OfframpPolicy) and ppl.threshold == 2.5


def test_the_papers_baselines_by_name():
    """naive: NaiveHybrid at naive_share; ppl-late: perplexity judged on the full local decode; ppl-end: on the
    end-of-speech pilot."""
    naive = RoutingOptions(policy="naive", naive_share=0.3).make_policy()
    assert isinstance(naive, NaiveHybrid) and naive.probability == 0.3
    draws = [naive.decide(None, 2.0).offload for _ in range(2000)]
    assert 0.25 < np.mean(draws) < 0.35  # a random share, whatever the hypothesis
    with pytest.raises(ValueError, match="naive_share 1.5"):
        RoutingOptions(policy="naive", naive_share=1.5).make_policy()
    late = RoutingOptions(policy="ppl-late", threshold=3.0).make_policy()
    assert late.judges == "final" and late.name == "Late-PPL" and isinstance(late.offramp, LogPerplexityOfframp)
    assert RoutingOptions(policy="ppl", threshold=3.0).make_policy().judges == "pilot"
    end = RoutingOptions(policy="ppl-end", threshold=3.0).make_policy()
    assert end.judges == "end" and end.name == "End-PPL" and isinstance(end.offramp, LogPerplexityOfframp)
    with pytest.raises(ValueError, match=r"routing\.threshold"):
        RoutingOptions(policy="ppl-late").make_policy()
    bilstm = object()  # the model's BiLSTM offramp
    late_bilstm = RoutingOptions(policy="bilstm-late", threshold=0.4).make_policy(bilstm=bilstm)
    assert late_bilstm.judges == "final" and late_bilstm.name == "Late-BiLSTM" and late_bilstm.offramp is bilstm
    end_bilstm = RoutingOptions(policy="bilstm-end", threshold=0.4).make_policy(bilstm=bilstm)
    assert end_bilstm.judges == "end" and end_bilstm.name == "End-BiLSTM" and end_bilstm.offramp is bilstm
    assert RoutingOptions(policy="bilstm+intent").judges == "pilot"  # the pair judges the last pilot
    with pytest.raises(ValueError, match="needs the model's BiLSTM offramp"):
        RoutingOptions(policy="bilstm-late", threshold=0.4).make_policy()


def test_a_hypothesis_of_the_whole_input_is_weighed_by_its_tokens():
    """A pilot's score is weighed by the seconds of the whole command; the end-of-speech pilot and the full decode
    heard all of it, so theirs by their own tokens: for perplexity, in log units, their total surprisal."""
    hypothesis = Hypothesis((1, 2), 0.0, True, (-0.5, -1.0, -0.5), (-0.1, -0.1))
    end = RoutingOptions(policy="ppl-end", threshold=1.9).make_policy()
    assert end.score(hypothesis, 3.0) == pytest.approx(2.0) == end.score(hypothesis, 30.0)
    assert end.decide(hypothesis, 3.0).offload
    late = RoutingOptions(policy="ppl-late", threshold=2.1).make_policy()
    assert late.score(hypothesis, 3.0) == pytest.approx(2.0) and not late.decide(hypothesis, 10.0).offload
    pilot = RoutingOptions(policy="ppl", threshold=1.0).make_policy()
    assert pilot.score(hypothesis, 3.0) == pytest.approx((0.5 + 1.0) / 2 * 3.0)  # its words' surprisal x seconds
    doubt = PerplexityOfframp()  # any offramp: the BiLSTM's probability is weighed the same way
    for policy, weighed in (("bilstm", 5.0), ("bilstm-end", 3), ("bilstm-late", 3)):  # 5 s, 3 tokens (<eos>)
        scored = RoutingOptions(policy=policy, threshold=0.5).make_policy(bilstm=doubt).score(hypothesis, 5.0)
        assert scored == pytest.approx(doubt.score(hypothesis) * weighed)
    nothing = Hypothesis((), 0.0, False, (), ())
    assert end.score(nothing, 3.0) == math.inf and end.decide(nothing, 3.0).offload  # nothing heard: offload


def test_a_pilot_is_judged_on_its_words_whether_or_not_it_ended():
    """A pilot's <eos> score says whether the command sounded finished when it ran, not whether its words are right:
    the pilot stopped by the token cap and the one that ended score the same words the same."""
    policy = RoutingOptions(policy="ppl", threshold=1.0).make_policy()
    capped = Hypothesis((4, 5), 0.0, False, (-0.2, -0.6), (-0.1, -0.1))
    ended = Hypothesis((4, 5), 0.0, True, (-0.2, -0.6, -6.0), (-0.1, -0.1))
    assert policy.score(capped, 2.0) == pytest.approx(policy.score(ended, 2.0)) == pytest.approx(0.8)
    only_end = Hypothesis((), 0.0, True, (-0.3,), ())
    assert policy.score(only_end, 2.0) == math.inf  # no words heard yet: nothing to trust
    # the end-of-speech pilot heard the whole command: its <eos> counts
    end = RoutingOptions(policy="ppl-end", threshold=1.0).make_policy()
    assert end.score(ended, 2.0) > end.score(capped, 2.0)


def test_an_offramp_policy_without_its_threshold_says_which_is_missing():
    """Thresholds are the model's (`offramp_train.calibrated_routing`): unset ones are an error, not a guess."""
    with pytest.raises(ValueError, match=r"routing\.threshold: calibrate"):
        RoutingOptions(policy="ppl").make_policy()
    with pytest.raises(ValueError, match=r"routing\.threshold and routing\.intent_threshold"):
        RoutingOptions(policy="ppl+intent").make_policy(object())


def test_token_comes_from_the_token_file(tmp_path):
    assert RoutingOptions().token() is None
    (tmp_path / "token").write_text("# this device's token\n\n  s3cret  \nignored\n")
    assert RoutingOptions(token_file=str(tmp_path / "token")).token() == "s3cret"
    with pytest.raises(FileNotFoundError):
        RoutingOptions(token_file=str(tmp_path / "missing")).token()


def test_offramp_policy_weighs_the_score_by_the_speech_length():
    """A corpus WER sums edits: the same doubtful hypothesis is worth offloading in a long command, not a short one."""
    doubtful = Hypothesis((5, 6, 7), 0.0, True, token_att=(-1.0, -1.0, -1.0, -1.0))  # perplexity e
    policy = OfframpPolicy(PerplexityOfframp(), threshold=2 * math.e)
    assert policy.score(doubtful, 4.0) == pytest.approx(4 * math.e)
    assert policy.decide(doubtful, 4.0).offload and not policy.decide(doubtful, 1.0).offload
    as_is = OfframpPolicy(PerplexityOfframp(), threshold=2.0, weighing="none")
    assert as_is.decide(doubtful, 1.0).offload and as_is.decide(doubtful, 4.0).offload


def test_a_policy_without_a_hypothesis_offloads():
    assert OfframpPolicy(PerplexityOfframp(), threshold=1e9).decide(None, 3.0).offload


def test_the_intent_policy_needs_the_models_intent_reader():
    class Disagreeing:  # an offramp whose reader never agrees with the pilot
        def score(self, hypothesis):
            return 0.9

    with pytest.raises(ValueError, match="intent reader"):
        RoutingOptions(policy="intent", intent_threshold=0.5).make_policy()
    policy = RoutingOptions(policy="intent", intent_threshold=0.5).make_policy(Disagreeing())
    pilot = Hypothesis((5, 6), 0.0, True, token_att=(-0.1, -0.1, -0.1))
    assert policy.decide(pilot, 1.0).offload


class FixedDoubt:
    """An intent offramp whose doubt is set by the test."""

    def __init__(self, doubt: float):
        self.doubt = doubt

    def score(self, hypothesis):
        return self.doubt


def test_the_bilstm_policies_read_the_models_bilstm():
    """The paper's learned offramp as the agent's word check, alone or beside the intent check."""
    with pytest.raises(ValueError, match="BiLSTM offramp"):
        RoutingOptions(policy="bilstm", threshold=1.2).make_policy()
    words = RoutingOptions(policy="bilstm", threshold=1.2).make_policy(bilstm=FixedDoubt(0.5))
    pilot = Hypothesis((5, 6), 0.0, True, token_att=(-0.1, -0.1, -0.1))
    assert words.name == "Ours-BiLSTM" and words.decide(pilot, 3.0).offload and not words.decide(pilot, 2.0).offload
    routing = RoutingOptions(policy="bilstm+intent", threshold=1.2, intent_threshold=0.5)
    assert routing.word_check == "bilstm" and routing.reads_intent
    both = routing.make_policy(FixedDoubt(0.4), bilstm=FixedDoubt(0.3))
    assert both.name == "Ours-BiLSTM+Intent"
    assert not both.decide(pilot, 3.0).offload  # 0.3 x 3 s <= 1.2, intent 0.4 <= 0.5
    assert routing.make_policy(FixedDoubt(0.6), bilstm=FixedDoubt(0.3)).decide(pilot, 3.0).offload  # 0.6 > 0.5
    assert RoutingOptions(policy="bilstm+intent").unset_thresholds == ["threshold", "intent_threshold"]


def test_the_cli_offers_every_policy():
    from typing import get_args

    from pasu.device.cli import POLICIES
    from pasu.device.routing import PolicyName

    assert POLICIES == get_args(PolicyName)


def test_the_ppl_and_intent_policy_offloads_when_either_check_fires():
    """Right words under a doubtful intent, or a sure intent over doubtful words: both go to the cloud."""
    routing = RoutingOptions(policy="ppl+intent", threshold=2.0, intent_threshold=0.4)
    with pytest.raises(ValueError, match="pasu offramp train"):
        routing.make_policy()
    sure_words = Hypothesis((5, 6), 0.0, True, token_att=(-0.01, -0.01, -0.01))  # a word's surprisal about 0
    doubtful_words = Hypothesis((5, 6), 0.0, True, token_att=(-1.0, -1.0, -1.0))  # 1 nat a token
    seconds = 3.0  # 1 nat x 3 s > 2, 0.01 x 3 s not; P(intent wrong) 0.5 > 0.4, 0.2 not (not weighed)
    decide = lambda hypothesis, doubt: routing.make_policy(FixedDoubt(doubt)).decide(hypothesis, seconds).offload
    assert decide(doubtful_words, 0.2) and decide(sure_words, 0.5) and decide(doubtful_words, 0.5)
    assert not decide(sure_words, 0.2)


def test_the_intent_check_is_not_weighed_by_the_speechs_length():
    """Intent accuracy counts utterances: a long command is no likelier to carry a wrong intent."""
    policy = RoutingOptions(policy="intent", intent_threshold=0.4).make_policy(FixedDoubt(0.3))
    hypothesis = Hypothesis((5, 6), 0.0, True, token_att=(-0.1, -0.1, -0.1))
    assert [policy.decide(hypothesis, seconds).offload for seconds in (0.5, 2.0, 9.0)] == [False] * 3
    assert policy.decide(hypothesis, 9.0).score == pytest.approx(0.3)


def test_the_either_policy_scores_each_part_in_units_of_its_own_threshold():
    parts = (OfframpPolicy(PerplexityOfframp(), 4.0), OfframpPolicy(FixedDoubt(0.3), 0.5, weighing="none"))
    either = EitherPolicy(parts, threshold=1.2)
    doubtful_words = Hypothesis((5, 6), 0.0, True, token_att=(-1.0, -1.0, -1.0))
    assert either.score(doubtful_words, 2.0) == pytest.approx(max(2 * math.e / 4.0, 0.3 / 0.5))
    assert either.decide(doubtful_words, 2.0).offload and not either.decide(doubtful_words, 1.0).offload
    many = EitherPolicy.combine([np.array([4.0, 1.0]), np.array([0.1, 0.4])], [2.0, 0.5])
    assert many == pytest.approx([2.0, 0.8])
