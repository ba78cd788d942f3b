"""Knowledge distillation for `pasu train`: the model's decoder also learns a teacher's next-token distributions.

The teacher is a packaged model with the same tokenizer (e.g. the larger, more accurate Conformer that serves the
cloud, distilled into the device model). It reads the batch without SpecAugment and is teacher-forced on the same
targets as the model; the model's logits come from the decoder pass ESPnet's loss already ran (a forward hook), so
distillation costs one teacher forward pass a batch and no second student pass.
"""

from __future__ import annotations

import os
from typing import Sequence

import torch
from espnet2.asr.espnet_model import ESPnetASRModel
from espnet.nets.pytorch_backend.transformer.add_sos_eos import add_sos_eos

from pasu.models.decoder_logits import TrainingDecoderLogits
from pasu.models.package import load_packaged


def distillation_loss(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, mask: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Mean over the unmasked positions of KL(teacher || student), both softened by `temperature` and the KL
    scaled by its square (Hinton et al., 2015) so that its gradients keep their size as the temperature moves."""
    log_teacher = torch.log_softmax(teacher_logits / temperature, dim=-1)
    log_student = torch.log_softmax(student_logits / temperature, dim=-1)
    kl = (log_teacher.exp() * (log_teacher - log_student)).sum(dim=-1)
    mask = mask.to(kl.dtype)
    return (kl * mask).sum() / mask.sum().clamp(min=1.0) * temperature**2


def load_teacher(folder: str | os.PathLike, token_list: Sequence[str], device: torch.device) -> ESPnetASRModel:
    """A packaged model as a frozen teacher; its tokens must be the student's, or its distributions mean nothing."""
    teacher, tokenizer, _ = load_packaged(folder)
    if tokenizer.token_list != list(token_list):
        raise ValueError(f"{folder}: the teacher's token list differs from the model's; distillation needs the same "
                         "tokenizer (a model trained with --init-from the same package has it)")
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher.to(device).eval()


class DecoderDistillation:
    """KL(teacher || model) of the decoder's next-token distributions on the targets of the batch the model's
    forward pass just read."""

    def __init__(self, model: ESPnetASRModel, teacher: ESPnetASRModel, temperature: float = 1.0):
        if temperature <= 0:
            raise ValueError(f"distillation temperature must be > 0, got {temperature}")
        self.teacher, self.temperature = teacher, temperature
        self.sos, self.eos, self.ignore_id = model.sos, model.eos, model.ignore_id
        self.decoder_logits = TrainingDecoderLogits(model.decoder, "DecoderDistillation")

    def __call__(self, speech: torch.Tensor, speech_lengths: torch.Tensor, text: torch.Tensor,
                 text_lengths: torch.Tensor) -> torch.Tensor:
        student = self.decoder_logits.take()
        text = text[:, : int(text_lengths.max())]  # as ESPnet's forward trims it
        ys_in, ys_out = add_sos_eos(text, self.sos, self.eos, self.ignore_id)
        with torch.no_grad():
            encoded, encoded_lengths = self.teacher.encode(speech, speech_lengths)
            teacher_logits, _ = self.teacher.decoder(encoded, encoded_lengths, ys_in, text_lengths + 1)
        return distillation_loss(student, teacher_logits, ys_out != self.ignore_id, self.temperature)
