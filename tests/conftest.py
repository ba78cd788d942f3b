"""Settings every test shares."""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread: the 2-core machine is often shared with a training job, and train() uses one too."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
