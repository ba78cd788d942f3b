"""The server's parts on their own: token checks, the micro-batcher's rules (the config: test_config.py)."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from pasu.cloud.auth import bearer_token, token_matches
from pasu.cloud.batching import BatchingOptions, DeadlineExpired, MicroBatcher, QueueFull

# --- Auth -------------------------------------------------------------------------------------------------


def test_bearer_token_parsing_and_matching():
    assert bearer_token([("authorization", "Bearer abc")]) == "abc"
    assert bearer_token([("x", "y"), ("authorization", b"bearer  abc ")]) == "abc"
    assert bearer_token([("authorization", "Basic abc")]) is None
    assert bearer_token([("authorization", "Bearer ")]) is None
    assert bearer_token(None) is None
    assert token_matches("b", ["a", "b"]) and not token_matches("c", ["a", "b"]) and not token_matches("a", [])


# --- Batching ---------------------------------------------------------------------------------------------


def _lengths(calls: list[list[int]], delay: float = 0.0):
    def run(waveforms):
        calls.append([len(w) for w in waveforms])
        time.sleep(delay)
        return [len(w) for w in waveforms]
    return run


def test_batcher_collects_concurrent_requests_up_to_the_batch_size():
    calls: list[list[int]] = []

    async def main():
        batcher = MicroBatcher(_lengths(calls), BatchingOptions(max_batch_size=3, max_wait_ms=200, max_queue=10))
        batcher.start()
        outcomes = await asyncio.gather(*(batcher.submit(np.zeros(n)) for n in (1, 2, 3, 4)))
        await batcher.close()
        return outcomes

    outcomes = asyncio.run(main())
    assert [o.result for o in outcomes] == [1, 2, 3, 4]
    assert calls == [[1, 2, 3], [4]]
    assert [o.batch_size for o in outcomes] == [3, 3, 3, 1]


def test_batcher_waits_at_most_max_wait_for_company():
    async def main():
        batcher = MicroBatcher(_lengths([]), BatchingOptions(max_batch_size=8, max_wait_ms=50, max_queue=10))
        batcher.start()
        t0 = time.perf_counter()
        outcome = await batcher.submit(np.zeros(5))
        await batcher.close()
        return outcome, time.perf_counter() - t0

    outcome, elapsed = asyncio.run(main())
    assert outcome.batch_size == 1 and 0.04 < elapsed < 1.0 and outcome.queue_ms >= 40


def test_batcher_refuses_beyond_the_queue_bound_and_drops_expired():
    calls: list[list[int]] = []

    async def main():
        batcher = MicroBatcher(_lengths(calls, delay=0.3), BatchingOptions(max_batch_size=1, max_wait_ms=0,
                                                                           max_queue=2))
        batcher.start()
        running = asyncio.ensure_future(batcher.submit(np.zeros(1)))
        await asyncio.sleep(0.05)  # the first is in the model now
        expiring = asyncio.ensure_future(batcher.submit(np.zeros(2), timeout_s=0.1))
        waiting = asyncio.ensure_future(batcher.submit(np.zeros(3)))
        await asyncio.sleep(0)
        with pytest.raises(QueueFull, match=r"queue full \(2 pending\)"):
            await batcher.submit(np.zeros(4))
        results = await asyncio.gather(running, expiring, waiting, return_exceptions=True)
        await batcher.close()
        return results

    first, expired, third = asyncio.run(main())
    assert first.result == 1 and isinstance(expired, DeadlineExpired) and third.result == 3
    assert calls == [[1], [3]]  # the expired request never reached the model


def test_one_failing_input_does_not_fail_its_batch_mates():
    def run(waveforms):
        if any(len(w) == 2 for w in waveforms):
            raise ValueError("bad input")
        return [len(w) for w in waveforms]

    async def main():
        batcher = MicroBatcher(run, BatchingOptions(max_batch_size=3, max_wait_ms=100, max_queue=10))
        batcher.start()
        results = await asyncio.gather(*(batcher.submit(np.zeros(n)) for n in (1, 2, 3)), return_exceptions=True)
        await batcher.close()
        return results

    ok1, bad, ok3 = asyncio.run(main())
    assert ok1.result == 1 and ok3.result == 3 and isinstance(bad, ValueError)
