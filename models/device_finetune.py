"""Fine-tune the device model on a GPU lent for a few minutes: `write_pack` here, `finetune` there.

Two CPU cores give the device about one step a second, too slow for SpecAugment's masks to pay (the device's
training log, sitting 17). The GPU machine has neither our corpus nor our TTS engines and takes only 64 MiB a
call, and Ogg Opus at the bitrates that fit costs this model 2-5 WER points (`scripts/device_pack_fidelity.py`,
300 `dev` utterances), so the pack holds what the encoder reads instead: the model's own normalized log-mel features.

- `write_pack` (here): training renderings spread over the sentences (each sentence's first rendering, then
  each one's second, ...), and a fixed `dev` subset, as normalized fbank quantized to int8 steps (`step`: at
  0.2-0.3 the shipped model's CTC WER on 300 `dev` utterances moves by less than 0.4 points, its dev loss by
  0.02-0.16), differenced over time and LZMA-compressed in shards; token ids beside them. Part folders stay
  under `part_mib` each.
- `finetune` (there): the package's weights, Adam with warm-up and a linear decay to 0 over a time box,
  ESPnet's loss (CTC + attention) on the features (SpecAugmented or warped if asked), bf16 matrix work; the
  teacher-forced `dev` loss now and then picks the best state, and the last few evaluated states are averaged.
  Writes both as float16.

- `finetune_fresh` (there): the same training on speech `pasu corpus build` renders on the GPU machine's own
  cores during the run (pasu.models.fresh_feed), so the carry limits only the `dev` pack; features are computed
  on the GPU from the waveforms (scripts/device_fresh_gpu.sh).

Tried on an H200 (the device's training log, sitting 19): 10-20 passes over the 25,000 renderings four calls
carried raised `dev` loss in every setting; the shipped device was not replaced. The fresh path (sitting 21)
awaits a lease.
"""

from __future__ import annotations

import json
import logging
import lzma
import os
import random
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from espnet2.asr.specaug.specaug import SpecAug
from tqdm import tqdm

from pasu.models.build import DEFAULT_SPECAUG_CONF
from pasu.models.data import IGNORE_ID, bucket_batches, dev_subset, load_split, read_audio
from pasu.models.fresh_feed import PCM_SCALE, ShardFeed
from pasu.models.gpu_lease import TimeBoxedTraining, fill_parts
from pasu.models.package import half_state_dict, load_packaged
from pasu.models.tokenizer import Tokenizer
from pasu.models.dev_eval import encoded_losses, weighted_loss

log = logging.getLogger(__name__)

PACK_INDEX = "pack.json"


@dataclass(frozen=True)
class PackOptions:
    train_utterances: int = 25000  # renderings spread over the sentences (every sentence once before any twice)
    dev_utterances: int = 500  # pasu.models.data.dev_subset of dev: the loss that picks the state kept
    step: float = 0.25  # int8 quantization step of the normalized features (their std is 1)
    part_mib: float = 45.0  # each part folder stays under this; one call carries one part (and the checkout)
    utterances_per_shard: int = 1000  # one LZMA file holds this many, decompressed in parallel there
    workers: int = 2  # processes computing features here
    seed: int = 0


@dataclass(frozen=True)
class FinetuneOptions:
    minutes: float = 6.0  # training time box; the learning rate decays linearly to 0 over it
    batch_frames: int = 60000  # padded feature frames per batch (10 ms each: 600 s of audio)
    # the defaults are sitting 19's least harmful run (the device's training log): no run beat the shipped weights
    lr: float = 4e-4  # peak Adam learning rate
    warmup_steps: int = 300
    grad_clip: float = 5.0  # the CPU recipe's (models/train.py OptimOptions)
    eval_seconds: float = 30.0  # dev loss this often (and at the end)
    average_last: int = 4  # the last this many evaluated states are averaged into avg.pt
    spec_augment: bool = False  # ESPnet's SpecAug with pasu.models.build's DEFAULT_SPECAUG_CONF (as pasu train)
    # new voices and tempos from heard ones, as a fresh rendering gives: each utterance's mel axis stretched by a
    # factor drawn from [1 - warp, 1 + warp] (a vocal-tract-length change), each batch's time axis by one from
    # [1 - tempo, 1 + tempo] (0: off)
    warp: float = 0.0
    tempo: float = 0.0
    seed: int = 0
    # fresh speech (finetune_fresh): padded seconds of audio per batch, read from builds still rendering
    batch_seconds: float = 300.0
    first_utterances: int = 200  # rendered utterances read before the first step
    wait_seconds: float = 90.0  # how long those may take before the run gives up


