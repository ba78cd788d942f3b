"""`pasu cloud gateway`: HTTP/JSON in front of the gRPC cloud, for callers that speak HTTP rather than gRPC.

POST an audio file (WAV, FLAC, OGG, ...: what libsndfile reads; any rate, mono or stereo) to /v1/understand and
get the cloud's transcript, intent and slots as JSON. The gateway is a gRPC client of `pasu cloud serve`, as
grpc-gateway or Envoy's gRPC-JSON transcoder would be, and adds no policy of its own: it decodes and resamples
the file to the served model's rate (the server does not resample), forwards the caller's `Authorization: Bearer`
token, and turns the server's status codes into HTTP ones, so the server's limits, tokens, admission control and
deadlines hold for HTTP callers too. It reuses the device's client (device/cloud_client.py): one channel, round
robin over replicas, retries on UNAVAILABLE within the deadline.

    pasu cloud gateway --cloud 127.0.0.1:50051 --port 8080
    curl -s --data-binary @command.wav http://127.0.0.1:8080/v1/understand?utterance_id=u1

Routes: POST /v1/understand (200 and the answer; an error status and {"error": {"status", "message"}}),
GET /healthz (the gateway runs), GET /readyz (the cloud answers its gRPC health check: 200, else 503),
GET /openapi.json (their OpenAPI 3.1 description, cloud/openapi.py: generate a client from it).
"""

from __future__ import annotations

import io
import json
import logging
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np

from pasu import __version__
from pasu.cloud.auth import bearer_token
from pasu.cloud.openapi import OPENAPI_PATH, openapi_document
from pasu.device.audio import AudioError, check_length, decode_audio
from pasu.device.cloud_client import CloudClient, CloudResult, FallbackReason

log = logging.getLogger("pasu.gateway")

UNDERSTAND_PATH = "/v1/understand"

# What an HTTP caller gets for each reason the cloud gave no answer (google.rpc's HTTP mapping of the codes).
_STATUS = {
    FallbackReason.DEADLINE: HTTPStatus.GATEWAY_TIMEOUT,
    FallbackReason.UNAVAILABLE: HTTPStatus.SERVICE_UNAVAILABLE,
    FallbackReason.UNAUTHENTICATED: HTTPStatus.UNAUTHORIZED,
    FallbackReason.RESOURCE_EXHAUSTED: HTTPStatus.TOO_MANY_REQUESTS,
    FallbackReason.REJECTED: HTTPStatus.BAD_REQUEST,
    FallbackReason.CANCELLED: HTTPStatus.SERVICE_UNAVAILABLE,
    FallbackReason.ERROR: HTTPStatus.BAD_GATEWAY,
}


@dataclass(frozen=True)
class GatewayOptions:
    """Where the gateway listens and what it accepts."""

    host: str = "127.0.0.1"  # listen address; 0.0.0.0 to serve other machines (behind a TLS-terminating proxy)
    port: int = 8080  # 0 picks a free one (tests)
    max_body_bytes: int = 16 * 1024 * 1024  # larger uploads get 413 unread (30 s of 48-kHz stereo WAV is 5.8 MB)
    max_in_flight: int = 64  # requests answered at once beyond which new ones get 429 (one thread each)
    sample_rate: int = 16000  # the served model's rate: uploads are resampled to it


@dataclass(frozen=True)
class Reply:
    """An HTTP answer: status and JSON body."""

    status: HTTPStatus
    body: dict[str, Any]

    @classmethod
    def error(cls, status: HTTPStatus, reason: str, message: str) -> Reply:
        return cls(status, {"error": {"status": reason, "message": message}})


