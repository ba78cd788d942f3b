"""Splitting a pack into parts that each fit one call to a lent GPU, and training boxed in wall time."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from pasu.models.gpu_lease import TimeBoxedTraining, fill_parts


def _staged(tmp_path, sizes):
    staged = tmp_path / "staged"
    staged.mkdir()
    files = []
    for n, size in enumerate(sizes):
        (staged / f"f{n}").write_bytes(b"x" * size)
        files.append((f"f{n}", [{"id": f"u{n}"}]))
    return staged, files


def test_files_go_to_parts_in_order_each_under_the_budget(tmp_path):
    staged, files = _staged(tmp_path, [400_000, 400_000, 400_000, 100_000])
    parts = fill_parts(tmp_path / "pack", staged, files, part_mib=1.0)
    assert [sorted(f.name for f in p.iterdir()) for p in parts] == [["f0", "f1"], ["f2", "f3"]]
    assert [[r["id"] for r in rows] for rows in parts.values()] == [["u0", "u1"], ["u2", "u3"]]
    row_bytes = len(json.dumps({"id": "u0"})) + 2
    assert all(sum(f.stat().st_size for f in p.iterdir()) + 2 * row_bytes <= 2**20 for p in parts)
    assert not staged.exists()


def test_what_part0_already_holds_counts_against_its_budget(tmp_path):
    staged, files = _staged(tmp_path, [400_000, 400_000])
    parts = fill_parts(tmp_path / "pack", staged, files, part_mib=1.0, part0_bytes=500_000)
    assert [sorted(f.name for f in p.iterdir()) for p in parts] == [["f0"], ["f1"]]


def test_a_file_over_the_budget_still_gets_a_part_of_its_own(tmp_path):
    staged, files = _staged(tmp_path, [2 * 2**20, 1000])
    parts = fill_parts(tmp_path / "pack", staged, files, part_mib=1.0)
    assert [sorted(f.name for f in p.iterdir()) for p in parts] == [["f0"], ["f1"]]


class _LineFit(TimeBoxedTraining):
    """y = 3x by one weight, from 0: each step moves the weight towards 3 and lowers the dev loss."""

    def __init__(self, out, minutes=0.01, average_last=3):
        torch.manual_seed(0)
        self.model = torch.nn.Linear(1, 1, bias=False)
        torch.nn.init.zeros_(self.model.weight)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.x = torch.linspace(-1, 1, 16)[:, None]
        options = SimpleNamespace(minutes=minutes, lr=0.1, warmup_steps=2, grad_clip=10.0, eval_seconds=0.0)
        super().__init__(options, out, self.model.parameters(), average_last)

    def batch_loss(self):
        return ((self.model(self.x) - 3 * self.x) ** 2).mean()

    def dev_loss(self):
        with torch.no_grad():
            return float(self.batch_loss())


def test_the_box_keeps_the_lowest_dev_loss_state_and_averages_the_last_ones(tmp_path):
    fit = _LineFit(tmp_path)
    assert fit.best_step == 0 and fit.history[0]["dev_loss"] == pytest.approx(9 * float((fit.x**2).mean()))
    fit.run()
    assert fit.step >= 3 and len(fit.history) == fit.step + 1  # an evaluation after every step (eval_seconds 0)
    losses = [h["dev_loss"] for h in fit.history]
    assert fit.best_loss == min(losses) < losses[0] and fit.best_step == fit.history[losses.index(min(losses))]["step"]
    assert fit.history[1]["lr"] == pytest.approx(0.05, rel=0.2)  # half warmed up (and barely decayed) at step 1
    assert fit.history[-1]["lr"] < 0.02  # the last step began in the box's last fifth: the rate decayed near 0
    steps = [s for s, _ in fit.recent]
    assert steps == [h["step"] for h in fit.history[-3:]]
    mean = sum(state["weight"] for _, state in fit.recent) / 3
    assert torch.allclose(fit.averaged_recent()["weight"], mean)
    assert json.loads((tmp_path / "history.json").read_text()) == fit.history


def test_the_model_as_it_came_is_kept_when_training_never_beats_it(tmp_path):
    class Worse(_LineFit):
        def batch_loss(self):  # trains towards y = -3x
            return ((self.model(self.x) + 3 * self.x) ** 2).mean()

        def dev_loss(self):
            with torch.no_grad():
                return float(((self.model(self.x) - 3 * self.x) ** 2).mean())

    fit = Worse(tmp_path)
    fit.run()
    assert fit.best_step == 0 and torch.all(fit.best_state["weight"] == 0)
