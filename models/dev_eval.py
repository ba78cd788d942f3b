"""Dev evaluation during training: ESPnet's losses, the decoder's token accuracy and CTC-greedy SLU scores.

Cheap enough to run every few hundred steps (one encoder pass, no beam search); `pasu eval` gives the
numbers a model card reports.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from espnet2.asr.espnet_model import ESPnetASRModel
from pasu.device.decoding.ctc_prefix import collapse_path
from pasu.metrics import SluResult, evaluate_slu
from pasu.models.data import SpeechDataset, Utterance, batch_loader, bucket_batches
from pasu.models.targets import decode_target
from pasu.models.tokenizer import Tokenizer


# the DevResult fields a run may pick its best snapshots by, and which way is better
HIGHER_IS_BETTER = {"acc": True, "intent_accuracy": True, "slu_f1": True, "loss": False, "wer": False}


@dataclass(frozen=True)
class DevResult:
    n: int  # utterances evaluated
    loss: float  # ctc_weight * loss_ctc + (1 - ctc_weight) * loss_att, per utterance
    loss_ctc: float
    loss_att: float
    acc: float  # decoder token accuracy (teacher forced)
    wer: float  # CTC greedy transcript vs reference
    intent_accuracy: float  # CTC greedy intent
    slu_f1: float  # SLURP SLU-F1 over the rows whose slots are known
    seconds: float  # wall time of the evaluation


def ctc_greedy_from_encoder(model: ESPnetASRModel, enc: torch.Tensor, enc_lens: torch.Tensor) -> list[list[int]]:
    best = model.ctc.argmax(enc).cpu()
    return [collapse_path(best[b, :n]) for b, n in enumerate(enc_lens.tolist())]


@torch.no_grad()
def evaluate(
    model: ESPnetASRModel,
    tokenizer: Tokenizer,
    utterances: Sequence[Utterance],
    batch_seconds: float,
    device: torch.device | str = "cpu",
) -> DevResult:
    """Dev losses, decoder accuracy and CTC-greedy WER / intent accuracy / SLU-F1 over `utterances`."""
    # ESPnet's MultiSequential (every repeat()-built encoder) draws layer-drop probabilities even in eval
    # mode: without fork_rng, how often dev evaluation runs would change training's dropout/SpecAugment.
    with torch.random.fork_rng(devices=[]):
        return _evaluate(model, tokenizer, utterances, batch_seconds, device)


def _evaluate(
    model: ESPnetASRModel,
    tokenizer: Tokenizer,
    utterances: Sequence[Utterance],
    batch_seconds: float,
    device: torch.device | str,
) -> DevResult:
    start = time.perf_counter()
    was_training = model.training
    model.eval()
    dataset = SpeechDataset(utterances, tokenizer)
    batches = bucket_batches([u.duration for u in utterances], batch_seconds)
    sums = {"loss_ctc": 0.0, "loss_att": 0.0, "acc": 0.0}
    hyps: dict[str, str] = {}
    for batch in batch_loader(dataset, batches):
        x = batch.model_inputs(device)
        enc, enc_lens = model.encode(x["speech"], x["speech_lengths"])
        loss_ctc, loss_att, acc = encoded_losses(model, enc, enc_lens, x["text"], x["text_lengths"])
        n = len(batch.ids)
        sums["loss_ctc"] += float(loss_ctc) * n
        sums["loss_att"] += float(loss_att) * n
        sums["acc"] += float(acc) * n
        for utt_id, ids in zip(batch.ids, ctc_greedy_from_encoder(model, enc, enc_lens)):
            hyps[utt_id] = tokenizer.decode(ids)
    model.train(was_training)
    scores = evaluate_slu(*slu_results(utterances, hyps))
    n = len(utterances)
    loss_ctc, loss_att = sums["loss_ctc"] / n, sums["loss_att"] / n
    return DevResult(
        n=n,
        loss=weighted_loss(model, loss_ctc, loss_att),
        loss_ctc=loss_ctc,
        loss_att=loss_att,
        acc=sums["acc"] / n,
        wer=scores.wer,
        intent_accuracy=scores.intent_accuracy,
        slu_f1=scores.slu_f1,
        seconds=time.perf_counter() - start,
    )


def encoded_losses(model: ESPnetASRModel, enc: torch.Tensor, enc_lens: torch.Tensor, text: torch.Tensor,
                   text_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """ESPnet's CTC and attention losses (per utterance, batch-averaged) and the decoder's token accuracy."""
    loss_ctc, _ = model._calc_ctc_loss(enc, enc_lens, text, text_lengths)
    loss_att, acc, _, _ = model._calc_att_loss(enc, enc_lens, text, text_lengths)
    return loss_ctc, loss_att, acc


def weighted_loss(model: ESPnetASRModel, loss_ctc: Any, loss_att: Any) -> Any:
    """ctc_weight x CTC + (1 - ctc_weight) x attention, as ESPnet's forward weighs them."""
    return model.ctc_weight * loss_ctc + (1 - model.ctc_weight) * loss_att


def slu_results(utterances: Sequence[Utterance], hyps: dict[str, str]) -> tuple[list, list]:
    """Gold and decoded SluResults; rows with unknown gold slots get no slots on either side (neutral)."""
    refs, outs = [], []
    for u in utterances:
        hyp = decode_target(hyps[u.id])
        if u.slots is None:
            hyp = SluResult(hyp.text, hyp.intent)
        refs.append(SluResult(u.text, u.intent, tuple(u.slots or ())))
        outs.append(hyp)
    return refs, outs
