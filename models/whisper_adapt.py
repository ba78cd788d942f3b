"""`pasu whisper adapt`: train Whisper's decoder on our commands, keeping its encoder as it is.

Whisper's encoder output for a 30-s window is fixed by the audio, so it is computed once per training
utterance by the deployed CTranslate2 model (int8, as the server runs it) and kept on disk (float16, 1.2 MB a
window); training then runs only the decoder (`models/whisper_decoder.py`), a few hundred times cheaper than
the whole model. The decoder learns the commands' sentences in the corpus's spoken form (lower case, numbers
as words), which the recognizer's `spoken_form` leaves as they are.

EXPDIR (`--exp`): encoded-{split}.f16 + encoded-{split}.json (the windows and their utterance ids; an
interrupted encoding resumes), checkpoint.pt (latest state; the same command resumes), best.pt (the lowest
dev loss), log.jsonl (one line per dev evaluation). The result (`--out`, an .npz) holds the adapted decoder
variables under their CTranslate2 names, matrices as int8 rows with scales (`pack_adaptation`); whisper.yaml's
`adaptation` names it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from pasu.models.checkpoints import atomic_save, restore_checkpoint, save_checkpoint
from pasu.models.ctranslate2_file import read_model_file
from pasu.models.data import Utterance, load_split, read_audio
from pasu.models.train import OptimOptions, learning_rate
from pasu.models.whisper_decoder import WhisperDecoder, pack_adaptation, token_logprobs
from pasu.models.whisper_recognizer import WhisperRecognizer, load_model, read_weights, weights_folder
from pasu.torch_threads import set_torch_threads

log = logging.getLogger(__name__)

FRAMES = 1500  # Whisper's encoder output per 30-s window (its width is the model's: 384 in tiny, 512 in base)


@dataclass(frozen=True)
class AdaptOptions:
    # a seeded random subset of train (encoding costs ~0.23 s each, 1.2 MB on disk); a larger count keeps the
    # smaller one's utterances first, so the encodings on disk are kept and only the new ones are encoded
    train_utterances: int = 6000
    dev_utterances: int = 200  # the first of dev, for the teacher-forced loss that picks best.pt
    batch_size: int = 16  # utterances per step
    max_steps: int = 1000  # optimizer steps (the schedule decays to 0 there)
    max_minutes: float | None = None  # wall minutes of this run; the same command resumes
    eval_interval_steps: int = 100  # dev loss (and best.pt) this often
    checkpoint_minutes: float = 5.0  # checkpoint.pt at least this often
    # AdamW, warmup then linear decay: small steps, the decoder already knows English
    optim: OptimOptions = OptimOptions(lr=1e-4, scheduler="warmup_linear", warmup_steps=100, weight_decay=0.01,
                                       betas=(0.9, 0.98), grad_clip=1.0)
    seed: int = 0
    threads: int = 2  # torch and CTranslate2 threads


def nested_sample(items: list[Utterance], count: int, seed: int) -> list[Utterance]:
    """A seeded random subset whose first k items are the subset of size k, for every k <= count.

    random.sample is not (it switches algorithm with the count); this draws as its set-based branch does, so
    the 4,000 utterances a run with random.sample(items, 4000) chose, for 36,000 items, are still the first.
    """
    rng, chosen, taken = random.Random(seed), [], set()
    while len(chosen) < min(count, len(items)):
        j = rng.randrange(len(items))
        if j not in taken:
            taken.add(j)
            chosen.append(items[j])
    return chosen


class EncodedSplit:
    """Whisper's encoder output for a list of utterances, on disk as float16 [N, 1500, width] (memory-mapped).

    A cache written for a prefix of `utterances` grows to hold them all, one written for more serves its first
    rows (nested_sample draws such lists); any other is refused.
    """

    def __init__(self, exp_dir: Path, split: str, utterances: list[Utterance], width: int):
        self.path = exp_dir / f"encoded-{split}.f16"
        self.index_path = exp_dir / f"encoded-{split}.json"
        self.utterances = utterances
        self.ids = [u.id for u in utterances]
        shape = (len(self.ids), FRAMES, width)
        if self.index_path.exists():
            stored = json.loads(self.index_path.read_text())
            common = min(len(stored["ids"]), len(self.ids))
            if stored["ids"][:common] != self.ids[:common]:
                raise ValueError(f"{self.index_path} holds other utterances: use another --exp or delete it")
            if len(stored["ids"]) < len(self.ids):
                with open(self.path, "r+b") as f:
                    f.truncate(int(np.prod(shape)) * 2)  # float16; the new rows read as zeros until encoded
                self.index_path.write_text(json.dumps({"ids": self.ids, "done": stored["done"]}))
        mode = "r+" if self.path.exists() else "w+"
        self.array = np.memmap(self.path, dtype=np.float16, mode=mode, shape=shape)

    def done(self) -> int:
        return min(json.loads(self.index_path.read_text())["done"], len(self.ids)) if self.index_path.exists() else 0

    def fill(self, recognizer: WhisperRecognizer, desc: str) -> None:
        """Encode what is not encoded yet, saving progress every 100 windows."""
        start = self.done()
        for i in tqdm(range(start, len(self.utterances)), desc=desc, initial=start, total=len(self.utterances),
                      unit="utt", dynamic_ncols=True):
            self.array[i] = np.asarray(recognizer.encode(read_audio(self.utterances[i].audio)), dtype=np.float16)[0]
            if (i + 1) % 100 == 0 or i + 1 == len(self.utterances):
                self.array.flush()
                self.index_path.write_text(json.dumps({"ids": self.ids, "done": i + 1}))

    def batch(self, rows: list[int]) -> torch.Tensor:
        return torch.from_numpy(np.stack([self.array[i] for i in rows]).astype(np.float32))


def adapt(folder: Path, corpus: Path, exp_dir: Path, out: Path, options: AdaptOptions = AdaptOptions()) -> Path:
    """Encode, train, and write the adapted decoder variables of the Whisper model folder `folder` to `out`."""
    set_torch_threads(options.threads)
    torch.manual_seed(options.seed)  # the batch order (a resumed run restores its RNG from the checkpoint)
    exp_dir.mkdir(parents=True, exist_ok=True)
    weights = dataclasses.replace(read_weights(folder), adaptation="")  # always adapt the original
    recognizer = WhisperRecognizer(load_model(weights, cpu_threads=options.threads), weights)
    everything = load_split(corpus, "train")
    train_rows = nested_sample(everything, options.train_utterances, options.seed)
    train = EncodedSplit(exp_dir, "train", train_rows, recognizer.encoder_width)
    dev = EncodedSplit(exp_dir, "dev", load_split(corpus, "dev")[: options.dev_utterances], recognizer.encoder_width)
    dev.fill(recognizer, "encode dev")
    train.fill(recognizer, "encode train")
    decoder = WhisperDecoder(read_model_file(weights_folder(weights) / "model.bin").variables)
    trainer = _Trainer(decoder, recognizer, train, dev, exp_dir, options)
    trainer.run()
    best = torch.load(exp_dir / "best.pt", map_location="cpu", weights_only=True)
    decoder.load_state_dict(best)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(out, **pack_adaptation(decoder.adapted_variables()))
    log.info("wrote %s (best dev loss %.4f)", out, trainer.best_loss)
    return out


class _Trainer:
    """Shuffled batches of cached windows; dev loss, best.pt and checkpoint.pt as it goes."""

    def __init__(self, decoder: WhisperDecoder, recognizer: WhisperRecognizer, train: EncodedSplit,
                 dev: EncodedSplit, exp_dir: Path, options: AdaptOptions):
        self.decoder, self.train, self.dev, self.exp_dir, self.options = decoder, train, dev, exp_dir, options
        self.prompt = recognizer.prompt
        self.encode_text = lambda text: recognizer.tokenizer.encode(" " + text) + [recognizer.tokenizer.eot]
        o = options.optim
        self.optimizer = torch.optim.AdamW([p for p in decoder.parameters() if p.requires_grad], lr=o.lr,
                                           betas=o.betas, weight_decay=o.weight_decay)
        self.step, self.best_loss = 0, float("inf")
        self.order: list[int] = []
        checkpoint = exp_dir / "checkpoint.pt"
        if checkpoint.exists():
            state = restore_checkpoint(checkpoint, decoder, self.optimizer)
            self.step, self.best_loss, self.order = state["step"], state["best_loss"], state["order"]
            log.info("resumed from %s at step %d", checkpoint, self.step)

    def run(self) -> None:
        o = self.options
        started = last_checkpoint = time.monotonic()
        if self.step == 0:
            self._evaluate()  # Whisper as shipped: the loss to beat
        with tqdm(total=o.max_steps, initial=self.step, unit="step", dynamic_ncols=True, desc="adapt") as bar:
            while self.step < o.max_steps:
                if o.max_minutes is not None and time.monotonic() - started >= 60 * o.max_minutes:
                    break
                loss = self._train_step()
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.3f}", best=f"{self.best_loss:.3f}")
                if self.step % o.eval_interval_steps == 0 or self.step == o.max_steps:
                    self._evaluate()
                if time.monotonic() - last_checkpoint >= 60 * o.checkpoint_minutes:
                    self._save_checkpoint()
                    last_checkpoint = time.monotonic()
        self._save_checkpoint()

    def _train_step(self) -> float:
        if len(self.order) < self.options.batch_size:  # a new epoch
            self.order = torch.randperm(len(self.train.utterances)).tolist()
        rows, self.order = self.order[: self.options.batch_size], self.order[self.options.batch_size :]
        self.step += 1
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(self.step, self.options.optim, self.options.max_steps)
        self.decoder.train()
        loss = self._loss(self.train, rows)
        self.optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.decoder.parameters(), self.options.optim.grad_clip)
        self.optimizer.step()
        return loss.item()

    def _loss(self, split: EncodedSplit, rows: list[int]) -> torch.Tensor:
        """Mean negative log-likelihood per text token (and end of text), the prompt excluded."""
        texts = [self.encode_text(split.utterances[i].text) for i in rows]
        width = len(self.prompt) + max(len(t) for t in texts)
        tokens = torch.tensor([self.prompt + t + t[-1:] * (width - len(self.prompt) - len(t)) for t in texts])
        logprobs = token_logprobs(self.decoder, tokens, split.batch(rows))[:, len(self.prompt) - 1 :]
        lengths = torch.tensor([len(t) for t in texts])
        mask = torch.arange(logprobs.shape[1])[None] < lengths[:, None]
        return -(logprobs * mask).sum() / mask.sum()

    @torch.no_grad()
    def _evaluate(self) -> None:
        self.decoder.eval()
        rows = list(range(len(self.dev.utterances)))
        losses = [float(self._loss(self.dev, rows[i : i + 32])) for i in range(0, len(rows), 32)]
        loss = float(np.mean(losses))
        if loss < self.best_loss:
            self.best_loss = loss
            atomic_save(self.decoder.state_dict(), self.exp_dir / "best.pt")
        with open(self.exp_dir / "log.jsonl", "a") as f:
            f.write(json.dumps({"step": self.step, "dev_loss": round(loss, 5), "time": time.time()}) + "\n")
        log.info("step %d: dev loss %.4f (best %.4f)", self.step, loss, self.best_loss)

    def _save_checkpoint(self) -> None:
        state: dict[str, Any] = {"step": self.step, "best_loss": self.best_loss, "order": self.order}
        save_checkpoint(self.exp_dir / "checkpoint.pt", self.decoder, self.optimizer, state)