class Gateway:
    """The HTTP server (one thread per request) over a CloudClient."""

    def __init__(self, client: CloudClient, options: GatewayOptions = GatewayOptions()):
        self.client = client
        self.options = options
        self._slots = threading.BoundedSemaphore(options.max_in_flight)
        self.openapi = openapi_document(UNDERSTAND_PATH, __version__)  # GET /openapi.json's body, built once
        self._http = ThreadingHTTPServer((options.host, options.port), _Handler)
        self._http.daemon_threads = True
        self._http.gateway = self  # type: ignore[attr-defined]  # the handler's way back
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._http.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> Gateway:
        """Serve on a background thread until `stop`."""
        self._thread = threading.Thread(target=self._http.serve_forever, name="pasu-gateway", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting; requests in progress finish on their threads."""
        self._http.shutdown()
        self._http.server_close()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> Gateway:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def understand(self, audio_file: bytes, authorization: str | None, utterance_id: str = "") -> Reply:
        """The reply to one upload: decode, resample, ask the cloud, map its answer."""
        token = bearer_token([("authorization", authorization)]) if authorization is not None else None
        if authorization is not None and token is None:  # the server would refuse it too; this says why
            return Reply.error(HTTPStatus.UNAUTHORIZED, "unauthenticated",
                               "the Authorization header must be `Bearer <token>`")
        try:
            waveform = self._waveform(audio_file)
        except AudioError as error:
            return Reply.error(HTTPStatus.BAD_REQUEST, "invalid_audio", str(error))
        if not self._slots.acquire(blocking=False):
            return Reply.error(HTTPStatus.TOO_MANY_REQUESTS, "resource_exhausted",
                               f"the gateway is answering {self.options.max_in_flight} requests already")
        try:
            started = time.monotonic()
            outcome = self.client.understand(waveform, self.options.sample_rate, utterance_id, token=token)
        finally:
            self._slots.release()
        if outcome.cloud is None:
            return Reply.error(_STATUS[outcome.fallback], outcome.fallback.value, outcome.detail)
        return Reply(HTTPStatus.OK, answer(outcome.cloud, utterance_id, time.monotonic() - started))

    def ready(self) -> Reply:
        serving = self.client.serving()
        status = HTTPStatus.OK if serving else HTTPStatus.SERVICE_UNAVAILABLE
        return Reply(status, {"status": "serving" if serving else "not serving", "cloud": self.client.target})

    def _waveform(self, audio_file: bytes) -> np.ndarray:
        if not audio_file:
            raise AudioError("empty body: POST the audio file's bytes")
        waveform = decode_audio(io.BytesIO(audio_file), self.options.sample_rate, source="upload")
        check_length(len(waveform), self.options.sample_rate, source="upload")
        return waveform


def answer(cloud: CloudResult, utterance_id: str, seconds: float) -> dict[str, Any]:
    """The JSON body of a successful reply."""
    result = cloud.result
    return {
        "utterance_id": utterance_id,
        "transcript": result.text,
        "intent": result.intent,
        "slots": [{"type": s.type, "value": s.value} for s in result.slots],
        "confidence": round(cloud.confidence, 4),
        "model_id": cloud.model_id,
        "timings_ms": {"queue": round(cloud.queue_ms, 1), "inference": round(cloud.inference_ms, 1),
                       "server": round(cloud.server_ms, 1), "gateway": round(1000 * seconds, 1)},
        "batch_size": cloud.batch_size,
    }


class _Handler(BaseHTTPRequestHandler):
    """Routes one HTTP request to its Gateway."""

    protocol_version = "HTTP/1.1"  # keep-alive: a caller's connection serves many requests
    server_version = "pasu-gateway"

    def do_POST(self) -> None:
        gateway: Gateway = self.server.gateway  # type: ignore[attr-defined]
        url = urlsplit(self.path)
        if url.path != UNDERSTAND_PATH:
            return self._send(Reply.error(HTTPStatus.NOT_FOUND, "not_found", f"no route {url.path}; POST audio "
                                                                              f"to {UNDERSTAND_PATH}"))
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self.close_connection = True  # a body of unknown length cannot be skipped
            return self._send(Reply.error(HTTPStatus.LENGTH_REQUIRED, "length_required",
                                          "send the audio file with a Content-Length header"))
        if int(length) > gateway.options.max_body_bytes:
            self.close_connection = True  # the body stays unread
            return self._send(Reply.error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "too_large",
                                          f"{length} bytes; at most {gateway.options.max_body_bytes}"))
        body = self.rfile.read(int(length))
        utterance_id = parse_qs(url.query).get("utterance_id", [""])[0]
        self._send(gateway.understand(body, self.headers.get("Authorization"), utterance_id))

    def do_GET(self) -> None:
        gateway: Gateway = self.server.gateway  # type: ignore[attr-defined]
        path = urlsplit(self.path).path
        if path == "/healthz":
            return self._send(Reply(HTTPStatus.OK, {"status": "ok"}))
        if path == "/readyz":
            return self._send(gateway.ready())
        if path == OPENAPI_PATH:
            return self._send(Reply(HTTPStatus.OK, gateway.openapi))
        if path == UNDERSTAND_PATH:
            return self._send(Reply.error(HTTPStatus.METHOD_NOT_ALLOWED, "method_not_allowed",
                                          f"POST the audio file to {UNDERSTAND_PATH}"), {"Allow": "POST"})
        self._send(Reply.error(HTTPStatus.NOT_FOUND, "not_found", f"no route {path}"))

    def _send(self, reply: Reply, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(reply.body).encode()
        self.send_response(reply.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if reply.status == HTTPStatus.UNAUTHORIZED:
            self.send_header("WWW-Authenticate", "Bearer")
        if reply.status == HTTPStatus.TOO_MANY_REQUESTS:
            self.send_header("Retry-After", "1")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        log.info("http", extra={"fields": {"method": self.command, "path": urlsplit(self.path).path,
                                           "status": int(code) if str(code).isdigit() else code}})

    def log_message(self, format: str, *args: Any) -> None:  # http.server's own errors (bad request lines)
        log.warning(format % args)
