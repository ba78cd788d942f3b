"""The SLU label shared by corpus, models and metrics: an intent and `[type : value]` slots."""

from __future__ import annotations

import re
from typing import NamedTuple


class Slot(NamedTuple):
    """One filled slot, SLURP style: `[date : tomorrow]` is Slot("date", "tomorrow")."""

    type: str
    value: str


_SPAN = re.compile(r"\[\s*([^\[\]:]+?)\s*:\s*([^\[\]]*?)\s*\]")


def parse_annotation(annotated: str) -> tuple[str, tuple[Slot, ...]]:
    """Split a SLURP/HWU64 annotation into its plain sentence and its slots, in order of appearance."""
    slots = tuple(Slot(m.group(1).strip(), m.group(2).strip()) for m in _SPAN.finditer(annotated))
    plain = _SPAN.sub(lambda m: m.group(2).strip(), annotated)
    return " ".join(plain.split()), slots
