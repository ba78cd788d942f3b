"""The device's cloud client under faults: a killed and restarted server, a partition, 30% loss, resets, a slow
network. In every case `understand` returns exactly one outcome (the cloud's result, or a fallback with its
reason) and never hangs past its deadline; afterwards the same client works again.

Network faults come from pasu.netproxy (a user-space TCP proxy on loopback: no root, no netem); the servers
are real, on 127.0.0.1, with the tiny model of tests/cloud/support.py. The full-queue and slow-server cases
are in test_cloud_client.py.
"""

from __future__ import annotations

import threading
import time

from pasu.device.cloud_client import (
    CloudClient,
    CloudOutcome,
    FallbackReason,
    RetryPolicy,
)

from pasu.netproxy import NetworkProxy

SLACK_S = 1.5  # scheduling slack on a loaded machine; a hang would overshoot by far more


def understand_once(client: CloudClient, waveform, deadline_s: float, utterance_id: str = "u") -> CloudOutcome:
    """One utterance in a thread: it must come back within its deadline with exactly one answer."""
    results: list[CloudOutcome] = []
    worker = threading.Thread(target=lambda: results.append(
        client.understand(waveform, 16000, utterance_id=utterance_id, deadline_s=deadline_s)))
    worker.start()
    worker.join(deadline_s + SLACK_S)
    assert not worker.is_alive(), f"understand() still running {deadline_s + SLACK_S:.1f} s after it began"
    [outcome] = results
    assert (outcome.cloud is None) != (outcome.fallback is None)  # a result or a fallback, never both or none
    assert outcome.latency_s <= deadline_s + SLACK_S
    return outcome


def eventually_ok(client: CloudClient, waveform, deadline_s: float, within_s: float = 20.0) -> list[CloudOutcome]:
    """Outcomes of repeated calls until one succeeds (a reconnect may cost a call or two)."""
    outcomes: list[CloudOutcome] = []
    stop = time.monotonic() + within_s
    while time.monotonic() < stop:
        outcomes.append(understand_once(client, waveform, deadline_s))
        if outcomes[-1].ok:
            return outcomes
        time.sleep(0.2)
    raise AssertionError(f"no cloud answer within {within_s} s: {[(o.fallback, o.detail) for o in outcomes]}")


# --- Server process killed mid-request, then restarted ----------------------------------------------------


def test_cloud_process_killed_mid_request_then_restarted(cloud_support, start_server, tmp_path):
    folder = cloud_support.write_model_folder(tmp_path / "model")
    # A lone request waits up to 30 s for batch-mates: it is surely inside the server when we kill it.
    with cloud_support.CliServer(folder, "--max-batch-wait-ms", "30000") as process:
        wave = cloud_support.waveform(0.5)
        with NetworkProxy(process.address) as proxy, CloudClient(proxy.address, deadline_s=5) as client:
            results: list[CloudOutcome] = []
            worker = threading.Thread(target=lambda: results.append(understand_once(client, wave, 5.0)))
            worker.start()
            assert cloud_support.eventually(lambda: proxy.stats.bytes_up > len(wave) * 2, timeout=10)  # all sent
            time.sleep(0.3)
            process.kill()
            worker.join(10)
            [killed] = results
            assert killed.fallback is FallbackReason.UNAVAILABLE, killed.detail  # retried, nobody there

            down = understand_once(client, wave, 1.0)  # while nothing listens
            assert down.fallback is FallbackReason.UNAVAILABLE

            start_server(port=process.port)  # the replacement comes up on the same address
            outcomes = eventually_ok(client, wave, 5.0)
            assert all(o.fallback is FallbackReason.UNAVAILABLE for o in outcomes[:-1])


def test_graceful_restart_between_utterances(cloud_support, start_server):
    server = start_server()
    port = server.port
    wave = cloud_support.waveform(0.5)
    with CloudClient(f"127.0.0.1:{port}", deadline_s=5) as client:
        assert understand_once(client, wave, 5.0).ok
        server.stop(grace=5)
        assert understand_once(client, wave, 1.0).fallback is FallbackReason.UNAVAILABLE
        start_server(port=port)
        eventually_ok(client, wave, 5.0)


