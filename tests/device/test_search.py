"""The pilot-assisted beam search against ESPnet's own, with each speed-up on its own and together."""

from __future__ import annotations

import pytest
import torch
from pasu.device.decoding.search import Reference, SearchAborted, SearchOptions

SECONDS = (1.0, 1.2, 1.4, 1.6)


@pytest.fixture(scope="module")
def encoded(tiny_model, speech_like):
    """Encoder outputs (T, D) of four utterances of different lengths."""
    out = []
    with torch.inference_mode():
        for seed, seconds in enumerate(SECONDS):
            wave = torch.from_numpy(speech_like(seconds, seed)).unsqueeze(0)
            enc, lengths = tiny_model.model.encode(wave, torch.tensor([wave.size(1)]))
            out.append(enc[0, : int(lengths[0])])
    return out


@pytest.fixture(scope="module")
def vanilla(tiny_model, encoded):
    return [tiny_model.search.search(enc) for enc in encoded]


def _same_or_better(result, reference_result) -> bool:
    """Same answer as vanilla, or one the model scores strictly higher (a hypothesis vanilla's beam lost)."""
    best, ref = result.best, reference_result.best
    return best.tokens == ref.tokens or best.score > ref.score + 1e-4


def _nbest_scores(espnet_hyps) -> list[float]:
    """ESPnet's five best scores: compared within 1e-3, not rounded to 3 places, since our float64 CTC and its
    float32 one can put a score either side of a rounding boundary."""
    return [float(h.score) for h in espnet_hyps[:5]]


def test_with_speedups_off_it_is_espnets_batch_beam_search(tiny_model, encoded, vanilla):
    espnet = tiny_model.espnet_search(beam_size=5, ctc_weight=0.3, batch=True)
    for enc, ours in zip(encoded, vanilla):
        with torch.inference_mode():  # ESPnet scores the inference-mode encoder output
            hyps = espnet(x=enc, maxlenratio=0.0, minlenratio=0.0)
        assert [int(t) for t in hyps[0].yseq[1:-1]] == list(ours.best.tokens)
        assert float(hyps[0].score) == pytest.approx(ours.best.score, abs=1e-4)
        assert _nbest_scores(hyps) == pytest.approx([h.score for h in ours.hypotheses[:5]], abs=1e-3)


def test_beam_collapse_with_the_right_reference_follows_it(tiny_model, encoded, vanilla):
    for enc, v in zip(encoded, vanilla):
        result = tiny_model.search.search(enc, SearchOptions(beam_collapse=True), Reference(v.best.tokens, len(enc)))
        assert _same_or_better(result, v)
        assert result.stats.collapsed_steps >= len(v.best.tokens) // 2
        assert result.stats.ctc_frames < v.stats.ctc_frames  # the point: less CTC work


def test_beam_collapse_recovers_from_a_wrong_reference(tiny_model, encoded, vanilla):
    vocab = len(tiny_model.token_list)
    for enc, v in zip(encoded, vanilla):
        wrong = list(v.best.tokens)
        wrong[2] = (wrong[2] + 7) % (vocab - 2) + 1  # diverges at the third token
        result = tiny_model.search.search(enc, SearchOptions(beam_collapse=True), Reference(tuple(wrong), len(enc)))
        assert result.stats.collapsed_steps <= 2  # followed it only while it was right
        assert _same_or_better(result, v)


def test_early_termination_keeps_the_answer_when_the_prediction_is_long_enough(tiny_model, encoded, vanilla):
    for enc, v in zip(encoded, vanilla):
        # A reference as long as vanilla's answer over the whole input predicts at least its length.
        options = SearchOptions(early_termination=True, length_margin=0)
        result = tiny_model.search.search(enc, options, Reference(v.best.tokens, len(enc)))
        assert result.best.tokens == v.best.tokens
        assert result.stats.steps <= v.stats.steps


