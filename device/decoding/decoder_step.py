"""One step of an ESPnet transformer decoder over a batch of hypotheses, with the encoder output's key and value
projections computed once per utterance instead of once per hypothesis and step.

ESPnet's `TransformerDecoder.batch_score` runs every layer's source attention on the whole encoder output again
at every step, for every hypothesis of the beam: on the shipped two-layer decoder those projections are most of
a step's work. `SourceKeys` holds them for one utterance; `batch_score` is ESPnet's with them, the same
arithmetic otherwise (the decoder's cache, the per-hypothesis states and the log-probabilities are ESPnet's), so
a search gives the same hypotheses and scores. Decoders this does not cover (other layer types, attention
variants) go on through ESPnet's own `batch_score` (`SourceKeys.of` returns None for them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from espnet.nets.pytorch_backend.transformer.attention import MultiHeadedAttention
from espnet.nets.pytorch_backend.transformer.decoder_layer import DecoderLayer
from espnet.nets.pytorch_backend.transformer.mask import subsequent_mask


class SourceKeys:
    """Each decoder layer's source-attention keys and values of one utterance's (1, T, D) encoder output."""

    def __init__(self, keys_values: list[tuple[torch.Tensor, torch.Tensor]]):
        self.keys_values = keys_values  # per layer: (1, heads, T, d_k) keys, then values

    @classmethod
    def of(cls, decoder: Any, memory: torch.Tensor) -> SourceKeys | None:
        """The projections of `memory` (1, T, D) for `decoder`; None when its layers are not the plain kind
        `batch_score` reproduces."""
        if not _plain_layers(decoder):
            return None
        return cls([(_heads(layer.src_attn, layer.src_attn.linear_k(memory)),
                     _heads(layer.src_attn, layer.src_attn.linear_v(memory))) for layer in decoder.decoders])


def batch_score(decoder: Any, ys: torch.Tensor, states: Sequence[Any],
                keys: SourceKeys) -> tuple[torch.Tensor, list[Any]]:
    """`decoder.batch_score(ys, states, memory)` with the memory's projections from `keys`: (n, vocab)
    log-probabilities of the next token after each prefix of ys (n, L), and each hypothesis's new state."""
    n, layers = len(ys), len(decoder.decoders)
    cache = None if states[0] is None else [torch.stack([states[b][i] for b in range(n)]) for i in range(layers)]
    mask = subsequent_mask(ys.size(-1), device=ys.device).unsqueeze(0)
    x = decoder.embed(ys)
    new_cache = []
    for i, (layer, (k, v)) in enumerate(zip(decoder.decoders, keys.keys_values)):
        x = _layer_step(layer, x, mask, None if cache is None else cache[i], k, v)
        new_cache.append(x)
    y = decoder.after_norm(x[:, -1]) if decoder.normalize_before else x[:, -1]
    if decoder.output_layer is not None:
        y = torch.log_softmax(decoder.output_layer(y), dim=-1)
    return y, [[new_cache[i][b] for i in range(layers)] for b in range(n)]


def _plain_layers(decoder: Any) -> bool:
    """Layers whose step `_layer_step` reproduces: ESPnet's DecoderLayer with plain multi-head attention, no
    concatenation, no sequential attention, no q/k normalization, no SDPA or flash attention."""
    layers = getattr(decoder, "decoders", None)
    if layers is None or not all(hasattr(decoder, a) for a in ("embed", "after_norm", "normalize_before",
                                                               "output_layer")):
        return False
    return all(type(layer) is DecoderLayer and not layer.concat_after and layer.sequential_attn is None
               and type(layer.src_attn) is MultiHeadedAttention and isinstance(layer.src_attn.q_norm, torch.nn.Identity)
               and not getattr(layer.src_attn, "use_sdpa", False) and not layer.src_attn.use_flash_attn
               for layer in layers)


def _heads(attention: MultiHeadedAttention, projected: torch.Tensor) -> torch.Tensor:
    """(B, T, D) -> (B, heads, T, d_k), as MultiHeadedAttention.forward_qkv splits them."""
    return projected.view(projected.size(0), -1, attention.h, attention.d_k).transpose(1, 2)


def _source_attention(attention: MultiHeadedAttention, x: torch.Tensor, k: torch.Tensor,
                      v: torch.Tensor) -> torch.Tensor:
    """MultiHeadedAttention.forward(x, memory, memory, None) with memory's projections k, v (1, heads, T, d_k),
    shared by every hypothesis of the batch."""
    q = _heads(attention, attention.linear_q(x))  # (B, heads, 1, d_k)
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(attention.d_k)
    context = torch.matmul(attention.dropout(torch.softmax(scores, dim=-1)), v)  # (B, heads, 1, d_k)
    return attention.linear_out(context.transpose(1, 2).contiguous().view(x.size(0), -1, attention.h * attention.d_k))


def _layer_step(layer: DecoderLayer, tgt: torch.Tensor, tgt_mask: torch.Tensor, cache: torch.Tensor | None,
                k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """DecoderLayer.forward(tgt, tgt_mask, memory, None, cache) with the source attention on k, v."""
    residual = tgt
    if layer.normalize_before:
        tgt = layer.norm1(tgt)
    if cache is None:
        tgt_q, tgt_q_mask = tgt, tgt_mask
    else:  # only the last position is new: the cache holds this layer's outputs for the others
        tgt_q, residual, tgt_q_mask = tgt[:, -1:, :], residual[:, -1:, :], tgt_mask[:, -1:, :]
    x = residual + layer.dropout(layer.self_attn(tgt_q, tgt, tgt, tgt_q_mask))
    if not layer.normalize_before:
        x = layer.norm1(x)
    residual = x
    if layer.normalize_before:
        x = layer.norm2(x)
    x = residual + layer.dropout(_source_attention(layer.src_attn, x, k, v))
    if not layer.normalize_before:
        x = layer.norm2(x)
    residual = x
    if layer.normalize_before:
        x = layer.norm3(x)
    x = residual + layer.dropout(layer.feed_forward(x))
    if not layer.normalize_before:
        x = layer.norm3(x)
    return x if cache is None else torch.cat([cache, x], dim=1)
