"""Torch's thread counts: for a process (a training run, the device agent), and in threads we start ourselves.

`torch.set_num_threads` stores the count for ATen, but OpenMP keeps its own count per OS thread: a thread
started later runs its BLAS and oneDNN calls with OpenMP's default, every core. On the 2-core device that
made the agent's worker use two threads where one was asked for (with OMP_WAIT_POLICY=ACTIVE the second
one spins), so its decoding ran ~10% slower than the same work on the main thread.
"""

from __future__ import annotations

import torch


def adopt_torch_threads() -> None:
    """Make the calling thread use the process's torch thread count (call first thing in a new thread)."""
    torch.set_num_threads(torch.get_num_threads())


def set_torch_threads(n: int) -> None:
    """`n` threads for the process's operators and one for inter-op work (settable only before any)."""
    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(1)  # only allowed before any parallel work: fine to miss on resume
    except RuntimeError:
        pass
