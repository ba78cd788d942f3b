"""Late-contextualization encoder (Wang & Lin, Sec. 3.1 / 4.1): streaming conv blocks, then attention.

Layout: Conv2d subsampling (x4) -> `num_conv_blocks` cgMLP-only blocks with a CAUSAL depthwise conv
-> `num_attn_blocks` Branchformer blocks (self-attention branch || cgMLP branch, merged) -> LayerNorm.

Why Branchformer blocks on top: the paper builds its model from a trained Branchformer (Fig. 3a), keeping
the cgMLP branch in the N-k-1 bottom layers and both branches in the k+1 top layers, and trains it with the
Branchformer's recipe. The top blocks see the whole input, so their cgMLP conv stays symmetric: together
with attention they supply the right context that the causal bottom blocks give up.

Streaming exactness. Subsampled frame t reads feature frames [4t, 4t+6] (two 3x3 convs, stride 2, no
padding), so it is emitted as soon as feature frame 4t+6 has arrived; a stream of T feature frames emits
((T-1)//2-1)//2 frames, exactly the offline count, and NOTHING is left for an end-of-stream flush (the last
(T-3) % 4 + 3 feature frames that no output covers are also unused offline). Conv-block output t reads only
subsampled frames <= t (causal kernel, left zero padding), so old outputs never change when audio is added.
Dropout makes the streaming path differ from `forward` in training mode: stream in eval mode.
Padded batches: the causal blocks never read padding, but the attention blocks' symmetric cgMLP conv (as
in ESPnet's Branchformer) does, so a shorter utterance's last ~15 outputs depend slightly on its padding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from espnet.nets.pytorch_backend.nets_utils import make_pad_mask
from espnet.nets.pytorch_backend.transformer.attention import RelPositionMultiHeadedAttention
from espnet.nets.pytorch_backend.transformer.embedding import RelPositionalEncoding
from espnet.nets.pytorch_backend.transformer.layer_norm import LayerNorm
from espnet.nets.pytorch_backend.transformer.repeat import repeat
from espnet.nets.pytorch_backend.transformer.subsampling import Conv2dSubsampling, TooShortUttError
from espnet2.asr.encoder.abs_encoder import AbsEncoder
from espnet2.asr.encoder.branchformer_encoder import BranchformerEncoderLayer
from espnet2.asr.layers.cgmlp import ConvolutionalGatingMLP
from pasu.models.attention_stream import AttentionBlockStream, PositionTable, can_stream

SUBSAMPLING = 4
SUBSAMPLING_RECEPTIVE_FIELD = 7  # feature frames read by one subsampled frame


def subsampled_length(num_feats: int | torch.Tensor) -> int | torch.Tensor:
    """Frames out of Conv2dSubsampling for `num_feats` input frames (0 when fewer than 7)."""
    if isinstance(num_feats, torch.Tensor):
        return torch.clamp(((num_feats - 1) // 2 - 1) // 2, min=0)
    return max(((num_feats - 1) // 2 - 1) // 2, 0)


class CausalConv1d(torch.nn.Conv1d):
    """Depthwise Conv1d padded on the left only: output t reads inputs t-k+1..t."""

    def __init__(self, channels: int, kernel_size: int):
        super().__init__(channels, channels, kernel_size, stride=1, padding=0, groups=channels)

    @property
    def left_context(self) -> int:
        return self.kernel_size[0] - 1

    def forward(self, x: torch.Tensor, left: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, C, T); `left`: the previous (B, C, k-1) inputs, zeros (offline start) when None."""
        x = F.pad(x, (self.left_context, 0)) if left is None else torch.cat([left, x], dim=-1)
        return super().forward(x)


