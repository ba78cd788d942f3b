"""The device's cloud client against real servers on 127.0.0.1: results, round robin, every fallback path."""

from __future__ import annotations

import io
import socket
import threading
import time

import numpy as np
import pytest
import soundfile
from pasu.cloud.config import TlsConfig
from pasu.device.cloud_client import (
    ClientTls,
    CloudClient,
    FallbackReason,
    RetryPolicy,
    channel_target,
    encode_audio,
)
from pasu.protos import slu_pb2

from pasu.metrics import SluResult
from pasu.slu import Slot
import pasu_tests_cloud_support  # loaded by tests/conftest.py


support = pasu_tests_cloud_support


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ok_count(server) -> float:
    return server.metrics.value("pasu_cloud_requests_total", {"method": "Understand", "code": "OK"})


# --- Success --------------------------------------------------------------------------------------------


def test_understand_returns_the_cloud_result(start_server):
    recognizer = support.tiny_recognizer()
    server = start_server(recognizer, auth_tokens=("tok",))
    wave = support.waveform(1.0)
    with CloudClient(f"127.0.0.1:{server.port}", deadline_s=10, token="tok", client_id="dev-1") as client:
        pilot = SluResult("wake me up", "alarm_set", (Slot("time", "five am"),))
        outcome = client.understand(wave, 16000, utterance_id="u-7", pilot=pilot, pilot_confidence=0.4)
    assert outcome.ok and outcome.fallback is None and outcome.attempts == 1
    cloud = outcome.cloud
    pcm = np.frombuffer(encode_audio(wave)[1], "<i2").astype(np.float32) / 32768.0
    expected = recognizer.recognize_batch([pcm])[0]
    assert (cloud.result.text, cloud.result.intent, cloud.result.slots) == (expected.text, expected.intent,
                                                                              expected.slots)
    assert cloud.model_id == "tiny-untrained" and cloud.batch_size == 1
    assert 0 < cloud.inference_ms <= cloud.server_ms < outcome.latency_s * 1000


