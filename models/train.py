"""`pasu train`: train an SLU model (intent + words + slot markup) on a PASU corpus, resumably.

EXPDIR layout:
    config.yaml       the resolved experiment config (model section with token_list and frontend stats)
    tokenizer.model   sentencepiece model (targets <-> ids)
    checkpoint.pt     latest full state: model, optimizer, step, epoch, batch, RNG states, best list
    snapshots/        model weights at the N best dev evaluations (kept for averaging)
    log.jsonl         one line per log interval ("train") and per dev evaluation ("dev")
    model_avg.pt      the average of the N best snapshots (ESPnet-style), written at the end
    summary.json      final dev scores, seconds per step, parameter count
    run.json          corpus folder, the latest command line, and every start (resumes with the options they changed)
    STOP              create it (`touch EXPDIR/STOP`) to end the run cleanly (see below); removed at start

Resuming: run the same command again. The model section and tokenizer stored in EXPDIR win over the
given config (the token list must not change under a checkpoint); the training options (steps, epochs,
intervals, threads) come from the given config, so a finished run can be extended by raising max_steps.
A resume that changes what the run learns with (learning rate, schedule, data, seed; not its time or threads)
logs each change and records it in run.json, whose `starts` the packaged model's card carries.

Stopping early: the STOP file, a first Ctrl-C or SIGTERM end the run after the current step exactly as a
limit does (dev evaluation, checkpoint, averaging, summary), so a stopped run can be packaged; a second
Ctrl-C aborts at once (the last periodic checkpoint stays).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import logging
import math
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from tqdm import tqdm

from espnet2.asr.espnet_model import ESPnetASRModel
from pasu.config import from_dict
from pasu.files import write_text_atomic
from pasu.models.build import DEFAULT_SPECAUG_CONF, build_asr_model
from pasu.models.checkpoints import (
    atomic_save,
    average_state_dicts,
    count_parameters,
    restore_checkpoint,
    save_checkpoint,
)
from pasu.models.data import (
    Batch,
    SpeechDataset,
    Utterance,
    batch_loader,
    bucket_batches,
    dev_subset,
    load_split,
    sample_global_stats,
)
from pasu.models.decoder_logits import TrainingDecoderLogits
from pasu.models.dev_eval import HIGHER_IS_BETTER, DevResult, evaluate
from pasu.models.distill import DecoderDistillation, load_teacher
from pasu.models.package import AVERAGED_WEIGHTS
from pasu.models.targets import target_symbols
from pasu.models.tokenizer import Tokenizer, TokenizerOptions
from pasu.models.warm_start import warm_start
from pasu.torch_threads import set_torch_threads

log = logging.getLogger(__name__)

STOP_FILE = "STOP"  # EXPDIR/STOP: end the run after the current step

# --- Options ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DataOptions:
    train_split: str = "train"  # manifest name in the corpus folder (<split>.jsonl)
    # more corpus folders whose `train_split` is trained on too, e.g. `pasu corpus build --train-variant 1`'s
    # fresh rendering of the same sentences; they must hold out the same voices as the main corpus
    extra_corpora: tuple[str, ...] = ()
    dev_split: str = "dev"
    batch_seconds: float = 60.0  # padded audio seconds per batch (batch size x longest utterance)
    stats_utterances: int = 500  # training utterances sampled for the global fbank mean/std
    num_workers: int = 0  # DataLoader workers decoding FLAC; 0 keeps the cores for the model


@dataclass(frozen=True)
class OptimOptions:
    lr: float = 2e-3  # peak learning rate (reached at the end of warmup)
    scheduler: str = "noam"  # "noam": warmup then 1/sqrt decay (ESPnet WarmupLR); "warmup_linear": linear
    # warmup then linear decay to 0 at max_steps; "constant": warmup then flat
    warmup_steps: int = 1000
    weight_decay: float = 1e-6  # Adam's L2 term (ESPnet's SLURP conformer recipe value)
    betas: tuple[float, float] = (0.9, 0.98)
    grad_clip: float = 5.0  # max global gradient norm
    accum_grad: int = 1  # batches per optimizer step


@dataclass(frozen=True)
class TrainOptions:
    max_epochs: int | None = 50  # stop after this many passes over train (None: no limit)
    max_steps: int | None = None  # stop after this many optimizer steps (None: no limit); the first wins
    max_minutes: float | None = None  # stop after this many wall minutes of this run (a time-boxed GPU lease)
    num_threads: int = 2  # torch intra-op threads (1 each when two trainings share a 2-core machine)
    seed: int = 0  # data order, dropout, SpecAugment
    specaug: bool = True  # SpecAugment on the fbank features (model.specaug_conf, or the defaults above)
    device: str = "cpu"  # "cpu", "cuda" or "auto" (cuda when available)
    # a packaged model folder to start from (its tokenizer, frontend stats and weights; a fresh optimizer):
    # how training goes on across machines that keep only the shipped float16 weights. Labels of the corpus the
    # package lacks join its tokenizer as new tokens (their rows untrained). Ignored on resume.
    init_from: str | None = None
    # with init_from: keep THIS config's architecture and load only the package's tensors whose names and
    # shapes match (frontend stats, subsampling, decoder, CTC): warm-starts a baseline encoder from the device
    # model without touching its blocks, so what the blocks learn (e.g. the branch weights) is their own
    init_partial: bool = False
    # with init_partial: the decoder layers the package lacks start as the identity (the output projections of
    # their attention and feed-forward branches zeroed), so a deeper decoder starts from the package's answers
    # and learns what its new layers add, instead of first unlearning random ones
    init_new_decoder_layers_identity: bool = False
    # with init_partial: the late-context encoder's conv blocks the package lacks (stacked on its own) start as
    # the identity, so a deeper streaming stack starts from the package's answers; they run during ingestion,
    # so they add capacity without adding time after the end of speech
    init_new_conv_blocks_identity: bool = False
    # > 0: this times the cross-entropy of the decoder's first output token (the intent, in PASU's targets) is
    # added to ESPnet's loss, where the intent is one token of a dozen or more: weighs the intent against the
    # words (0: ESPnet's loss as it is)
    intent_loss_weight: float = 0.0
    # knowledge distillation: a packaged model folder with this model's tokenizer (e.g. the cloud's Conformer)
    # whose decoder's next-token distributions this model's decoder also learns (pasu.models.distill)
    teacher: str | None = None
    distill_weight: float = 0.0  # with teacher: this times KL(teacher || model) per target token joins the loss
    distill_temperature: float = 1.0  # softens both distributions; the KL is scaled by its square
    log_interval_steps: int = 20  # steps per "train" line in log.jsonl
    checkpoint_minutes: float = 5.0  # write checkpoint.pt at least this often (wall clock) ...
    checkpoint_steps: int | None = None  # ... and every this many steps when set


@dataclass(frozen=True)
class EvalOptions:
    interval_steps: int | None = 1000  # dev evaluation every this many steps (None: never by steps) ...
    interval_minutes: float | None = 30.0  # ... or after this many minutes since the last one, first wins
    dev_utterances: int = 300  # fixed random dev subset size (0: all of dev)
    best_metric: str = "acc"  # acc (decoder token accuracy, ESPnet's default), loss, wer, intent_accuracy,
    # slu_f1: picks the snapshots that are averaged
    keep_best: int = 5  # snapshots kept and averaged into model_avg.pt


@dataclass(frozen=True)
class ExperimentConfig:
    model: dict[str, Any]  # build_asr_model config; token_list and stats are filled in by training
    tokenizer: TokenizerOptions = TokenizerOptions()
    data: DataOptions = DataOptions()
    optim: OptimOptions = OptimOptions()
    train: TrainOptions = TrainOptions()
    eval: EvalOptions = EvalOptions()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_SECTIONS = {
    "tokenizer": TokenizerOptions,
    "data": DataOptions,
    "optim": OptimOptions,
    "train": TrainOptions,
    "eval": EvalOptions,
}


def config_from_dict(raw: dict[str, Any]) -> ExperimentConfig:
    """ExperimentConfig from a parsed YAML dict; unknown sections or keys are errors (typos fail early)."""
    unknown = set(raw) - set(_SECTIONS) - {"model"}
    if unknown:
        raise ValueError(f"unknown config sections {sorted(unknown)}")
    sections = {name: from_dict(cls, raw.get(name) or {}, name) for name, cls in _SECTIONS.items()}
    return ExperimentConfig(model=dict(raw.get("model") or {}), **sections)


def load_config(path: str | os.PathLike, overrides: Sequence[str] = ()) -> ExperimentConfig:
    """The experiment YAML, with `section.field=value` overrides (values parsed as YAML) applied on top."""
    with open(path) as f:
        raw = yaml.safe_load(f) or {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"override {item!r} is not section.field=value")
        *parents, leaf = key.split(".")
        node = raw
        for name in parents:
            node = node.setdefault(name, {})
            if not isinstance(node, dict):
                raise ValueError(f"override {item!r}: {name} is not a section")
        node[leaf] = yaml.safe_load(value)
    return config_from_dict(raw)


# --- Learning rate ----------------------------------------------------------------------------------


def learning_rate(step: int, optim: OptimOptions, total_steps: int | None) -> float:
    """LR for optimizer step `step` (1-based); a pure function of the step, so resuming needs only the step.

    `total_steps` (max_steps, or max_epochs x steps per epoch) is where warmup_linear reaches 0."""
    step = max(step, 1)
    warmup = max(optim.warmup_steps, 1)
    if step <= warmup:
        return optim.lr * step / warmup
    if optim.scheduler == "noam":
        return optim.lr * math.sqrt(warmup / step)  # ESPnet WarmupLR, normalized to peak at lr
    if optim.scheduler == "warmup_linear":
        if not total_steps:
            raise ValueError("warmup_linear needs a known number of steps")
        return optim.lr * max(0.0, (total_steps - step) / max(total_steps - warmup, 1))
    if optim.scheduler == "constant":
        return optim.lr
    raise ValueError(f"unknown scheduler {optim.scheduler!r}")


# --- Training -----------------------------------------------------------------------------------


@dataclass
class TrainState:
    """Everything besides model and optimizer that a resumed run needs."""

    step: int = 0  # optimizer steps done
    epoch: int = 0  # current epoch (0-based)
    batch_in_epoch: int = 0  # batches of this epoch already consumed
    elapsed: float = 0.0  # wall seconds over all runs (evaluations and checkpoints included)
    best: list[tuple[float, int, str]] = field(default_factory=list)  # (metric, step, snapshot file)
    last_eval_step: int = -1
    skipped_steps: int = 0  # updates skipped for a non-finite gradient (all runs)


@dataclass(frozen=True)
class TrainResult:
    exp_dir: Path
    steps: int
    seconds_per_step: float  # mean wall time of a training step in this run (data loading included)
    final_dev: DevResult | None
    averaged: Path | None  # model_avg.pt


def train(
    config: ExperimentConfig,
    corpus_dir: str | os.PathLike,
    exp_dir: str | os.PathLike,
    command: str | None = None,
) -> TrainResult:
    """Train (or resume) an experiment; `command` (the CLI line) goes into run.json for the model card."""
    corpus_dir, exp_dir = Path(corpus_dir), Path(exp_dir)
    exp_dir.mkdir(parents=True, exist_ok=True)
    opts = config.train
    if opts.max_epochs is None and opts.max_steps is None and opts.max_minutes is None:
        raise ValueError("set train.max_epochs, train.max_steps or train.max_minutes")
    for grow in ("init_new_decoder_layers_identity", "init_new_conv_blocks_identity"):
        if getattr(opts, grow) and not opts.init_partial:
            raise ValueError(f"train.{grow} needs train.init_partial=true: without it the package's own "
                             "architecture is kept and no layer is new")
    if (opts.teacher is None) != (opts.distill_weight == 0):
        raise ValueError("distillation needs both train.teacher and train.distill_weight > 0")
    set_torch_threads(opts.num_threads)
    device = _device(opts.device)
    torch.manual_seed(opts.seed)
    random.seed(opts.seed)
    np.random.seed(opts.seed)

    train_utts = training_utterances(corpus_dir, config.data)
    dev_utts = dev_subset(load_split(corpus_dir, config.data.dev_split), config.eval.dev_utterances)
    ckpt_path = exp_dir / "checkpoint.pt"
    init_from = Path(opts.init_from) if opts.init_from and not ckpt_path.exists() else None
    tokenizer, model_config, changed = _prepare_experiment(config, train_utts, exp_dir, init_from)
    model = build_asr_model(model_config)
    if init_from is not None:
        warm_start(model, init_from, partial=opts.init_partial, grow_decoder=opts.init_new_decoder_layers_identity,
                   grow_conv_blocks=opts.init_new_conv_blocks_identity)
    model = model.to(device)
    optimizer = torch.optim.Adam(
        model.parameters(), lr=config.optim.lr, betas=config.optim.betas, weight_decay=config.optim.weight_decay
    )
    state = TrainState()
    if ckpt_path.exists():
        state = _load_checkpoint(ckpt_path, model, optimizer)
        log.info("resumed from %s at step %d (epoch %d, batch %d)", ckpt_path, state.step, state.epoch,
                 state.batch_in_epoch)
    changed = changed if ckpt_path.exists() else {}  # a stored config without a checkpoint starts at step 0
    if changed:
        log.warning("resumed at step %d with options that differ from the run's so far (recorded in run.json): %s",
                    state.step, ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changed.items()))
    _record_start(exp_dir, corpus_dir, command, state.step, changed)
    loop = _Loop(config, model, optimizer, tokenizer, state, train_utts, dev_utts, exp_dir, device)
    return loop.run()


# Options a resume may change without changing what the run learns: how long and on what it computes, how often it
# logs and checkpoints, and the warm start, which a resume ignores.
UNLEARNED_OPTIONS = frozenset({
    "train.max_epochs", "train.max_minutes", "train.num_threads", "train.device", "train.log_interval_steps",
    "train.checkpoint_minutes", "train.checkpoint_steps", "train.init_from", "train.init_partial",
    "train.init_new_decoder_layers_identity", "train.init_new_conv_blocks_identity"})


def changed_options(stored: Mapping[str, Any], config: ExperimentConfig) -> dict[str, tuple[Any, Any]]:
    """{"section.field": (stored, now)} for each learning option `config` changes against a stored config.yaml's."""
    # as config.yaml holds them (tuples read back as lists); the model section is checked apart, eval learns nothing
    before, now = ({k: v for k, v in d.items() if k not in ("model", "eval")}
                   for d in (stored, yaml.safe_load(yaml.safe_dump(config.to_dict()))))
    changed = {}
    for section in sorted(set(before) | set(now)):
        old, new = before.get(section) or {}, now.get(section) or {}
        for field_name in sorted(set(old) | set(new)):
            key = f"{section}.{field_name}"
            if key not in UNLEARNED_OPTIONS and old.get(field_name) != new.get(field_name):
                changed[key] = (old.get(field_name), new.get(field_name))
    return changed