# --- here: the pack --------------------------------------------------------------------------------------


def spread_over_sentences(utterances: Sequence, count: int, seed: int) -> list:
    """Up to `count` utterances: every sentence's first rendering (sentences in a seeded order), then every
    sentence's second, and so on, so a subset covers as many sentences as it can."""
    rng = random.Random(seed)
    by_sentence: dict[str, list] = {}
    for u in utterances:
        by_sentence.setdefault(u.target, []).append(u)
    groups = list(by_sentence.values())
    rng.shuffle(groups)
    for group in groups:
        rng.shuffle(group)
    chosen: list = []
    for depth in range(max(map(len, groups), default=0)):
        chosen += [g[depth] for g in groups if depth < len(g)][: count - len(chosen)]
    return chosen


def write_pack(model_folder: Path, corpora: Sequence[Path], out: Path, options: PackOptions = PackOptions()
               ) -> list[Path]:
    """Write part0, part1, ... under `out` (part0 holds dev and the pack's settings); returns them."""
    tokenizer = Tokenizer(Path(model_folder) / "tokenizer.model")
    train = spread_over_sentences([u for c in corpora for u in load_split(c, "train")], options.train_utterances,
                                  options.seed) if options.train_utterances > 0 else []  # 0: dev alone
    dev = dev_subset(load_split(corpora[0], "dev"), options.dev_utterances)
    shards = [("dev", dev[k : k + options.utterances_per_shard])
              for k in range(0, len(dev), options.utterances_per_shard)]
    shards += [("train", train[k : k + options.utterances_per_shard])
               for k in range(0, len(train), options.utterances_per_shard)]
    staging = out / "shards"
    staging.mkdir(parents=True, exist_ok=True)
    jobs = [(Path(model_folder), staging / f"{split}-{n:04d}.xz", chunk, options.step)
            for n, (split, chunk) in enumerate(shards)]
    with ProcessPoolExecutor(max_workers=options.workers) as pool:
        written = list(tqdm(pool.map(_write_shard, jobs), total=len(jobs), desc="feature shards", unit="shard",
                            dynamic_ncols=True))
    rows = {u.id: tokenizer.encode(u.target) for _, chunk in shards for u in chunk}
    bins = load_packaged(model_folder)[0].frontend.output_size()
    meta = {"step": options.step, "bins": bins, "model": str(model_folder), "corpora": [str(c) for c in corpora],
            "train_utterances": len(train), "dev_utterances": len(dev)}
    listed = [(name, [{**place, "id": u.id, "split": name.split("-")[0], "tokens": rows[u.id]}
                      for u, place in utterances]) for name, utterances in written]  # dev first: it lands in part0
    parts = fill_parts(out, staging, listed, options.part_mib)
    for n, (folder, index_rows) in enumerate(parts.items()):
        (folder / PACK_INDEX).write_text(json.dumps({**meta, "part": n, "parts": len(parts), "utterances": index_rows}))
    return list(parts)


def _write_shard(job: tuple[Path, Path, list, float]) -> tuple[str, list[tuple[object, dict]]]:
    """One LZMA file of the utterances' quantized, time-differenced features: (file name, [(utterance, place)])."""
    model_folder, path, utterances, step = job
    model, _, _ = load_packaged(model_folder)
    pieces, places, offset = [], [], 0
    for u in utterances:
        features = encoder_input(model, read_audio(u.audio))
        pieces.append(quantize(features, step))
        places.append((u, {"shard": path.name, "offset": offset, "frames": len(features)}))
        offset += len(features)
    path.write_bytes(lzma.compress(np.concatenate(pieces).tobytes(), preset=9))
    return path.name, places


