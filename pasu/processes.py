"""Work spread over processes with one core and one torch thread each: replays and decodes that time themselves.

On a small machine one process with two torch threads gains little on a single utterance's small matrices, and
its timings mix the two cores' work; two processes with one thread each finish a split in about half the time and
each times its own work as a device with one core would. Processes are spawned (a fresh interpreter: no forked
torch thread pools); what every item needs (a model) is pickled once per process, not once per item.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, TypeVar

from pasu.torch_threads import set_torch_threads

Item = TypeVar("Item")
Result = TypeVar("Result")

_shared: list[Any] = []  # in a worker process: the `shared` object map_in_processes handed it


def map_in_processes(work: Callable[[Any, Item], Result], shared: Any, items: Sequence[Item], jobs: int,
                     progress: Callable[[int, int], None] | None = None) -> list[Result]:
    """[work(shared, item) for item in items], computed by `jobs` processes (`work`: a module-level function);
    `progress(done, total)` after each item, in the order they finish."""
    if jobs <= 1 or len(items) <= 1:
        return _map_here(work, shared, items, progress)
    results: list[Any] = [None] * len(items)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(min(jobs, len(items)), mp_context=context, initializer=_start,
                             initargs=(shared,)) as pool:
        positions = {pool.submit(_run, work, item): i for i, item in enumerate(items)}
        for done, future in enumerate(as_completed(positions), 1):
            results[positions[future]] = future.result()
            if progress:
                progress(done, len(items))
    return results


def _map_here(work: Callable[[Any, Item], Result], shared: Any, items: Sequence[Item],
              progress: Callable[[int, int], None] | None) -> list[Result]:
    results = []
    for item in items:
        results.append(work(shared, item))
        if progress:
            progress(len(results), len(items))
    return results


def _start(shared: Any) -> None:
    set_torch_threads(1)
    _shared.append(shared)


def _run(work: Callable[[Any, Item], Result], item: Item) -> Result:
    return work(_shared[0], item)