# --- Network faults ---------------------------------------------------------------------------------------


def test_partition_mid_request_falls_back_on_deadline_and_recovers(cloud_support, start_server):
    slow = cloud_support.SlowRecognizer(cloud_support.tiny_recognizer(), delay_s=0.3)
    server = start_server(slow)
    wave = cloud_support.waveform(0.5)
    with NetworkProxy(f"127.0.0.1:{server.port}", "wifi") as proxy, \
            CloudClient(proxy.address, deadline_s=5) as client:
        assert understand_once(client, wave, 5.0).ok
        results: list[CloudOutcome] = []
        worker = threading.Thread(target=lambda: results.append(understand_once(client, wave, 1.5)))
        worker.start()
        assert slow.started.wait(5)
        proxy.set_profile("partition")  # the answer cannot get back
        worker.join(10)
        [cut] = results
        assert cut.fallback is FallbackReason.DEADLINE and cut.attempts == 1
        assert understand_once(client, wave, 1.0).fallback is FallbackReason.DEADLINE  # still dark
        proxy.set_profile("wifi")
        eventually_ok(client, wave, 5.0)


def test_partition_before_the_first_call(cloud_support, start_server):
    server = start_server()
    with NetworkProxy(f"127.0.0.1:{server.port}", "partition") as proxy, \
            CloudClient(proxy.address, deadline_s=1) as client:
        outcome = understand_once(client, cloud_support.waveform(0.5), 1.0)
    # The TCP connection opens but the HTTP/2 handshake never completes: the deadline ends the wait.
    assert outcome.fallback in (FallbackReason.DEADLINE, FallbackReason.UNAVAILABLE)


def test_30_percent_packet_loss(cloud_support, start_server):
    server = start_server()
    with NetworkProxy(f"127.0.0.1:{server.port}", "loss30", seed=7) as proxy, \
            CloudClient(proxy.address, deadline_s=4) as client:
        outcomes = [understand_once(client, cloud_support.waveform(0.3, seed=i), 4.0, f"u{i}") for i in range(4)]
        lost = proxy.stats.segments_lost
    assert lost > 0  # the loss really happened
    assert all(o.ok or o.fallback is FallbackReason.DEADLINE for o in outcomes), [o.detail for o in outcomes]
    assert sum(o.ok for o in outcomes) >= 1  # retransmission delays cost time, not answers


def test_connection_reset_mid_request_is_retried_once_answered_once(cloud_support, start_server):
    slow = cloud_support.SlowRecognizer(cloud_support.tiny_recognizer(), delay_s=0.5)
    server = start_server(slow)
    with NetworkProxy(f"127.0.0.1:{server.port}") as proxy, \
            CloudClient(proxy.address, deadline_s=10, retry=RetryPolicy(initial_backoff_s=0.05)) as client:
        results: list[CloudOutcome] = []
        worker = threading.Thread(target=lambda: results.append(
            understand_once(client, cloud_support.waveform(0.5), 10.0, "reset-me")))
        worker.start()
        assert slow.started.wait(5)
        assert proxy.reset_connections() >= 1
        worker.join(15)
    [outcome] = results
    assert outcome.ok and outcome.attempts >= 2  # UNAVAILABLE from the reset, then a fresh connection
    # The server may have answered the first attempt too (into a dead connection); the device got one answer.
    assert len(slow.batches) >= 2


def test_network_slower_than_the_deadline(cloud_support, start_server):
    server = start_server()
    with NetworkProxy(f"127.0.0.1:{server.port}", "poor", seed=0) as proxy, \
            CloudClient(proxy.address, deadline_s=0.1) as client:
        outcome = understand_once(client, cloud_support.waveform(0.5), 0.1)  # less than one 150 ms RTT
    assert outcome.fallback is FallbackReason.DEADLINE and outcome.latency_s < 0.1 + SLACK_S
