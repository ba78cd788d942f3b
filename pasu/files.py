"""Writing files so that a killed run never leaves half of one behind."""

from __future__ import annotations

import os
from pathlib import Path


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """`text` written to a temporary file beside `path`, then renamed over it (a rename is atomic)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path