def _record_start(exp_dir: Path, corpus_dir: Path, command: str | None, step: int,
                  changed: Mapping[str, tuple[Any, Any]]) -> None:
    """run.json: the corpus and the latest command, and every start of the run with the options it changed."""
    path = exp_dir / "run.json"
    starts = (json.loads(path.read_text()).get("starts") or []) if path.exists() and step > 0 else []
    starts.append({"step": step, "command": command, "changed": {k: list(v) for k, v in changed.items()}})
    run_info = {"corpus": str(corpus_dir.resolve()), "command": command, "starts": starts}
    path.write_text(json.dumps(run_info, indent=2) + "\n")


def training_utterances(corpus_dir: Path, data: DataOptions) -> list[Utterance]:
    """The corpus's training manifest followed by those of `data.extra_corpora`."""
    utterances = load_split(corpus_dir, data.train_split)
    for extra in map(Path, data.extra_corpora):
        _check_held_out_voices(corpus_dir, extra)
        utterances += load_split(extra, data.train_split)
    return utterances


def _check_held_out_voices(corpus_dir: Path, extra: Path) -> None:
    """An extra corpus that trains on a voice the main corpus holds out would void `test_unseen`."""
    def held_out(folder: Path) -> list[str] | None:
        info = folder / "build.json"
        return json.loads(info.read_text()).get("unseen_voices") if info.is_file() else None

    mine, theirs = held_out(corpus_dir), held_out(extra)
    if mine is None or theirs is None:
        log.warning("%s or %s has no build.json: cannot check that they hold out the same voices", corpus_dir, extra)
    elif sorted(mine) != sorted(theirs):
        raise ValueError(f"{extra} holds out other voices than {corpus_dir}: training on it would put "
                         "test_unseen voices in training (build it with the same --seed and --voices)")


