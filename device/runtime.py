"""A loaded SLU model and everything the agent asks of it: streams, searches, and reading its output."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from pasu.device.decoding.search import BeamSearch, Hypothesis
from pasu.device.encoding import EncoderStream, open_stream
from pasu.device.intent_offramp import intent_confidence
from pasu.models.recognizer import DecodingOptions, banned_token_ids, espnet_beam_search, packaged_weights_id
from pasu.models.targets import decode_target

from pasu.metrics import SluResult

if TYPE_CHECKING:
    from pasu.device.intent_offramp import IntentMixture


class DeviceModel:
    """An ESPnet hybrid CTC/attention model whose target is `intent words-with-slot-markup`."""

    def __init__(self, model: Any, token_list: Sequence[str], detokenize: Callable[[list[int]], str],
                 model_id: str, weights_id: str | None = None):
        self.model = model.eval()
        self.token_list = list(token_list)
        self.detokenize = detokenize
        self.model_id = model_id  # the name in tables and logs
        self.weights_id = weights_id or model_id  # name@digest: which weights exactly (replay caches key on it)
        self.banned = banned_token_ids(self.token_list)
        self.search = BeamSearch(model.decoder, model.ctc, model.sos, model.eos, len(self.token_list),
                                 self.banned, blank=0)
        # the intent reader the answer weighs in (MODEL/offramp: `offramp_train.load_device_model`); None: the
        # decoder's intent as it is
        self.intent_mixture: IntentMixture | None = None

    @classmethod
    def from_folder(cls, folder: str | os.PathLike) -> DeviceModel:
        """A PASU model folder (`pasu package`: config.yaml, model.pt, tokenizer.model)."""
        from pasu.models.package import load_packaged

        model, tokenizer, config = load_packaged(folder)
        return cls(model, tokenizer.token_list, tokenizer.decode, config.get("name", Path(folder).name),
                   packaged_weights_id(Path(folder), config))

    @classmethod
    def from_espnet(cls, config_yaml: str | os.PathLike, model_pth: str | os.PathLike,
                    stats_file: str | os.PathLike | None = None) -> DeviceModel:
        """An ordinary ESPnet ASR training output (e.g. a user's Branchformer or Conformer)."""
        from pasu.models.package import load_espnet_checkpoint

        model = load_espnet_checkpoint(config_yaml, model_pth, stats_file)
        token_list = list(model.token_list)
        return cls(model, token_list, _piece_joiner(token_list), Path(model_pth).stem)

    def open_stream(self) -> EncoderStream:
        return open_stream(self.model)

    def read(self, tokens: Sequence[int]) -> SluResult:
        """Transcript, intent and slots of an output token sequence."""
        return decode_target(self.detokenize(list(tokens)))

    def answer(self, tokens: Sequence[int], hypothesis: Hypothesis | None) -> SluResult:
        """What the device answers: `read(tokens)`, its intent the mixture's when a reader is attached and the
        search's `hypothesis` of these tokens gives the decoder's confidence."""
        slu = self.read(tokens)
        if self.intent_mixture is None or hypothesis is None:
            return slu
        intent, _ = self.intent_mixture.reading(slu, intent_confidence(hypothesis))
        return replace(slu, intent=intent)

    def espnet_search(self, beam_size: int, ctc_weight: float, batch: bool) -> Any:
        """ESPnet's own BatchBeamSearch / BeamSearch with the same scorers (the vanilla baselines)."""
        options = DecodingOptions(beam_size=beam_size, ctc_weight=ctc_weight)
        return espnet_beam_search(self.model, self.token_list, options, batch=batch)

    @torch.inference_mode()
    def espnet_decode(self, search: Any, encoded: torch.Tensor) -> tuple[list[int], float]:
        """Best token ids of an ESPnet search and its 1 / perplexity under the decoder."""
        hyps = search(x=encoded, maxlenratio=0.0, minlenratio=0.0)
        if not hyps:
            return [], 0.0
        best = hyps[0]
        steps = max(len(best.yseq) - 1, 1)
        confidence = math.exp(min(float(best.scores["decoder"]) / steps, 0.0))
        return [int(t) for t in best.yseq[1:-1]], confidence


def _piece_joiner(token_list: Sequence[str]) -> Callable[[list[int]], str]:
    """Sentencepiece-style detokenizer for ESPnet token lists ('▁' starts a word)."""
    specials = {"<blank>", "<unk>", "<sos/eos>"}

    def join(ids: list[int]) -> str:
        pieces = [token_list[i] for i in ids if 0 <= i < len(token_list) and token_list[i] not in specials]
        return "".join(pieces).replace("\u2581", " ").strip()

    return join