def test_round_robin_spreads_calls_over_two_replicas(start_server):
    a, b = start_server(), start_server()
    with CloudClient([f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"], deadline_s=10) as client:
        assert client.target == f"ipv4:127.0.0.1:{a.port},127.0.0.1:{b.port}"
        outcomes = [client.understand(support.waveform(0.3, seed=i), 16000) for i in range(8)]
    assert all(o.ok for o in outcomes)
    assert support.eventually(lambda: _ok_count(a) + _ok_count(b) == 8)
    assert _ok_count(a) > 0 and _ok_count(b) > 0


def test_a_dead_replica_does_not_cost_answers(start_server):
    live = start_server()
    with CloudClient([f"127.0.0.1:{_free_port()}", f"127.0.0.1:{live.port}"], deadline_s=5) as client:
        outcomes = [client.understand(support.waveform(0.3), 16000) for _ in range(4)]
    assert all(o.ok for o in outcomes), [o.detail for o in outcomes]


def test_tls_client_with_certificate(start_server, tmp_path):
    pki = support.make_pki(tmp_path)
    server = start_server(tls=TlsConfig(cert=str(pki.server_cert), key=str(pki.server_key), client_ca=str(pki.ca)))
    target = f"127.0.0.1:{server.port}"
    with CloudClient(target, deadline_s=10, tls=ClientTls(root_ca=str(pki.ca), cert=str(pki.client_cert),
                                                          key=str(pki.client_key))) as client:
        assert client.understand(support.waveform(0.5), 16000).ok
    with CloudClient(target, deadline_s=2, tls=ClientTls(root_ca=str(pki.ca))) as no_cert:
        outcome = no_cert.understand(support.waveform(0.5), 16000)
    assert outcome.fallback is FallbackReason.UNAVAILABLE  # the handshake fails: the TLS layer says unavailable


# --- Fallbacks ------------------------------------------------------------------------------------------


def test_no_server_falls_back_unavailable_after_bounded_retries():
    retry = RetryPolicy(max_attempts=3, initial_backoff_s=0.02)
    with CloudClient(f"127.0.0.1:{_free_port()}", deadline_s=2, retry=retry) as client:
        outcome = client.understand(support.waveform(0.5), 16000)
    assert not outcome.ok and outcome.fallback is FallbackReason.UNAVAILABLE
    assert outcome.attempts == 3 and outcome.latency_s < 2


def test_retries_stop_at_the_deadline():
    retry = RetryPolicy(max_attempts=100, initial_backoff_s=0.05, max_backoff_s=0.05)
    with CloudClient(f"127.0.0.1:{_free_port()}", deadline_s=0.4, retry=retry) as client:
        outcome = client.understand(support.waveform(0.5), 16000)
    assert outcome.fallback is FallbackReason.UNAVAILABLE
    assert 1 < outcome.attempts < 100 and outcome.latency_s < 0.6


def test_server_stopped_mid_request_falls_back(start_server):
    slow = support.SlowRecognizer(support.tiny_recognizer(), delay_s=1.0)
    server = start_server(slow)
    result = {}
    with CloudClient(f"127.0.0.1:{server.port}", deadline_s=5) as client:
        worker = threading.Thread(target=lambda: result.update(o=client.understand(support.waveform(0.5), 16000)))
        worker.start()
        assert slow.started.wait(5)
        server.stop(grace=0)  # in-flight request cut off, nothing listening afterwards
        worker.join(10)
    outcome = result["o"]  # returned, not raised
    assert not outcome.ok
    assert outcome.fallback in (FallbackReason.UNAVAILABLE, FallbackReason.CANCELLED)
    assert outcome.latency_s < 5


def test_slow_server_falls_back_on_deadline(start_server):
    server = start_server(support.SlowRecognizer(support.tiny_recognizer(), delay_s=0.6))
    with CloudClient(f"127.0.0.1:{server.port}", deadline_s=0.25) as client:
        outcome = client.understand(support.waveform(0.5), 16000)
    assert outcome.fallback is FallbackReason.DEADLINE and outcome.attempts == 1
    assert outcome.latency_s < 0.5


def test_wrong_token_falls_back_unauthenticated(start_server):
    server = start_server(auth_tokens=("right",))
    for token in (None, "wrong"):
        with CloudClient(f"127.0.0.1:{server.port}", deadline_s=5, token=token) as client:
            outcome = client.understand(support.waveform(0.5), 16000)
        assert outcome.fallback is FallbackReason.UNAUTHENTICATED and outcome.attempts == 1  # no retry


def test_a_calls_own_token_replaces_the_clients(start_server):
    server = start_server(auth_tokens=("right",))
    with CloudClient(f"127.0.0.1:{server.port}", deadline_s=5, token="wrong") as client:
        assert client.understand(support.waveform(0.5), 16000, token="right").ok
        assert client.understand(support.waveform(0.5), 16000).fallback is FallbackReason.UNAUTHENTICATED


def test_serving_reports_the_servers_health_without_a_token(start_server):
    server = start_server(auth_tokens=("right",))
    with CloudClient(f"127.0.0.1:{server.port}") as client:
        assert client.serving()
        server.stop()
        assert not client.serving(timeout_s=0.5)
    with CloudClient(f"127.0.0.1:{_free_port()}") as nobody:
        assert not nobody.serving(timeout_s=0.5)


def test_full_server_falls_back_resource_exhausted(start_server):
    slow = support.SlowRecognizer(support.tiny_recognizer(), delay_s=0.5)
    server = start_server(slow, max_batch_size=1, max_queue=1)
    target = f"127.0.0.1:{server.port}"
    with CloudClient(target, deadline_s=5) as busy, CloudClient(target, deadline_s=5) as client:
        first = threading.Thread(target=busy.understand, args=(support.waveform(0.5), 16000))
        first.start()
        assert slow.started.wait(5)
        second = threading.Thread(target=busy.understand, args=(support.waveform(0.5, seed=1), 16000))
        second.start()
        deadline = time.monotonic() + 2
        while server.server.batcher.pending < 1 and time.monotonic() < deadline:  # second is queued
            time.sleep(0.01)
        outcome = client.understand(support.waveform(0.5, seed=2), 16000)
        first.join()
        second.join()
    assert outcome.fallback is FallbackReason.RESOURCE_EXHAUSTED and "queue full" in outcome.detail


def test_rejected_input_falls_back_rejected(start_server):
    server = start_server()
    with CloudClient(f"127.0.0.1:{server.port}", deadline_s=5) as client:
        outcome = client.understand(support.waveform(0.5), 8000)
    assert outcome.fallback is FallbackReason.REJECTED and "16000" in outcome.detail


def test_closed_client_falls_back_instead_of_raising():
    client = CloudClient(f"127.0.0.1:{_free_port()}", deadline_s=1)
    client.close()
    assert client.understand(support.waveform(0.5), 16000).fallback is FallbackReason.ERROR


# --- Encoding and targets -------------------------------------------------------------------------------


def test_encode_audio():
    wave = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 2.0], dtype=np.float32)
    encoding, data = encode_audio(wave)
    assert encoding == slu_pb2.LINEAR16
    assert np.frombuffer(data, "<i2").tolist() == [0, 16384, -16384, 32767, -32768, 32767]  # clipped
    encoding, data = encode_audio(wave, "float32")
    assert encoding == slu_pb2.FLOAT32 and np.array_equal(np.frombuffer(data, "<f4"), wave)
    ints = np.array([1, -2, 3], dtype=np.int16)
    assert np.frombuffer(encode_audio(ints)[1], "<i2").tolist() == [1, -2, 3]  # int16 passes through
    with pytest.raises(ValueError):
        encode_audio(np.zeros((2, 10)))


