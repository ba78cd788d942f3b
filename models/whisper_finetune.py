"""Fine-tune all of Whisper (encoder and decoder blocks) on our commands, on a GPU lent for a few minutes.

Adapting the decoder alone (`models/whisper_adapt.py`) runs on 2 CPU cores because the encoder's output is
cached; the encoder, which hears our synthetic voices worst, needs a GPU. The GPU machine has neither our corpus
nor our TTS engines and takes only 64 MiB a call, so the work is split in two:

- `write_pack` (here, on the CPU): a seeded random subset of `train` and the first of `dev` as Ogg Opus (a few
  long streams with an index), each utterance's Whisper tokens, and the weights to start from (the served
  model's encoder and decoder, its decoder adaptation applied) with the token embedding cut to the tokens our
  texts use, in part folders each under the size a call carries (`part_mib`); part0 holds the weights and dev.
- `finetune` (there): reads every part it is given, trains encoder and decoder blocks with AdamW for a time
  box, keeps the state with the lowest teacher-forced dev loss, and writes the trained variables as adaptation
  files (CTranslate2 names, int8 rows; `pack_adaptation`) plus the dev hypotheses of greedy decoding before and
  after, for WER to be scored here.

The token embedding (also the output projection) stays frozen, so the vocabulary cut changes no trained weight:
it only makes the softmax in training run over our tokens instead of Whisper's 51,864.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from pasu.models.gpu_lease import TimeBoxedTraining, fill_parts
from pasu.models.whisper_decoder import WhisperDecoder, pack_adaptation, unpack_adaptation
from pasu.models.whisper_encoder import SAMPLE_RATE, WhisperEncoder, log_mel

log = logging.getLogger(__name__)

PACK_INDEX = "pack.json"
PACK_WEIGHTS = "weights.npz"
GAP_SAMPLES = 1600  # silence between utterances in a stream, so the codec's memory does not carry across


@dataclass(frozen=True)
class PackOptions:
    train_utterances: int = 24000  # a seeded random subset of train (models.whisper_adapt.nested_sample)
    dev_utterances: int = 500  # the first of dev: teacher-forced loss picks the state kept; greedy WER reported
    part_mib: float = 57.0  # each part folder stays under this; one call carries one part (and the checkout)
    utterances_per_stream: int = 500  # one Ogg file holds this many, decoded in parallel there
    workers: int = 2  # processes encoding streams here
    bitrate_kbps: float = 12.0  # Opus, wideband speech; what fits the 64 MiB a call carries
    seed: int = 0


@dataclass(frozen=True)
class FinetuneOptions:
    minutes: float = 5.0  # training time box; the learning rate decays linearly to 0 over it
    batch_size: int = 64
    lr: float = 5e-5  # peak AdamW learning rate, for encoder and decoder blocks alike
    warmup_steps: int = 200
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    eval_seconds: float = 40.0  # dev loss this often (and at the end); the lowest is kept
    spec_augment: bool = True  # two frequency and two time masks per training utterance
    max_new_tokens: int = 64  # greedy decoding of dev
    seed: int = 0


# --- here: the pack --------------------------------------------------------------------------------------


def write_pack(cloud_folder: Path, corpus: Path, out: Path, options: PackOptions = PackOptions(),
               start_from: Path | None = None) -> list[Path]:
    """Write part0, part1, ... under `out` (part0 with the weights and dev); returns them. The weights are
    Whisper's with `start_from` applied (an adaptation .npz; by default the one the folder's whisper.yaml names)."""
    from pasu.models.ctranslate2_file import read_model_file
    from pasu.models.data import load_split
    from pasu.models.whisper_adapt import nested_sample
    from pasu.models.whisper_encoder import mel_filters
    from pasu.models.whisper_recognizer import WhisperRecognizer, load_model, read_weights, weights_folder

    weights = read_weights(cloud_folder)
    recognizer = WhisperRecognizer(load_model(weights, cpu_threads=2), weights)
    encode = lambda text: recognizer.tokenizer.encode(" " + text) + [recognizer.tokenizer.eot]  # noqa: E731
    train = nested_sample(load_split(corpus, "train"), options.train_utterances, options.seed)
    dev = load_split(corpus, "dev")[: options.dev_utterances]
    rows = {u.id: encode(u.text) for u in train + dev}
    vocabulary = sorted({t for tokens in rows.values() for t in tokens} | set(recognizer.prompt))

    variables = read_model_file(weights_folder(weights) / "model.bin").variables
    start_from = start_from or (Path(cloud_folder) / weights.adaptation if weights.adaptation else None)
    if start_from is not None:
        variables = {**variables, **unpack_adaptation(start_from)}
    kept = {name: value for name, value in variables.items()
            if name.startswith(("encoder/", "decoder/")) and name != "decoder/embeddings/weight"}
    kept["decoder/embeddings/weight"] = variables["decoder/embeddings/weight"][vocabulary]
    kept["mel_filters"] = mel_filters()  # faster-whisper's, which the GPU machine does not have

    part0 = out / "part0"
    part0.mkdir(parents=True, exist_ok=True)
    np.savez(part0 / PACK_WEIGHTS, **_packed(kept))
    streams = _write_streams(out / "streams", "dev", dev, options) + _write_streams(out / "streams", "train", train,
                                                                                      options)
    meta = {"prompt": recognizer.prompt, "eot": recognizer.tokenizer.eot, "vocabulary": vocabulary,
            "pieces": [recognizer.tokenizer.decode([t]) if t < recognizer.tokenizer.eot else "" for t in vocabulary],
            "model": weights.name, "start_from": str(start_from or "")}
    listed = [(name, [{**place, "id": u.id, "split": name.split("-")[0], "text": u.text, "tokens": rows[u.id]}
                      for u, place in utterances]) for name, utterances in streams]  # dev first: it lands in part0
    parts = fill_parts(out, out / "streams", listed, options.part_mib,
                       (part0 / PACK_WEIGHTS).stat().st_size + len(json.dumps(meta)))
    for folder, index_rows in parts.items():
        (folder / PACK_INDEX).write_text(json.dumps({**(meta if folder == part0 else {}), "utterances": index_rows}))
    return list(parts)


def _packed(variables: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Linear weights as int8 rows (half the bytes; the served model runs them int8 anyway), the rest as they
    are: positions, the token embedding and the mel filters must reach the GPU exactly."""
    linear = {n: v for n, v in variables.items() if n.endswith("/weight") and v.ndim == 2
              and n != "decoder/embeddings/weight"}
    return {**{n: v for n, v in variables.items() if n not in linear}, **pack_adaptation(linear)}


