"""pasu.torch_threads: threads we start use the torch thread count the process asked for."""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

import pytest
import torch

from pasu.torch_threads import adopt_torch_threads, set_torch_threads


def _openmp_max_threads() -> ctypes._CFuncPtr:
    """omp_get_max_threads of the OpenMP runtime torch uses (per calling thread). Other packages (CTranslate2,
    scikit-learn) bring their own copies of libgomp, so torch's is the one in torch's folder, or the only one."""
    with open("/proc/self/maps") as maps:
        libs = {line.split()[-1] for line in maps if "libgomp" in line or "libiomp" in line}
    torch_dir = str(Path(torch.__file__).parent)
    ours = sorted(lib for lib in libs if lib.startswith(torch_dir)) or (sorted(libs) if len(libs) == 1 else [])
    if not ours:
        pytest.skip(f"cannot tell which OpenMP runtime is torch's among {sorted(libs)}")
    function = ctypes.CDLL(ours[0]).omp_get_max_threads
    function.restype = ctypes.c_int
    return function


def _in_new_thread(work) -> int:
    out = []
    thread = threading.Thread(target=lambda: out.append(work()))
    thread.start()
    thread.join()
    return out[0]


def test_a_new_thread_adopts_the_process_torch_thread_count():
    torch.zeros(1) @ torch.zeros(1)  # make sure the OpenMP runtime is loaded
    max_threads = _openmp_max_threads()
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        if len(os.sched_getaffinity(0)) > 1 and "OMP_NUM_THREADS" not in os.environ:
            assert _in_new_thread(max_threads) > 1  # the fault this guards against: OpenMP's default
        assert _in_new_thread(lambda: (adopt_torch_threads(), max_threads())[1]) == 1
    finally:
        torch.set_num_threads(before)


def test_set_torch_threads_sets_the_count_and_survives_a_second_call():
    before = torch.get_num_threads()
    try:
        set_torch_threads(1)
        set_torch_threads(1)  # resuming in the same process: inter-op threads can no longer change
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