@contextlib.contextmanager
def _stop_on_signals(request_stop: Callable[[], None]) -> Iterator[None]:
    """SIGINT and SIGTERM call request_stop the first time; a second SIGINT raises KeyboardInterrupt.
    Outside the main thread (where handlers cannot be set) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []

    def handle(signum: int, _frame: Any) -> None:
        if received and signum == signal.SIGINT:
            raise KeyboardInterrupt
        received.append(signum)
        request_stop()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _prepare_experiment(
    config: ExperimentConfig, train_utts: Sequence[Utterance], exp_dir: Path, init_from: Path | None = None
) -> tuple[Tokenizer, dict[str, Any], dict[str, tuple[Any, Any]]]:
    """Tokenizer, full model config, and the learning options `config` changes against EXPDIR's stored ones
    (`changed_options`): from EXPDIR when present (resume), from the `init_from` package, else trained and written
    there (nothing changed)."""
    tok_path, cfg_path = exp_dir / "tokenizer.model", exp_dir / "config.yaml"
    if init_from is not None and not (tok_path.exists() and cfg_path.exists()):
        tokenizer = _package_tokenizer_for(init_from, train_utts)
        tokenizer.save(tok_path)
        packaged = yaml.safe_load((init_from / "config.yaml").read_text())["model"]
        if config.train.init_partial:  # this config's architecture, the package's vocabulary
            packaged = {}
        # the package's architecture wins; the frontend stats come with its weights
        model_config = {**_model_section(config), **{k: v for k, v in packaged.items() if k not in (
            "specaug", "specaug_conf", "init")}}
        model_config.update(token_list=tokenizer.token_list, stats=None)
        _write_resolved(config, model_config, cfg_path)
        return tokenizer, model_config, {}
    if tok_path.exists() and cfg_path.exists():
        stored = yaml.safe_load(cfg_path.read_text())
        model_config = stored["model"]
        if _model_section(config) != {k: v for k, v in model_config.items() if k not in ("token_list", "stats")}:
            log.warning("model section differs from %s; keeping the stored one (it matches the checkpoint)",
                        cfg_path)
        changed = changed_options(stored, config)
        # the record (and the packaged card) shows the options this run goes on with, beside its command in run.json
        _write_resolved(config, model_config, cfg_path)
        return Tokenizer(tok_path), model_config, changed

    symbols = _label_symbols(train_utts)
    tokenizer = Tokenizer.train((u.text for u in train_utts), symbols, config.tokenizer)
    log.info("tokenizer: %d tokens (%d intent/markup symbols)", tokenizer.vocab_size, len(symbols))
    mean, std = sample_global_stats(train_utts, config.data.stats_utterances, config.train.seed)
    model_config = {
        **_model_section(config),
        "token_list": tokenizer.token_list,
        "stats": {"mean": mean.tolist(), "std": std.tolist()},
    }
    tokenizer.save(tok_path)
    _write_resolved(config, model_config, cfg_path)
    return tokenizer, model_config, {}


def _label_symbols(utterances: Sequence[Utterance]) -> list[str]:
    """The single-token intents and slot markup the utterances' targets need."""
    return target_symbols((u.intent for u in utterances), (t for u in utterances for t, _ in (u.slots or ())))


