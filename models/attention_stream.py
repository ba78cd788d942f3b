"""The first attention block of a late-contextualization encoder, computed while audio arrives.

The first Branchformer block above the streaming conv blocks reads inputs that never change once emitted, so
almost all of its work can be done on arrival instead of after the end of speech:

- its position-wise parts (LayerNorms, query/key/value projections, the cgMLP's first projection) per frame;
- its cgMLP branch's symmetric depthwise conv as soon as a frame's right context (k // 2 frames) is in;
- its self-attention itself, by online softmax (as in FlashAttention): every query row keeps a running
  maximum, normalizer and weighted value sum over the key frames seen so far, and each new chunk adds its new
  rows and its new columns. Relative positions depend only on query minus key, so nothing already added is
  ever revisited.

What is left for `output()` is per frame and cheap (normalize the sums, the attention's output projection,
the merge, the final LayerNorm) plus the cgMLP conv of the last k // 2 frames, which read the end of the
input. `output()` can be called at any time (a pilot) and equals `BranchformerEncoderLayer.forward` on all
the frames so far, in eval mode, up to float rounding (the tests check 1e-4).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from espnet.nets.pytorch_backend.transformer.attention import RelPositionMultiHeadedAttention
from espnet.nets.pytorch_backend.transformer.embedding import RelPositionalEncoding
from espnet2.asr.encoder.branchformer_encoder import BranchformerEncoderLayer

MIN_POSITIONS = 64  # smallest relative-position table built: avoids regrowing it on every early chunk


def can_stream(block: BranchformerEncoderLayer) -> bool:
    """Whether `AttentionBlockStream` reproduces this block: rel-pos attention, a cgMLP, concat merge."""
    return (
        isinstance(block.attn, RelPositionMultiHeadedAttention)
        and block.cgmlp is not None
        and block.merge_method == "concat"
    )


class PositionTable:
    """An attention block's projected relative positions, linear_pos(pe(r)), grown as the input grows.

    They depend on the input's length only, so a stream builds them while audio arrives, also for the blocks
    that can only run after the end of speech (ESPnet's forward recomputes them in every pass).
    """

    def __init__(self, attn: RelPositionMultiHeadedAttention, positions: RelPositionalEncoding):
        self.attn = attn
        self.positions = positions
        self.table: torch.Tensor | None = None  # (H, 2L-1, dk): relative positions L-1 down to -(L-1)

    @property
    def max_frames(self) -> int:
        """Longest input the table covers."""
        return 0 if self.table is None else (self.table.size(1) + 1) // 2

    @torch.no_grad()
    def reserve(self, frames: int) -> None:
        """Cover inputs of `frames` frames, doubling the table when it grows."""
        have = self.max_frames
        if frames <= have:
            return
        size = max(frames, 2 * have, MIN_POSITIONS)
        weight = self.attn.linear_pos.weight
        pos_emb = self.positions(weight.new_zeros(1, size, weight.size(1)))[1][0]  # (2L-1, d)
        self.table = self.attn.linear_pos(pos_emb).view(-1, self.attn.h, self.attn.d_k).transpose(0, 1)

    def scores(self, q_v: torch.Tensor, rows: slice, cols: slice) -> torch.Tensor:
        """Position logits (B, H, rows, cols) of queries `q_v` (B, H, rows, dk) against keys at `cols`."""
        self.reserve(max(rows.stop, cols.stop))
        # Query t and key s meet at relative position t - s, row L-1-(t-s) of the table.
        t = torch.arange(rows.start, rows.stop)[:, None]
        s = torch.arange(cols.start, cols.stop)[None, :]
        index = self.max_frames - 1 - (t - s)
        if index.size(1) < index.size(0):
            # Many old rows, few new columns: pick each pair's position vector (as many products as q.k).
            return torch.einsum("bhrd,hrcd->bhrc", q_v, self.table[:, index])
        # Few new rows over many columns: multiply the distances they span, then gather into place.
        lo, hi = int(index.min()), int(index.max())
        bd = torch.matmul(q_v, self.table[:, lo : hi + 1].transpose(-2, -1))
        return torch.gather(bd, -1, (index - lo).expand(*bd.shape[:2], *index.shape))


class AttentionBlockStream:
    """One Branchformer block (attention || cgMLP, concat merge) over a growing input of batch B."""

    def __init__(self, block: BranchformerEncoderLayer, positions: PositionTable):
        if not can_stream(block):
            raise ValueError("AttentionBlockStream needs rel-pos self-attention, a cgMLP branch and concat merge")
        if block.training:
            raise ValueError("stream in eval mode: dropout would make the streamed block differ from forward")
        self.block = block
        self.attn: RelPositionMultiHeadedAttention = block.attn
        self.positions = positions
        conv = block.cgmlp.csgu.conv
        self.right_context = (conv.kernel_size[0] - 1) // 2  # frames after t that cgMLP output t reads
        self.inputs: torch.Tensor | None = None  # (B, T, d) block inputs so far (the residual path)
        self.q_u = self.q_v = self.k = self.v = None  # (B, H, T, dk) projections (+ position biases)
        self.row_max = self.row_sum = self.row_acc = None  # online softmax state per head and query row
        self.gate = None  # (B, C, T) normalized gate half of the cgMLP, the depthwise conv's input
        self.gate_linear = None  # (B, T, C) the other (linear) half
        self.mlp_out = None  # (B, D, d) cgMLP branch outputs of the frames whose right context is complete

    @property
    def num_frames(self) -> int:
        return 0 if self.inputs is None else self.inputs.size(1)

    @torch.no_grad()
    def accept(self, x: torch.Tensor) -> None:
        """Add new block inputs (B, n, d) and do all the work they make possible."""
        if x.size(1) == 0:
            return
        old = self.num_frames
        q_u, q_v, k, v = self._project(x)
        gate_linear, gate = self._gate_halves(x)
        if self.inputs is None:
            self.inputs, self.q_u, self.q_v, self.k, self.v = x, q_u, q_v, k, v
            self.gate_linear, self.gate = gate_linear, gate
            self.mlp_out = x.new_zeros(x.size(0), 0, x.size(2))
        else:
            self.inputs = torch.cat([self.inputs, x], dim=1)
            self.q_u, self.q_v = torch.cat([self.q_u, q_u], dim=2), torch.cat([self.q_v, q_v], dim=2)
            self.k, self.v = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
            self.gate_linear = torch.cat([self.gate_linear, gate_linear], dim=1)
            self.gate = torch.cat([self.gate, gate], dim=2)
        self._add_attention(old)
        done = max(self.num_frames - self.right_context, 0)
        self.mlp_out = torch.cat([self.mlp_out, self._cgmlp(self.mlp_out.size(1), done)], dim=1)

    @torch.no_grad()
    def output(self) -> torch.Tensor:
        """The block's output (B, T, d) on all inputs so far, as if the input ended here."""
        if self.inputs is None:
            raise ValueError("no frames accepted yet")
        block, attn = self.block, self.attn
        b, h, t, dk = self.row_acc.shape
        heads = (self.row_acc / self.row_sum[..., None]).transpose(1, 2).reshape(b, t, h * dk)
        x_att = attn.linear_out(heads)
        x_mlp = torch.cat([self.mlp_out, self._cgmlp(self.mlp_out.size(1), t)], dim=1)
        y = self.inputs + block.merge_proj(torch.cat([x_att, x_mlp], dim=-1))
        return block.norm_final(y)

    # ---- attention ----------------------------------------------------------------------------------
    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Queries with the two position biases, keys and values: each (B, H, n, dk)."""
        attn = self.attn
        x1 = self.block.norm_mha(x)
        b, n, _ = x1.shape
        q = attn.linear_q(x1).view(b, n, attn.h, attn.d_k)
        k = attn.linear_k(x1).view(b, n, attn.h, attn.d_k).transpose(1, 2)
        v = attn.linear_v(x1).view(b, n, attn.h, attn.d_k).transpose(1, 2)
        return (q + attn.pos_bias_u).transpose(1, 2), (q + attn.pos_bias_v).transpose(1, 2), k, v

    def _scores(self, rows: slice, cols: slice) -> torch.Tensor:
        """Attention logits (B, H, rows, cols), as ESPnet's RelPositionMultiHeadedAttention computes them."""
        ac = torch.matmul(self.q_u[:, :, rows], self.k[:, :, cols].transpose(-2, -1))
        bd = self.positions.scores(self.q_v[:, :, rows], rows, cols)
        return (ac + bd) / math.sqrt(self.attn.d_k)

    def _add_attention(self, old: int) -> None:
        """Fold the new key columns into the old rows, and start the new rows over every column."""
        total = self.num_frames
        if old:
            scores = self._scores(slice(0, old), slice(old, total))
            new_max = torch.maximum(self.row_max, scores.amax(-1))
            decay = torch.exp(self.row_max - new_max)
            weights = torch.exp(scores - new_max[..., None])
            self.row_sum = self.row_sum * decay + weights.sum(-1)
            self.row_acc = self.row_acc * decay[..., None] + torch.matmul(weights, self.v[:, :, old:])
            self.row_max = new_max
        scores = self._scores(slice(old, total), slice(0, total))
        row_max = scores.amax(-1)
        weights = torch.exp(scores - row_max[..., None])
        row_sum, row_acc = weights.sum(-1), torch.matmul(weights, self.v)
        if old:
            row_max = torch.cat([self.row_max, row_max], dim=2)
            row_sum = torch.cat([self.row_sum, row_sum], dim=2)
            row_acc = torch.cat([self.row_acc, row_acc], dim=2)
        self.row_max, self.row_sum, self.row_acc = row_max, row_sum, row_acc

    # ---- cgMLP branch -------------------------------------------------------------------------------
    def _gate_halves(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """channel_proj1 and the gate's LayerNorm, per frame: (B, n, C) linear half, (B, C, n) gate half."""
        cgmlp = self.block.cgmlp
        h = cgmlp.channel_proj1(self.block.norm_mlp(x))
        x_r, x_g = h.chunk(2, dim=-1)
        return x_r, cgmlp.csgu.norm(x_g).transpose(1, 2)

    def _cgmlp(self, start: int, stop: int) -> torch.Tensor:
        """cgMLP branch outputs (B, stop-start, d) of frames [start, stop); zeros stand beyond the input."""
        cgmlp, csgu = self.block.cgmlp, self.block.cgmlp.csgu
        if stop <= start:
            return self.inputs.new_zeros(self.inputs.size(0), 0, self.inputs.size(2))
        r, total = self.right_context, self.num_frames
        lo, hi = start - r, stop + r  # conv inputs these outputs read, zero padded outside [0, total)
        window = self.gate[:, :, max(lo, 0) : min(hi, total)]
        window = F.pad(window, (max(-lo, 0), max(hi - total, 0)))
        x_g = F.conv1d(window, csgu.conv.weight, csgu.conv.bias, groups=csgu.conv.groups).transpose(1, 2)
        if csgu.linear is not None:
            x_g = csgu.linear(x_g)
        return cgmlp.channel_proj2(self.gate_linear[:, start:stop] * csgu.act(x_g))