def _write_streams(folder: Path, split: str, utterances: list, options: PackOptions) -> list[tuple[str, list]]:
    """Ogg Opus streams of `utterances_per_stream` utterances each, encoded in parallel:
    [(file name, [(utterance, {"stream", "start", "length"})])]."""
    folder.mkdir(parents=True, exist_ok=True)
    step = options.utterances_per_stream
    jobs = [(folder / f"{split}-{k // step:04d}.ogg", utterances[k : k + step], options.bitrate_kbps)
            for k in range(0, len(utterances), step)]
    with ProcessPoolExecutor(max_workers=options.workers) as pool:
        return list(tqdm(pool.map(_write_stream, jobs), total=len(jobs), desc=f"{split} streams", unit="stream",
                         dynamic_ncols=True))


def _write_stream(job: tuple[Path, list, float]) -> tuple[str, list]:
    import soundfile as sf

    from pasu.models.data import read_audio

    path, utterances, kbps = job
    pieces, places, offset = [], [], 0
    for u in utterances:
        audio = read_audio(u.audio)
        places.append((u, {"stream": path.name, "start": offset, "length": len(audio)}))
        pieces += [audio, np.zeros(GAP_SAMPLES, np.float32)]
        offset += len(audio) + GAP_SAMPLES
    sf.write(path, np.concatenate(pieces), SAMPLE_RATE, format="OGG", subtype="OPUS",
             compression_level=opus_compression_level(kbps))
    return path.name, places


def opus_compression_level(kbps: float) -> float:
    """libsndfile's Opus compression level for a bitrate: the bitrate is linear in it, 256 kb/s at 0, 6 kb/s at 1."""
    return (256.0 - kbps) / 250.0


# --- there: the fine-tuning ------------------------------------------------------------------------------


@dataclass
class _Data:
    meta: dict  # part 0's index: prompt, eot, vocabulary, pieces
    weights: dict[str, np.ndarray]
    train: list[tuple[torch.Tensor, list[int]]]  # (waveform, tokens in the cut vocabulary)
    dev: list[tuple[torch.Tensor, list[int], str]]  # (waveform, tokens, text)

    def to(self, device: torch.device) -> _Data:
        return _Data(self.meta, self.weights, [(w.to(device), t) for w, t in self.train],
                     [(w.to(device), t, text) for w, t, text in self.dev])


