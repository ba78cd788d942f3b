"""Packs for a GPU lent for a few minutes: data files split into part folders that each fit one call (a call
carries 64 MiB, the checkout included), with an index row per item."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path


def fill_parts(out: Path, staged: Path, files: Sequence[tuple[str, list[dict]]], part_mib: float,
               part0_bytes: int = 0) -> dict[Path, list[dict]]:
    """Move the `staged` files into out/part0, part1, ... in order, each part under `part_mib` with its index rows
    counted (part0 starts with `part0_bytes` in it: weights or a header written beside); the rows of each part.
    `staged` is removed once empty."""
    folder, size = out / "part0", part0_bytes
    folder.mkdir(parents=True, exist_ok=True)
    parts: dict[Path, list[dict]] = {folder: []}
    for name, rows in files:
        added = (staged / name).stat().st_size + sum(len(json.dumps(r)) + 2 for r in rows)
        if size > 0 and size + added > part_mib * 2**20:
            folder, size = out / f"part{len(parts)}", 0
            folder.mkdir(exist_ok=True)
            parts[folder] = []
        (staged / name).rename(folder / name)
        parts[folder] += rows
        size += added
    staged.rmdir()
    return parts
