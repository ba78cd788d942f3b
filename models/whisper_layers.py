"""What Whisper's encoder and decoder share in PyTorch: weights read from CTranslate2's variables under their
names, pre-norm linear, layer-norm and attention helpers, and trained variables written back under those names."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

LAYER_NORM_EPS = 1e-5


class WhisperPart(nn.Module):
    """The float variables under `prefix` ("encoder/" or "decoder/") as parameters, trained where `trainable`."""

    def __init__(self, variables: dict[str, np.ndarray], prefix: str, trainable: Callable[[str], bool]):
        super().__init__()
        self.prefix = prefix
        self.heads = int(variables[prefix + "num_heads"])
        self.layers = sum(1 for name in variables
                          if name.startswith(prefix + "layer_") and name.endswith("self_attention/linear_0/weight"))
        # CTranslate2 names hold "/" ; parameter names may not hold "."
        self.names = {_key(name): name for name in variables
                      if name.startswith(prefix) and variables[name].dtype.kind == "f" and variables[name].ndim}
        self.weights = nn.ParameterDict({
            key: nn.Parameter(torch.from_numpy(variables[name].astype(np.float32)), requires_grad=trainable(name))
            for key, name in self.names.items()})

    def w(self, name: str) -> torch.Tensor:
        return self.weights[_key(self.prefix + name)]

    def adapted_variables(self) -> dict[str, np.ndarray]:
        """The trained variables under their CTranslate2 names, float16 as Whisper's file stores them."""
        return {self.names[key]: p.detach().float().cpu().numpy().astype(np.float16)
                for key, p in self.weights.items() if p.requires_grad}

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.linear(x, self.w(name + "/weight"), self.w(name + "/bias"))

    def _norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.layer_norm(x, x.shape[-1:], self.w(name + "/gamma"), self.w(name + "/beta"), LAYER_NORM_EPS)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        split = lambda t: t.unflatten(-1, (self.heads, -1)).transpose(1, 2)  # noqa: E731  [B, H, T, d]
        out = F.scaled_dot_product_attention(split(q), split(k), split(v), attn_mask=mask,
                                             scale=1.0 / math.sqrt(q.shape[-1] // self.heads))
        return out.transpose(1, 2).flatten(-2)


def _key(name: str) -> str:
    return name.replace("/", ":")