def read_packs(folders: list[Path]) -> _Data:
    """Every utterance of the packs, decoded (in worker processes: call this before CUDA starts)."""
    first = next((f for f in folders if (f / PACK_WEIGHTS).exists()), None)
    if first is None:
        raise FileNotFoundError(f"none of {[str(f) for f in folders]} holds {PACK_WEIGHTS} (part 0)")
    indexes = {folder: json.loads((folder / PACK_INDEX).read_text()) for folder in folders}
    meta = indexes[first]
    index = {t: i for i, t in enumerate(meta["vocabulary"])}
    jobs = [(folder, name) for folder in folders
            for name in sorted({u["stream"] for u in indexes[folder]["utterances"]})]
    with ProcessPoolExecutor(max_workers=os.cpu_count()) as pool:
        audio = dict(zip(jobs, pool.map(_decode_stream, jobs)))
    data = _Data(meta, unpack_adaptation(first / PACK_WEIGHTS, np.float32), [], [])
    for folder in folders:
        for u in indexes[folder]["utterances"]:
            wave = torch.from_numpy(audio[(folder, u["stream"])][u["start"] : u["start"] + u["length"]])
            tokens = [index[t] for t in u["tokens"]]
            if u["split"] == "dev":
                data.dev.append((wave, tokens, u["text"]))
            else:
                data.train.append((wave, tokens))
    return data


def _decode_stream(job: tuple[Path, str]) -> np.ndarray:
    import soundfile as sf

    folder, name = job
    audio, rate = sf.read(folder / name, dtype="float32")
    if rate != SAMPLE_RATE:
        raise ValueError(f"{folder / name}: {rate} Hz, expected {SAMPLE_RATE}")
    return audio


class _Whisper(torch.nn.Module):
    def __init__(self, weights: dict[str, np.ndarray]):
        super().__init__()
        self.encoder = WhisperEncoder(weights)
        self.decoder = WhisperDecoder(weights)


def finetune(folders: list[Path], out: Path, options: FinetuneOptions = FinetuneOptions()) -> dict:
    """Train on the packs in `folders`; write encoder.npz, decoder.npz, dev-hypotheses.json, history.json and
    summary.json to `out`."""
    started = time.monotonic()
    data = read_packs(folders)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = data.to(device)
    log.info("read %d train and %d dev utterances in %.0f s on %s", len(data.train), len(data.dev),
             time.monotonic() - started, device)
    out.mkdir(parents=True, exist_ok=True)
    trainer = _Trainer(data, device, options, out)
    before = trainer.greedy_texts()
    trainer.run()
    trainer.model.load_state_dict(trainer.best_state)
    after = trainer.greedy_texts()
    model = trainer.model
    np.savez(out / "encoder.npz", **pack_adaptation(model.encoder.adapted_variables()))
    np.savez(out / "decoder.npz", **pack_adaptation(model.decoder.adapted_variables()))
    summary = {"steps": trainer.step, "train_utterances": len(data.train), "dev_utterances": len(data.dev),
               "best_dev_loss": trainer.best_loss, "initial_dev_loss": trainer.history[0]["dev_loss"],
               "history": trainer.history, "options": options.__dict__,
               "seconds": round(time.monotonic() - started, 1),
               "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu"}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "dev-hypotheses.json").write_text(json.dumps(
        [{"text": text, "before": b, "after": a} for (_, _, text), b, a in zip(data.dev, before, after)]))
    return summary


class _Trainer(TimeBoxedTraining):
    """AdamW over encoder and decoder blocks on random batches of utterances; the lowest-loss state kept."""

    def __init__(self, data: _Data, device: torch.device, options: FinetuneOptions, out: Path):
        self.data = data
        self.model = _Whisper(data.weights).to(device)
        self.filters = torch.from_numpy(data.weights["mel_filters"]).to(device)
        self.prompt = [data.meta["vocabulary"].index(t) for t in data.meta["prompt"]]
        self.eot = data.meta["vocabulary"].index(data.meta["eot"])
        trained = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trained, lr=options.lr, betas=(0.9, 0.98),
                                           weight_decay=options.weight_decay)
        torch.manual_seed(options.seed)
        self.rng = random.Random(options.seed)
        self.order: list[int] = []
        super().__init__(options, out, trained)

    def batch_loss(self) -> torch.Tensor:
        o = self.options
        if len(self.order) < o.batch_size:  # a new epoch
            self.order = list(range(len(self.data.train)))
            self.rng.shuffle(self.order)
        batch = [self.data.train[i] for i in self.order[: o.batch_size]]
        self.order = self.order[o.batch_size :]
        return _loss(self.model, self.filters, self.prompt, batch, o.spec_augment)

    def dev_loss(self) -> float:
        self.model.eval()
        with torch.no_grad():
            losses = [_loss(self.model, self.filters, self.prompt, self.data.dev[i : i + 100], False).item()
                      for i in range(0, len(self.data.dev), 100)]
        self.model.train()
        return float(np.mean(losses))

    def greedy_texts(self) -> list[str]:
        return _greedy_texts(self.model, self.filters, self.prompt, self.eot, self.data, self.options)


