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

    def initial_forward(self) -> torch.Tensor:
        """(T, 2) forward variables of the empty prefix: all blanks."""
        r = torch.full((self.num_frames, 2), LOGZERO, dtype=self.logp.dtype)
        r[:, 1] = torch.cumsum(self.logp[:, self.blank], 0)
        return r

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
        x_ = torch.stack([xs, self.logp[:, self.blank].view(T, 1, 1).expand(T, n, p)])  # (2, T, n, P)
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
        for t in range(begin, T):
            rp = r[t - 1]
            rr = torch.stack([rp[0], log_phi[t - 1], rp[0], rp[1]]).view(2, 2, n, p)
            r[t] = torch.logsumexp(rr, 1) + x_[:, t]
        log_phi_x = torch.cat((log_phi[0].unsqueeze(0), log_phi[:-1]), dim=0) + xs  # (T, n, P)
        head = self._head(r, begin, leap)  # (1, n, P): everything before frame `begin`
        psi = torch.logsumexp(torch.cat((log_phi_x[begin:], head), dim=0), dim=0)
        psi_cum = self._cumulative(log_phi_x, head, begin, leap) if record else None
        return psi, r, psi_cum

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
