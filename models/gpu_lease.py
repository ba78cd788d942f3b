"""What fine-tuning on a GPU lent for a few minutes needs beside the model: data split into part folders that each
fit one call (a call carries 64 MiB, the checkout included), and a training loop boxed in wall time."""

from __future__ import annotations

import copy
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path

import torch

log = logging.getLogger(__name__)


def fill_parts(out: Path, staged: Path, files: Sequence[tuple[str, list[dict]]], part_mib: float,
               part0_bytes: int = 0) -> dict[Path, list[dict]]:
    """Move the `staged` files into out/part0, part1, ... in order, each part under `part_mib` with its index rows
    counted (part0 starts with `part0_bytes` in it: weights or a header written beside); the rows of each part.
    `staged` is removed once empty."""
    folder, size = out / "part0", part0_bytes
    folder.mkdir(parents=True, exist_ok=True)
    parts: dict[Path, list[dict]] = {folder: []}
    for name, rows in files:
        added = (staged / name).stat().st_size + sum(len(json.dumps(r)) + 2 for r in rows)
        if size > 0 and size + added > part_mib * 2**20:
            folder, size = out / f"part{len(parts)}", 0
            folder.mkdir(exist_ok=True)
            parts[folder] = []
        (staged / name).rename(folder / name)
        parts[folder] += rows
        size += added
    staged.rmdir()
    return parts


class TimeBoxedTraining:
    """Training for `options.minutes` of wall time: the learning rate warms up over `options.warmup_steps` to
    `options.lr` and decays linearly to 0 over the box; every `options.eval_seconds` (and at the end) the dev loss
    is measured, and the lowest-loss state (at first, the model as it came) and the last `average_last` evaluated
    states are kept. A subclass sets `model` and `optimizer`, then calls this __init__, and gives `batch_loss`
    (one training batch's loss) and `dev_loss`."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer

    def __init__(self, options: object, out: Path, clipped: Sequence[torch.nn.Parameter], average_last: int = 1):
        self.options, self.out, self.clipped, self.average_last = options, out, list(clipped), average_last
        self.step = 0
        self.best_loss, self.best_step = self.dev_loss(), 0
        self.best_state = copy.deepcopy(self.model.state_dict())
        self.recent: list[tuple[int, dict[str, torch.Tensor]]] = []
        self.history: list[dict] = [{"step": 0, "dev_loss": self.best_loss, "seconds": 0.0}]
        log.info("step 0: dev loss %.4f", self.best_loss)

    def batch_loss(self) -> torch.Tensor:
        raise NotImplementedError

    def dev_loss(self) -> float:
        raise NotImplementedError

    def run(self) -> None:
        started = last_eval = time.monotonic()
        budget = 60.0 * self.options.minutes
        while (elapsed := time.monotonic() - started) < budget:
            loss = self._train_step(elapsed / budget)
            now = time.monotonic()
            if now - last_eval >= self.options.eval_seconds or now - started >= budget:
                self._evaluate(loss, round(now - started, 1))
                last_eval = time.monotonic()

    def averaged_recent(self) -> dict[str, torch.Tensor]:
        """The mean of the recent evaluated states (integer tensors: the first's)."""
        first = self.recent[0][1]
        return {k: sum(s[k].float() for _, s in self.recent) / len(self.recent) if v.is_floating_point() else v
                for k, v in first.items()}

    def _train_step(self, spent: float) -> float:
        """One batch at the learning rate of this step and this share of the box (`spent`)."""
        self.step += 1
        for group in self.optimizer.param_groups:
            group["lr"] = self.options.lr * min(1.0, self.step / self.options.warmup_steps) * max(0.0, 1.0 - spent)
        loss = self.batch_loss()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.clipped, self.options.grad_clip)
        self.optimizer.step()
        return loss.item()

    def _evaluate(self, train_loss: float, seconds: float) -> None:
        current = self.dev_loss()
        lr = self.optimizer.param_groups[0]["lr"]
        self.history.append({"step": self.step, "dev_loss": current, "train_loss": train_loss, "lr": lr,
                             "seconds": seconds})
        log.info("step %d (%.0f s): train loss %.4f, dev loss %.4f (best %.4f), lr %.2e", self.step, seconds,
                 train_loss, current, min(self.best_loss, current), lr)
        state = copy.deepcopy(self.model.state_dict())
        if current < self.best_loss:
            self.best_loss, self.best_step, self.best_state = current, self.step, state
        self.recent = (self.recent + [(self.step, state)])[-self.average_last :]
        (self.out / "history.json").write_text(json.dumps(self.history, indent=1))
