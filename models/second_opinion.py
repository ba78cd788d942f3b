"""A second recognizer beside Whisper in the cloud: our SLU model adds its n-best and scores every candidate.

Whisper tiny.en knows English; our SLU model knows these commands and these (synthetic, noisy) voices. They
err differently: on 150 dev utterances the best of their pooled candidates has 25.7% WER, against 35.0% for
the SLU model's own 10-best and 52.2% for Whisper's 8-best. So the cloud pools both lists and scores every
transcript with both models plus the word LM (`WhisperRecognizer` weighs them, see whisper.yaml).

The SLU model's target is `intent [markup] words`, and a transcript from Whisper has no intent or slot
markup. It is scored as `intent SLOTS_UNKNOWN words`, the form training used for sentences without slot
labels (models/targets.py), under each of the intents its own n-best proposes, keeping the best: every
candidate, whichever list it came from, is scored the same way.

Once a transcript is chosen, the SLU model also says which intent it hears in it (`intent_logprobs`): the same
joint score under every intent it knows, normalized over them, i.e. log P(intent | audio, words). The text
pass that reads the transcript adds this, weighed, to its own reading (see `TextIntentPass`): the SLU model
heard the audio, so where the words came out wrong it may still know the intent.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pasu.models.targets import SLOTS_UNKNOWN, decode_target

MAX_INTENTS = 3  # intents (from its own n-best) under which the SLU model scores a transcript


@dataclass(frozen=True)
class Opinion:
    """What the SLU model heard in one waveform: its distinct transcripts and the scorer for any others."""

    texts: list[str]  # distinct transcripts of its n-best, best first
    intents: list[str]  # distinct intents of its n-best, best first, at most MAX_INTENTS
    encoded: torch.Tensor  # (T, D) encoder output, for `SecondOpinion.scores`


class SecondOpinion:
    """A PASU SLU model (ESPnet hybrid CTC/attention) used to propose and score transcripts."""

    def __init__(self, model: Any, tokenizer: Any, model_id: str, beam_size: int = 10, ctc_weight: float = 0.3):
        # model: espnet2 ESPnetASRModel in eval mode; tokenizer: pasu.models.tokenizer.Tokenizer
        from pasu.device.decoding.search import BeamSearch, SearchOptions
        from pasu.models.recognizer import banned_token_ids

        token_list = tokenizer.token_list
        if SLOTS_UNKNOWN not in token_list:
            raise ValueError(f"{model_id}: a second opinion needs a model trained with {SLOTS_UNKNOWN} targets")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.options = SearchOptions(beam_size=beam_size, ctc_weight=ctc_weight)

        def search(ban_slots_unknown: bool) -> BeamSearch:
            banned = banned_token_ids(token_list, ban_slots_unknown)
            return BeamSearch(model.decoder, model.ctc, model.sos, model.eos, len(token_list), banned)

        self.search = search(ban_slots_unknown=True)  # its own n-best: never emits SLOTS_UNKNOWN
        self.scorer = search(ban_slots_unknown=False)  # scores `intent SLOTS_UNKNOWN words`
        self.intents = tuple(tokenizer.intents)  # every intent it can emit

    @classmethod
    def from_folder(cls, folder: str | os.PathLike, beam_size: int = 10) -> SecondOpinion:
        """A PASU model folder (`pasu package`)."""
        from pasu.models.package import load_packaged
        from pasu.models.recognizer import packaged_weights_id

        model, tokenizer, config = load_packaged(folder)
        return cls(model, tokenizer, packaged_weights_id(Path(folder), config), beam_size)

    @torch.inference_mode()
    def listen(self, waveform: np.ndarray) -> Opinion:
        """Encode 16 kHz audio and beam-search it."""
        speech = torch.from_numpy(np.asarray(waveform, dtype=np.float32))[None]
        encoded = self.model.encode(speech, torch.tensor([speech.size(1)]))[0][0]
        texts: list[str] = []
        intents: list[str] = []
        for hypothesis in self.search.search(encoded, self.options).hypotheses:
            slu = decode_target(self.tokenizer.decode(list(hypothesis.tokens)))
            if slu.text and slu.text not in texts:
                texts.append(slu.text)
            if slu.intent and slu.intent not in intents:
                intents.append(slu.intent)
        return Opinion(texts, intents[:MAX_INTENTS], encoded)

    def scores(self, opinion: Opinion, texts: list[str]) -> np.ndarray:
        """Joint CTC/attention log-probability of each transcript, best over the opinion's intents."""
        if not texts or not opinion.intents or opinion.encoded.size(0) == 0:
            return np.full(len(texts), -np.inf)
        joint = self._joint(opinion, [(intent, text) for text in texts for intent in opinion.intents])
        return joint.reshape(len(texts), len(opinion.intents)).max(axis=1)

    def intent_logprobs(self, opinion: Opinion, text: str) -> dict[str, float]:
        """log P(intent | audio, words) for every intent it knows: the joint score of `text` under each intent,
        normalized over them; {} when there is nothing to score."""
        if not self.intents or opinion.encoded.size(0) == 0:
            return {}
        joint = self._joint(opinion, [(intent, text) for intent in self.intents])
        return dict(zip(self.intents, (joint - np.logaddexp.reduce(joint)).tolist()))

    @torch.inference_mode()
    def _joint(self, opinion: Opinion, pairs: list[tuple[str, str]]) -> np.ndarray:
        """Joint CTC/attention log-probability of `intent SLOTS_UNKNOWN words` for each (intent, words)."""
        out = np.empty(len(pairs))
        # token_scores takes equal-length sequences: one forced pass per length, not one per pair
        by_length: dict[int, list[tuple[int, list[int]]]] = defaultdict(list)
        for k, (intent, text) in enumerate(pairs):
            sequence = self.tokenizer.encode(f"{intent} {SLOTS_UNKNOWN} {text}")
            by_length[len(sequence)].append((k, sequence))
        for group in by_length.values():
            scored = self.scorer.token_scores(opinion.encoded, [s for _, s in group], self.options)
            for (k, _), hypothesis in zip(group, scored):
                out[k] = hypothesis.score
        return out
