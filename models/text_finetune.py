"""Fine-tuning the text pass's encoder together with its intent and slot heads.

The frozen-encoder classifier (models/text_intent.py) fits two linear read-outs on all-MiniLM-L6-v2's states:
intent from the L2-normalized mean of the token states, a BIO slot label from each word's first sub-token state
next to its neighbours'. Here the same two read-outs train jointly with the encoder's six transformer layers
(the token embeddings stay frozen: they are half the weights, and what words missing from the training text
rely on). Nothing about the read-outs changes shape, so the fine-tuned classifier is saved and served as the
frozen one is, plus the transformer layers' weights (`SentenceEncoder.adapted_state`).

Training words are dropped at random (with their slot labels) so that the encoder learns to read transcripts
that lost words, as a recognizer's do.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch
from tqdm import tqdm

from pasu.corpus.text import normalize_text
from pasu.models.text_intent import ADAPTED_PREFIX
from pasu.models.text_slots import OUTSIDE, bio_labels

if TYPE_CHECKING:
    from pasu.corpus.text import Sentence
    from pasu.models.text_intent import SentenceEncoder


@dataclass(frozen=True)
class FineTuneOptions:
    epochs: float = 3.0  # passes over the training sentences
    batch_size: int = 32  # sentences per step
    encoder_lr: float = 5e-5  # AdamW on the transformer layers: small, they already know English
    head_lr: float = 2e-3  # the two read-outs start from zero
    # The pooled embedding has unit length, so confident intent logits need large weights, which zero-started
    # weights reach slowly; the read-out sees the embedding times this (a cosine classifier's scale), folded
    # into the saved weights. Without it (1.0), 3 epochs gave 84.3% on SLURP test gold transcripts.
    intent_scale: float = 16.0
    warmup_steps: int = 100  # linear warm-up, then linear decay to 0 at the last step
    weight_decay: float = 0.01
    word_drop: float = 0.1  # each training word is left out with this probability (recognizers drop words)
    seed: int = 0


class Heads(NamedTuple):
    """The read-outs, as TextIntentClassifier and SlotTagger hold them: one (weights, bias) row per class."""

    intents: list[str]
    intent_weights: np.ndarray  # (intents, dim)
    intent_bias: np.ndarray
    labels: list[str]  # BIO slot labels, OUTSIDE first
    slot_weights: np.ndarray  # (labels, 3 * dim)
    slot_bias: np.ndarray
    slot_sentences: int  # training sentences whose slots were found in their words
    slot_words: int


class _Example(NamedTuple):
    words: list[str]
    intent: int
    bio: list[str] | None  # None: no slot annotation, or values not found in the words


def fine_tune(encoder: SentenceEncoder, sentences: Sequence[Sentence],
              options: FineTuneOptions = FineTuneOptions()) -> Heads:
    """Train `encoder`'s transformer layers (in place) and the two read-outs on labelled sentences."""
    intents = sorted({s.intent for s in sentences})
    if len(intents) < 2:
        raise ValueError("fine-tuning needs at least two intents")
    examples = [_example(s, intents) for s in sentences]
    labels = [OUTSIDE] + sorted({b for e in examples for b in e.bio or () if b != OUTSIDE})
    model = encoder.model
    intent_head = torch.nn.Linear(encoder.dim, len(intents))
    slot_head = torch.nn.Linear(3 * encoder.dim, len(labels))
    for head in (intent_head, slot_head):  # zero start: the first steps move the heads, not the encoder
        torch.nn.init.zeros_(head.weight)
        torch.nn.init.zeros_(head.bias)
    for name, p in model.named_parameters():  # the embeddings (MPNet: also its relative position bias) stay
        p.requires_grad = name.startswith(ADAPTED_PREFIX)  # as packaged: the adaptation file holds the layers only
    layers = [p for p in model.parameters() if p.requires_grad]
    heads = [*intent_head.parameters(), *slot_head.parameters()]
    optimizer = torch.optim.AdamW([{"params": layers, "lr": options.encoder_lr},
                                   {"params": heads, "lr": options.head_lr}], weight_decay=options.weight_decay)
    steps = max(1, round(options.epochs * len(examples) / options.batch_size))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda k: min(1.0, (k + 1) / options.warmup_steps) * max(0.0, 1.0 - k / steps))
    rng = random.Random(options.seed)
    torch.manual_seed(options.seed)
    label_index = {label: k for k, label in enumerate(labels)}
    model.train()
    with tqdm(total=steps, unit="step", desc="fine-tune", dynamic_ncols=True) as bar:
        for batch in _batches(examples, options.batch_size, steps, rng):
            batch = [_drop_words(e, options.word_drop, rng) for e in batch]
            pooled, words = encoder.differentiable_states([e.words for e in batch])
            logits = intent_head(options.intent_scale * pooled)
            loss = torch.nn.functional.cross_entropy(logits, torch.tensor([e.intent for e in batch]))
            tagged = [(w, e.bio) for w, e in zip(words, batch) if e.bio is not None]
            if tagged:
                x = torch.cat([word_features(w) for w, _ in tagged])
                y = torch.tensor([label_index[b] for _, bio in tagged for b in bio])
                loss = loss + torch.nn.functional.cross_entropy(slot_head(x), y)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(layers, 1.0)
            optimizer.step()
            schedule.step()
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()
    encoder.adopt_trained_layers()  # float16: what is measured next is what is saved and served
    slotted = [e for e in examples if e.bio is not None]
    return Heads(intents, options.intent_scale * _numpy(intent_head.weight), _numpy(intent_head.bias), labels,
                 _numpy(slot_head.weight),
                 _numpy(slot_head.bias), len(slotted), sum(len(e.words) for e in slotted))


def word_features(states: torch.Tensor) -> torch.Tensor:
    """models.text_slots.word_features on a (words, dim) tensor: each word's state, its left and right neighbours'."""
    pad = states.new_zeros((1, states.shape[1]))
    return torch.cat([states, torch.cat([pad, states[:-1]]), torch.cat([states[1:], pad])], dim=1)


def _example(sentence: Sentence, intents: list[str]) -> _Example:
    words = normalize_text(sentence.text).split()
    bio = bio_labels(words, sentence.slots) if sentence.slots is not None else None
    return _Example(words, intents.index(sentence.intent), bio)


def _batches(examples: list[_Example], size: int, steps: int, rng: random.Random):
    """`steps` batches of `size`, reshuffled at each pass."""
    order: list[int] = []
    for _ in range(steps):
        if len(order) < size:
            order = list(range(len(examples)))
            rng.shuffle(order)
        rows, order = order[:size], order[size:]
        yield [examples[i] for i in rows]


def _drop_words(example: _Example, probability: float, rng: random.Random) -> _Example:
    keep = [i for i in range(len(example.words)) if rng.random() >= probability] or list(range(len(example.words)))
    bio = [example.bio[i] for i in keep] if example.bio is not None else None
    return _Example([example.words[i] for i in keep], example.intent, bio)


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().numpy().astype(np.float32)
