"""`pasu cloud gateway`: HTTP callers upload audio files and get the real cloud server's answers as JSON."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
import soundfile as sf

from pasu.cloud.gateway import UNDERSTAND_PATH, Gateway, GatewayOptions
from pasu.cloud.openapi import OPENAPI_PATH
from pasu.corpus import tts
from pasu.device.cloud_client import CloudClient, RetryPolicy


def wav(waveform: np.ndarray, rate: int = 16000, fmt: str = "WAV") -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, waveform, rate, format=fmt)
    return buffer.getvalue()


@pytest.fixture
def gateway_for():
    """gateway_for(server, token=None, **GatewayOptions fields) -> a started Gateway on a free port over a
    CloudClient to the server; both closed at teardown."""
    opened = []

    def make(server, deadline_s: float = 10.0, **options):
        client = CloudClient(f"127.0.0.1:{server.port}", deadline_s=deadline_s,
                             retry=RetryPolicy(max_attempts=2, initial_backoff_s=0.05))
        gateway = Gateway(client, GatewayOptions(port=0, **options)).start()
        opened.append((gateway, client))
        return gateway

    yield make
    for gateway, client in opened:
        gateway.stop()
        client.close()


def post(gateway: Gateway, body: bytes, **kwargs) -> requests.Response:
    return requests.post(gateway.url + UNDERSTAND_PATH, data=body, timeout=30, **kwargs)


def test_an_uploaded_file_at_any_rate_is_answered_as_json(support, start_server, gateway_for):
    gateway = gateway_for(start_server())
    stereo_8k = np.stack([support.waveform(1.0)[::2]] * 2, axis=1)  # 1 s of 8-kHz stereo
    reply = post(gateway, wav(stereo_8k, 8000), params={"utterance_id": "u-7"})
    assert reply.status_code == 200, reply.text
    assert reply.headers["Content-Type"] == "application/json"
    body = reply.json()
    assert body["utterance_id"] == "u-7"
    assert body["model_id"] == "tiny-untrained"
    assert set(body) >= {"transcript", "intent", "slots", "confidence", "timings_ms", "batch_size"}
    assert 0.0 <= body["confidence"] <= 1.0 and body["batch_size"] == 1
    assert body["timings_ms"]["gateway"] >= body["timings_ms"]["server"] > 0
    # FLAC uploads too, on the same kept-alive connection
    with requests.Session() as session:
        for fmt in ("FLAC", "WAV"):
            answer = session.post(gateway.url + UNDERSTAND_PATH, data=wav(support.waveform(0.5), fmt=fmt), timeout=30)
            assert answer.status_code == 200 and answer.json()["model_id"] == "tiny-untrained"


def test_a_spoken_command_gets_its_intent_from_a_trained_model(start_server, gateway_for):
    from pasu.models.recognizer import DecodingOptions, load_recognizer
    from pasu.settings import shipped_model

    voice = tts.voice_by_id("espeak:en-us")
    if not tts.is_installed(voice):
        pytest.skip("espeak-ng is not installed (make tts)")
    recognizer = load_recognizer(shipped_model("device"), DecodingOptions(beam_size=3, num_threads=1))
    gateway = gateway_for(start_server(recognizer))
    reply = post(gateway, wav(tts.render(voice, "wake me up at seven am tomorrow")))
    assert reply.status_code == 200, reply.text
    assert reply.json()["intent"] == "alarm_set"
    assert "wake" in reply.json()["transcript"]


@pytest.mark.parametrize("body, message", [
    (b"", "empty body"),
    (b"RIFF this is not audio", "not a readable audio file"),
    (None, "too short"),  # 50 ms of real WAV audio
])
def test_bad_uploads_get_400_with_the_reason_and_never_reach_the_model(support, start_server, gateway_for, body,
                                                                        message):
    slow = support.SlowRecognizer(support.tiny_recognizer(), delay_s=0.0)
    gateway = gateway_for(start_server(slow))
    reply = post(gateway, wav(support.waveform(0.05)) if body is None else body)
    assert reply.status_code == 400
    assert reply.json()["error"]["status"] == "invalid_audio"
    assert message in reply.json()["error"]["message"]
    assert "BytesIO" not in reply.json()["error"]["message"]  # says what is wrong with the file, not where it was
    assert slow.batches == []
    assert post(gateway, wav(support.waveform(0.5))).status_code == 200  # the gateway serves on


def test_an_upload_over_the_size_limit_gets_413_unread(support, start_server, gateway_for):
    gateway = gateway_for(start_server(), max_body_bytes=10_000)
    reply = post(gateway, wav(support.waveform(1.0)))  # 32 kB
    assert reply.status_code == 413
    assert "at most 10000" in reply.json()["error"]["message"]


def test_the_callers_token_is_forwarded_and_refusals_are_401(support, start_server, gateway_for):
    gateway = gateway_for(start_server(auth_tokens=("s3cret-token",)))
    audio = wav(support.waveform(0.5))
    assert post(gateway, audio, headers={"Authorization": "Bearer s3cret-token"}).status_code == 200
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic czNjcmV0"}):
        reply = post(gateway, audio, headers=headers)
        assert reply.status_code == 401, headers
        assert reply.headers["WWW-Authenticate"] == "Bearer"
        assert reply.json()["error"]["status"] == "unauthenticated"
    assert "Bearer <token>" in post(gateway, audio, headers={"Authorization": "Basic czNjcmV0"}).text


def test_a_full_server_queue_is_429_with_retry_after(support, start_server, gateway_for):
    slow = support.SlowRecognizer(support.tiny_recognizer(), delay_s=0.6)
    gateway = gateway_for(start_server(slow, max_batch_size=1, max_queue=1))
    audio = wav(support.waveform(0.5))
    with ThreadPoolExecutor(4) as pool:
        running = pool.submit(post, gateway, audio)
        assert slow.started.wait(10)
        replies = list(pool.map(lambda _: post(gateway, audio), range(3)))
    assert running.result().status_code == 200
    refused = [r for r in replies if r.status_code == 429]
    assert len(refused) == 2 and sum(r.status_code == 200 for r in replies) == 1
    assert all(r.headers["Retry-After"] == "1" and r.json()["error"]["message"] == "queue full (1 pending)"
               for r in refused)


def test_the_gateways_own_bound_on_requests_in_progress(support, start_server, gateway_for):
    slow = support.SlowRecognizer(support.tiny_recognizer(), delay_s=0.6)
    gateway = gateway_for(start_server(slow), max_in_flight=1)
    audio = wav(support.waveform(0.5))
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(post, gateway, audio)
        assert slow.started.wait(10)
        refused = post(gateway, audio)
    assert running.result().status_code == 200
    assert refused.status_code == 429 and "answering 1 requests already" in refused.json()["error"]["message"]


def test_readiness_follows_the_cloud_and_a_stopped_cloud_is_503(support, start_server, gateway_for):
    server = start_server()
    gateway = gateway_for(server, deadline_s=2.0)
    assert requests.get(gateway.url + "/readyz", timeout=10).json()["status"] == "serving"
    server.stop()
    assert requests.get(gateway.url + "/healthz", timeout=10).status_code == 200  # the gateway itself runs
    assert requests.get(gateway.url + "/readyz", timeout=10).status_code == 503
    reply = post(gateway, wav(support.waveform(0.5)))
    assert reply.status_code in (503, 504)  # refused, or the deadline passed while reconnecting
    assert reply.json()["error"]["status"] in ("unavailable", "deadline")


def test_the_openapi_document_is_valid_and_describes_the_replies(support, start_server, gateway_for):
    """Callers generate clients from /openapi.json: it must be valid OpenAPI 3.1, and the gateway's real replies,
    answers and errors alike, must match the schemas it gives for their route and status."""
    from jsonschema import Draft202012Validator
    from openapi_spec_validator import validate

    server = start_server()
    gateway = gateway_for(server, deadline_s=2.0)
    document = requests.get(gateway.url + OPENAPI_PATH, timeout=10).json()
    validate(document)

    def check(method: str, path: str, reply: requests.Response) -> None:
        described = document["paths"][path][method]["responses"][str(reply.status_code)]
        schema = {"$ref": described["content"]["application/json"]["schema"]["$ref"],
                  "components": document["components"]}
        Draft202012Validator(schema).validate(reply.json())

    check("post", UNDERSTAND_PATH, post(gateway, wav(support.waveform(1.0)), params={"utterance_id": "u-1"}))
    check("post", UNDERSTAND_PATH, post(gateway, b"not audio"))
    check("get", "/healthz", requests.get(gateway.url + "/healthz", timeout=10))
    check("get", "/readyz", requests.get(gateway.url + "/readyz", timeout=10))
    server.stop()
    check("get", "/readyz", requests.get(gateway.url + "/readyz", timeout=10))
    check("post", UNDERSTAND_PATH, post(gateway, wav(support.waveform(0.5))))


def test_unknown_routes_and_methods(support, start_server, gateway_for):
    gateway = gateway_for(start_server())
    assert requests.get(gateway.url + UNDERSTAND_PATH, timeout=10).status_code == 405
    assert requests.get(gateway.url + "/v2/nothing", timeout=10).status_code == 404
    assert requests.post(gateway.url + "/understand", data=b"x", timeout=10).status_code == 404


def test_the_cli_serves_until_sigterm(support, tmp_path):
    with support.CliServer(support.write_model_folder(tmp_path / "model")) as server:
        proc = subprocess.Popen([sys.executable, "-m", "pasu.cli", "cloud", "gateway", "--cloud", server.address,
                                 "--port", "0"], stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "GRPC_VERBOSITY": "ERROR"})
        try:
            url = _serving_url(proc)
            reply = requests.post(url + UNDERSTAND_PATH, data=wav(support.waveform(0.5)), timeout=30)
            assert reply.status_code == 200 and reply.json()["model_id"].startswith("tiny-untrained")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()


def _serving_url(proc: subprocess.Popen, timeout: float = 60.0) -> str:
    """The URL of the gateway's `serving` log line (its port is picked by the OS)."""
    found: list[str] = []

    def read() -> None:
        for line in proc.stderr:
            if line.startswith("{") and json.loads(line)["msg"] == "serving":
                found.append(json.loads(line)["url"])
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
    assert found, "the gateway did not log `serving`"
    return found[0]