@torch.no_grad()
def encoder_input(model: torch.nn.Module, waveform: np.ndarray) -> np.ndarray:
    """What the model's encoder reads for one waveform: its normalized log-mel, (frames, bins)."""
    wave = torch.from_numpy(waveform)[None]
    feats, lengths = model._extract_feats(wave, torch.tensor([wave.shape[1]]))
    if model.normalize is not None:
        feats, _ = model.normalize(feats, lengths)
    return feats[0].numpy()


def quantize(features: np.ndarray, step: float) -> np.ndarray:
    """int8 steps of `features` (T, bins), differenced over time (smaller numbers compress better)."""
    steps = np.clip(np.round(features / step), -127, 127).astype(np.int16)
    return np.diff(steps, axis=0, prepend=0).astype(np.int8)


def dequantize(deltas: np.ndarray, step: float) -> np.ndarray:
    return np.cumsum(deltas.astype(np.int16), axis=0).astype(np.float32) * step


# --- there: the fine-tuning ------------------------------------------------------------------------------


@dataclass
class _Split:
    """Feature batches of one split, padded and ready on the device."""

    batches: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]  # feats, lengths, text, lengths
    utterances: int


def read_packs(folders: Sequence[Path], batch_frames: int, device: torch.device) -> tuple[dict, _Split, _Split]:
    """Every utterance of the packs as batches of similar length: (pack settings, train, dev). Part 0 (dev) must be
    among them; a pack read without some other part (a call lost between two others) is trained on, with a
    warning, and the settings list the parts read."""
    by_part = sorted(((json.loads((f / PACK_INDEX).read_text()), f) for f in folders), key=lambda p: p[0]["part"])
    indexes, folders = [index for index, _ in by_part], [folder for _, folder in by_part]
    read = [index["part"] for index in indexes]
    if not read or read[0] != 0 or len(set(read)) != len(read):
        raise ValueError(f"parts {read} of {[str(f) for f in folders]}: each part once, part 0 (dev) among them")
    total = indexes[0].get("parts", len(read))  # older packs do not say
    if len(read) < total:
        log.warning("training on parts %s of the pack's %d: the others were not given", read, total)
    jobs = [(folder, name) for folder, index in zip(folders, indexes)
            for name in sorted({u["shard"] for u in index["utterances"]})]
    step, bins = indexes[0]["step"], indexes[0]["bins"]
    with ProcessPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        shards = dict(zip(jobs, pool.map(_read_shard, jobs, [bins] * len(jobs))))
    items: dict[str, list] = {"train": [], "dev": []}
    for folder, index in zip(folders, indexes):
        for u in index["utterances"]:
            deltas = shards[(folder, u["shard"])][u["offset"] : u["offset"] + u["frames"]]
            items[u["split"]].append((dequantize(deltas, step), u["tokens"]))
    meta = {**{k: v for k, v in indexes[0].items() if k not in ("utterances", "part")}, "parts_read": read}
    return meta, *(_Split(_batches(items[s], batch_frames, device), len(items[s])) for s in ("train", "dev"))


def _read_shard(job: tuple[Path, str], bins: int) -> np.ndarray:
    folder, name = job
    return np.frombuffer(lzma.decompress((folder / name).read_bytes()), np.int8).reshape(-1, bins)


def _batches(items: list[tuple[np.ndarray, list[int]]], batch_frames: int, device: torch.device) -> list:
    """Items sorted by length, cut into batches of at most `batch_frames` padded frames, padded on `device`."""
    padded = []
    for batch in bucket_batches([len(features) for features, _ in items], batch_frames):
        feats = torch.nn.utils.rnn.pad_sequence([torch.from_numpy(items[i][0]) for i in batch], batch_first=True)
        text = torch.nn.utils.rnn.pad_sequence([torch.tensor(items[i][1]) for i in batch], batch_first=True,
                                               padding_value=IGNORE_ID)
        lengths = torch.tensor([len(items[i][0]) for i in batch])
        text_lengths = torch.tensor([len(items[i][1]) for i in batch])
        padded.append(tuple(t.to(device) for t in (feats, lengths, text, text_lengths)))
    return padded


