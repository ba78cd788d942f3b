"""Hybrid CTC/attention beam search that a pilot hypothesis can speed up (Wang & Lin, Sec. 4).

With every option off, `BeamSearch.search` is ESPnet's `BatchBeamSearch` (pre-beam on the weighted
full-scorer scores, CTC prefix scores on the pre-beam, end detection, <eos> forced at the last step): the
tests check that both return the same hypotheses and scores. Three options use a `Reference`, the best
hypothesis of an earlier search over a prefix of the same input (a pilot):

- beam collapse: when the step's best candidate token equals the reference token at that position, only
  that hypothesis goes on (1/beam of the work); on divergence the full beam comes back;
- early termination: stop once the predicted length n = T_full / T_ref * len(ref) + C is reached and a
  hypothesis has ended (or at the first that ends after it);
- CTC leap: for a prefix the reference search scored too, copy its CTC forward variables for frames
  before p * T_ref and compute only the rest, when enough of the pre-beam tokens agree with its record.

Two more need no reference (ours, not the paper's):

- decided stop: stop as soon as the best ended hypothesis outscores every running one. Scores only fall as
  hypotheses grow, so the answer is already decided; ESPnet's end detection waits for several more lengths to
  end badly.
- first-token rescoring: the best hypothesis is scored again with each of the first step's k best first
  tokens in place of its own (one teacher-forced decoder pass and one CTC pass for all k), and the best
  scoring one is returned. With SLURP-style targets the first token is the intent: beam collapse fixes it at
  the first step, while a full beam could still let another intent overtake once the words are heard.

Pilots themselves run this search with a token cap, recording CTC forward variables for the next one.
Every step scores the beam with the decoder through `decoder_step.batch_score`, which projects the encoder
output for the source attention once per search instead of ESPnet's once per hypothesis and step.

Shallow fusion: a search built with a token LM (ESPnet's `SequentialRNNLM`, `pasu lm train`) adds
`lm_weight` x its log-probability of each token to the scores, before the pre-beam, as ESPnet's search does
with Speech2Text's `lm` scorer; the forced scores (`token_scores`, first-token rescoring) add it too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from pasu.device.decoding.ctc_prefix import (
    LOGZERO,
    CandidateForward,
    CtcPrefixScorer,
    LeapStart,
    PrefixCache,
    collapse_path,
)
from pasu.device.decoding.decoder_step import SourceKeys
from pasu.device.decoding.decoder_step import batch_score as decoder_batch_score

BANNED_SCORE = -1.0e10  # added to tokens the search must never emit (finite: see LOGZERO)


@dataclass(frozen=True)
class SearchOptions:
    """One beam search's settings; the defaults are the paper's full decode with every speed-up off."""

    beam_size: int = 5  # hypotheses kept per step (the paper: 5 for the full decode, 3 for pilots)
    ctc_weight: float = 0.3  # weight of the CTC prefix score; the attention decoder gets 1 - ctc_weight
    pre_beam_size: int | None = None  # tokens per hypothesis scored by CTC; None: int(1.5 * beam) as ESPnet
    length_bonus: float = 0.0  # added per emitted token (ESPnet's `penalty`)
    max_tokens: int | None = None  # pilots: stop after this many tokens, keeping unfinished hypotheses;
    # None: up to the frame count with ESPnet's end detection and <eos> forced at the last step
    beam_collapse: bool = False  # keep only the best hypothesis while it agrees with the reference
    collapse_match: str = "prefix"  # "prefix": the best hypothesis equals the reference so far; "token":
    # only its latest token equals the reference's at that position (the paper's literal rule: also
    # collapses after a substituted token, but can follow a path the vanilla search would have dropped)
    early_termination: bool = False  # stop at the length predicted from the reference
    length_margin: int = 5  # C in n = T_full / T_ref * n_ref + C
    ctc_leap: bool = False  # reuse the reference search's CTC forward variables
    leap_fraction: float = 0.75  # p: frames [0, p * T_ref) are copied, the end of the pilot is recomputed
    leap_agreement: float = 0.7  # share of a hypothesis' pre-beam the record must hold (paper: 7 of 10)
    record_ctc: bool = False  # keep CTC forward variables of every scored prefix (for the next leap)
    # stop once the best ended hypothesis outscores every running one: with length_bonus <= 0 every step
    # adds log-probabilities (<= 0) to a hypothesis' score, so the best answer can no longer change (exact
    # for the best hypothesis; the n-best list behind it is shorter). Needs no reference.
    stop_when_decided: bool = False
    # k > 1: the best hypothesis is rescored with each of the first step's k best first tokens in its place
    # (SLURP-style targets: the intent) and the best scoring one is returned; <= 1: off
    rescore_first_tokens: int = 0
    # weight of the search's LM (shallow fusion; BeamSearch(lm=...)); 0: off. Not part of token_att/token_ctc.
    lm_weight: float = 0.0

    @property
    def pre_beam(self) -> int:
        return self.pre_beam_size or int(1.5 * self.beam_size)


@dataclass(frozen=True)
class Reference:
    """An earlier search's best hypothesis over the first `num_frames` encoder frames."""

    tokens: tuple[int, ...]  # without <sos>/<eos>
    num_frames: int  # encoder frames the earlier search saw
    ctc_cache: PrefixCache | None = None  # its recorded CTC forward variables (for the leap)


