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
from pasu.models.recognizer import (
    DecodingOptions,
    banned_token_ids,
    espnet_beam_search,
    packaged_weights_id,
    weights_digest,
)
from pasu.models.targets import decode_target

from pasu.metrics import SluResult

if TYPE_CHECKING:
    from pasu.device.intent_offramp import IntentMixture
    from pasu.device.spelling import SpellingCorrector
    from pasu.models.lm import PackagedLm

ESPNET_WEIGHTS_SUFFIX = ".pth"  # what ESPnet's trainer writes (valid.acc.ave.pth, NNepoch.pth, ...)


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
        self.lm: PackagedLm | None = None  # shallow fusion in every search with lm_weight > 0 (use_lm)
        self.search = self._build_search()
        # the intent reader the answer weighs in (MODEL/offramp: `offramp_train.load_device_model`); None: the
        # decoder's intent as it is
        self.intent_mixture: IntentMixture | None = None
        self.speller: SpellingCorrector | None = None  # rewrites unknown words of the answer (use_speller)

    def _build_search(self) -> BeamSearch:
        lm = self.lm.model.lm if self.lm is not None else None  # the network inside ESPnetLanguageModel scores
        return BeamSearch(self.model.decoder, self.model.ctc, self.model.sos, self.model.eos, len(self.token_list),
                          self.banned, blank=0, lm=lm)

    def use_lm(self, lm: PackagedLm) -> None:
        """Fuse a token LM (`pasu lm train`) into the searches whose options give it a weight; ValueError when it
        reads other tokens than this model."""
        from pasu.models.lm import check_token_list

        check_token_list(lm, self.token_list)
        self.lm = lm
        self.search = self._build_search()
        # the model's name stays (an LM at weight 0 changes nothing); replay caches must tell them apart
        self.weights_id += f"+{lm.name}@{weights_digest(lm.weights)}"

    def use_speller(self, words_file: Path) -> None:
        """Correct the answers' unknown words towards those of `words_file` (pasu.device.spelling)."""
        from pasu.device.spelling import SpellingCorrector

        self.speller = SpellingCorrector.load(words_file)
        self.weights_id += f"+words@{weights_digest(words_file)}"  # the answers change: replay caches must tell

    @classmethod
    def load(cls, path: str | os.PathLike) -> DeviceModel:
        """A packaged folder, or an ESPnet checkpoint: a .pth with the config.yaml of its training beside it, as
        ESPnet's exp/asr_*/ folders keep them (FileNotFoundError when either is missing)."""
        path = Path(path)
        if path.suffix != ESPNET_WEIGHTS_SUFFIX:
            if not (path / "config.yaml").is_file():
                raise FileNotFoundError(f"{path}: no device model folder there (`pasu train --package DIR`), "
                                        f"nor an ESPnet checkpoint (*{ESPNET_WEIGHTS_SUFFIX})")
            return cls.from_folder(path)
        config = path.with_name("config.yaml")
        for needed in (path, config):
            if not needed.is_file():
                raise FileNotFoundError(f"{needed}: missing (an ESPnet checkpoint is read with the config.yaml "
                                        "of its training beside it)")
        return cls.from_espnet(config, path)

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
        search's `hypothesis` of these tokens gives the decoder's confidence, then its unknown words corrected
        when a speller is attached (the reader reads the words as the decoder wrote them, as it was chosen)."""
        slu = self.read(tokens)
        if self.intent_mixture is not None and hypothesis is not None:
            intent, _ = self.intent_mixture.reading(slu, intent_confidence(hypothesis))
            slu = replace(slu, intent=intent)
        return self.speller.correct(slu) if self.speller is not None else slu

    def espnet_search(self, beam_size: int, ctc_weight: float, batch: bool, lm_weight: float = 0.0,
                      length_bonus: float = 0.0) -> Any:
        """ESPnet's own BatchBeamSearch / BeamSearch with the same scorers (the vanilla baselines), the LM
        (use_lm) among them at `lm_weight` > 0, `length_bonus` per token (ESPnet's `penalty`)."""
        if lm_weight and self.lm is None:
            raise ValueError(f"lm_weight {lm_weight} needs a model with an LM (use_lm)")
        options = DecodingOptions(beam_size=beam_size, ctc_weight=ctc_weight, lm_weight=lm_weight,
                                  length_bonus=length_bonus)
        return espnet_beam_search(self.model, self.token_list, options, batch=batch,
                                  lm=self.lm if lm_weight else None)

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


def model_folder(path: str | os.PathLike) -> Path:
    """Where a device model's own files live (its offramps, intent reader, word list): the packaged folder
    itself, or the folder of an ESPnet checkpoint."""
    path = Path(path)
    return path.parent if path.suffix == ESPNET_WEIGHTS_SUFFIX else path


def _piece_joiner(token_list: Sequence[str]) -> Callable[[list[int]], str]:
    """Sentencepiece-style detokenizer for ESPnet token lists ('▁' starts a word)."""
    specials = {"<blank>", "<unk>", "<sos/eos>"}

    def join(ids: list[int]) -> str:
        pieces = [token_list[i] for i in ids if 0 <= i < len(token_list) and token_list[i] not in specials]
        return "".join(pieces).replace("\u2581", " ").strip()

    return join
