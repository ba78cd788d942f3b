"""CTC prefix scoring (Watanabe et al. 2017, Algorithm 2) with CTC leap (Wang & Lin, Sec. 4.4).

The arithmetic mirrors ESPnet's `CTCPrefixScoreTH` for one utterance (same log-sum-exp grouping, same
"start at frame max(L, 1)" shortcut), so a search that uses it reproduces ESPnet's scores exactly. What it adds:
the forward variables r^n, r^b of each scored prefix and the running sum of its prefix probability can be
recorded (`PrefixCache`), and a later, longer input can resume them from a frame instead of frame 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LOGZERO = -1.0e10  # ESPnet's log(0): finite, so that LOGZERO - LOGZERO stays finite in later arithmetic


def collapse_path(path: torch.Tensor, blank: int = 0) -> list[int]:
    """A CTC best path, (T,) token ids per frame, as the token sequence it emits: repeats merged, blanks dropped."""
    return [int(t) for t in torch.unique_consecutive(path) if int(t) != blank]


@dataclass(frozen=True)
class CandidateForward:
    """What scoring one prefix g's candidate tokens produced, kept so a later search can leap over it."""

    ids: torch.Tensor  # (P,) candidate token ids c (prefixes g + c)
    r: torch.Tensor  # (T, 2, P) log r^n_t, r^b_t of each g + c
    psi_cum: torch.Tensor  # (T, P) log prefix probability of g + c over frames 0..t


# Recorded forward variables, keyed by the prefix g (token ids without <sos>) whose candidates they hold.
PrefixCache = dict[tuple[int, ...], CandidateForward]


@dataclass(frozen=True)
class LeapStart:
    """Resume the candidates at `frame` from forward variables recorded on an earlier (shorter) input."""

    frame: int  # first frame computed anew (> the prefixes' length); frames < frame are copied
    r: torch.Tensor  # (frame, 2, n, P) the recorded r^n, r^b of the same prefixes + candidates
    psi_cum: torch.Tensor  # (frame, n, P) their recorded prefix probabilities over frames 0..t

    @staticmethod
    def gather(frame: int, records: list[CandidateForward], columns: torch.Tensor) -> LeapStart:
        """Stack prefix i's record at columns[i] (indices into records[i].ids) for n prefixes."""
        r = torch.stack([rec.r[:frame, :, col] for rec, col in zip(records, columns)], dim=2)
        psi = torch.stack([rec.psi_cum[:frame, col] for rec, col in zip(records, columns)], dim=1)
        return LeapStart(frame, r, psi)