def test_early_termination_stops_at_the_predicted_length(tiny_model, encoded, vanilla):
    enc, v = encoded[-1], vanilla[-1]
    short = Reference(v.best.tokens[:4], len(enc))  # predicts 4 + margin tokens
    result = tiny_model.search.search(enc, SearchOptions(early_termination=True, length_margin=2), short)
    assert result.stats.early_stop
    assert result.stats.steps < v.stats.steps
    assert result.best.ended


def test_stopping_when_decided_returns_the_vanilla_answer_in_fewer_steps(tiny_model, encoded, vanilla):
    saved = 0
    for enc, v in zip(encoded, vanilla):
        result = tiny_model.search.search(enc, SearchOptions(stop_when_decided=True))
        assert result.best.tokens == v.best.tokens
        assert result.best.score == pytest.approx(v.best.score, abs=1e-4)
        assert result.stats.steps <= v.stats.steps
        saved += v.stats.steps - result.stats.steps
    assert saved > 0  # ESPnet's end detection runs on after the answer is decided


def test_a_length_bonus_turns_the_decided_stop_off(tiny_model, encoded):
    # a positive bonus can lift a running hypothesis past the best ended one: the stop would not be exact
    options = SearchOptions(stop_when_decided=True, length_bonus=1.0)
    assert not any(tiny_model.search.search(enc, options).stats.decided_stop for enc in encoded)


def test_ctc_leap_over_unchanged_frames_returns_the_vanilla_answer(tiny_model, encoded, vanilla):
    vocab = len(tiny_model.token_list)
    for enc, v in zip(encoded, vanilla):
        pilot_frames = int(0.7 * len(enc))  # the pilot saw a prefix of the same encoder output
        pilot = tiny_model.search.search(
            enc[:pilot_frames], SearchOptions(beam_size=3, max_tokens=15, pre_beam_size=vocab, record_ctc=True)
        )
        result = tiny_model.search.search(enc, SearchOptions(ctc_leap=True), pilot.as_reference())
        assert result.stats.leap_scorings > 0
        assert result.best.tokens == v.best.tokens
        assert result.best.score == pytest.approx(v.best.score, abs=1e-3)
        assert result.stats.ctc_frames < v.stats.ctc_frames


def test_a_capped_pilot_offers_unfinished_hypotheses(tiny_model, encoded):
    result = tiny_model.search.search(encoded[0], SearchOptions(beam_size=3, max_tokens=4))
    assert result.stats.steps == 4
    assert all(len(h.tokens) <= 4 for h in result.hypotheses)
    assert result.best is not None and len(result.best.token_att) == len(result.best.token_ctc)


def test_a_search_can_be_abandoned_between_steps(tiny_model, encoded):
    calls = []

    def abort_on_third_poll() -> bool:
        calls.append(1)
        return len(calls) >= 3

    with pytest.raises(SearchAborted):
        tiny_model.search.search(encoded[0], SearchOptions(), should_abort=abort_on_third_poll)
    assert len(calls) == 3


def test_first_token_rescoring_keeps_a_best_hypothesis_no_alternative_beats(tiny_model, encoded, vanilla):
    for enc, v in zip(encoded, vanilla):
        result = tiny_model.search.search(enc, SearchOptions(rescore_first_tokens=5))
        assert result.best.tokens[1:] == v.best.tokens[1:]
        assert result.best.score >= v.best.score - 1e-4
        if not result.stats.first_token_rescored:
            assert result.best == v.best


def test_forced_scores_reproduce_the_searchs_own(tiny_model, encoded, vanilla):
    checked = 0
    for enc, v in zip(encoded, vanilla):
        # a hypothesis ended by the length limit has no <eos> score (ESPnet forces the end there)
        for hyp in [h for h in v.hypotheses[:3] if len(h.token_att) == len(h.tokens) + 1]:
            checked += 1
            forced = tiny_model.search.token_scores(enc, [hyp.tokens])[0]
            assert forced.token_att == pytest.approx(hyp.token_att, abs=1e-4)
            assert forced.token_ctc == pytest.approx(hyp.token_ctc, abs=1e-3)
            assert forced.score == pytest.approx(hyp.score, abs=1e-3)
    assert checked >= 4


