"""SLU training targets: the intent label, then the words with inline slot markup (ESPnet SLURP style).

ESPnet's SLURP recipes write one target per utterance so a single ASR model does transcription, intent
classification and (in `slurp_entity`) slot filling. Ours is the same idea with explicit markup:

    alarm_set wake me up at SLOT_time five am SLOT_END on SLOT_date monday SLOT_END

- the FIRST token is the intent (`scenario_action`; always has an underscore, which no word has: words are
  normalized to [a-z0-9'] by the corpus builder);
- `SLOT_<type>` opens a slot, `SLOT_END` closes it; the words in between are the slot value. Markup tokens
  are upper case, so they never collide with (lower-case) words or intents;
- removing every markup token and the intent gives back the transcript exactly, so WER is computed on the
  same text the corpus holds.

Rows whose slots are unknown (`slots: null` in the manifest; ~13% of the full training set, SLURP training
sentences labelled by slurpfood only) get a marker right after the intent and NO slot markup:

    calendar_set SLOTS_UNKNOWN remind me to call mum tomorrow

Why not drop them: they hold half the calendar_set rows and the only examples of four intents, and their
words and intents are as good as any. Why not train them as plain unmarked text: the model would learn that
e.g. calendar_set sentences often have no slots at all and skip the markup at test time. With the marker,
"no markup" is conditioned on a token the decoder emitted itself, so a decoder that bans `SLOTS_UNKNOWN`
(its score set to -inf in beam search) always takes the marked-up branch. A decoder that does not ban it
still works: `decode_target` ignores the marker and the utterance simply has no slots.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from pasu.metrics import SluResult
from pasu.slu import Slot

log = logging.getLogger(__name__)

SLOT_PREFIX = "SLOT_"  # + slot type opens a slot: SLOT_time
SLOT_END = "SLOT_END"  # closes the open slot
SLOTS_UNKNOWN = "SLOTS_UNKNOWN"  # after the intent: this row's slots were not annotated (see module doc)


def slot_open(slot_type: str) -> str:
    """The opening markup token of a slot type (whitespace in the type becomes `_` so it stays one token)."""
    return SLOT_PREFIX + "_".join(slot_type.split())


def is_markup(token: str) -> bool:
    """True for SLOT_<type>, SLOT_END and SLOTS_UNKNOWN."""
    return token == SLOTS_UNKNOWN or token.startswith(SLOT_PREFIX)


def is_intent(token: str) -> bool:
    """Intent labels are `scenario_action`: an underscore no normalized word has, and not markup."""
    return "_" in token and not is_markup(token)


def target_symbols(intents: Iterable[str], slot_types: Iterable[str]) -> list[str]:
    """Every non-word target token (intents, slot markup), sorted, for the tokenizer's user symbols."""
    markup = {slot_open(t) for t in slot_types} | {SLOT_END, SLOTS_UNKNOWN}
    return sorted(set(intents)) + sorted(markup)


def encode_target(text: str, intent: str, slots: Sequence[Slot] | Sequence[Sequence[str]] | None) -> str:
    """The training target of one row; slot values not found in `text` are logged and left unmarked."""
    if not is_intent(intent):
        raise ValueError(f"intent {intent!r} is not a scenario_action label")
    words = text.split()
    if slots is None:
        return " ".join([intent, SLOTS_UNKNOWN, *words])
    spans = locate_slots(words, [Slot(*s) for s in slots])
    opens = {start: slot_open(slot.type) for start, _, slot in spans}
    ends = {end for _, end, _ in spans}
    out = [intent]
    for i, word in enumerate(words):
        if i in opens:
            out.append(opens[i])
        out.append(word)
        if i + 1 in ends:
            out.append(SLOT_END)
    return " ".join(out)


def locate_slots(words: Sequence[str], slots: Sequence[Slot]) -> list[tuple[int, int, Slot]]:
    """Non-overlapping word spans [start, end) of the slots, sorted by start; unfound slots are skipped.

    Annotations list slots in order of appearance, so each value is looked for after the previous slot's
    span first; this puts a repeated value ("from five to five thirty") on the right occurrence. Only when
    that fails is any free occurrence taken (slot order not as spoken).
    """
    taken = [False] * len(words)
    spans: list[tuple[int, int, Slot]] = []
    cursor = 0
    for slot in slots:
        value = slot.value.split()
        start = _find_free(words, value, taken, cursor)
        if start is None:
            start = _find_free(words, value, taken, 0)
        if start is None:
            log.debug("slot %s=%r not found in %r; left unmarked", slot.type, slot.value, " ".join(words))
            continue
        end = start + len(value)
        taken[start:end] = [True] * len(value)
        spans.append((start, end, slot))
        cursor = end
    return sorted(spans, key=lambda span: span[0])


def _find_free(words: Sequence[str], value: Sequence[str], taken: Sequence[bool], begin: int) -> int | None:
    """First index >= begin where `value` occurs on words no other slot has taken."""
    n = len(value)
    if n == 0:
        return None
    for i in range(begin, len(words) - n + 1):
        if list(words[i : i + n]) == list(value) and not any(taken[i : i + n]):
            return i
    return None


def decode_target(target: str) -> SluResult:
    """Parse a (possibly malformed) model output back into transcript, intent and slots.

    Robustness rules, for outputs a partly trained model does produce:
    - intent: the first intent-like token anywhere (normally position 0); "" when there is none; further
      intent-like tokens are dropped (they are not words);
    - a slot opened while another is open closes the first one; an unclosed slot ends at the last word;
    - a stray SLOT_END and an empty slot are ignored; SLOTS_UNKNOWN is ignored.
    """
    intent = ""
    words: list[str] = []
    slots: list[Slot] = []
    open_type: str | None = None
    value: list[str] = []

    def close() -> None:
        nonlocal open_type, value
        if open_type is not None and value:
            slots.append(Slot(open_type, " ".join(value)))
        open_type, value = None, []

    for token in target.split():
        if token == SLOTS_UNKNOWN:
            continue
        if token == SLOT_END:
            close()
        elif token.startswith(SLOT_PREFIX):
            close()
            open_type = token[len(SLOT_PREFIX) :]
        elif is_intent(token):
            intent = intent or token
        else:
            words.append(token)
            if open_type is not None:
                value.append(token)
    close()
    return SluResult(text=" ".join(words), intent=intent, slots=tuple(slots))
