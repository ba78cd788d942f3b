"""Run state that every trainer here (`pasu train`, the LM, Whisper's decoder adaptation) saves and resumes alike.

A checkpoint holds the model, the optimizer, the trainer's own loop state and the RNG states, so a resumed run
draws the same batches and dropout masks as one that never stopped. Files are written to a temporary name and
renamed: a crash never leaves a half-written checkpoint.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch


def atomic_save(obj: Any, path: Path) -> None:
    """torch.save to a temporary file, then rename."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def save_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    state: dict[str, Any]) -> None:
    """Model, optimizer, the trainer's loop `state` (plain data) and the RNG states, atomically."""
    rng = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    atomic_save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "state": state, "rng": rng}, path)


def restore_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Load model, optimizer and RNG states from a `save_checkpoint` file; returns its loop state."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    model.load_state_dict(checkpoint["model"], strict=True)
    optimizer.load_state_dict(checkpoint["optimizer"])
    rng = checkpoint["rng"]
    torch.set_rng_state(rng["torch"])
    np.random.set_state(rng["numpy"])
    random.setstate(rng["python"])
    return checkpoint["state"]


def average_state_dicts(paths: Sequence[Path]) -> dict[str, torch.Tensor]:
    """Element-wise mean of float tensors (ESPnet's average_nbest_models); integer buffers from the first."""
    if not paths:
        raise ValueError("nothing to average")
    avg: dict[str, torch.Tensor] = {}
    for path in paths:
        state = torch.load(path, map_location="cpu", weights_only=True)
        for k, v in state.items():
            if not v.is_floating_point():
                avg.setdefault(k, v.clone())  # e.g. BatchNorm's num_batches_tracked
            elif k in avg:
                avg[k] += v.double()
            else:
                avg[k] = v.double().clone()
    return {k: (v / len(paths)).float() if v.is_floating_point() else v for k, v in avg.items()}


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
