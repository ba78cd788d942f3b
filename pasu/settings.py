"""Where PASU finds things outside the repository."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

# The shared read-only data (SLURP/HWU64 text, noise, recordings). Never copied into the repository.
SHARED_DATA_ENV = "PASU_SHARED_DATA"
DEFAULT_SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


def shared_data_dir(override: str | os.PathLike | None = None) -> Path:
    """The shared data folder: the explicit override, else $PASU_SHARED_DATA, else ../shared/data."""
    if override is not None:
        return Path(override)
    return Path(os.environ.get(SHARED_DATA_ENV, DEFAULT_SHARED_DATA))

# Trained models the project ships (`pasu package` output folders with their model cards).
SHIPPED_MODELS = REPO_ROOT / "models" / "shipped"


def shipped_model(name: str) -> Path:
    """The shipped model folder `name` (device, cloud, baseline_branchformer, ...)."""
    return SHIPPED_MODELS / name


# The weight of an LM fused into the device's final decode when none is given (every --lm of
# pasu.device.cli.add_lm_flags, through pasu.device.agent.fusing_lm): the shipped LM's, chosen on 300 dev
# utterances (models/shipped/lm/README.md).
SHIPPED_LM_WEIGHT = 0.2

# Files derived from shipped ones and built once (e.g. Whisper with an adapted decoder): $PASU_CACHE.
CACHE_ENV = "PASU_CACHE"


def cache_dir() -> Path:
    """Where derived files are built once and reused: $PASU_CACHE, else ~/.cache/pasu."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "pasu")
