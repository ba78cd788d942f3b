"""`pasu lm train`: a token-level language model over an ASR model's tokenizer, for shallow fusion.

A search that fuses it (ESPnet's, DecodingOptions.lm in models/recognizer.py, or the device agent's own) adds
`lm_weight` x this LM's log-probability of each token to its scores. The LM reads the same token ids as the ASR
model (its tokenizer.model / token_list), on the same target strings (models/targets.py: intent first, then the
words with slot markup), so it scores intents and slot markup too.
Text need not have been rendered as speech: `--also` adds sentence files (`pasu corpus swap-slots`, `pasu
text-intent pseudo-label`) or text files to the corpus's training sentences.

The network is ESPnet's SequentialRNNLM (an LSTM) inside ESPnetLanguageModel, as ESPnet's LM task builds
it: the state-dict keys are ESPnet's, and `model.lm` is the scorer that ESPnet's Speech2Text puts into its
beam search as `lm`.

LM folder (`--out`):
    config.yaml      {"format": 1, "kind": "lm", "lm": "seq_rnn", "lm_conf": SequentialRNNLM arguments,
                     "token_list": the ASR model's, "training": recipe, data, dev perplexity, ...}
    model.pt         ESPnetLanguageModel state dict, float16 parameters (loaded back as float32)
    tokenizer.model  the ASR model's sentencepiece model (text -> ids for perplexity without the ASR model)
    README.md        model card

EXPDIR (`--exp`): config.yaml (the LM config and the token list: they must not change under a checkpoint),
checkpoint.pt (latest full state), best.pt (weights at the lowest dev perplexity, what gets packaged),
log.jsonl (one line per dev evaluation), summary.json, run.json. Running the same command again resumes;
the network section stored in EXPDIR wins over the flags, the training options come from the flags.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import random
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from tqdm import tqdm

from espnet2.lm.espnet_model import ESPnetLanguageModel
from espnet2.lm.seq_rnn_lm import SequentialRNNLM
from pasu.config import from_dict
from pasu.corpus.text import read_sentences
from pasu.models.checkpoints import atomic_save, count_parameters, restore_checkpoint, save_checkpoint
from pasu.models.data import load_split
from pasu.models.package import TOKENIZER_FILE, WEIGHTS_FILE, half_state_dict, repo_relative
from pasu.models.targets import encode_target
from pasu.models.tokenizer import Tokenizer
from pasu.models.train import OptimOptions, learning_rate
from pasu.torch_threads import set_torch_threads

log = logging.getLogger(__name__)

LM_FORMAT = 1
LM_KIND = "lm"  # config.yaml "kind": tells an LM folder from an ASR model folder
PAD_ID = 0  # <blank>: never in a target, so it pads (ESPnetLanguageModel's ignore_id, the embedding's padding_idx)


# --- Options ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LmNetOptions:
    """espnet2.lm.seq_rnn_lm.SequentialRNNLM's arguments (ESPnet's `lm_conf`), the vocabulary aside."""

    unit: int = 512  # embedding and LSTM width
    nlayers: int = 2  # stacked LSTM layers
    # ~8k distinct training sentences: an LSTM of this size learns them by heart without dropout
    dropout_rate: float = 0.3
    rnn_type: str = "lstm"  # lstm, gru, rnn_tanh, rnn_relu
    tie_weights: bool = False  # share the embedding matrix with the output layer (unit x vocabulary fewer weights)


@dataclass(frozen=True)
class LmTrainOptions:
    batch_size: int = 64  # sentences per optimizer step
    max_epochs: int | None = 30  # passes over the distinct training sentences (None: no limit)
    max_steps: int | None = None  # optimizer steps (None: no limit); the first limit reached wins
    max_minutes: float | None = None  # wall minutes of this run (a time box); resuming gives another box
    patience: int | None = 3  # stop after this many epochs without a lower dev perplexity (None or 0: never)
    num_threads: int = 2  # torch intra-op threads
    seed: int = 0  # batch order and dropout
    checkpoint_minutes: float = 5.0  # write checkpoint.pt at least this often, and at every epoch's end
    train_split: str = "train"  # manifest read from a corpus folder for training ...
    dev_split: str = "dev"  # ... and for the dev perplexity


# Adam at a flat 1e-3 after a short warmup: the usual RNNLM recipe. (accum_grad is not used here.)
LM_OPTIM = OptimOptions(lr=1e-3, scheduler="constant", warmup_steps=100, weight_decay=0.0, grad_clip=1.0)


@dataclass(frozen=True)
class LmConfig:
    lm: LmNetOptions = LmNetOptions()
    optim: OptimOptions = LM_OPTIM
    train: LmTrainOptions = LmTrainOptions()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --- Data ---------------------------------------------------------------------------------------------


def read_texts(source: str | os.PathLike, split: str) -> list[str]:
    """Distinct target strings in first-seen order: a corpus folder's `<split>.jsonl` rows (encode_target), a
    sentence file's rows (`.jsonl`, as `pasu corpus build --train-text` reads: `pasu corpus swap-slots`, `pasu
    text-intent pseudo-label`), or a text file's non-empty lines (target strings, or plain sentences: those teach
    words but no intents).

    Distinct, because the corpus renders each sentence in several voices: the copies are the same text, so
    an epoch over distinct sentences teaches the same in a fraction of the time.
    """
    source = Path(source)
    if source.is_dir():
        texts = [u.target for u in load_split(source, split)]
    elif source.suffix == ".jsonl":
        texts = [encode_target(s.text, s.intent, s.slots) for s in read_sentences(source)]
    else:
        texts = [" ".join(line.split()) for line in source.read_text().splitlines()]
    return list(dict.fromkeys(t for t in texts if t))


def encode_texts(tokenizer: Tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Token ids per non-empty text; warns about <unk>s (intents or slot types the tokenizer does not know)."""
    sequences = [tokenizer.encode(t) for t in texts]
    unknown = sum(ids.count(tokenizer.unk_id) for ids in sequences)
    if unknown:
        log.warning("%d <unk> tokens in %d texts: intents or slot types the ASR model's tokenizer lacks",
                    unknown, len(texts))
    return [ids for ids in sequences if ids]


def pad(sequences: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L) ids padded with PAD_ID, and (B,) lengths: ESPnetLanguageModel's (text, text_lengths)."""
    lengths = torch.tensor([len(s) for s in sequences], dtype=torch.long)
    text = torch.full((len(sequences), int(lengths.max())), PAD_ID, dtype=torch.long)
    for i, s in enumerate(sequences):
        text[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return text, lengths


def epoch_batches(n: int, batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """Shuffled index batches, a function of (seed, epoch) only: a resumed epoch sees the same batches."""
    order = list(range(n))
    random.Random(f"{seed}-{epoch}").shuffle(order)
    return [order[i : i + batch_size] for i in range(0, n, batch_size)]


# --- The model --------------------------------------------------------------------------------------


def build_lm(vocab_size: int, options: LmNetOptions = LmNetOptions()) -> ESPnetLanguageModel:
    """ESPnetLanguageModel(SequentialRNNLM), as ESPnet's LMTask.build_model assembles them."""
    lm = SequentialRNNLM(vocab_size=vocab_size, ignore_id=PAD_ID, **dataclasses.asdict(options))
    return ESPnetLanguageModel(lm=lm, vocab_size=vocab_size, ignore_id=PAD_ID)


@torch.no_grad()
def perplexity(model: ESPnetLanguageModel, sequences: Sequence[Sequence[int]], batch_size: int = 256) -> float:
    """exp(mean negative log-likelihood per token), <eos> counted as a token (as ESPnet's lm_calc_perplexity)."""
    was_training = model.training
    model.eval()
    total, tokens = 0.0, 0
    for start in range(0, len(sequences), batch_size):
        nll, lengths = model.nll(*pad(sequences[start : start + batch_size]))
        total += float(nll.sum())
        tokens += int(lengths.sum())
    model.train(was_training)
    return math.exp(total / max(tokens, 1))


def asr_tokenizer(folder: str | os.PathLike) -> Tokenizer:
    """The tokenizer of a packaged ASR model folder or of a `pasu train` EXPDIR (both: config.yaml + tokenizer)."""
    folder = Path(folder)
    config = yaml.safe_load((folder / "config.yaml").read_text())
    tokenizer = Tokenizer(folder / config.get("tokenizer", TOKENIZER_FILE))
    if tokenizer.token_list != list(config["model"]["token_list"]):
        raise ValueError(f"{folder}: tokenizer and config token lists differ")
    return tokenizer


# --- Loading LM folders ------------------------------------------------------------------------------


@dataclass(frozen=True)
class PackagedLm:
    """A loaded LM folder."""

    model: ESPnetLanguageModel  # eval mode, float32; `model.lm` is the beam-search scorer
    token_list: list[str]  # must equal the ASR model's, token for token
    name: str
    weights: Path  # model.pt (its digest names the LM in model ids)


def load_lm(folder: str | os.PathLike) -> PackagedLm:
    """An LM folder written by `pasu lm train` (package_lm)."""
    folder = Path(folder)
    path = folder / "config.yaml"
    if not path.exists():
        raise FileNotFoundError(f"{folder}: no LM folder there (`pasu lm train --out`)")
    config = yaml.safe_load(path.read_text())
    if config.get("kind") != LM_KIND or config.get("format") != LM_FORMAT:
        raise ValueError(f"{folder}: not an LM folder of format {LM_FORMAT} (`pasu lm train --out`)")
    token_list = list(config["token_list"])
    model = build_lm(len(token_list), from_dict(LmNetOptions, config["lm_conf"], str(path)))
    weights = folder / config.get("weights", WEIGHTS_FILE)
    state = torch.load(weights, map_location="cpu", weights_only=True)
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()}, strict=True)
    return PackagedLm(model.float().eval(), token_list, config.get("name", folder.name), weights)


def check_token_list(lm: PackagedLm, token_list: Sequence[str]) -> None:
    """ValueError unless the LM reads exactly the ASR model's tokens: other ids would score other tokens."""
    ours, theirs = lm.token_list, list(token_list)
    if ours == theirs:
        return
    first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    raise ValueError(
        f"LM {lm.name!r} ({lm.weights.parent}) was trained on another token list than the ASR model's "
        f"({len(ours)} vs {len(theirs)} tokens; id {first}: {_token_at(ours, first)} vs {_token_at(theirs, first)}): "
        f"train one on this model's tokenizer with `pasu lm train --model MODEL_DIR`")


def _token_at(tokens: Sequence[str], i: int) -> str:
    return repr(tokens[i]) if i < len(tokens) else "nothing"


# --- Training ---------------------------------------------------------------------------------------


@dataclass
class LmState:
    """Everything besides model and optimizer that a resumed run needs."""

    step: int = 0  # optimizer steps done
    epoch: int = 0  # epochs completed
    batch_in_epoch: int = 0  # batches of the current epoch already consumed
    elapsed: float = 0.0  # wall seconds over all runs
    best_perplexity: float = math.inf  # lowest dev perplexity so far (its weights: best.pt)
    best_step: int = -1
    best_epoch: int = 0  # epochs completed when best.pt was written (patience counts from here)
    last_eval_step: int = -1


@dataclass(frozen=True)
class LmTrainResult:
    exp_dir: Path
    steps: int
    epochs: int
    dev_perplexity: float  # best.pt's
    best_step: int


def train_lm(
    asr_model: str | os.PathLike,
    corpus: str | os.PathLike,
    exp_dir: str | os.PathLike,
    config: LmConfig = LmConfig(),
    dev: str | os.PathLike | None = None,
    command: str | None = None,
    also: Sequence[str | os.PathLike] = (),
) -> LmTrainResult:
    """Train (or resume) an LM on `corpus` and the sources in `also` (each a corpus folder, sentence file or text
    file) over `asr_model`'s tokenizer; dev perplexity on `dev` (default: the corpus folder's dev split).
    `command` goes into the model card."""
    corpus, exp_dir, also = Path(corpus), Path(exp_dir), [Path(a) for a in also]
    for source in (corpus, *also):
        if not source.exists():
            raise FileNotFoundError(f"{source}: no such corpus folder, sentence file or text file")
    if dev is None and not corpus.is_dir():
        raise ValueError(f"{corpus} is a text file: give the dev sentences too (--dev)")
    dev = Path(dev) if dev is not None else corpus
    opts = config.train
    if opts.max_epochs is None and opts.max_steps is None and opts.max_minutes is None:
        raise ValueError("set max_epochs, max_steps or max_minutes")
    exp_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = asr_tokenizer(asr_model)
    config = _prepare_experiment(exp_dir, config, tokenizer)
    train_texts = list(dict.fromkeys(t for source in (corpus, *also) for t in read_texts(source, opts.train_split)))
    dev_texts = read_texts(dev, opts.dev_split)
    train_seqs, dev_seqs = encode_texts(tokenizer, train_texts), encode_texts(tokenizer, dev_texts)
    if not train_seqs or not dev_seqs:
        raise ValueError(f"no training ({len(train_seqs)}) or dev ({len(dev_seqs)}) sentences")
    tokenizer.save(exp_dir / TOKENIZER_FILE)
    run = {"asr_model": str(Path(asr_model).resolve()), "corpus": str(corpus.resolve()), "dev": str(dev.resolve()),
           "also": [str(a.resolve()) for a in also], "command": command, "train_sentences": len(train_seqs),
           "train_tokens": sum(map(len, train_seqs)),
           "dev_sentences": len(dev_seqs), "dev_tokens": sum(map(len, dev_seqs))}
    (exp_dir / "run.json").write_text(json.dumps(run, indent=2) + "\n")

    set_torch_threads(opts.num_threads)
    torch.manual_seed(opts.seed)
    model = build_lm(tokenizer.vocab_size, config.lm)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.optim.lr, betas=config.optim.betas,
                                 weight_decay=config.optim.weight_decay)
    state = LmState()
    if (exp_dir / "checkpoint.pt").exists():
        state = LmState(**restore_checkpoint(exp_dir / "checkpoint.pt", model, optimizer))
        log.info("resumed from %s at step %d (epoch %d)", exp_dir / "checkpoint.pt", state.step, state.epoch)
    return _LmLoop(config, model, optimizer, state, train_seqs, dev_seqs, exp_dir).run()


def _prepare_experiment(exp_dir: Path, config: LmConfig, tokenizer: Tokenizer) -> LmConfig:
    """The config to train with: the stored network section on resume (it matches the checkpoint), else `config`,
    written to EXPDIR/config.yaml with the token list."""
    path = exp_dir / "config.yaml"
    if path.exists():
        stored = yaml.safe_load(path.read_text())
        if stored["token_list"] != tokenizer.token_list:
            raise ValueError(f"{exp_dir} holds an LM over another token list: use a new --exp for this ASR model")
        net = from_dict(LmNetOptions, stored["lm"], str(path))
        if net != config.lm:
            log.warning("network options differ from %s; keeping the stored ones (they match the checkpoint)", path)
        config = dataclasses.replace(config, lm=net)
    resolved = {**config.to_dict(), "token_list": tokenizer.token_list}
    path.write_text(yaml.safe_dump(resolved, sort_keys=False, default_flow_style=None, width=120))
    return config


class _LmLoop:
    """Epochs of shuffled sentence batches; dev perplexity, best.pt and a checkpoint at every epoch's end."""

    def __init__(self, config: LmConfig, model: ESPnetLanguageModel, optimizer: torch.optim.Optimizer,
                 state: LmState, train_seqs: list[list[int]], dev_seqs: list[list[int]], exp_dir: Path):
        self.config, self.model, self.optimizer, self.state = config, model, optimizer, state
        self.train_seqs, self.dev_seqs, self.exp_dir = train_seqs, dev_seqs, exp_dir
        self.loss_sum, self.loss_steps = 0.0, 0  # training loss since the last evaluation

    def run(self) -> LmTrainResult:
        opts, s = self.config.train, self.state
        steps_per_epoch = math.ceil(len(self.train_seqs) / opts.batch_size)
        limits = [n for n in (opts.max_steps, opts.max_epochs and opts.max_epochs * steps_per_epoch) if n]
        self.total_steps = min(limits) if limits else None  # None: time-boxed only
        self.run_start = self.last_ckpt = time.monotonic()
        self.elapsed_before = s.elapsed
        with tqdm(total=self.total_steps, initial=s.step, unit="step", dynamic_ncols=True) as self.bar:
            while not self._done():
                self._run_epoch()
        if s.last_eval_step != s.step:  # stopped inside an epoch: these weights may still be the best
            self._evaluate()
        self._save_checkpoint()
        self._write_summary()
        return LmTrainResult(self.exp_dir, s.step, s.epoch, s.best_perplexity, s.best_step)

    def _done(self) -> bool:
        opts, s = self.config.train, self.state
        return ((opts.max_steps is not None and s.step >= opts.max_steps)
                or (opts.max_epochs is not None and s.epoch >= opts.max_epochs)
                or (opts.max_minutes is not None and time.monotonic() - self.run_start >= 60 * opts.max_minutes)
                or (bool(opts.patience) and s.epoch - s.best_epoch >= opts.patience))

    def _run_epoch(self) -> None:
        s, opts = self.state, self.config.train
        batches = epoch_batches(len(self.train_seqs), opts.batch_size, opts.seed, s.epoch)
        self.model.train()
        for batch in batches[s.batch_in_epoch :]:
            self._step([self.train_seqs[i] for i in batch])
            s.batch_in_epoch += 1
            if time.monotonic() - self.last_ckpt >= 60 * opts.checkpoint_minutes:
                self._save_checkpoint()
            if self._done():
                return
        s.epoch, s.batch_in_epoch = s.epoch + 1, 0
        self._evaluate()
        self._save_checkpoint()

    def _step(self, sequences: list[list[int]]) -> None:
        s, optim = self.state, self.config.optim
        loss, _, _ = self.model(*pad(sequences))  # mean negative log-likelihood per token
        loss.backward()
        loss = float(loss.detach())
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), optim.grad_clip)
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(s.step + 1, optim, self.total_steps)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        s.step += 1
        self.loss_sum, self.loss_steps = self.loss_sum + loss, self.loss_steps + 1
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{loss:.2f}", epoch=s.epoch)

    def _evaluate(self) -> None:
        s = self.state
        ppl = perplexity(self.model, self.dev_seqs)
        train_loss = self.loss_sum / self.loss_steps if self.loss_steps else math.nan  # nan: no step since the last
        self.loss_sum, self.loss_steps = 0.0, 0
        s.last_eval_step = s.step
        if ppl < s.best_perplexity:
            s.best_perplexity, s.best_step, s.best_epoch = ppl, s.step, s.epoch
            atomic_save(self.model.state_dict(), self.exp_dir / "best.pt")
        line = {"kind": "dev", "step": s.step, "epoch": s.epoch, "time": time.time(), "train_loss": train_loss,
                "train_perplexity": math.exp(train_loss), "dev_perplexity": ppl}
        with open(self.exp_dir / "log.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")
        self.bar.write(f"step {s.step} epoch {s.epoch}: train ppl {math.exp(train_loss):.2f}, dev ppl {ppl:.2f}"
                       f" (best {s.best_perplexity:.2f} at step {s.best_step})")

    def _save_checkpoint(self) -> None:
        s = self.state
        s.elapsed = self.elapsed_before + time.monotonic() - self.run_start
        save_checkpoint(self.exp_dir / "checkpoint.pt", self.model, self.optimizer, dataclasses.asdict(s))
        self.last_ckpt = time.monotonic()

    def _write_summary(self) -> None:
        s = self.state
        history = [json.loads(line) for line in (self.exp_dir / "log.jsonl").read_text().splitlines() if line]
        summary = {"steps": s.step, "epochs": s.epoch, "train_seconds": s.elapsed,
                   "num_threads": self.config.train.num_threads, "parameters": count_parameters(self.model),
                   "dev_perplexity": s.best_perplexity, "best_step": s.best_step,
                   "history": [{k: h[k] for k in ("step", "epoch", "train_perplexity", "dev_perplexity")}
                               for h in history]}
        (self.exp_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


# --- Packaging --------------------------------------------------------------------------------------


def package_lm(exp_dir: str | os.PathLike, out_dir: str | os.PathLike, name: str | None = None) -> Path:
    """Write an LM folder from a `train_lm` EXPDIR: best.pt in float16, config, tokenizer, model card."""
    exp_dir, out_dir = Path(exp_dir), Path(out_dir)
    stored = yaml.safe_load((exp_dir / "config.yaml").read_text())
    net = from_dict(LmNetOptions, stored["lm"], str(exp_dir / "config.yaml"))
    model = build_lm(len(stored["token_list"]), net)
    model.load_state_dict(torch.load(exp_dir / "best.pt", map_location="cpu", weights_only=True), strict=True)
    run = json.loads((exp_dir / "run.json").read_text())
    summary = json.loads((exp_dir / "summary.json").read_text())
    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(exp_dir / TOKENIZER_FILE, out_dir / TOKENIZER_FILE)
    torch.save(half_state_dict(model), out_dir / WEIGHTS_FILE)
    config = {
        "format": LM_FORMAT,
        "kind": LM_KIND,
        "name": name or out_dir.name,
        "lm": "seq_rnn",  # ESPnet's LMTask choice names and arguments
        "lm_conf": dataclasses.asdict(net),
        "model_conf": {"ignore_id": PAD_ID},
        "token_list": stored["token_list"],
        "tokenizer": TOKENIZER_FILE,
        "weights": WEIGHTS_FILE,
        "parameters": count_parameters(model),
        "training": {**run, **summary, **{k: repo_relative(run[k]) for k in ("asr_model", "corpus", "dev")},
                     "also": [repo_relative(a) for a in run.get("also", [])],
                     "options": {k: v for k, v in stored.items() if k in ("optim", "train")}},
    }
    (out_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False, width=120))
    (out_dir / "README.md").write_text(lm_card(config, repo_relative(str(out_dir))))
    return out_dir


def lm_card(config: dict[str, Any], folder: str) -> str:
    """README.md of the LM folder `folder`: what it is, data, recipe, dev perplexity per epoch, how to decode with it."""
    t, net = config["training"], config["lm_conf"]
    history = [f"| {h['epoch']} | {h['step']} | {h['train_perplexity']:.2f} | {h['dev_perplexity']:.2f} |"
               for h in t.get("history", [])]
    return "\n".join([
        f"# {config['name']}",
        "",
        "Token-level language model for shallow fusion in PASU's beam search: it reads the token ids of the ASR",
        f"model `{t['asr_model']}` (same sentencepiece model and token list, {len(config['token_list'])} tokens) on",
        "its target strings (intent, then the words with slot markup; `models/targets.py`).",
        "",
        "## Architecture",
        "",
        f"ESPnet `SequentialRNNLM` in `ESPnetLanguageModel`: {net['nlayers']} x {net['rnn_type'].upper()} "
        f"{net['unit']} units, dropout {net['dropout_rate']}, {config['parameters'] / 1e6:.2f} M parameters.",
        "",
        "## Data",
        "",
        f"- training: {', '.join(f'`{s}`' for s in [t['corpus'], *t.get('also', [])])}, "
        f"{t['train_sentences']:,} distinct sentences, {t['train_tokens']:,} tokens",
        f"- dev: `{t['dev']}`, {t['dev_sentences']:,} distinct sentences, {t['dev_tokens']:,} tokens",
        "",
        "## Training",
        "",
        f"{t['steps']} steps, {t['epochs']} epochs, {t['train_seconds'] / 60:.1f} min with {t['num_threads']} torch "
        f"threads; weights from step {t['best_step']} (lowest dev perplexity).",
        "",
        "```",
        t.get("command") or "pasu lm train --model MODEL_DIR --corpus CORPUS --exp EXPDIR --out LM_DIR",
        "```",
        "",
        "## Results",
        "",
        f"Dev perplexity: **{t['dev_perplexity']:.2f}** per token (`<eos>` included).",
        "",
        "| epoch | step | train perplexity | dev perplexity |",
        "|---|---|---|---|",
        *history,
        "",
        "## Use",
        "",
        "```",
        f"pasu eval {t['asr_model']} --corpus CORPUS --lm {folder} --lm-weight 0.3 --beam 10",
        f"pasu cloud serve --model {t['asr_model']} --lm {folder} --lm-weight 0.3",
        "```",
        "",
        "Decoding refuses an ASR model whose token list differs from this one's.",
        "",
        "## Files",
        "",
        "`config.yaml` (`lm_conf`, `token_list`, training record; load with `pasu.models.lm.load_lm`), `model.pt`",
        "(ESPnet state-dict keys, float16 parameters), `tokenizer.model` (the ASR model's sentencepiece model).",
        "",
    ])