def _package_tokenizer_for(package: Path, train_utts: Sequence[Utterance]) -> Tokenizer:
    """The package's tokenizer, extended by the labels of `train_utts` it lacks (which it would read as <unk>)."""
    tokenizer = Tokenizer(package / "tokenizer.model")
    extended = tokenizer.with_symbols(_label_symbols(train_utts))
    added = extended.token_list[tokenizer.vocab_size - 1 : -1]  # appended before <sos/eos>
    if added:
        log.warning("warm start: the corpus has %d labels %s lacks, added as tokens: %s", len(added), package,
                    ", ".join(added))
    return extended


def _write_resolved(config: ExperimentConfig, model_config: dict[str, Any], cfg_path: Path) -> None:
    resolved = {**config.to_dict(), "model": model_config}
    write_text_atomic(cfg_path, yaml.safe_dump(resolved, sort_keys=False, default_flow_style=None, width=120))


def _model_section(config: ExperimentConfig) -> dict[str, Any]:
    """The model dict with train.specaug applied (SpecAug has no weights, so this never breaks a resume)."""
    model = copy.deepcopy(config.model)
    model.pop("token_list", None)
    model.pop("stats", None)
    if config.train.specaug:
        model["specaug"] = "specaug"
        model.setdefault("specaug_conf", DEFAULT_SPECAUG_CONF)
    else:
        model["specaug"] = None
    return model


