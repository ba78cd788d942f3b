"""Whisper's text decoder in PyTorch, on CTranslate2's variables, so the cloud can adapt it to our commands.

Whisper tiny.en writes fluent English but not our commands: on synthetic voices its best hypothesis is often an
English sentence that sounds alike. Its decoder is the part that knows which sentences are likely, and it is
cheap to train once the encoder's output is fixed (`models/whisper_adapt.py`). This module reads the decoder
from a CTranslate2 `ModelFile`, computes teacher-forced log-probabilities exactly as CTranslate2 does (pre-norm
blocks: causal self-attention, cross-attention on the encoder's output, GELU feed-forward; output projection tied
to the token embedding), and writes trained weights back under their CTranslate2 names.
"""

from __future__ import annotations

import os

import numpy as np
import torch
from torch.nn import functional as F

from pasu.models.whisper_layers import WhisperPart

SCALE_SUFFIX = ":int8_scale"  # an .npz key holding the row scales of the int8 matrix named before it


def is_adaptable(name: str) -> bool:
    """The decoder variables that adaptation trains: its blocks and final norm. The token embedding (also the
    output projection, 20 M of tiny's 39 M parameters) and the positions stay frozen: a vocabulary-wide
    change would need far more text than our commands, and the file shipped stays small."""
    return name.startswith("decoder/layer_") or name.startswith("decoder/layer_norm/")


class WhisperDecoder(WhisperPart):
    """Teacher-forced Whisper decoding: (prompt + text tokens, encoder output) -> next-token logits."""

    def __init__(self, variables: dict[str, np.ndarray]):
        super().__init__(variables, "decoder/", is_adaptable)

    def forward(self, tokens: torch.Tensor, encoded: torch.Tensor) -> torch.Tensor:
        """tokens [B, T] (right-padded: causal attention keeps padding out of earlier positions),
        encoded [B, S, D] -> logits [B, T, vocabulary]."""
        x = F.embedding(tokens, self.w("embeddings/weight")) + self.w("position_encodings/encodings")[: tokens.shape[1]]
        causal = torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool, device=tokens.device).tril()
        for i in range(self.layers):
            layer = f"layer_{i}/"
            h = self._norm(x, layer + "self_attention/layer_norm")
            q, k, v = self._linear(h, layer + "self_attention/linear_0").chunk(3, dim=-1)
            x = x + self._linear(self._attend(q, k, v, causal), layer + "self_attention/linear_1")
            h = self._norm(x, layer + "attention/layer_norm")
            q = self._linear(h, layer + "attention/linear_0")
            k, v = self._linear(encoded, layer + "attention/linear_1").chunk(2, dim=-1)
            x = x + self._linear(self._attend(q, k, v), layer + "attention/linear_2")
            h = self._norm(x, layer + "ffn/layer_norm")
            x = x + self._linear(F.gelu(self._linear(h, layer + "ffn/linear_0")), layer + "ffn/linear_1")
        return self._norm(x, "layer_norm") @ self.w("embeddings/weight").T


def pack_adaptation(variables: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Adapted variables as an .npz stores them: each matrix as int8 rows, each row with a float32 scale (the
    scheme of CTranslate2's int8 compute type, which re-derives these very integers from the unpacked float16
    rows, so the served model is unchanged), vectors as float16. Half the bytes of float16 matrices."""
    packed = {}
    for name, value in variables.items():
        if value.ndim != 2:
            packed[name] = value.astype(np.float16)
            continue
        rows = value.astype(np.float32)
        scale = 127.0 / np.maximum(np.abs(rows).max(axis=1, keepdims=True), 1e-12)
        packed[name] = np.round(rows * scale).astype(np.int8)
        packed[name + SCALE_SUFFIX] = scale.astype(np.float32)
    return packed


def unpack_adaptation(path: str | os.PathLike, dtype: type = np.float16) -> dict[str, np.ndarray]:
    """The variables of an adaptation .npz, packed (`pack_adaptation`) or written plain: floats as `dtype` (float16,
    as a CTranslate2 file stores them, by default), anything else (a head count) as stored."""
    with np.load(path) as npz:
        stored = {name: npz[name] for name in npz.files}
    def unpacked(name: str, value: np.ndarray) -> np.ndarray:
        if name + SCALE_SUFFIX in stored:
            return (value / stored[name + SCALE_SUFFIX]).astype(dtype)
        return value.astype(dtype) if value.dtype.kind == "f" else value

    return {name: unpacked(name, value) for name, value in stored.items() if not name.endswith(SCALE_SUFFIX)}


def token_logprobs(decoder: WhisperDecoder, tokens: torch.Tensor, encoded: torch.Tensor) -> torch.Tensor:
    """log P(tokens[:, t + 1] | tokens[:, : t + 1], audio) for every position: [B, T - 1]."""
    logits = decoder(tokens[:, :-1], encoded)
    return torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, 1:, None])[..., 0]
