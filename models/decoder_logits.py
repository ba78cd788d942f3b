"""The decoder's logits from the training pass ESPnet's loss already ran, for extra loss terms without a second pass."""

from __future__ import annotations

from typing import Any

import torch


class TrainingDecoderLogits:
    """Keeps the (B, L+1, V) logits of the decoder's last training forward pass (a forward hook); `take` hands them
    over once, so each extra loss term reads the pass it belongs to."""

    def __init__(self, decoder: torch.nn.Module, owner: str):
        self.owner = owner  # who reads them, for the error message
        self.logits: torch.Tensor | None = None
        decoder.register_forward_hook(self._keep)

    def _keep(self, module: torch.nn.Module, inputs: Any, output: Any) -> None:
        # a training pass only: evaluation and decoding run the decoder too, and must not hold its output
        self.logits = output[0] if module.training else None

    def take(self) -> torch.Tensor:
        if self.logits is None:
            raise RuntimeError(f"{self.owner} needs the decoder's training pass first")
        logits, self.logits = self.logits, None
        return logits
