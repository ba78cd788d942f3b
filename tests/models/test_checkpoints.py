"""Checkpoints every trainer shares: a restored run draws what an unbroken one draws; snapshot averaging."""

import random

import numpy as np
import pytest
import torch

from pasu.models.checkpoints import average_state_dicts, count_parameters, restore_checkpoint, save_checkpoint


def _draws() -> tuple:
    return torch.rand(3).tolist(), np.random.rand(3).tolist(), [random.random() for _ in range(3)]


def test_a_restored_checkpoint_continues_the_run_it_saved(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(8, 4)).sum().backward()
    optimizer.step()
    save_checkpoint(tmp_path / "checkpoint.pt", model, optimizer, {"step": 1})
    expected = _draws()  # what the run would draw next

    fresh = torch.nn.Linear(4, 2)
    fresh_optimizer = torch.optim.Adam(fresh.parameters(), lr=0.1)
    torch.manual_seed(123), np.random.seed(123), random.seed(123)
    state = restore_checkpoint(tmp_path / "checkpoint.pt", fresh, fresh_optimizer)

    assert state == {"step": 1}
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))
    assert fresh_optimizer.state_dict()["state"][0]["step"] == 1  # Adam's moments came back too
    assert _draws() == expected
    assert not (tmp_path / "checkpoint.pt.tmp").exists()


def test_restoring_into_another_shape_fails(tmp_path):
    model = torch.nn.Linear(4, 2)
    save_checkpoint(tmp_path / "checkpoint.pt", model, torch.optim.SGD(model.parameters(), lr=0.1), {})
    other = torch.nn.Linear(4, 3)
    with pytest.raises(RuntimeError):
        restore_checkpoint(tmp_path / "checkpoint.pt", other, torch.optim.SGD(other.parameters(), lr=0.1))


def test_average_state_dicts(tmp_path):
    paths = []
    for i, value in enumerate([1.0, 2.0, 6.0]):
        paths.append(tmp_path / f"{i}.pt")
        torch.save({"w": torch.full((2,), value), "n": torch.tensor(i)}, paths[-1])
    avg = average_state_dicts(paths)
    assert torch.allclose(avg["w"], torch.full((2,), 3.0)) and avg["w"].dtype == torch.float32
    assert avg["n"] == 0  # integer buffers are not averaged
    with pytest.raises(ValueError):
        average_state_dicts([])


def test_count_parameters():
    assert count_parameters(torch.nn.Linear(4, 2)) == 10