@dataclass(frozen=True)
class Hypothesis:
    tokens: tuple[int, ...]  # without <sos>/<eos>
    score: float  # weighted sum of all scorers (what the beam ranks by)
    ended: bool  # reached <eos>
    token_att: tuple[float, ...] = ()  # attention-decoder log-probability of each token (<eos> included)
    token_ctc: tuple[float, ...] = ()  # CTC prefix-score increment of each token (<eos> included)
    decoder_state: Any = field(default=None, repr=False, compare=False)
    ctc_r: torch.Tensor | None = field(default=None, repr=False, compare=False)  # (T, 2) forward variables
    ctc_psi: float = 0.0  # log CTC prefix probability of `tokens`
    lm_state: Any = field(default=None, repr=False, compare=False)  # the LM's state after `tokens`
    # the (T, D) encoder output the search read (set on a search's results): what the CNN offramp judges
    encoded: torch.Tensor | None = field(default=None, repr=False, compare=False)


@dataclass
class SearchStats:
    steps: int = 0  # decoder steps taken
    collapsed_steps: int = 0  # steps that ran with one hypothesis because it followed the reference
    leap_scorings: int = 0  # hypothesis-steps whose CTC scores started from recorded forward variables
    ctc_frames: int = 0  # CTC forward frames computed (hypothesis-steps x frames): the CTC work done
    early_stop: bool = False  # ended at the predicted length
    decided_stop: bool = False  # ended because no running hypothesis could overtake the best ended one
    first_token_rescored: bool = False  # the best hypothesis' first token was replaced by a better scoring one


@dataclass(frozen=True)
class SearchResult:
    hypotheses: list[Hypothesis]  # best first: ended ones, or (token cap) ended and unfinished ones
    num_frames: int  # encoder frames searched
    stats: SearchStats
    ctc_cache: PrefixCache | None = None  # recorded forward variables when options.record_ctc

    @property
    def best(self) -> Hypothesis | None:
        return self.hypotheses[0] if self.hypotheses else None

    def as_reference(self) -> Reference | None:
        if self.best is None:
            return None
        return Reference(self.best.tokens, self.num_frames, self.ctc_cache)


class SearchAborted(Exception):
    """The caller's `should_abort` asked the search to stop (e.g. a pilot overtaken by end of speech)."""