def _load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> TrainState:
    state = TrainState(**restore_checkpoint(path, model, optimizer))
    state.best = [tuple(b) for b in state.best]
    return state


# what each "train" line of log.jsonl averages over its batches: ESPnet's loss and its parts, the intent loss
# (train.intent_loss_weight > 0), the distillation loss (train.teacher) and the decoder's token accuracy
LOGGED_STATS = ("loss", "loss_ctc", "loss_att", "loss_intent", "loss_distill", "acc")


class FirstTokenLoss:
    """Cross-entropy of the decoder's first output token (the intent, in PASU's targets) against the target's
    first token, read off the decoder pass ESPnet's loss already ran (a forward hook: no second pass)."""

    def __init__(self, decoder: torch.nn.Module):
        self.decoder_logits = TrainingDecoderLogits(decoder, "FirstTokenLoss")

    def __call__(self, text: torch.Tensor) -> torch.Tensor:
        """Mean over the batch; `text`: the (B, L) targets the model's forward pass just read."""
        first = self.decoder_logits.take()[:, 0]
        return torch.nn.functional.cross_entropy(first, text[:, 0], ignore_index=-1)


class _Loop:
    """The training loop with its bookkeeping (progress, log, evaluation, checkpoints)."""

    def __init__(
        self,
        config: ExperimentConfig,
        model: ESPnetASRModel,
        optimizer: torch.optim.Optimizer,
        tokenizer: Tokenizer,
        state: TrainState,
        train_utts: Sequence[Utterance],
        dev_utts: Sequence[Utterance],
        exp_dir: Path,
        device: torch.device,
    ):
        self.config, self.model, self.optimizer, self.tokenizer = config, model, optimizer, tokenizer
        self.state, self.exp_dir, self.device = state, exp_dir, device
        self.train_utts, self.dev_utts = train_utts, dev_utts
        self.dataset = SpeechDataset(train_utts, tokenizer)
        self.durations = [u.duration for u in train_utts]
        self.log_file = open(exp_dir / "log.jsonl", "a")
        self.step_times: list[float] = []
        self.window: dict[str, float] = {}
        self.final_dev: DevResult | None = None
        self.intent_loss = FirstTokenLoss(model.decoder) if config.train.intent_loss_weight > 0 else None
        self.distillation = None
        if config.train.teacher is not None:
            teacher = load_teacher(config.train.teacher, tokenizer.token_list, device)
            self.distillation = DecoderDistillation(model, teacher, config.train.distill_temperature)

    def run(self) -> TrainResult:
        opts = self.config.train
        batches_per_epoch = len(bucket_batches(self.durations, self.config.data.batch_seconds))
        steps_per_epoch = max(batches_per_epoch // self.config.optim.accum_grad, 1)
        limits = [n for n in (opts.max_steps, opts.max_epochs and opts.max_epochs * steps_per_epoch)
                  if n is not None]
        total = min(limits) if limits else None  # None: time-boxed only
        if batches_per_epoch == 0:
            raise ValueError("the training split is empty")
        self.total_steps = total
        self.last_ckpt = self.last_eval = self.run_start = time.monotonic()
        self.elapsed_before = self.state.elapsed
        start_step = self.state.step
        (self.exp_dir / STOP_FILE).unlink(missing_ok=True)  # a stale request must not end this run
        self.stop_requested = False
        initial = min(self.state.step, total or self.state.step)
        with _stop_on_signals(self._request_stop), tqdm(total=total, initial=initial, unit="step",
                                                        dynamic_ncols=True) as bar:
            self.bar = bar
            while not self._done():
                self._run_epoch()
        if self.state.last_eval_step != self.state.step or self.final_dev is None:
            self._evaluate()
        self._save_checkpoint()
        averaged = self._average()
        result = TrainResult(self.exp_dir, self.state.step, self._seconds_per_step(), self.final_dev, averaged)
        self._write_summary(result, self.state.step - start_step)
        self.log_file.close()
        return result

    def _request_stop(self) -> None:
        log.warning("stopping after this step (once more to abort)")
        self.stop_requested = True

    def _done(self) -> bool:
        opts = self.config.train
        if not self.stop_requested and (self.exp_dir / STOP_FILE).exists():
            log.warning("%s found: stopping after this step", self.exp_dir / STOP_FILE)
            self.stop_requested = True
        return (
            self.stop_requested
            or (opts.max_steps is not None and self.state.step >= opts.max_steps)
            or (opts.max_epochs is not None and self.state.epoch >= opts.max_epochs)
            or (opts.max_minutes is not None and time.monotonic() - self.run_start >= 60 * opts.max_minutes)
        )

    def _run_epoch(self) -> None:
        s = self.state
        batches = bucket_batches(self.durations, self.config.data.batch_seconds, self.config.train.seed, s.epoch)
        accum = self.config.optim.accum_grad
        self.model.train()
        loader = batch_loader(self.dataset, batches[s.batch_in_epoch :], self.config.data.num_workers)
        tick = time.perf_counter()
        for batch in loader:
            s.batch_in_epoch += 1
            self._forward_backward(batch, accum)
            if s.batch_in_epoch % accum and s.batch_in_epoch < len(batches):
                continue
            self._optimizer_step()
            self.step_times.append(time.perf_counter() - tick)
            self._after_step()
            if self._done():
                return
            tick = time.perf_counter()
        s.epoch += 1
        s.batch_in_epoch = 0

    def _forward_backward(self, batch: Batch, accum: int) -> None:
        inputs = batch.model_inputs(self.device)
        loss, stats, _ = self.model(**inputs)
        if self.intent_loss is not None:
            intent_loss = self.intent_loss(inputs["text"])
            loss = loss + self.config.train.intent_loss_weight * intent_loss
            stats["loss_intent"] = intent_loss.detach()
        if self.distillation is not None:
            distill_loss = self.distillation(**inputs)
            loss = loss + self.config.train.distill_weight * distill_loss
            stats["loss_distill"] = distill_loss.detach()
        if not torch.isfinite(loss):
            log.debug("non-finite loss on batch %s; skipped", batch.ids[:3])
            self._accumulate({"skipped_batches": 1.0})
            return
        (loss / accum).backward()
        values = {k: float(stats[k]) for k in LOGGED_STATS if stats.get(k) is not None}
        self._accumulate({**values, "batches": 1.0, "utterances": float(len(batch.ids))})

    def _optimizer_step(self) -> None:
        s = self.state
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.optim.grad_clip)
        lr = learning_rate(s.step + 1, self.config.optim, self.total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        finite = bool(torch.isfinite(grad_norm))
        if finite:  # as ESPnet's trainer: a non-finite gradient skips the update, the step still counts
            self.optimizer.step()
        else:
            s.skipped_steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        s.step += 1
        self._accumulate({"grad_norm": float(grad_norm) if finite else 0.0, "lr": lr, "steps": 1.0,
                          "skipped_steps": 0.0 if finite else 1.0})

    def _accumulate(self, values: dict[str, float]) -> None:
        for k, v in values.items():
            self.window[k] = self.window.get(k, 0.0) + v

    def _after_step(self) -> None:
        s, opts, eopts = self.state, self.config.train, self.config.eval
        w = self.window
        batches = max(w.get("batches", 0.0), 1.0)
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{w.get('loss', math.nan) / batches:.2f}",
                             lr=f"{w.get('lr', 0.0) / max(w.get('steps', 1.0), 1.0):.1e}",
                             s_step=f"{self._seconds_per_step():.2f}", epoch=s.epoch)
        if s.step % opts.log_interval_steps == 0:
            self._log_train()
        now = time.monotonic()
        if (eopts.interval_steps and s.step % eopts.interval_steps == 0) or (
            eopts.interval_minutes is not None and now - self.last_eval >= 60 * eopts.interval_minutes
        ):
            self._evaluate()
        if (opts.checkpoint_steps and s.step % opts.checkpoint_steps == 0) or (
            now - self.last_ckpt >= 60 * opts.checkpoint_minutes
        ):
            self._save_checkpoint()

    def _log_train(self) -> None:
        w, self.window = self.window, {}
        batches, steps = max(w.pop("batches", 0.0), 1.0), max(w.pop("steps", 0.0), 1.0)
        line = {"kind": "train", "step": self.state.step, "epoch": self.state.epoch, "time": time.time(),
                "s_per_step": self._seconds_per_step(window=int(steps))}
        for k in LOGGED_STATS:
            if k in w:
                line[k] = w[k] / batches
        skipped = w.get("skipped_steps", 0.0)
        line.update(lr=w.get("lr", 0.0) / steps, grad_norm=w.get("grad_norm", 0.0) / max(steps - skipped, 1.0),
                    utterances=w.get("utterances", 0.0), skipped_steps=skipped,
                    skipped_batches=w.get("skipped_batches", 0.0))
        self._write_log(line)
        if skipped or w.get("skipped_batches"):
            self.bar.write(f"warning: steps {self.state.step - int(steps) + 1}-{self.state.step}: {int(skipped)} "
                           f"updates skipped (non-finite gradient), {int(w.get('skipped_batches', 0))} batches "
                           "skipped (non-finite loss)")

    def _write_log(self, line: dict[str, Any]) -> None:
        self.log_file.write(json.dumps(line) + "\n")
        self.log_file.flush()

    def _seconds_per_step(self, window: int = 50) -> float:
        recent = self.step_times[-window:]
        return sum(recent) / len(recent) if recent else math.nan

    def _evaluate(self) -> None:
        s, eopts = self.state, self.config.eval
        if not self.dev_utts:
            log.warning("no dev utterances: skipping evaluation (nothing will be averaged)")
            return
        result = evaluate(self.model, self.tokenizer, self.dev_utts, self.config.data.batch_seconds, self.device)
        self.last_eval, s.last_eval_step, self.final_dev = time.monotonic(), s.step, result
        self._write_log({"kind": "dev", "step": s.step, "epoch": s.epoch, "time": time.time(),
                         **dataclasses.asdict(result)})
        self.bar.write(f"step {s.step} dev: loss {result.loss:.2f} acc {result.acc:.3f} wer {result.wer:.3f} "
                       f"intent {result.intent_accuracy:.3f} slu_f1 {result.slu_f1:.3f} ({result.seconds:.0f}s)")
        self._update_best(getattr(result, eopts.best_metric))

    def _update_best(self, value: float) -> None:
        """Keep the snapshot if it ranks among the keep_best best; delete the one it pushes out."""
        s, eopts = self.state, self.config.eval
        if eopts.best_metric not in HIGHER_IS_BETTER:
            raise ValueError(f"unknown best_metric {eopts.best_metric!r}; choose from {sorted(HIGHER_IS_BETTER)}")
        sign = 1.0 if HIGHER_IS_BETTER[eopts.best_metric] else -1.0
        if not math.isfinite(value):
            return
        snap_dir = self.exp_dir / "snapshots"
        snap_dir.mkdir(exist_ok=True)
        name = f"step{s.step:08d}.pt"
        entries = [b for b in s.best if b[1] != s.step] + [(value, s.step, name)]
        # Best first; on equal metric the later step wins (it has trained longer).
        entries.sort(key=lambda b: (sign * b[0], b[1]), reverse=True)
        keep, drop = entries[: eopts.keep_best], entries[eopts.keep_best :]
        if any(b[1] == s.step for b in keep):
            atomic_save(self.model.state_dict(), snap_dir / name)
        for _, _, old in drop:
            (snap_dir / old).unlink(missing_ok=True)
        s.best = keep

    def _save_checkpoint(self) -> None:
        s = self.state
        s.elapsed = self.elapsed_before + time.monotonic() - self.run_start
        save_checkpoint(self.exp_dir / "checkpoint.pt", self.model, self.optimizer, dataclasses.asdict(s))
        self.last_ckpt = time.monotonic()

    def _average(self) -> Path | None:
        paths = [self.exp_dir / "snapshots" / name for _, _, name in self.state.best]
        paths = [p for p in paths if p.exists()]
        if not paths:
            return None
        out = self.exp_dir / AVERAGED_WEIGHTS
        atomic_save(average_state_dicts(paths), out)
        log.info("averaged %d snapshots (steps %s) into %s", len(paths), [b[1] for b in self.state.best], out)
        return out

    def _write_summary(self, result: TrainResult, steps_this_run: int) -> None:
        summary = {
            "steps": result.steps,
            "epoch": self.state.epoch,
            "steps_this_run": steps_this_run,
            "seconds_per_step": result.seconds_per_step,
            "train_seconds": self.state.elapsed,
            "num_threads": self.config.train.num_threads,
            "skipped_steps": self.state.skipped_steps,
            "parameters": count_parameters(self.model),
            "vocab_size": self.tokenizer.vocab_size,
            "averaged_steps": [b[1] for b in self.state.best],
            "best_metric": self.config.eval.best_metric,
            "final_dev": None if result.final_dev is None else dataclasses.asdict(result.final_dev),
        }
        (self.exp_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        print(f"trained {result.steps} steps; {result.seconds_per_step:.3f} s/step "
              f"({self.config.train.num_threads} threads); averaged -> {result.averaged}")
