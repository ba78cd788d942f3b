"""`pasu text-intent pseudo-label`: intents for SLURP's unlabelled training sentences, from the text classifier.

About 5,300 of lm.txt's 11,500 training sentences have no label in the public sources (`pasu.corpus.text`), so the
speech models never heard them. The text pass (88% intent accuracy on gold transcripts) labels them; only its
confident answers are kept. Slots come from the same pass's slot tagger (SLU-F1 78% on gold transcripts), or stay
unknown (`SLOTS_UNKNOWN` in the target, `models/targets.py`). Unknown slots invent no markup but cost the device
model slot skill: after 1,700 steps on a fifth of its batches with them, SLU-F1 on 200 dev utterances fell 1.9 points
while WER fell 1.0 (the device's training log).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from pasu.corpus.text import PSEUDO_SOURCE, Sentence
from pasu.models.text_intent import TextIntentClassifier


@dataclass(frozen=True)
class PseudoLabelOptions:
    # keep a sentence only if the classifier's probability of its intent is at least this; on SLURP devel gold
    # transcripts 0.7 keeps 92.7% of the sentences at 92.6% accuracy (88.6% with every sentence kept)
    min_probability: float = 0.7
    # slots from the classifier's slot tagger; False (or a classifier without one): unknown slots
    tag_slots: bool = True


@dataclass(frozen=True)
class Coverage:
    """How many sentences a threshold keeps, and how often their intents are right where that is known."""

    kept: int
    total: int
    accuracy: float | None  # of the kept ones' intents; None for unlabelled sentences


def pseudo_label(texts: Sequence[str], classifier: TextIntentClassifier,
                 options: PseudoLabelOptions = PseudoLabelOptions()) -> list[Sentence]:
    """The texts the classifier is confident about, each labelled with its intent and slots (`options.tag_slots`)."""
    guesses = classifier.predict(texts)
    kept = [(text, g.intent) for text, g in zip(texts, guesses) if g.probability >= options.min_probability]
    tagger = classifier.slots if options.tag_slots else None
    slots = tagger.tag([text for text, _ in kept]) if tagger is not None else [None] * len(kept)
    out = []
    for (text, intent), found in zip(kept, slots):
        scenario, _, action = intent.partition("_")
        out.append(Sentence(_pseudo_id(text), text, scenario, action, intent, found, PSEUDO_SOURCE))
    return out


def coverage(sentences: Sequence[Sentence], classifier: TextIntentClassifier,
             options: PseudoLabelOptions = PseudoLabelOptions()) -> Coverage:
    """What `pseudo_label` would keep of labelled sentences (their gold text), and its accuracy."""
    guesses = classifier.predict([s.text for s in sentences])
    kept = [g.intent == s.intent for s, g in zip(sentences, guesses) if g.probability >= options.min_probability]
    return Coverage(len(kept), len(sentences), float(np.mean(kept)) if kept else None)


def _pseudo_id(text: str) -> str:
    return "pseudo-" + hashlib.sha1(text.encode("utf-8")).hexdigest()[:12]