def test_ctc_greedy_is_the_best_path_scored_as_forced_decoding(tiny_model, encoded):
    search = tiny_model.search
    checked = 0
    for enc in encoded:
        with torch.inference_mode():
            path = search.ctc.argmax(enc.unsqueeze(0))[0].tolist()
        collapsed = [t for i, t in enumerate(path) if t != search.blank and (i == 0 or t != path[i - 1])]
        greedy = search.ctc_greedy(enc)
        if collapsed:
            checked += 1
            assert list(greedy.tokens) == collapsed and greedy.ended
            assert greedy == search.token_scores(enc, [collapsed])[0]
            assert len(greedy.token_att) == len(greedy.token_ctc) == len(collapsed) + 1  # <eos> scored too
    assert checked


def test_ctc_greedy_of_frames_that_are_all_blank_is_none(tiny_model, encoded):
    search = tiny_model.search
    weight = search.ctc.ctc_lo.weight  # frames along the blank's output row: the CTC says blank on each
    blank_only = 50.0 * weight[search.blank].detach().expand(len(encoded[0]), -1).clone()
    with torch.inference_mode():
        assert (search.ctc.argmax(blank_only.unsqueeze(0))[0] == search.blank).all()
    assert search.ctc_greedy(blank_only) is None


def test_first_token_rescoring_picks_the_best_scoring_first_token(tiny_model, encoded):
    """Greedy search commits to its first token (as collapse does); rescoring tries the others."""
    search = tiny_model.search
    for enc in encoded:
        plain = search.search(enc, SearchOptions(beam_size=1))
        rescored = search.search(enc, SearchOptions(beam_size=1, rescore_first_tokens=5))
        candidates = search.search(enc, SearchOptions(beam_size=5, max_tokens=1)).hypotheses
        firsts = [h.tokens[0] for h in candidates if h.tokens]
        tail = plain.best.tokens[1:]
        scored = search.token_scores(enc, [(c, *tail) for c in firsts])
        best = max(scored + search.token_scores(enc, [plain.best.tokens]), key=lambda h: h.score)
        assert rescored.best.tokens == best.tokens
        assert rescored.stats.first_token_rescored == (best.tokens != plain.best.tokens)
        assert rescored.best.score == pytest.approx(best.score, abs=1e-3)


def test_with_an_lm_it_is_espnets_batch_beam_search_with_that_lm(with_lm, encoded, vanilla):
    espnet = with_lm.espnet_search(beam_size=5, ctc_weight=0.3, batch=True, lm_weight=0.5)
    changed = 0
    for enc, v in zip(encoded, vanilla):
        ours = with_lm.search.search(enc, SearchOptions(lm_weight=0.5))
        with torch.inference_mode():
            hyps = espnet(x=enc, maxlenratio=0.0, minlenratio=0.0)
        assert [int(t) for t in hyps[0].yseq[1:-1]] == list(ours.best.tokens)
        assert _nbest_scores(hyps) == pytest.approx([h.score for h in ours.hypotheses[:5]], abs=1e-3)
        changed += ours.best.tokens != v.best.tokens
    assert changed  # the LM has a say


def test_forced_scores_with_an_lm_reproduce_the_searchs_own(with_lm, encoded):
    options = SearchOptions(lm_weight=0.5)
    checked = 0
    for enc in encoded:
        for hyp in with_lm.search.search(enc, options).hypotheses[:3]:
            if len(hyp.token_att) != len(hyp.tokens) + 1:  # ended by the length limit: no <eos> score
                continue
            checked += 1
            assert with_lm.search.token_scores(enc, [hyp.tokens], options)[0].score == pytest.approx(hyp.score, abs=1e-3)
    assert checked >= 4


def test_an_lm_weight_needs_a_search_with_an_lm(tiny_model, encoded):
    with pytest.raises(ValueError, match="needs a search built with an LM"):
        tiny_model.search.search(encoded[0], SearchOptions(lm_weight=0.3))
    with pytest.raises(ValueError, match="needs a model with an LM"):
        tiny_model.espnet_search(beam_size=5, ctc_weight=0.3, batch=True, lm_weight=0.3)
