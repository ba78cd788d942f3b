"""The cloud server end to end: real gRPC on 127.0.0.1, a real (tiny, untrained) ESPnet model behind it."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from pasu.cloud.config import TlsConfig
from pasu.protos import slu_pb2, slu_pb2_grpc

SERVICE = "pasu.v1.SpeechUnderstanding"


def _code(call) -> tuple[grpc.StatusCode, str]:
    """(status code, details) of a call that must fail."""
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details()


# --- Round trips ------------------------------------------------------------------------------------------


def test_unary_round_trip_runs_the_model(support, start_server, stub_for):
    recognizer = support.tiny_recognizer()
    server = start_server(recognizer)
    response = stub_for(server).Understand(support.request(1.0, utterance_id="u-1"), timeout=10)

    # The answer is the model's own output for the (16-bit quantized) waveform, not a canned string.
    pcm = np.frombuffer(support.pcm16(1.0), dtype="<i2").astype(np.float32) / 32768.0
    expected = recognizer.recognize_batch([pcm])[0]
    assert (response.transcript, response.intent) == (expected.text, expected.intent)
    assert [(s.type, s.value) for s in response.slots] == [tuple(s) for s in expected.slots]
    assert response.confidence == pytest.approx(expected.confidence, rel=1e-5)
    assert 0.0 <= response.confidence <= 1.0
    assert response.model_id == "tiny-untrained" and response.utterance_id == "u-1"
    t = response.timings
    assert t.batch_size == 1 and t.inference_ms > 0 and t.total_ms >= t.inference_ms and t.queue_ms >= 0


def test_float32_audio_is_accepted(support, start_server, stub_for):
    server = start_server()
    audio = slu_pb2.Audio(encoding=slu_pb2.FLOAT32, sample_rate=16000, data=support.waveform(0.5).tobytes())
    response = stub_for(server).Understand(slu_pb2.UnderstandRequest(audio=audio), timeout=10)
    assert response.model_id == "tiny-untrained"


def test_streaming_round_trip_with_acks(support, start_server, stub_for):
    server = start_server()
    stub = stub_for(server)
    data = support.pcm16(1.0)
    chunk = 6400  # 0.2 s of 16-bit audio; the last chunk is shorter

    def messages():
        meta = slu_pb2.UtteranceMetadata(utterance_id="s-1")
        yield slu_pb2.StreamRequest(config=slu_pb2.StreamConfig(
            encoding=slu_pb2.LINEAR16, sample_rate=16000, metadata=meta, send_acks=True))
        for i in range(0, len(data), chunk):
            yield slu_pb2.StreamRequest(audio=data[i : i + chunk])
        yield slu_pb2.StreamRequest(end=slu_pb2.EndOfAudio())

    replies = list(stub.StreamingUnderstand(messages(), timeout=10))
    acks = [r.ack for r in replies if r.WhichOneof("response") == "ack"]
    assert [a.received_bytes for a in acks] == list(range(chunk, len(data), chunk)) + [len(data)]
    assert acks[-1].received_seconds == pytest.approx(1.0)
    final = replies[-1]
    assert final.WhichOneof("response") == "result" and final.result.utterance_id == "s-1"
    # Same audio, same model: the stream's answer equals the unary one.
    assert final.result.transcript == stub.Understand(support.request(1.0), timeout=10).transcript


def test_flac_stream_answers_as_the_same_audio_in_linear16(support, start_server, stub_for):
    """A compressed file may be cut anywhere into chunks; acks count its bytes (seconds are known once decoded)."""
    import io

    import soundfile

    stub = stub_for(start_server())
    buffer = io.BytesIO()
    soundfile.write(buffer, np.frombuffer(support.pcm16(1.0), "<i2"), 16000, format="FLAC", subtype="PCM_16")
    flac = buffer.getvalue()
    messages = [slu_pb2.StreamRequest(config=slu_pb2.StreamConfig(encoding=slu_pb2.FLAC, sample_rate=16000,
                                                                  send_acks=True)),
                *(slu_pb2.StreamRequest(audio=flac[i : i + 1000]) for i in range(0, len(flac), 1000)),
                slu_pb2.StreamRequest(end=slu_pb2.EndOfAudio())]
    replies = list(stub.StreamingUnderstand(iter(messages), timeout=10))
    acks = [r.ack for r in replies if r.WhichOneof("response") == "ack"]
    assert acks[-1].received_bytes == len(flac) and {a.received_seconds for a in acks} == {0.0}
    assert replies[-1].result.transcript == stub.Understand(support.request(1.0), timeout=10).transcript


def test_stream_half_close_without_end_marker_still_answers(support, start_server, stub_for):
    server = start_server()
    messages = [slu_pb2.StreamRequest(config=slu_pb2.StreamConfig(encoding=slu_pb2.LINEAR16, sample_rate=16000)),
                slu_pb2.StreamRequest(audio=support.pcm16(0.5))]
    replies = list(stub_for(server).StreamingUnderstand(iter(messages), timeout=10))
    assert [r.WhichOneof("response") for r in replies] == ["result"]


# --- Health, reflection, metrics --------------------------------------------------------------------------


def test_health_serving_and_reflection_lists_the_service(start_server):
    server = start_server()
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", SERVICE):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        reflect = reflection_pb2_grpc.ServerReflectionStub(channel)
        [reply] = list(reflect.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                                    timeout=5))
        names = {s.name for s in reply.list_services_response.service}
        assert {SERVICE, "grpc.health.v1.Health"} <= names


# --- Validation and limits --------------------------------------------------------------------------------


def _audio(encoding=slu_pb2.LINEAR16, rate=16000, data=b"\x01\x00" * 8000):
    return slu_pb2.UnderstandRequest(audio=slu_pb2.Audio(encoding=encoding, sample_rate=rate, data=data))


@pytest.mark.parametrize("request_, code, message", [
    (_audio(data=b""), grpc.StatusCode.INVALID_ARGUMENT, "empty audio"),
    (slu_pb2.UnderstandRequest(), grpc.StatusCode.INVALID_ARGUMENT, "encoding"),
    (_audio(rate=8000), grpc.StatusCode.INVALID_ARGUMENT, "expects 16000 Hz"),
    (_audio(encoding=slu_pb2.AUDIO_ENCODING_UNSPECIFIED), grpc.StatusCode.INVALID_ARGUMENT, "encoding"),
    (_audio(data=b"\x01\x00\x02"), grpc.StatusCode.INVALID_ARGUMENT, "whole number"),
    (_audio(encoding=slu_pb2.FLOAT32, data=np.array([0.1, np.nan] * 4000, "<f4").tobytes()),
     grpc.StatusCode.INVALID_ARGUMENT, "NaN"),
    (_audio(data=b"\x00\x00" * 16000 * 3), grpc.StatusCode.OUT_OF_RANGE, "longer than the 2 s limit"),
    (_audio(data=b"\x00\x00" * 800), grpc.StatusCode.OUT_OF_RANGE, "shorter than"),
], ids=["empty", "no-audio", "rate", "encoding", "odd-bytes", "nan", "too-long", "too-short"])
def test_invalid_requests_are_rejected_before_the_model(support, start_server, stub_for, request_, code, message):
    server = start_server(max_audio_seconds=2.0)
    got, details = _code(lambda: stub_for(server).Understand(request_, timeout=5))
    assert got == code and message in details
    assert support.eventually(
        lambda: server.metrics.value("pasu_cloud_requests_total", {"method": "Understand", "code": code.name}) == 1)
    assert server.metrics.value("pasu_cloud_batch_size_count") == 0  # the model never ran


def test_stream_must_start_with_config_and_is_cut_when_too_long(support, start_server, stub_for):
    server = start_server(max_audio_seconds=1.0)
    stub = stub_for(server)
    got, details = _code(lambda: list(stub.StreamingUnderstand(
        iter([slu_pb2.StreamRequest(audio=support.pcm16(0.5))]), timeout=5)))
    assert got == grpc.StatusCode.INVALID_ARGUMENT and "first message must be a StreamConfig" in details

    def endless():  # never sends the end marker: the duration limit must stop it
        yield slu_pb2.StreamRequest(config=slu_pb2.StreamConfig(encoding=slu_pb2.LINEAR16, sample_rate=16000))
        while True:
            yield slu_pb2.StreamRequest(audio=support.pcm16(0.25))

    got, details = _code(lambda: list(stub.StreamingUnderstand(endless(), timeout=5)))
    assert got == grpc.StatusCode.OUT_OF_RANGE and "limit" in details


def test_message_size_limit(support, start_server, stub_for):
    server = start_server(max_message_bytes=64 * 1024)
    got, _ = _code(lambda: stub_for(server).Understand(support.request(3.0), timeout=5))  # 96 kB
    assert got == grpc.StatusCode.RESOURCE_EXHAUSTED


# --- Deadlines, admission control, batching ---------------------------------------------------------------


def test_request_whose_deadline_passes_in_the_queue_is_not_run(support, start_server, stub_for):
    slow = support.SlowRecognizer(support.tiny_recognizer(), delay_s=0.8)
    server = start_server(slow, max_batch_size=1)
    stub = stub_for(server)
    first = stub.Understand.future(support.request(1.0), timeout=10)  # occupies the model
    assert slow.started.wait(5)
    got, _ = _code(lambda: stub.Understand(support.request(0.5, seed=1), timeout=0.3))
    assert got == grpc.StatusCode.DEADLINE_EXCEEDED
    assert first.result().model_id
    assert support.eventually(lambda: server.metrics.value(
        "pasu_cloud_requests_total", {"method": "Understand", "code": "DEADLINE_EXCEEDED"}) == 1)
    time.sleep(0.2)  # let the collector reach the expired request
    assert slow.batches == [[16000]]  # only the first request's 1 s of audio ever reached the model


def test_full_queue_answers_resource_exhausted(support, start_server, stub_for):
    slow = support.SlowRecognizer(support.tiny_recognizer(), delay_s=0.5)
    server = start_server(slow, max_batch_size=1, max_queue=1)
    stub = stub_for(server)
    running = stub.Understand.future(support.request(0.5), timeout=10)
    assert slow.started.wait(5)  # first request is in the model; the queue is empty
    waiting = [stub.Understand.future(support.request(0.5, seed=i), timeout=10) for i in range(3)]
    codes, messages = [], []
    for call in waiting:
        try:
            call.result()
            codes.append(grpc.StatusCode.OK)
        except grpc.RpcError as error:
            codes.append(error.code())
            messages.append(error.details())
    assert running.result().model_id
    assert codes.count(grpc.StatusCode.OK) == 1  # one fits in the queue of one
    assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 2
    assert all(m == "queue full (1 pending)" for m in messages)


def test_concurrent_requests_are_micro_batched(support, start_server, stub_for):
    server = start_server(max_batch_size=4, max_batch_wait_ms=300.0, metrics_port=0)
    stub = stub_for(server)
    calls = [stub.Understand.future(support.request(0.5 + 0.1 * i, seed=i), timeout=10) for i in range(4)]
    sizes = [call.result().timings.batch_size for call in calls]
    assert max(sizes) > 1
    metrics = server.metrics
    assert metrics.value("pasu_cloud_batch_size_sum") > metrics.value("pasu_cloud_batch_size_count")
    assert support.eventually(lambda: metrics.value(
        "pasu_cloud_requests_total", {"method": "Understand", "code": "OK"}) == 4)
    # The same numbers over the Prometheus HTTP endpoint.
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.server.metrics_port}/metrics", timeout=5).read().decode()
    samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert float(samples["pasu_cloud_batch_size_sum"]) > float(samples["pasu_cloud_batch_size_count"])
    assert float(samples['pasu_cloud_requests_total{code="OK",method="Understand"}']) == 4


# --- Security ---------------------------------------------------------------------------------------------


def test_token_authentication(support, start_server):
    server = start_server(auth_tokens=("s3cret-token",))
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = slu_pb2_grpc.SpeechUnderstandingStub(channel)
        for metadata in [(), (("authorization", "Bearer wrong"),), (("authorization", "s3cret-token"),)]:
            got, _ = _code(lambda: stub.Understand(support.request(0.5), timeout=5, metadata=metadata))
            assert got == grpc.StatusCode.UNAUTHENTICATED
        got, _ = _code(lambda: list(stub.StreamingUnderstand(iter([]), timeout=5)))
        assert got == grpc.StatusCode.UNAUTHENTICATED
        ok = stub.Understand(support.request(0.5), timeout=5, metadata=(("authorization", "Bearer s3cret-token"),))
        assert ok.model_id
        # Health checks need no token (probes carry none).
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    assert server.metrics.value("pasu_cloud_requests_total", {"method": "Understand", "code": "UNAUTHENTICATED"}) == 3


def test_tls_and_mutual_tls(support, start_server, tmp_path):
    pki = support.make_pki(tmp_path)
    ca = pki.ca.read_bytes()
    tls = start_server(tls=TlsConfig(cert=str(pki.server_cert), key=str(pki.server_key)))
    with grpc.secure_channel(f"127.0.0.1:{tls.port}", grpc.ssl_channel_credentials(ca)) as channel:
        assert slu_pb2_grpc.SpeechUnderstandingStub(channel).Understand(support.request(0.5), timeout=10).model_id
    with grpc.insecure_channel(f"127.0.0.1:{tls.port}") as plaintext:  # a plaintext client gets nowhere
        stub = slu_pb2_grpc.SpeechUnderstandingStub(plaintext)
        got, _ = _code(lambda: stub.Understand(support.request(0.5), timeout=2))
        assert got == grpc.StatusCode.UNAVAILABLE

    mtls = start_server(tls=TlsConfig(cert=str(pki.server_cert), key=str(pki.server_key), client_ca=str(pki.ca)))
    with grpc.secure_channel(f"127.0.0.1:{mtls.port}", grpc.ssl_channel_credentials(ca)) as no_cert:
        stub = slu_pb2_grpc.SpeechUnderstandingStub(no_cert)
        got, _ = _code(lambda: stub.Understand(support.request(0.5), timeout=2))
        assert got == grpc.StatusCode.UNAVAILABLE  # handshake refused: no client certificate
    with_cert = grpc.ssl_channel_credentials(ca, pki.client_key.read_bytes(), pki.client_cert.read_bytes())
    with grpc.secure_channel(f"127.0.0.1:{mtls.port}", with_cert) as channel:
        assert slu_pb2_grpc.SpeechUnderstandingStub(channel).Understand(support.request(0.5), timeout=10).model_id


# --- Shutdown ---------------------------------------------------------------------------------------------


def test_graceful_shutdown_finishes_in_flight_and_refuses_new(support, start_server, stub_for):
    slow = support.SlowRecognizer(support.tiny_recognizer(), delay_s=0.6)
    server = start_server(slow)
    stub = stub_for(server)
    in_flight = stub.Understand.future(support.request(0.5), timeout=10)
    assert slow.started.wait(5)
    stopping = server.stop_async(grace=5.0)
    time.sleep(0.1)
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as late:
        got, _ = _code(lambda: slu_pb2_grpc.SpeechUnderstandingStub(late).Understand(support.request(0.5), timeout=2))
    assert got == grpc.StatusCode.UNAVAILABLE
    assert in_flight.result(timeout=10).model_id  # finished, not cut off
    stopping.result(timeout=10)
    assert slow.batches == [[8000]]


def test_cli_serves_a_model_folder_and_stops_on_sigterm(support, tmp_path):
    folder = support.write_model_folder(tmp_path / "model")
    (tmp_path / "cloud.yaml").write_text("max_batch_size: 2\ndecoding: {beam_size: 2, maxlenratio: -5}\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pasu.cli", "cloud", "serve", "--model", str(folder), "--config",
         str(tmp_path / "cloud.yaml"), "--port", "0", "--no-metrics", "--threads", "1", "--grace", "5"],
        stderr=subprocess.PIPE, text=True, env={**os.environ, "GRPC_VERBOSITY": "ERROR"})
    try:
        serving = _wait_for_log(proc, "serving", timeout=180)  # with the text pass: transformers loads first
        assert serving["max_batch_size"] == 2 and serving["model_id"].startswith("tiny-untrained@")
        with grpc.insecure_channel(serving["address"]) as channel:
            reply = slu_pb2_grpc.SpeechUnderstandingStub(channel).Understand(support.request(0.5), timeout=20)
        assert reply.model_id == serving["model_id"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        rest = [json.loads(line) for line in proc.stderr.read().splitlines() if line.startswith("{")]
        assert [e["msg"] for e in rest if e["msg"] in ("stopping", "stopped")] == ["stopping", "stopped"]
        rpc = next(e for e in rest if e["msg"] == "rpc")
        assert rpc["code"] == "OK" and "transcript" not in rpc  # no user content in logs by default
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _wait_for_log(proc: subprocess.Popen, message: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        while time.monotonic() < deadline:
            line = pool.submit(proc.stderr.readline).result(timeout=max(deadline - time.monotonic(), 0.1))
            if not line:
                raise AssertionError(f"server exited with {proc.wait()} before logging {message!r}")
            if line.startswith("{") and json.loads(line)["msg"] == message:
                return json.loads(line)
        raise AssertionError(f"no {message!r} log line within {timeout} s")
    finally:
        pool.shutdown(wait=False)