class BeamSearch:
    """Searches one utterance's encoder output with an ESPnet attention decoder and CTC head."""

    def __init__(self, decoder: Any, ctc: Any, sos: int, eos: int, vocab_size: int,
                 banned_tokens: Sequence[int] = (), blank: int = 0, lm: Any = None):
        # decoder: espnet2 AbsDecoder with batch_score (TransformerDecoder); ctc: espnet2 CTC (log_softmax);
        # lm: None or an ESPnet LM scorer with batch_score over the same token ids (SequentialRNNLM), used
        # when SearchOptions.lm_weight > 0
        self.decoder = decoder
        self.ctc = ctc
        self.lm = lm
        self.sos, self.eos, self.blank = sos, eos, blank
        self.vocab_size = vocab_size
        self.banned = torch.zeros(vocab_size)
        self.banned[list(banned_tokens)] = BANNED_SCORE

    @torch.inference_mode()
    def search(
        self,
        encoded: torch.Tensor,
        options: SearchOptions = SearchOptions(),
        reference: Reference | None = None,
        should_abort: Callable[[], bool] | None = None,
    ) -> SearchResult:
        """Decode (T, D) encoder frames; `should_abort` is polled before every step."""
        self._check_lm(options)
        run = _Run(self, encoded, options, reference)
        while not run.finished:
            if should_abort is not None and should_abort():
                raise SearchAborted
            run.step()
        return run.result()

    @torch.inference_mode()
    def token_scores(self, encoded: torch.Tensor, sequences: Sequence[Sequence[int]],
                     options: SearchOptions = SearchOptions()) -> list[Hypothesis]:
        """Given token sequences (no <sos>/<eos>, equal lengths) as ended hypotheses, scored on (T, D) encoder
        frames as the search with `options` would score them (forced decoding: per-token scores and total)."""
        self._check_lm(options)
        seqs = torch.tensor([list(s) for s in sequences], dtype=torch.long)
        memory = encoded.unsqueeze(0)
        ctc = CtcPrefixScorer(self.ctc.log_softmax(memory)[0], self.blank, self.eos)
        att, inc = forced_att(self, memory, seqs), forced_ctc(self, ctc, seqs)
        static = (self.banned + options.length_bonus)[_with_eos(seqs, self.eos)]
        totals = ((1.0 - options.ctc_weight) * att + options.ctc_weight * inc + static).sum(1)
        if options.lm_weight:
            totals += options.lm_weight * forced_lm(self, seqs).sum(1)
        return [Hypothesis(tuple(s), float(t), True, tuple(a.tolist()), tuple(c.tolist()))
                for s, t, a, c in zip(seqs.tolist(), totals, att, inc)]

    @torch.inference_mode()
    def ctc_greedy(self, encoded: torch.Tensor, options: SearchOptions = SearchOptions()) -> Hypothesis | None:
        """The CTC's best path over (T, D) encoder frames, collapsed and without blanks, as an ended hypothesis
        scored as `token_scores` scores it; None when the path emits nothing. A pilot of the whole input with no
        search, a few milliseconds after the final encode (what the offramps read of it:
        scripts/end_pilot_check.py)."""
        tokens = collapse_path(self.ctc.argmax(encoded.unsqueeze(0))[0], self.blank)
        return self.token_scores(encoded, [tokens], options)[0] if tokens else None

    def _check_lm(self, options: SearchOptions) -> None:
        if options.lm_weight and self.lm is None:
            raise ValueError(f"lm_weight {options.lm_weight} needs a search built with an LM (an agent's `lm`)")


