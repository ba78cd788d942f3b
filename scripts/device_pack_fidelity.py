"""What a GPU pack's lossy form costs the device model, and the bytes it takes: dev loss and CTC-greedy WER / intent
on a fixed `dev` subset with the audio as stored, through Ogg Opus at several bitrates (the form the Whisper pack
carries), and as the model's own normalized features in int8 steps (the form `models/device_finetune.py` packs).
`--also` scores other packages on the stored audio, e.g. a GPU run's weights installed by
`scripts/device_finetune.py install`.

    .venv/bin/python scripts/device_pack_fidelity.py --kbps 12 16 24 --steps 0.05 0.1 0.2 0.3
    .venv/bin/python scripts/device_pack_fidelity.py --kbps --steps --also exp/gpu/pkg-ns4-avg
"""

from __future__ import annotations

import argparse
import io
import lzma
from pathlib import Path

import numpy as np
import soundfile
import torch
from tqdm import tqdm

from pasu.metrics import evaluate_slu
from pasu.models.data import dev_subset, load_split, read_audio
from pasu.models.device_finetune import dequantize, encoder_input, quantize
from pasu.models.package import load_packaged
from pasu.models.dev_eval import ctc_greedy_from_encoder, encoded_losses, slu_results, weighted_loss
from pasu.models.whisper_finetune import opus_compression_level


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("models/shipped/device"))
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus-full"))
    parser.add_argument("--utterances", type=int, default=300, help="dev_subset of dev, as pasu train evaluates")
    parser.add_argument("--kbps", type=float, nargs="*", default=[12.0, 16.0, 24.0], help="Opus bitrates")
    parser.add_argument("--steps", type=float, nargs="*", default=[0.1, 0.25], help="feature quantization steps")
    parser.add_argument("--also", type=Path, nargs="*", default=[], help="more packages, on the stored audio")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    utterances = dev_subset(load_split(args.corpus, "dev"), args.utterances)
    audio = [read_audio(u.audio) for u in utterances]
    model, tokenizer, _ = load_packaged(args.model)
    stored = [encoder_input(model, a) for a in tqdm(audio, desc="features", leave=False)]
    report(f"{args.model}, stored audio", model, tokenizer, utterances, stored)
    for kbps in args.kbps:
        heard, sizes = zip(*(through_opus(a, kbps) for a in tqdm(audio, desc=f"opus {kbps:g}", leave=False)))
        report(f"Opus {kbps:g} kb/s", model, tokenizer, utterances, [encoder_input(model, a) for a in heard], sizes)
    for step in args.steps:
        packed = [quantize(f, step) for f in stored]
        sizes = [len(lzma.compress(p.tobytes(), preset=9)) for p in packed]
        report(f"features in steps of {step:g}", model, tokenizer, utterances, [dequantize(p, step) for p in packed],
               sizes)
    for folder in args.also:
        other, other_tokenizer, _ = load_packaged(folder)
        report(f"{folder}, stored audio", other, other_tokenizer, utterances, [encoder_input(other, a) for a in audio])


def through_opus(waveform: np.ndarray, kbps: float) -> tuple[np.ndarray, int]:
    """The waveform after an Ogg Opus round trip at `kbps`, as the Whisper pack writes it; the file's bytes."""
    buffer = io.BytesIO()
    soundfile.write(buffer, waveform, 16000, format="OGG", subtype="OPUS",
                    compression_level=opus_compression_level(kbps))
    size = buffer.tell()
    buffer.seek(0)
    return soundfile.read(buffer, dtype="float32")[0], size


@torch.no_grad()
def report(name: str, model: torch.nn.Module, tokenizer, utterances: list, feats: list[np.ndarray],
           sizes: tuple[int, ...] | list[int] = ()) -> None:
    """Dev loss per utterance (CTC and attention weighted as in training) and CTC-greedy scores, one line."""
    model.eval()
    hyps, loss = {}, 0.0
    for u, f in zip(utterances, feats):
        x, n = torch.from_numpy(f)[None], torch.tensor([len(f)])
        text = torch.tensor([tokenizer.encode(u.target)])
        encoded, encoded_lengths, _ = model.encoder(x, n)
        loss_ctc, loss_att, _ = encoded_losses(model, encoded, encoded_lengths, text, torch.tensor([text.shape[1]]))
        loss += float(weighted_loss(model, loss_ctc, loss_att))
        hyps[u.id] = tokenizer.decode(ctc_greedy_from_encoder(model, encoded, encoded_lengths)[0])
    scores = evaluate_slu(*slu_results(utterances, hyps))
    size = f", {np.mean(sizes):,.0f} bytes an utterance" if len(sizes) else ""
    print(f"{name}: dev loss {loss / len(utterances):.2f}, WER {100 * scores.wer:.1f}%, intent "
          f"{100 * scores.intent_accuracy:.1f}%{size}", flush=True)


if __name__ == "__main__":
    main()
