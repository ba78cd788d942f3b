"""Per-client concurrency accounting and how a client is named."""

from __future__ import annotations

import pytest
from pasu.cloud.limits import ClientLimiter, peer_host


def test_limiter_counts_per_client_and_frees_slots():
    limiter = ClientLimiter(2)
    assert limiter.acquire("a") and limiter.acquire("a")
    assert not limiter.acquire("a")  # at its limit
    assert limiter.acquire("b")  # others are not affected
    limiter.release("a")
    assert limiter.active("a") == 1 and limiter.acquire("a")
    for _ in range(2):
        limiter.release("a")
    limiter.release("b")
    assert limiter.active("a") == limiter.active("b") == 0 and not limiter._active  # nothing kept for idle clients


def test_no_limit_and_bad_limit():
    unlimited = ClientLimiter(None)
    assert all(unlimited.acquire("a") for _ in range(1000))
    with pytest.raises(ValueError):
        ClientLimiter(0)


@pytest.mark.parametrize("peer, host", [
    ("ipv4:127.0.0.1:54321", "127.0.0.1"),
    ("ipv6:[::1]:54321", "::1"),
    ("ipv6:%5B::1%5D:54321", "::1"),
    ("unix:/tmp/socket", "unix:/tmp/socket"),
])
def test_peer_host_drops_the_port(peer, host):
    assert peer_host(peer) == host