@pytest.mark.parametrize("name, wire, container", [("flac", slu_pb2.FLAC, "FLAC"), ("opus", slu_pb2.OGG_OPUS, "OGG")])
def test_compressed_encodings_are_smaller_files_of_the_same_audio(name, wire, container):
    wave = np.sin(np.arange(16000) * 0.05).astype(np.float32) * 0.3  # a tone: compressible, as speech is
    encoding, data = encode_audio(wave, name, 16000)
    assert encoding == wire and len(data) < len(encode_audio(wave)[1]) / 2
    decoded, rate = soundfile.read(io.BytesIO(data), dtype="float32")
    assert soundfile.info(io.BytesIO(data)).format == container and rate == 16000 and len(decoded) == len(wave)
    pcm = np.frombuffer(encode_audio(wave)[1], "<i2") / 32768.0
    tolerance = 0 if name == "flac" else 0.1  # flac is lossless; opus only close
    assert np.abs(decoded - pcm).max() <= tolerance + 1e-9


def test_a_rate_opus_cannot_code_falls_back_rejected_without_a_call():
    with CloudClient(f"127.0.0.1:{_free_port()}", deadline_s=1, encoding="opus") as client:
        outcome = client.understand(support.waveform(0.5), 22050)
    assert outcome.fallback is FallbackReason.REJECTED and outcome.attempts == 0 and "22050" in outcome.detail


def test_compressed_uploads_are_understood_flac_exactly_as_pcm(start_server):
    recognizer = support.tiny_recognizer()
    server = start_server(recognizer)
    wave = support.waveform(1.0)
    answers = {}
    for name in ("pcm16", "flac", "opus"):
        with CloudClient(f"127.0.0.1:{server.port}", deadline_s=10, encoding=name) as client:
            outcome = client.understand(wave, 16000)
        assert outcome.ok, outcome.detail
        answers[name] = outcome.cloud.result
    assert answers["flac"] == answers["pcm16"]  # lossless: the model saw the same samples


def test_channel_target():
    assert channel_target("cloud.example:443") == "cloud.example:443"
    assert channel_target(["10.0.0.1:1", "10.0.0.2:2"]) == "ipv4:10.0.0.1:1,10.0.0.2:2"
    assert channel_target(["[::1]:1", "[::1]:2"]) == "ipv6:[::1]:1,[::1]:2"
    with pytest.raises(ValueError, match="DNS name"):
        channel_target(["a.example:1", "b.example:2"])