def causal_cgmlp(
    size: int,
    linear_units: int,
    kernel_size: int,
    dropout_rate: float,
    use_linear_after_conv: bool,
    gate_activation: str,
) -> ConvolutionalGatingMLP:
    """ESPnet's cgMLP with its depthwise conv swapped for a causal one (same parameter names)."""
    cgmlp = ConvolutionalGatingMLP(
        size, linear_units, kernel_size, dropout_rate, use_linear_after_conv, gate_activation
    )
    cgmlp.csgu.conv = CausalConv1d(linear_units // 2, kernel_size)
    return cgmlp


@dataclass(frozen=True)
class EncoderStreamState:
    """Caches of one stream (batch B) between `forward_chunk` calls."""

    feat_cache: torch.Tensor  # (B, n, idim): feature frames from 4 * num_frames on, not yet consumed
    conv_caches: tuple[torch.Tensor, ...]  # per conv block: last k-1 normalized conv inputs (B, C, k-1)
    num_frames: int = 0  # subsampled / conv-block frames emitted so far
    num_feats: int = 0  # feature frames received so far


class LateContextEncoder(AbsEncoder):
    """Conv subsampling + causal cgMLP blocks (stream during ingestion) + Branchformer blocks (on the whole input)."""

    STREAMING_MODULES = ("embed", "conv_blocks")  # children that run chunk by chunk (see flops.py)

    def __init__(
        self,
        input_size: int,
        output_size: int = 144,
        num_conv_blocks: int = 6,
        num_attn_blocks: int = 3,
        attention_heads: int = 4,
        cgmlp_linear_units: int = 1152,
        # cgMLP hidden size of the attention blocks (None: cgmlp_linear_units). They run after the end of
        # speech, so a narrower cgMLP there moves encoder FLOPs into ingestion.
        attn_cgmlp_linear_units: int | None = None,
        conv_kernel: int = 31,  # causal kernel of the conv blocks: 30 frames (1.2 s) of left context
        attn_cgmlp_kernel: int = 31,  # symmetric kernel of the cgMLP branch in the attention blocks
        use_linear_after_conv: bool = False,
        gate_activation: str = "identity",
        merge_method: str = "concat",
        cgmlp_weight: float = 0.5,
        attn_branch_drop_rate: float = 0.0,
        dropout_rate: float = 0.1,
        positional_dropout_rate: float = 0.1,
        attention_dropout_rate: float = 0.0,
        stochastic_depth_rate: float = 0.0,
    ):
        super().__init__()
        self._input_size = input_size
        self._output_size = output_size
        self.num_conv_blocks = num_conv_blocks
        self.num_attn_blocks = num_attn_blocks
        # Relative positions: only the attention blocks use them, and they do not depend on where a chunk
        # boundary falls; the conv blocks need none (the causal conv is position-aware by itself).
        self.embed = Conv2dSubsampling(
            input_size, output_size, dropout_rate, RelPositionalEncoding(output_size, positional_dropout_rate)
        )
        self.conv_blocks = repeat(
            num_conv_blocks,
            lambda _: BranchformerEncoderLayer(
                output_size,
                None,
                causal_cgmlp(
                    output_size,
                    cgmlp_linear_units,
                    conv_kernel,
                    dropout_rate,
                    use_linear_after_conv,
                    gate_activation,
                ),
                dropout_rate,
                merge_method,
                stochastic_depth_rate=stochastic_depth_rate,
            ),
        )
        self.attn_blocks = repeat(
            num_attn_blocks,
            lambda _: BranchformerEncoderLayer(
                output_size,
                RelPositionMultiHeadedAttention(attention_heads, output_size, attention_dropout_rate),
                ConvolutionalGatingMLP(
                    output_size,
                    attn_cgmlp_linear_units or cgmlp_linear_units,
                    attn_cgmlp_kernel,
                    dropout_rate,
                    use_linear_after_conv,
                    gate_activation,
                ),
                dropout_rate,
                merge_method,
                cgmlp_weight,
                attn_branch_drop_rate,
                stochastic_depth_rate,
            ),
        )
        self.after_norm = LayerNorm(output_size)

    def output_size(self) -> int:
        return self._output_size

    # ---- offline -------------------------------------------------------------------------------------
    def forward(
        self,
        xs_pad: torch.Tensor,
        ilens: torch.Tensor,
        prev_states: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, None]:
        """(B, T, idim), (B,) -> (B, T', d), (B,), None with T' = ((T-1)//2-1)//2."""
        conv_out, olens = self.forward_conv(xs_pad, ilens)
        return self.forward_context(conv_out, olens), olens, None

    def forward_conv(self, xs_pad: torch.Tensor, ilens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Subsampling + conv blocks over whole (padded) inputs: the part that can stream."""
        if xs_pad.size(1) < SUBSAMPLING_RECEPTIVE_FIELD:
            raise TooShortUttError(
                f"has {xs_pad.size(1)} frames and is too short for subsampling "
                f"(it needs at least {SUBSAMPLING_RECEPTIVE_FIELD} frames)",
                xs_pad.size(1),
                SUBSAMPLING_RECEPTIVE_FIELD,
            )
        x = self._subsample(xs_pad)
        # Exact lengths (ESPnet's mask slicing counts up to 1 more frame for shorter padded inputs, whose
        # receptive field reaches into the padding); the causal blocks never look at padded frames.
        olens = subsampled_length(ilens).to(torch.long)
        x, _ = self.conv_blocks(x, None)
        # Padded frames carry no signal; zeroing them keeps the blocks' LayerNorm (eps 1e-12) from blowing
        # up the gradient that reaches all-zero padding, which made xavier-initialized training diverge.
        x = x.masked_fill(make_pad_mask(olens, maxlen=x.size(1))[:, :, None].to(x.device), 0.0)
        return x, olens

    def forward_context(self, conv_frames: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Attention blocks + final norm over all conv-block outputs so far: (B, T', d) -> (B, T', d)."""
        if lengths is None:
            lengths = torch.full((conv_frames.size(0),), conv_frames.size(1), dtype=torch.long)
        masks = (~make_pad_mask(lengths, maxlen=conv_frames.size(1))[:, None, :]).to(conv_frames.device)
        pos_emb = self.embed.out[1](conv_frames)[1]  # RelPositionalEncoding: (1, 2T'-1, d), content-free
        (x, _), _ = self.attn_blocks((conv_frames, pos_emb), masks)
        return self.after_norm(x)

    def _subsample(self, feats: torch.Tensor) -> torch.Tensor:
        """Conv2dSubsampling.forward minus masks/positions: (B, T, idim) -> (B, T', d), scaled by sqrt(d)."""
        x = self.embed.conv(feats.unsqueeze(1))
        b, c, t, f = x.size()
        return self.embed.out(x.transpose(1, 2).reshape(b, t, c * f))[0]

    # ---- streaming -----------------------------------------------------------------------------------
    def init_stream_state(self, batch_size: int = 1) -> EncoderStreamState:
        """Empty caches; zero conv caches reproduce the offline left zero padding."""
        p = next(self.parameters())
        caches = tuple(
            p.new_zeros(batch_size, blk.cgmlp.csgu.conv.in_channels, blk.cgmlp.csgu.conv.left_context)
            for blk in self.conv_blocks
        )
        return EncoderStreamState(p.new_zeros(batch_size, 0, self._input_size), caches)

    def forward_chunk(
        self, feats_chunk: torch.Tensor, state: EncoderStreamState
    ) -> tuple[torch.Tensor, EncoderStreamState]:
        """New feature frames (B, n, idim) -> the conv-block frames (B, m, d) they complete, new state."""
        buf = torch.cat([state.feat_cache, feats_chunk.to(state.feat_cache.dtype)], dim=1)
        num_feats = state.num_feats + feats_chunk.size(1)
        m = subsampled_length(buf.size(1))
        if m == 0:
            empty = buf.new_zeros(buf.size(0), 0, self._output_size)
            return empty, EncoderStreamState(buf, state.conv_caches, state.num_frames, num_feats)
        # Exactly the frames that produce m outputs; keep the rest from the next output's first frame.
        x = self._subsample(buf[:, : SUBSAMPLING * (m - 1) + SUBSAMPLING_RECEPTIVE_FIELD])
        caches = []
        for blk, cache in zip(self.conv_blocks, state.conv_caches):
            x, cache = _conv_block_step(blk, x, cache)
            caches.append(cache)
        new_state = EncoderStreamState(buf[:, SUBSAMPLING * m :], tuple(caches), state.num_frames + m, num_feats)
        return x, new_state


def _conv_block_step(
    block: BranchformerEncoderLayer, x: torch.Tensor, cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """BranchformerEncoderLayer.forward (cgMLP branch only) on new frames, with the causal conv's cache.

    Mirrors ESPnet's layer + ConvolutionalGatingMLP + ConvolutionalSpatialGatingUnit forward; the
    streaming tests check it against the offline path, which runs ESPnet's own forward.
    """
    cgmlp, csgu = block.cgmlp, block.cgmlp.csgu
    h = cgmlp.channel_proj1(block.norm_mlp(x))
    x_r, x_g = h.chunk(2, dim=-1)
    x_g = csgu.norm(x_g).transpose(1, 2)  # (B, C, n)
    k1 = csgu.conv.left_context
    full = torch.cat([cache, x_g], dim=-1)
    new_cache = full[..., full.size(-1) - k1 :]
    x_g = csgu.conv(x_g, left=cache).transpose(1, 2)
    if csgu.linear is not None:
        x_g = csgu.linear(x_g)
    x_g = csgu.act(x_g)
    y = cgmlp.channel_proj2(csgu.dropout(x_r * x_g))
    y = x + block.dropout(block.merge_proj(block.dropout(y)))
    return block.norm_final(y), new_cache


class IncrementalEncoder:
    """Feature frames in, encoder output over everything so far on demand: the encoder's work on a live stream.

    `accept` does all the work that old frames allow: subsampling, the conv blocks, most of the first
    attention block and every attention block's relative-position table (`pasu.models.attention_stream`).
    `encode` runs the rest, which needs the whole input, and can be called at any time (a pilot) or once
    after the end of speech. It equals `LateContextEncoder.forward` up to float rounding.
    """

    def __init__(self, encoder: LateContextEncoder, batch_size: int = 1):
        self.encoder = encoder
        self.state = encoder.init_stream_state(batch_size)
        self.blocks = list(encoder.attn_blocks)
        streamable = bool(self.blocks) and all(can_stream(block) for block in self.blocks)
        self.tables = [PositionTable(b.attn, encoder.embed.out[1]) for b in self.blocks] if streamable else []
        # None: the attention blocks all wait for encode(), which runs ESPnet's forward on the conv outputs
        self.first = AttentionBlockStream(self.blocks[0], self.tables[0]) if streamable else None
        self.frames: list[torch.Tensor] = []  # conv-block outputs, kept only when `first` is None

    @property
    def num_frames(self) -> int:
        """Encoder frames emitted so far."""
        return self.state.num_frames

    def accept(self, feats: torch.Tensor) -> None:
        """New feature frames (B, n, idim)."""
        out, self.state = self.encoder.forward_chunk(feats, self.state)
        if out.size(1) == 0:
            return
        if self.first is None:
            self.frames.append(out)
            return
        self.first.accept(out)
        for table in self.tables[1:]:
            table.reserve(self.num_frames)

    def encode(self) -> torch.Tensor:
        """(B, T', d) encoder output on all frames so far; T' = 0 before the first frame."""
        if self.num_frames == 0:
            return self.state.feat_cache.new_zeros(self.state.feat_cache.size(0), 0, self.encoder.output_size())
        if self.first is None:
            conv = torch.cat(self.frames, dim=1)
            self.frames = [conv]  # one tensor from now on: later encodes concatenate less
            return self.encoder.forward_context(conv)
        x = self.first.output()
        for block, table in zip(self.blocks[1:], self.tables[1:]):
            later = AttentionBlockStream(block, table)
            later.accept(x)
            x = later.output()
        return self.encoder.after_norm(x)