class _Run:
    """The state of one search: running and ended hypotheses, step by step."""

    def __init__(self, owner: BeamSearch, encoded: torch.Tensor, options: SearchOptions, reference: Reference | None):
        self.o = options
        self.s = owner
        self.memory = encoded.unsqueeze(0)
        self.T = encoded.size(0)
        self.ctc = CtcPrefixScorer(owner.ctc.log_softmax(self.memory)[0], owner.blank, owner.eos)
        self.source_keys = SourceKeys.of(owner.decoder, self.memory)  # None: ESPnet's batch_score every step
        self.reference = reference
        # CTC cannot emit more tokens than there are frames (and its scorer indexes frame L for L tokens).
        self.maxlen = self.T if options.max_tokens is None else min(options.max_tokens, self.T)
        self.predicted_length = self._predicted_length()
        self.leap_frame = self._leap_frame()
        self.cache: PrefixCache | None = {} if options.record_ctc else None
        self.stats = SearchStats()
        bias = owner.banned + options.length_bonus
        self.static_scores = bias
        self.running = [Hypothesis((), 0.0, False, ctc_r=self.ctc.initial_forward())]
        self.ended: list[Hypothesis] = []
        self.i = 0
        self.first_tokens: list[int] = []  # the first step's best first tokens (rescore_first_tokens)
        self.finished = self.maxlen <= 0

    # ---- reference-derived settings -------------------------------------------------------------------
    def _predicted_length(self) -> int | None:
        ref = self.reference
        if not self.o.early_termination or ref is None or ref.num_frames <= 0:
            return None
        return math.ceil(self.T / ref.num_frames * len(ref.tokens) + self.o.length_margin)

    def _leap_frame(self) -> int:
        ref = self.reference
        if not self.o.ctc_leap or ref is None or not ref.ctc_cache:
            return 0
        return min(int(self.o.leap_fraction * ref.num_frames), ref.num_frames, self.T)

    # ---- one step -------------------------------------------------------------------------------------
    def step(self) -> None:
        hyps = self.running
        n = len(hyps)
        ys = torch.tensor([[self.s.sos, *h.tokens] for h in hyps], dtype=torch.long)
        states = [h.decoder_state for h in hyps]
        if self.source_keys is not None:
            att, dec_states = decoder_batch_score(self.s.decoder, ys, states, self.source_keys)
        else:
            att, dec_states = self.s.decoder.batch_score(ys, states, self.memory.expand(n, -1, -1))
        weighted = (1.0 - self.o.ctc_weight) * att + self.static_scores
        lm_states: list = [None] * n
        if self.o.lm_weight:  # a full scorer, as the decoder: before the pre-beam (ESPnet's "full" key)
            lm_scores, lm_states = self.s.lm.batch_score(ys, [h.lm_state for h in hyps], self.memory)
            weighted = weighted + self.o.lm_weight * lm_scores
        ids = _pre_beam(weighted, self.o.pre_beam)
        ctc_inc, cand_r, psi, ids = self._ctc_scores(hyps, ids)
        total = weighted + self.o.ctc_weight * ctc_inc + torch.tensor([h.score for h in hyps]).unsqueeze(1)
        if self.i == 0:
            self.first_tokens = _first_token_candidates(total[0], ids[0], self.o.rescore_first_tokens,
                                                        (self.s.eos, self.s.blank))
        k = min(self.o.beam_size, total.numel())
        top_scores, top = total.view(-1).topk(k)
        new = []
        for score, flat in zip(top_scores.tolist(), top.tolist()):
            j, c = divmod(flat, self.s.vocab_size)
            new.append(self._extend(hyps[j], j, c, score, att, ctc_inc, dec_states, cand_r, psi, ids, lm_states))
        self._advance([h for h in new if h is not None])

    def _extend(self, parent: Hypothesis, j: int, c: int, score: float, att: torch.Tensor,
                ctc_inc: torch.Tensor, dec_states: list, cand_r: torch.Tensor, psi: torch.Tensor,
                ids: torch.Tensor, lm_states: list) -> Hypothesis | None:
        token_att = parent.token_att + (float(att[j, c]),)
        token_ctc = parent.token_ctc + (float(ctc_inc[j, c]),)
        if c == self.s.eos:
            return Hypothesis(parent.tokens, score, True, token_att, token_ctc, ctc_psi=parent.ctc_psi)
        cols = (ids[j] == c).nonzero()
        if cols.numel() == 0:  # outside the pre-beam: only reachable when the beam exceeds the candidates
            return None
        col = int(cols[0])
        return Hypothesis(parent.tokens + (c,), score, False, token_att, token_ctc, dec_states[j],
                          cand_r[:, :, j, col], float(psi[j, col]), lm_states[j])

    def _advance(self, new: list[Hypothesis]) -> None:
        """ESPnet's post_process + end detection, then the reference-driven collapse and termination."""
        i = self.i
        if self.o.max_tokens is None and i == self.maxlen - 1:
            new = [h if h.ended else replace(h, ended=True) for h in new]  # ESPnet forces <eos> here
        self.ended.extend(h for h in new if h.ended)
        running = [h for h in new if not h.ended]
        if self._collapse(new):
            running = running[:1]
            self.stats.collapsed_steps += 1
        self.running = running
        self.i += 1
        self.stats.steps += 1
        if self.predicted_length is not None and self.i >= self.predicted_length and self.ended:
            self.stats.early_stop = True
            self.finished = True
        elif self._decided():
            self.stats.decided_stop = True
            self.finished = True
        elif self.o.max_tokens is None and end_detect(self.ended, i):
            self.finished = True
        self.finished = self.finished or not self.running or self.i >= self.maxlen

    def _decided(self) -> bool:
        """The best ended hypothesis outscores every running one, whose scores can only fall from here."""
        if not (self.o.stop_when_decided and self.o.length_bonus <= 0 and self.ended and self.running):
            return False
        return max(h.score for h in self.ended) >= max(h.score for h in self.running)

    def _collapse(self, new: list[Hypothesis]) -> bool:
        """The step's best candidate is the reference's token at this position: follow it alone."""
        ref = self.reference
        if not self.o.beam_collapse or ref is None or not new or self.i >= len(ref.tokens):
            return False
        best = new[0]
        if best.ended:
            return False
        if self.o.collapse_match == "token":
            return best.tokens[self.i] == ref.tokens[self.i]
        return best.tokens == ref.tokens[: self.i + 1]

    # ---- CTC ------------------------------------------------------------------------------------------
    def _ctc_scores(
        self, hyps: list[Hypothesis], ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """CTC increments (n, V) (LOGZERO - psi(g) outside the pre-beam, as ESPnet), candidate r and psi."""
        n, p = ids.shape
        ids = ids.clone()
        last = torch.tensor([h.tokens[-1] if h.tokens else self.s.sos for h in hyps])
        r_prev = torch.stack([h.ctc_r for h in hyps], dim=2)  # (T, 2, n)
        psi = torch.empty(n, p)
        cand_r = torch.empty(self.T, 2, n, p)
        psi_cum = torch.empty(self.T, n, p) if self.cache is not None else None
        leaps = self._plan_leaps(hyps, ids)
        groups = [[j for j in range(n) if j not in leaps], [j for j in range(n) if j in leaps]]
        for rows, leaping in zip(groups, (False, True)):
            if not rows:
                continue
            leap = None
            if leaping:
                for j in rows:
                    ids[j] = leaps[j][0]
                leap = LeapStart.gather(self.leap_frame, [leaps[j][1] for j in rows],
                                        torch.stack([leaps[j][2] for j in rows]))
                self.stats.leap_scorings += len(rows)
            g_psi, g_r, g_cum = self.ctc.score(self.i, last[rows], r_prev[:, :, rows], ids[rows], leap,
                                               record=psi_cum is not None)
            psi[rows], cand_r[:, :, rows] = g_psi, g_r
            if psi_cum is not None:
                psi_cum[:, rows] = g_cum
            begin = leap.frame if leap is not None else max(self.i, 1)
            self.stats.ctc_frames += len(rows) * max(self.T - begin, 0)
        if self.cache is not None:
            for j, h in enumerate(hyps):
                self.cache[h.tokens] = CandidateForward(ids[j], cand_r[:, :, j], psi_cum[:, j])
        prev = torch.tensor([h.ctc_psi for h in hyps]).unsqueeze(1)
        scores = torch.full((n, self.s.vocab_size), LOGZERO)
        scores.scatter_(1, ids, psi)
        scores[:, self.s.eos] = self.ctc.eos_scores(r_prev)
        if self.s.eos != self.s.blank:
            scores[:, self.s.blank] = LOGZERO
        return scores - prev, cand_r, psi, ids

    def _plan_leaps(self, hyps: list[Hypothesis], ids: torch.Tensor) -> dict[int, tuple]:
        """Hypotheses whose CTC scores can start from the reference's record: row -> (ids, record, columns)."""
        if self.leap_frame <= self.i or self.reference is None or not self.reference.ctc_cache:
            return {}
        plans = {}
        need = math.ceil(self.o.leap_agreement * ids.size(1))
        for j, h in enumerate(hyps):
            record = self.reference.ctc_cache.get(h.tokens)
            if record is None:
                continue
            match = ids[j].unsqueeze(1) == record.ids.unsqueeze(0)  # (P, P_ref)
            agreed = match.any(1)
            if int(agreed.sum()) < need:
                continue
            # The pre-beam shrinks to the agreed tokens (the paper); pad with the first to keep the shape.
            keep = agreed.nonzero().view(-1)
            keep = torch.cat([keep, keep[:1].expand(ids.size(1) - keep.numel())])
            plans[j] = (ids[j][keep], record, match[keep].float().argmax(1))
        return plans

    # ---- result ---------------------------------------------------------------------------------------
    def result(self) -> SearchResult:
        pool = list(self.ended)
        if self.o.max_tokens is not None:  # a capped (pilot) search also offers its unfinished hypotheses
            pool += self.running
        pool.sort(key=lambda h: h.score, reverse=True)
        if pool and pool[0].ended and len(self.first_tokens) > 1:
            best = self._rescore_first_token(pool[0])
            if best is not pool[0]:
                pool.insert(0, best)
                self.stats.first_token_rescored = True
        pool = [replace(h, encoded=self.memory[0]) for h in pool]
        return SearchResult(pool, self.T, self.stats, self.cache)

    def _rescore_first_token(self, best: Hypothesis) -> Hypothesis:
        """`best` with the first token that scores it highest (itself unless another scores higher)."""
        if not best.tokens:
            return best
        first = [best.tokens[0]] + [c for c in self.first_tokens if c != best.tokens[0]]
        seqs = torch.tensor([[c, *best.tokens[1:]] for c in first], dtype=torch.long)  # (k, L)
        att = forced_att(self.s, self.memory, seqs)
        static = self.static_scores[_with_eos(seqs, self.s.eos)]
        # the CTC increments of a sequence add up to its CTC log-likelihood: one ctc_loss call scores all k
        totals = ((1.0 - self.o.ctc_weight) * att + static).sum(1) + self.o.ctc_weight * self.ctc.log_likelihood(seqs)
        if self.o.lm_weight:
            totals += self.o.lm_weight * forced_lm(self.s, seqs).sum(1)
        j = int(totals.argmax())
        # best's own score came from the beam's incremental arithmetic: compare like with like, and let only a
        # clearly better alternative replace it
        if j == 0 or float(totals[j]) <= float(totals[0]) + 1e-4:
            return best
        ctc = forced_ctc(self.s, self.ctc, seqs[j: j + 1])[0]
        return Hypothesis(tuple(seqs[j].tolist()), best.score + float(totals[j] - totals[0]), True,
                          tuple(att[j].tolist()), tuple(ctc.tolist()))


def forced_att(search: BeamSearch, memory: torch.Tensor, seqs: torch.Tensor) -> torch.Tensor:
    """Attention-decoder log-probability of each token of (k, L) sequences, then of <eos>: (k, L + 1), from one
    teacher-forced decoder pass over the (1, T, D) encoder output `memory` instead of L incremental steps."""
    k, length = seqs.shape
    logits, _ = search.decoder(memory.expand(k, -1, -1), torch.full((k,), memory.size(1)),
                               _with_sos(seqs, search.sos), torch.full((k,), length + 1))
    return _forced_logprobs(logits, seqs, search.eos)


def forced_lm(search: BeamSearch, seqs: torch.Tensor) -> torch.Tensor:
    """The search's LM log-probability of each token of (k, L) sequences, then of <eos>: (k, L + 1), from one
    teacher-forced pass (the LM reads <sos> first, as in the search)."""
    logits, _ = search.lm(_with_sos(seqs, search.sos), None)
    return _forced_logprobs(logits, seqs, search.eos)


def _forced_logprobs(logits: torch.Tensor, seqs: torch.Tensor, eos: int) -> torch.Tensor:
    """(k, L + 1, V) logits of a teacher-forced pass over <sos> + seqs -> the log-probability of each token of
    seqs, then of <eos>: (k, L + 1)."""
    return torch.log_softmax(logits, -1).gather(2, _with_eos(seqs, eos).unsqueeze(2)).squeeze(2)


def _with_sos(seqs: torch.Tensor, sos: int) -> torch.Tensor:
    """(k, L) token sequences -> (k, L + 1) with <sos> first: what a teacher-forced pass reads."""
    return torch.cat((torch.full((seqs.size(0), 1), sos), seqs), 1)


def _with_eos(seqs: torch.Tensor, eos: int) -> torch.Tensor:
    """(k, L) token sequences -> (k, L + 1) with <eos> appended: what each scored token of them is."""
    return torch.cat((seqs, torch.full((seqs.size(0), 1), eos)), 1)


def forced_ctc(search: BeamSearch, ctc: CtcPrefixScorer, seqs: torch.Tensor) -> torch.Tensor:
    """CTC prefix-score increment of each token of (k, L) sequences, then of <eos>: (k, L + 1)."""
    k, length = seqs.shape
    r = ctc.initial_forward().unsqueeze(2).expand(-1, -1, k)
    prev, last = torch.zeros(k), torch.full((k,), search.sos)
    increments = []
    for i in range(min(length, ctc.num_frames)):  # CTC cannot emit more tokens than there are frames
        psi, r_next, _ = ctc.score(i, last, r, seqs[:, i: i + 1])
        increments.append(psi[:, 0] - prev)
        prev, r, last = psi[:, 0], r_next[:, :, :, 0], seqs[:, i]
    increments += [torch.full((k,), LOGZERO)] * (length - len(increments))
    increments.append(ctc.eos_scores(r) - prev)
    return torch.stack(increments, 1)


def _first_token_candidates(scores: torch.Tensor, pre_beam: torch.Tensor, k: int,
                            excluded: tuple[int, ...]) -> list[int]:
    """The k best of the first step's pre-beam tokens by total score (`excluded` and banned ones left out)."""
    if k <= 1:
        return []
    ranked = sorted(pre_beam.tolist(), key=lambda c: float(scores[c]), reverse=True)
    return [c for c in ranked if c not in excluded and float(scores[c]) > BANNED_SCORE / 2][:k]


def _pre_beam(weighted: torch.Tensor, size: int) -> torch.Tensor:
    """(n, P) best token ids per hypothesis by the full scorers (ESPnet pre_beam_score_key="full")."""
    if size >= weighted.size(1):
        return torch.arange(weighted.size(1)).expand(weighted.size(0), -1)
    return torch.topk(weighted, size, dim=-1)[1]


def end_detect(ended: Sequence[Hypothesis], i: int, m: int = 3, d_end: float = -10.0) -> bool:
    """ESPnet's end detection (Watanabe et al. 2017, Eq. 50), on hypothesis lengths with <sos>/<eos>."""
    if not ended:
        return False
    best = max(h.score for h in ended)
    count = 0
    for k in range(m):
        same = [h.score for h in ended if len(h.tokens) + 2 == i - k]
        if same and max(same) - best < d_end:
            count += 1
    return count == m