def finetune(folders: Sequence[Path], model_folder: Path, out: Path, options: FinetuneOptions = FinetuneOptions()
             ) -> dict:
    """Train the package in `model_folder` on the packs; write best.pt, avg.pt (float16), history.json and
    summary.json to `out`."""
    started = time.monotonic()
    device = _device()
    meta, train, dev = read_packs(folders, options.batch_frames, device)  # worker processes: before CUDA work
    log.info("read %d train (%d batches) and %d dev utterances in %.0f s on %s", train.utterances,
             len(train.batches), dev.utterances, time.monotonic() - started, device)
    out.mkdir(parents=True, exist_ok=True)
    trainer = _Trainer(model_folder, train, dev, device, options, out)
    trainer.run()
    return _finish(trainer, out, started, {"epochs": round(trainer.step / len(train.batches), 2),
                                           "train_utterances": train.utterances, "pack": meta})


def finetune_fresh(dev_packs: Sequence[Path], builds: Sequence[Path], model_folder: Path, out: Path,
                   options: FinetuneOptions = FinetuneOptions()) -> dict:
    """Train the package in `model_folder` on the training speech of `builds` as `pasu corpus build` renders it
    (pasu.models.fresh_feed), the packs' dev as the held-out loss; writes what `finetune` writes."""
    started = time.monotonic()
    device = _device()
    meta, _, dev = read_packs(dev_packs, options.batch_frames, device)
    feed = ShardFeed(builds, Tokenizer(Path(model_folder) / "tokenizer.model"), options.seed)
    try:
        if not feed.wait_for(options.first_utterances, options.wait_seconds):
            raise RuntimeError(f"fewer than {options.first_utterances} rendered utterances in "
                               f"{[str(b) for b in builds]} after {options.wait_seconds:g} s: "
                               "is `pasu corpus build` rendering there?")
        log.info("first %d rendered utterances read after %.0f s", feed.size, time.monotonic() - started)
        out.mkdir(parents=True, exist_ok=True)
        trainer = _FreshTrainer(model_folder, feed, dev, device, options, out)
        trainer.run()
    finally:
        feed.stop()
    return _finish(trainer, out, started, {"fresh": feed.stats(), "pack": meta})


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _finish(trainer: _Trainer, out: Path, started: float, about: dict) -> dict:
    """Write best.pt and avg.pt (float16) and summary.json; the summary with the run's history."""
    for name, state in (("best.pt", trainer.best_state), ("avg.pt", trainer.averaged_recent())):
        trainer.model.load_state_dict(state)
        torch.save({k: v.cpu() for k, v in half_state_dict(trainer.model).items()}, out / name)
    device = next(trainer.model.parameters()).device
    summary = {"steps": trainer.step, **about, "dev_utterances": trainer.dev_split.utterances,
               "initial_dev_loss": trainer.history[0]["dev_loss"], "best_dev_loss": trainer.best_loss,
               "best_step": trainer.best_step, "averaged_steps": [s for s, _ in trainer.recent],
               "averaged_dev_loss": trainer.dev_loss(), "options": trainer.options.__dict__,
               "seconds": round(time.monotonic() - started, 1),
               "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu"}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return {**summary, "history": trainer.history}


class _Trainer(TimeBoxedTraining):
    """Adam over the whole model on the packed batches; the best and the recent states kept."""

    def __init__(self, model_folder: Path, train: _Split, dev: _Split, device: torch.device,
                 options: FinetuneOptions, out: Path):
        torch.manual_seed(options.seed)
        self.train_split, self.dev_split = train, dev
        self.model, _, _ = load_packaged(model_folder)
        self.model.specaug = SpecAug(**DEFAULT_SPECAUG_CONF) if options.spec_augment else None
        self.model.to(device).train()
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=options.lr, betas=(0.9, 0.98),
                                          weight_decay=1e-6)
        self.rng = random.Random(options.seed)
        self.order: list[int] = []
        super().__init__(options, out, self.model.parameters(), options.average_last)

    def batch_loss(self) -> torch.Tensor:
        """The next batch's loss per utterance, perturbed and masked as the options ask."""
        if not self.order:  # a new epoch: the batches in a new order
            self.order = list(range(len(self.train_split.batches)))
            self.rng.shuffle(self.order)
        feats, lengths, text, text_lengths = self.train_split.batches[self.order.pop()]
        if self.options.warp or self.options.tempo:
            feats, lengths = perturb(feats, lengths, self.model.frontend.normalize, self.options.warp,
                                     self.options.tempo)
        if self.model.specaug is not None:
            feats, lengths = self.model.specaug(feats, lengths)
        return _loss(self.model, feats, lengths, text, text_lengths) / len(text)

    @torch.no_grad()
    def dev_loss(self) -> float:
        """Teacher-forced loss per utterance (CTC and attention weighted as in training), as models/dev_eval.py's."""
        self.model.eval()
        total = sum(float(_loss(self.model, *batch)) for batch in self.dev_split.batches)
        self.model.train()
        return total / self.dev_split.utterances


