"""pasu.torch_threads: threads we start use the torch thread count the process asked for."""

from __future__ import annotations

import ctypes
import os
import threading

import pytest
import torch

from pasu.torch_threads import adopt_torch_threads


def _openmp_max_threads() -> ctypes._CFuncPtr:
    """omp_get_max_threads of the OpenMP runtime torch loaded (per calling thread)."""
    with open("/proc/self/maps") as maps:
        libs = {line.split()[-1] for line in maps if "libgomp" in line or "libiomp" in line}
    if not libs:
        pytest.skip("torch is not built with an OpenMP runtime here")
    function = ctypes.CDLL(sorted(libs)[0]).omp_get_max_threads
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
