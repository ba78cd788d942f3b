"""CTC prefix scoring: ESPnet's numbers, and the CTC leap is exact where the posteriors did not change."""

from __future__ import annotations

import pytest
import torch
from espnet.nets.ctc_prefix_score import CTCPrefixScoreTH
from pasu.device.decoding.ctc_prefix import CtcPrefixScorer, LeapStart, collapse_path


def _posteriors(frames: int, vocab: int = 12, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(3 * torch.randn(frames, vocab, generator=g), dim=-1)


def test_first_step_scores_equal_espnet():
    logp, eos = _posteriors(30), 11
    ids = torch.tensor([[3, 5, 7, eos]])
    ours = CtcPrefixScorer(logp, blank=0, eos=eos)
    psi, _, _ = ours.score(0, torch.tensor([eos]), ours.initial_forward().unsqueeze(2), ids)
    theirs = CTCPrefixScoreTH(logp.unsqueeze(0).clone(), torch.tensor([30]), 0, eos)
    espnet_psi, _ = theirs([torch.tensor([eos])], None, ids)
    assert torch.allclose(psi[0, :3], espnet_psi[0, ids[0, :3]])


@pytest.mark.parametrize("frames, vocab, seed", [(25, 12, 1), (750, 40, 5)], ids=["1s", "30s"])
def test_second_token_scores_equal_espnet(frames: int, vocab: int, seed: int):
    """Also on a 30-s input, where log X_t of the closed-form recursion spans thousands of nats."""
    logp, eos = _posteriors(frames, vocab, seed=seed), vocab - 1
    ours = CtcPrefixScorer(logp, blank=0, eos=eos)
    first = torch.tensor([[4, 6]])
    _, r, _ = ours.score(0, torch.tensor([eos]), ours.initial_forward().unsqueeze(2), first)
    ids = torch.tensor([[4, 2, 9]])  # 4 repeats the prefix's last token: needs a blank in between
    psi, _, _ = ours.score(1, torch.tensor([4]), r[:, :, :, 0], ids)

    theirs = CTCPrefixScoreTH(logp.unsqueeze(0).clone(), torch.tensor([frames]), 0, eos)
    _, state = theirs([torch.tensor([eos])], None, first)
    r_e, log_psi, f_min, f_max, _ = state
    state = (r_e[:, :, 0, 0].unsqueeze(2), log_psi[0, 4].view(1), f_min, f_max)
    espnet_inc, _ = theirs([torch.tensor([eos, 4])], state, ids)
    assert torch.allclose(psi[0] - log_psi[0, 4], espnet_inc[0, ids[0]], atol=1e-4)


def test_leap_is_exact_when_the_early_posteriors_are_unchanged():
    full = _posteriors(40, seed=2)
    pilot = full[:28]  # the pilot saw the first 28 frames; the full input has the same posteriors there
    eos, ids = 11, torch.tensor([[1, 2, 3, 4, 5]])
    start = torch.tensor([eos])
    pilot_scorer = CtcPrefixScorer(pilot, 0, eos)
    _, r_p, cum_p = pilot_scorer.score(0, start, pilot_scorer.initial_forward().unsqueeze(2), ids, record=True)

    scorer = CtcPrefixScorer(full, 0, eos)
    r0 = scorer.initial_forward().unsqueeze(2)
    exact_psi, exact_r, _ = scorer.score(0, start, r0, ids)
    leap = LeapStart(frame=21, r=r_p[:21], psi_cum=cum_p[:21])
    leap_psi, leap_r, _ = scorer.score(0, start, r0, ids, leap=leap)
    assert torch.allclose(leap_psi, exact_psi, atol=1e-4)
    assert torch.allclose(leap_r, exact_r, atol=1e-4)


def test_leap_differs_when_the_early_posteriors_changed():
    full = _posteriors(40, seed=3)
    pilot = _posteriors(28, seed=4)  # a different encoder output over the same frames
    eos, ids, start = 11, torch.tensor([[1, 2, 3]]), torch.tensor([11])
    p = CtcPrefixScorer(pilot, 0, eos)
    _, r_p, cum_p = p.score(0, start, p.initial_forward().unsqueeze(2), ids, record=True)
    scorer = CtcPrefixScorer(full, 0, eos)
    r0 = scorer.initial_forward().unsqueeze(2)
    exact, _, _ = scorer.score(0, start, r0, ids)
    leapt, _, _ = scorer.score(0, start, r0, ids, leap=LeapStart(20, r_p[:20], cum_p[:20]))
    assert not torch.allclose(exact, leapt, atol=1e-3)


def test_log_likelihood_is_what_the_prefix_increments_add_up_to(tiny_model, speech_like):
    from pasu.device.decoding.search import SearchOptions

    wave = torch.from_numpy(speech_like(1.3, 3)).unsqueeze(0)
    with torch.inference_mode():
        enc, lengths = tiny_model.model.encode(wave, torch.tensor([wave.size(1)]))
        result = tiny_model.search.search(enc[0], SearchOptions())
        scorer = CtcPrefixScorer(tiny_model.search.ctc.log_softmax(enc)[0], 0, tiny_model.search.eos)
        ended = [h for h in result.hypotheses if len(h.token_ctc) == len(h.tokens) + 1][:3]
        assert ended
        for h in ended:
            ll = scorer.log_likelihood(torch.tensor([h.tokens]))
            assert float(ll[0]) == pytest.approx(sum(h.token_ctc), abs=1e-3)


def test_a_best_path_collapses_to_the_tokens_it_emits():
    path = torch.tensor([0, 5, 5, 0, 0, 5, 7, 7, 0, 3])
    assert collapse_path(path) == [5, 5, 7, 3]  # a blank between repeats keeps both
    assert collapse_path(torch.tensor([2, 2, 4, 2]), blank=2) == [4]
    assert collapse_path(torch.zeros(6, dtype=torch.long)) == []