class CtcPrefixScorer:
    """Prefix scores of one utterance's CTC posteriors for batches of hypotheses x candidate tokens."""

    def __init__(self, logp: torch.Tensor, blank: int, eos: int):
        # logp: (T, V) CTC log-posteriors of the encoded input
        self.logp = logp
        self.blank = blank
        self.eos = eos
        self.num_frames = logp.size(0)
        # log b_0 + ... + b_t in float64, once per utterance: every score() call reads its blank run from here
        self.blank_cum = torch.cumsum(logp[:, blank].to(torch.float64), 0)

    def initial_forward(self) -> torch.Tensor:
        """(T, 2) forward variables of the empty prefix: all blanks."""
        r = torch.full((self.num_frames, 2), LOGZERO, dtype=self.logp.dtype)
        r[:, 1] = torch.cumsum(self.logp[:, self.blank], 0)
        return r

    def log_likelihood(self, seqs: torch.Tensor) -> torch.Tensor:
        """log p_CTC(y) of whole (k, L) token sequences: (k,), what their prefix-score increments add up to."""
        k, length = seqs.shape
        nll = torch.nn.functional.ctc_loss(
            self.logp.unsqueeze(1).expand(-1, k, -1), seqs, torch.full((k,), self.num_frames),
            torch.full((k,), length), blank=self.blank, reduction="none", zero_infinity=False)
        return -nll

    def eos_scores(self, r_prev: torch.Tensor) -> torch.Tensor:
        """log p(g ends here) for each prefix: (T, 2, n) -> (n,)."""
        return torch.logsumexp(r_prev[-1], 0)

    def score(
        self,
        output_length: int,
        last_tokens: torch.Tensor,
        r_prev: torch.Tensor,
        ids: torch.Tensor,
        leap: LeapStart | None = None,
        record: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Log prefix probabilities of g + c for each prefix g (n of them) and candidate c (ids: (n, P)).

        output_length: tokens in every g (without <sos>); last_tokens: (n,) last token of each g (<sos> for
        the empty prefix); r_prev: (T, 2, n) the prefixes' forward variables. With `leap`, frames before
        leap.frame are taken from the record instead of being computed (the CTC leap).
        Returns psi (n, P), r (T, 2, n, P) and, when `record`, psi_cum (T, n, P).
        """
        n, p = ids.shape
        T = self.num_frames
        xs = self.logp[:, ids]  # (T, n, P)
        r = torch.full((T, 2, n, p), LOGZERO, dtype=self.logp.dtype)
        if output_length == 0:
            r[0, 0] = xs[0]
        r_sum = torch.logsumexp(r_prev, 1)  # (T, n)
        # phi: a repeated token needs a blank in between, so it extends only the blank-ending paths.
        repeat = ids == last_tokens.view(n, 1)
        log_phi = torch.where(repeat.unsqueeze(0), r_prev[:, 1].unsqueeze(2), r_sum.unsqueeze(2))  # (T, n, P)
        begin = max(output_length, 1)
        if leap is not None:
            if leap.frame <= output_length:
                raise ValueError(f"leap frame {leap.frame} must exceed the prefix length {output_length}")
            begin = leap.frame
            r[:begin] = leap.r
        if begin < T:
            r[begin:] = self._forward(r[begin - 1], log_phi[begin - 1:T - 1], xs[begin:], begin)
        log_phi_x = torch.cat((log_phi[0].unsqueeze(0), log_phi[:-1]), dim=0) + xs  # (T, n, P)
        head = self._head(r, begin, leap)  # (1, n, P): everything before frame `begin`
        psi = torch.logsumexp(torch.cat((log_phi_x[begin:], head), dim=0), dim=0)
        psi_cum = self._cumulative(log_phi_x, head, begin, leap) if record else None
        return psi, r, psi_cum

    def _forward(self, r_start: torch.Tensor, log_phi: torch.Tensor, xs: torch.Tensor, begin: int) -> torch.Tensor:
        """r^n_t, r^b_t for t = begin..T-1 from r_start = r[begin - 1], without a loop over frames.

        In the probability domain both recursions are first-order linear:
        r^n_t = (r^n_{t-1} + phi_{t-1}) x_t and r^b_t = (r^n_{t-1} + r^b_{t-1}) b_t. With X_t = x_begin ... x_t,
        r^n_t = X_t (r^n_{begin-1} + phi_{begin-1} + sum_{begin <= s < t} phi_s / X_s), and r^b likewise
        once r^n is known: a cumulative sum and a log-cum-sum-exp each, where a loop pays a handful of tiny
        tensor ops per frame (half the decode time of a 3-s command). float64: log X_t falls by thousands of
        nats over a long input, and differences of such numbers need the extra digits.
        """
        f64 = torch.float64
        log_x = torch.cumsum(xs.to(f64), 0)  # (T - begin, n, P): log X_t
        log_b = (self.blank_cum[begin:] - self.blank_cum[begin - 1]).view(-1, 1, 1)  # log B_t, blanks only
        phi = log_phi.to(f64)  # phi_{begin-1} .. phi_{T-2}
        start_n, start_b = r_start.to(f64)
        terms = torch.cat((torch.logaddexp(start_n, phi[0]).unsqueeze(0), phi[1:] - log_x[:-1]))
        r_n = log_x + torch.logcumsumexp(terms, 0)
        terms = torch.cat((torch.logaddexp(start_b, start_n).unsqueeze(0), r_n[:-1] - log_b[:-1]))
        r_b = log_b + torch.logcumsumexp(terms, 0)
        return torch.stack((r_n, r_b), dim=1).to(self.logp.dtype)  # (T - begin, 2, n, P)

    @staticmethod
    def _head(r: torch.Tensor, begin: int, leap: LeapStart | None) -> torch.Tensor:
        if leap is None:
            return r[begin - 1, 0].unsqueeze(0)
        return leap.psi_cum[begin - 1].unsqueeze(0)

    def _cumulative(
        self, log_phi_x: torch.Tensor, head: torch.Tensor, begin: int, leap: LeapStart | None
    ) -> torch.Tensor:
        """psi over frames 0..t for every t (the record a later leap resumes from)."""
        n, p = log_phi_x.shape[1:]
        tail = torch.logcumsumexp(torch.cat((head, log_phi_x[begin:]), dim=0), dim=0)  # frames begin-1..T-1
        if leap is not None:
            before = leap.psi_cum[: begin - 1]
        else:
            before = torch.full((begin - 1, n, p), LOGZERO, dtype=log_phi_x.dtype)
        return torch.cat((before, tail), dim=0)