def _features(filters: torch.Tensor, waves: list[torch.Tensor], augment: bool) -> torch.Tensor:
    lengths = torch.tensor([len(w) for w in waves], device=filters.device)
    features = log_mel(torch.nn.utils.rnn.pad_sequence(waves, batch_first=True), lengths, filters)
    if augment:
        features = _spec_augment(features, lengths)
    return features


def _spec_augment(features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Two frequency masks (up to 8 of 80 bins) and two time masks (up to 40 frames inside the speech)."""
    b, bins, frames = features.shape
    dev = features.device
    keep = torch.ones_like(features, dtype=torch.bool)
    for _ in range(2):
        width = torch.randint(0, 9, (b, 1), device=dev)
        start = (torch.rand(b, 1, device=dev) * (bins - width)).long()
        f = torch.arange(bins, device=dev)[None]
        keep &= ~((f >= start) & (f < start + width))[:, :, None]
        speech = torch.clamp(lengths // 160, max=frames)[:, None]
        width = torch.randint(0, 41, (b, 1), device=dev)
        start = (torch.rand(b, 1, device=dev) * torch.clamp(speech - width, min=1)).long()
        t = torch.arange(frames, device=dev)[None]
        keep &= ~((t >= start) & (t < start + width))[:, None, :]
    return features.masked_fill(~keep, 0.0)


def _loss(model: _Whisper, filters: torch.Tensor, prompt: list[int], batch: list, augment: bool) -> torch.Tensor:
    """Mean negative log-likelihood per text token (and end of text), the prompt excluded."""
    texts = [item[1] for item in batch]
    width = len(prompt) + max(len(t) for t in texts)
    tokens = torch.tensor([prompt + t + t[-1:] * (width - len(prompt) - len(t)) for t in texts],
                          device=filters.device)
    features = _features(filters, [item[0] for item in batch], augment)  # float32: bf16 would coarsen the log
    with _autocast(filters.device):
        encoded = model.encoder(features)
        logits = model.decoder(tokens[:, :-1], encoded)
    logprobs = torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens[:, 1:, None])[..., 0]
    logprobs = logprobs[:, len(prompt) - 1 :]
    lengths = torch.tensor([len(t) for t in texts], device=filters.device)
    mask = torch.arange(logprobs.shape[1], device=filters.device)[None] < lengths[:, None]
    return -(logprobs * mask).sum() / mask.sum()


def _autocast(device: torch.device) -> torch.autocast:
    """bfloat16 matrix work on a GPU (the H200's fast path); float32 on the CPU, where tests run it."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


@torch.no_grad()
def _greedy_texts(model: _Whisper, filters: torch.Tensor, prompt: list[int], eot: int, data: _Data,
                  options: FinetuneOptions) -> list[str]:
    """Greedy decoding of every dev utterance over the cut vocabulary, as text (Whisper's pieces joined)."""
    model.eval()
    texts = []
    for start in range(0, len(data.dev), 100):
        chunk = data.dev[start : start + 100]
        features = _features(filters, [item[0] for item in chunk], False)
        with _autocast(filters.device):
            encoded = model.encoder(features)
            tokens = torch.tensor([prompt] * len(chunk), device=filters.device)
            done = torch.zeros(len(chunk), dtype=torch.bool, device=filters.device)
            for _ in range(options.max_new_tokens):
                following = model.decoder(tokens, encoded)[:, -1].float().argmax(-1)
                following = torch.where(done, torch.full_like(following, eot), following)
                tokens = torch.cat([tokens, following[:, None]], dim=1)
                done |= following == eot
                if bool(done.all()):
                    break
        for row in tokens[:, len(prompt) :].tolist():
            row = row[: row.index(eot)] if eot in row else row
            texts.append("".join(data.meta["pieces"][t] for t in row).strip())
    model.train()
    return texts