class _FreshTrainer(_Trainer):
    """The same training on batches of the fresh feed, their features computed on the device."""

    def __init__(self, model_folder: Path, feed: ShardFeed, dev: _Split, device: torch.device,
                 options: FinetuneOptions, out: Path):
        self.feed, self.device = feed, device
        super().__init__(model_folder, _Split([], 0), dev, device, options, out)

    def batch_loss(self) -> torch.Tensor:
        items = self.feed.batch(self.options.batch_seconds)
        samples = torch.nn.utils.rnn.pad_sequence([torch.from_numpy(i.samples) for i in items], batch_first=True)
        wave = samples.to(self.device, non_blocking=True).float() / PCM_SCALE
        wave_lengths = torch.tensor([len(i.samples) for i in items], device=self.device)
        text = torch.nn.utils.rnn.pad_sequence([torch.tensor(i.tokens) for i in items], batch_first=True,
                                               padding_value=IGNORE_ID).to(self.device)
        text_lengths = torch.tensor([len(i.tokens) for i in items], device=self.device)
        with torch.no_grad():
            feats, lengths = self.model._extract_feats(wave, wave_lengths)
            if self.model.normalize is not None:
                feats, lengths = self.model.normalize(feats, lengths)
        if self.model.specaug is not None:
            feats, lengths = self.model.specaug(feats, lengths)
        return _loss(self.model, feats, lengths, text, text_lengths) / len(items)


def perturb(feats: torch.Tensor, lengths: torch.Tensor, normalize: torch.nn.Module, warp: float, tempo: float
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalized log-mel (B, T, bins) with each utterance's mel axis stretched by a random factor within `warp`
    of 1 and the batch's time axis by one within `tempo` of 1 (linear interpolation, on the un-normalized
    log-mel so each bin keeps its own statistics); the new lengths."""
    batch, frames, bins = feats.shape
    raw = feats * normalize.std + normalize.mean
    if warp:
        factor = 1 + warp * (2 * torch.rand(batch, 1, device=feats.device) - 1)
        source = (torch.arange(bins, device=feats.device) / factor).clamp(max=bins - 1)  # (B, bins)
        low = source.floor().long()
        high = (low + 1).clamp(max=bins - 1)
        share = (source - low)[:, None, :]
        raw = (raw.gather(2, low[:, None, :].expand(-1, frames, -1)) * (1 - share)
               + raw.gather(2, high[:, None, :].expand(-1, frames, -1)) * share)
    if tempo:
        factor = 1 + tempo * (2 * float(torch.rand(())) - 1)
        stretched = max(1, round(frames / factor))
        raw = torch.nn.functional.interpolate(raw.transpose(1, 2), size=stretched, mode="linear",
                                              align_corners=True).transpose(1, 2)
        lengths = (lengths.float() * stretched / frames).round().long().clamp(1, stretched)
    out = (raw - normalize.mean) / normalize.std
    mask = torch.arange(out.shape[1], device=out.device)[None, :] < lengths[:, None]
    return out * mask[:, :, None], lengths


def _loss(model: torch.nn.Module, feats: torch.Tensor, lengths: torch.Tensor, text: torch.Tensor,
          text_lengths: torch.Tensor) -> torch.Tensor:
    """ESPnet's loss summed over the batch: ctc_weight x CTC + (1 - ctc_weight) x attention, from features."""
    with torch.autocast(feats.device.type, dtype=torch.bfloat16, enabled=feats.device.type == "cuda"):
        encoded, encoded_lengths, _ = model.encoder(feats, lengths)
        loss_ctc, loss_att, _ = encoded_losses(model, encoded, encoded_lengths, text, text_lengths)
    return weighted_loss(model, loss_ctc.float(), loss_att.float()) * len(text)
