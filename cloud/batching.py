"""Dynamic micro-batching with admission control, on the server's asyncio loop.

Requests wait in a bounded queue. One collector task takes the first waiting request, gathers more until it
has `max_batch_size` or `max_wait_ms` have passed since the first arrived, drops the ones whose deadline has already
expired (their callers get DeadlineExpired, the model never sees them), and runs one `run_batch` call in a
worker thread. While that call runs, new requests queue up and form the next batch, so under load batches
grow by themselves and at low load a request waits at most `max_wait_ms`.

One batch runs at a time: the model already uses every core it is given (torch intra-op threads), and two
concurrent batches would only fight for them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

R = TypeVar("R")


@dataclass(frozen=True)
class BatchingOptions:
    max_batch_size: int = 8  # requests per run_batch call
    max_wait_ms: float = 10.0  # the first request of a batch waits at most this long for others
    max_queue: int = 32  # waiting requests (not counting the running batch) before QueueFull


class QueueFull(Exception):
    """Admission refused: `pending` requests already wait."""

    def __init__(self, pending: int):
        super().__init__(f"queue full ({pending} pending)")
        self.pending = pending


class DeadlineExpired(Exception):
    """The request's deadline passed while it waited; it was not run."""


@dataclass(frozen=True)
class BatchOutcome(Generic[R]):
    """One request's result and what it cost."""

    result: R
    queue_ms: float  # from submit to its batch starting
    inference_ms: float  # the whole batch call
    batch_size: int  # requests in that call


@dataclass
class _Pending:
    waveform: np.ndarray
    deadline: float | None  # loop.time() after which running it is pointless; None: no deadline
    submitted: float  # loop.time() at submit
    future: asyncio.Future


class BatchObserver:
    """Hooks for metrics; the default does nothing."""

    def queue_depth(self, depth: int) -> None: ...
    def batch(self, size: int, seconds: float) -> None: ...
    def expired(self, count: int) -> None: ...


class MicroBatcher(Generic[R]):
    """Collects concurrent `submit` calls into `run_batch(waveforms)` calls (see the module doc)."""

    def __init__(self, run_batch: Callable[[list[np.ndarray]], Sequence[R]], options: BatchingOptions,
                 observer: BatchObserver | None = None, executor: Executor | None = None):
        if options.max_batch_size < 1 or options.max_queue < 1:
            raise ValueError("max_batch_size and max_queue must be at least 1")
        self.run_batch = run_batch
        self.options = options
        self.observer = observer or BatchObserver()
        self._executor = executor or ThreadPoolExecutor(max_workers=1, thread_name_prefix="pasu-infer")
        self._queue: asyncio.Queue[_Pending] | None = None
        self._task: asyncio.Task | None = None

    @property
    def pending(self) -> int:
        """Requests waiting for a batch (not counting the one running)."""
        return self._queue.qsize() if self._queue is not None else 0

    def start(self) -> None:
        """Start the collector on the running loop."""
        self._queue = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._collect_forever(), name="pasu-batcher")

    async def close(self) -> None:
        """Stop collecting; requests still waiting fail with CancelledError. Call after the RPCs drained."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        while self._queue is not None and not self._queue.empty():
            self._queue.get_nowait().future.cancel()
        # Not wait=True: that would block the event loop until a batch cut off by the cancel finishes.
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def submit(self, waveform: np.ndarray, timeout_s: float | None = None) -> BatchOutcome[R]:
        """Queue one waveform and wait for its result; QueueFull at once when the queue is at its bound."""
        if self._queue is None:
            raise RuntimeError("MicroBatcher.start() was not called")
        if self._queue.qsize() >= self.options.max_queue:
            raise QueueFull(self._queue.qsize())
        loop = asyncio.get_running_loop()
        now = loop.time()
        item = _Pending(waveform, None if timeout_s is None else now + timeout_s, now, loop.create_future())
        self._queue.put_nowait(item)
        self.observer.queue_depth(self._queue.qsize())
        # If our caller is cancelled (client gone, deadline hit), the future is cancelled with it and the
        # collector skips it.
        return await item.future

    async def _collect_forever(self) -> None:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._next_batch(loop)
            self.observer.queue_depth(self._queue.qsize())
            batch = self._drop_dead(batch, loop.time())
            if batch:
                await self._run(batch, loop)

    async def _next_batch(self, loop: asyncio.AbstractEventLoop) -> list[_Pending]:
        assert self._queue is not None
        batch = [await self._queue.get()]
        # Counted from the first request's arrival: one that already waited out a running batch takes
        # whatever else is queued and goes, instead of waiting again.
        close_at = batch[0].submitted + self.options.max_wait_ms / 1000.0
        while len(batch) < self.options.max_batch_size:
            if not self._queue.empty():  # take what is already there without waiting
                batch.append(self._queue.get_nowait())
                continue
            remaining = close_at - loop.time()
            if remaining <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), remaining))
            except TimeoutError:
                break
        return batch

    def _drop_dead(self, batch: list[_Pending], now: float) -> list[_Pending]:
        """Skip cancelled requests and fail expired ones before they cost model time."""
        alive, expired = [], 0
        for item in batch:
            if item.future.done():
                continue
            if item.deadline is not None and now >= item.deadline:
                item.future.set_exception(DeadlineExpired(f"deadline passed {now - item.deadline:.3f} s ago"))
                expired += 1
                continue
            alive.append(item)
        if expired:
            self.observer.expired(expired)
        return alive

    async def _run(self, batch: list[_Pending], loop: asyncio.AbstractEventLoop) -> None:
        started = loop.time()
        t0 = time.perf_counter()
        try:
            results = await loop.run_in_executor(self._executor, self.run_batch, [p.waveform for p in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"run_batch returned {len(results)} results for {len(batch)} inputs")
        except asyncio.CancelledError:
            for item in batch:
                item.future.cancel()
            raise
        except Exception as error:
            if len(batch) > 1:
                # One bad input must not fail its batch-mates: run them one by one to find it.
                for item in batch:
                    await self._run([item], loop)
            elif not batch[0].future.done():
                batch[0].future.set_exception(error)
            return
        seconds = time.perf_counter() - t0
        self.observer.batch(len(batch), seconds)
        for item, result in zip(batch, results, strict=True):
            if not item.future.done():
                item.future.set_result(
                    BatchOutcome(result, (started - item.submitted) * 1000.0, seconds * 1000.0, len(batch)))
