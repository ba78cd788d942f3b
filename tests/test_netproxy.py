"""The network emulator against a real echo server on loopback: bytes intact, delay, bandwidth, loss, faults.

Timing checks are lower bounds (an emulated delay can only add time) with generous upper bounds, so a
loaded machine does not make them flaky.
"""

from __future__ import annotations

import asyncio
import os
import socket
import socketserver
import threading
import time

import pytest

from pasu.netproxy import PROFILES, NetworkProfile, NetworkProxy, profile_named


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture(scope="module")
def echo():
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _connect(proxy: NetworkProxy, timeout: float = 10.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=timeout)


def _round_trip(sock: socket.socket, payload: bytes) -> tuple[bytes, float]:
    """(echoed bytes, seconds) for sending `payload` and reading as many bytes back."""
    t0 = time.monotonic()
    sock.sendall(payload)
    got = bytearray()
    while len(got) < len(payload):
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return bytes(got), time.monotonic() - t0


def test_presets_and_lookup():
    assert {"wifi", "5g", "poor", "partition", "loss30"} <= set(PROFILES)
    assert profile_named("wifi").rtt_ms == 10 and profile_named("5g").rtt_ms == 40
    poor = profile_named("poor")
    assert (poor.rtt_ms, poor.loss) == (150, 0.01)
    assert profile_named("loss30").loss == 0.30 and profile_named("partition").partitioned
    custom = NetworkProfile("lab", rtt_ms=5)
    assert profile_named(custom) is custom
    with pytest.raises(ValueError, match="presets"):
        profile_named("dialup")
    with pytest.raises(ValueError):
        NetworkProfile("bad", loss=1.0)


def test_bytes_arrive_intact_and_in_order_despite_loss_and_jitter(echo):
    payload = os.urandom(100_000)
    lossy = NetworkProfile("lossy", rtt_ms=2, jitter_ms=5, loss=0.2)
    with NetworkProxy(echo, lossy, seed=1) as proxy, _connect(proxy) as sock:
        got, _ = _round_trip(sock, payload)
        stats = proxy.stats
    assert got == payload
    assert stats.segments_lost > 0 and stats.bytes_up == stats.bytes_down == len(payload)


def test_round_trip_time_is_added(echo):
    with NetworkProxy(echo, NetworkProfile("slow", rtt_ms=300)) as proxy, _connect(proxy) as sock:
        _, seconds = _round_trip(sock, b"ping")
    # Half the RTT on the way to the echo server, half on the way back (a little clock slack).
    assert 0.29 <= seconds < 5.0


def test_bandwidth_limits_throughput(echo):
    with NetworkProxy(echo, NetworkProfile("narrow", bandwidth_kbps=200)) as proxy, _connect(proxy) as sock:
        _, seconds = _round_trip(sock, bytes(25_000))
    # 25 kB = 200 kbit: 1 s at 200 kbit/s (the echo streams back while the rest is still going up).
    assert 0.95 <= seconds < 10.0


def test_loss_stalls_by_retransmission_timeouts(echo):
    with NetworkProxy(echo, NetworkProfile("awful", loss=0.6), seed=2) as proxy, _connect(proxy) as sock:
        got, seconds = _round_trip(sock, b"x" * 100)  # one segment each way
        lost = proxy.stats.segments_lost
    assert got == b"x" * 100
    assert lost >= 1 and seconds >= 0.19 * lost  # each lost transmission costs at least one 200 ms RTO


def test_partition_holds_bytes_until_it_heals(echo):
    with NetworkProxy(echo, "ideal") as proxy, _connect(proxy) as sock:
        assert _round_trip(sock, b"before")[0] == b"before"
        proxy.set_profile("partition")
        sock.sendall(b"during")
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            sock.recv(100)  # nothing gets through
        proxy.set_profile("wifi")
        sock.settimeout(10)
        got = b""
        while len(got) < 6:
            got += sock.recv(100)
    assert got == b"during"


def test_reset_connections_aborts_them_and_new_ones_work(echo):
    with NetworkProxy(echo) as proxy:
        with _connect(proxy) as sock:
            assert _round_trip(sock, b"a")[0] == b"a"
            assert proxy.reset_connections() == 1
            with pytest.raises((ConnectionResetError, BrokenPipeError)):
                for _ in range(10):  # the RST may land after the first send
                    sock.sendall(b"b")
                    if not sock.recv(100):
                        raise ConnectionResetError("closed")
                    time.sleep(0.05)
        with _connect(proxy) as sock:
            assert _round_trip(sock, b"c")[0] == b"c"
        assert proxy.stats.resets == 1 and proxy.stats.connections == 2


def test_upstream_down_looks_like_a_dead_server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free: nothing listens
    with NetworkProxy(f"127.0.0.1:{port}") as proxy:
        # The reset may reach the client at connect, send or receive, depending on scheduling.
        with pytest.raises((ConnectionResetError, BrokenPipeError)):
            with _connect(proxy) as sock:
                sock.sendall(b"hello")
                if not sock.recv(100):
                    raise ConnectionResetError("closed")


def test_stop_with_open_connections_leaves_no_task_pending(echo, caplog):
    """A proxy stopped mid-connection ends every handler quietly: none is left for the closed loop to destroy, and
    none is logged as an error (a bench's log would show a traceback for every connection open at its end)."""
    proxy = NetworkProxy(echo).start()
    socks = [_connect(proxy) for _ in range(3)]
    for sock in socks:
        assert _round_trip(sock, b"x")[0] == b"x"
    with caplog.at_level("ERROR", logger="asyncio"):
        proxy.stop()
    try:
        assert [task for task in asyncio.all_tasks(proxy._loop) if not task.done()] == []
        assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []
    finally:
        for sock in socks:
            sock.close()


def test_stop_ends_a_connection_still_reaching_its_upstream(echo, monkeypatch):
    """A client accepted while the upstream connect hangs (a server restarting, a SYN lost) must not keep stop()
    waiting or leave its handler pending on the closed loop."""
    import pasu.netproxy

    async def never_connects(host, port):
        await asyncio.sleep(3600)

    monkeypatch.setattr(pasu.netproxy.asyncio, "open_connection", never_connects)
    proxy = NetworkProxy(echo).start()
    with _connect(proxy) as sock:
        deadline = time.monotonic() + 10
        while proxy.stats.connections == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        t0 = time.monotonic()
        proxy.stop()
        assert time.monotonic() - t0 < 5
        assert [task for task in asyncio.all_tasks(proxy._loop) if not task.done()] == []
        assert sock.recv(10) == b""  # the client's connection is closed, not left open
