"""The device's side of offloading: send one utterance to the cloud, get its result or a reason to fall back.

`CloudClient.understand` never raises for transport trouble. It returns a `CloudOutcome` holding either the
cloud's answer or a `FallbackReason` (deadline, unavailable, unauthenticated, resource_exhausted, ...), so
the device agent can always answer: with the cloud's result, or with its own, marked as a fallback.

One channel is reused for every call (connection set-up, TLS handshakes included, is paid once) with HTTP/2
keepalive, so a dead link is noticed between utterances. UNAVAILABLE (no connection, server stopping) is
retried with exponential backoff within the same deadline: with several replicas the retry lands on a
healthy one. Nothing else is retried: a full queue or a passed deadline will not improve by asking again,
and the device's local answer is ready.

    client = CloudClient(["127.0.0.1:50051", "127.0.0.1:50052"], deadline_s=1.5, token=os.environ["PASU_TOKEN"])
    outcome = client.understand(waveform, 16000, utterance_id="utt-1")
    result = outcome.cloud.result if outcome.ok else local_result
"""

from __future__ import annotations

import enum
import io
import ipaddress
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import grpc
import numpy as np
import soundfile
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pasu.protos import slu_pb2, slu_pb2_grpc

from pasu.metrics import SluResult
from pasu.slu import Slot

log = logging.getLogger(__name__)


class FallbackReason(enum.StrEnum):
    """Why the cloud gave no answer; the value is what logs and reports show."""

    DEADLINE = "deadline"  # the deadline passed (in the network, in the server's queue, or while retrying)
    UNAVAILABLE = "unavailable"  # no server reachable (down, stopping, network gone), after retries
    UNAUTHENTICATED = "unauthenticated"  # token missing or refused, or TLS client certificate refused
    RESOURCE_EXHAUSTED = "resource_exhausted"  # server queue full, or request over the message size limit
    REJECTED = "rejected"  # the input was refused: by the server (INVALID_ARGUMENT, OUT_OF_RANGE) or unsendable
    CANCELLED = "cancelled"  # the call was cancelled (e.g. server shut down without grace)
    ERROR = "error"  # anything else (INTERNAL, UNKNOWN, a closed client, ...)


_REASONS = {
    grpc.StatusCode.DEADLINE_EXCEEDED: FallbackReason.DEADLINE,
    grpc.StatusCode.UNAVAILABLE: FallbackReason.UNAVAILABLE,
    grpc.StatusCode.UNAUTHENTICATED: FallbackReason.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED: FallbackReason.UNAUTHENTICATED,
    grpc.StatusCode.RESOURCE_EXHAUSTED: FallbackReason.RESOURCE_EXHAUSTED,
    grpc.StatusCode.INVALID_ARGUMENT: FallbackReason.REJECTED,
    grpc.StatusCode.OUT_OF_RANGE: FallbackReason.REJECTED,
    grpc.StatusCode.CANCELLED: FallbackReason.CANCELLED,
}


@dataclass(frozen=True)
class CloudResult:
    """The cloud's answer and its server-side timings."""

    result: SluResult  # transcript, intent, slots
    confidence: float  # the cloud model's confidence in [0, 1]
    model_id: str
    queue_ms: float  # server: waiting for a batch
    inference_ms: float  # server: the batch's model call
    server_ms: float  # server: receipt to answer
    batch_size: int


@dataclass(frozen=True)
class CloudOutcome:
    """Either `cloud` (success) or `fallback` with a human-readable `detail`."""

    cloud: CloudResult | None
    fallback: FallbackReason | None
    detail: str  # the status message, for logs; never shown as a result
    latency_s: float  # wall time of understand(), retries and backoff included
    attempts: int  # RPCs sent

    @property
    def ok(self) -> bool:
        return self.cloud is not None


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff for UNAVAILABLE; every wait is also cut short by the call's deadline."""

    max_attempts: int = 4  # RPCs per understand() call, the first included
    initial_backoff_s: float = 0.05  # wait before the first retry
    multiplier: float = 2.0  # each further wait grows by this factor
    max_backoff_s: float = 0.5  # cap on one wait
    jitter: float = 0.2  # each wait is scaled by a random factor in [1 - jitter, 1 + jitter] (no herds)

    def backoff(self, retry: int, rng: random.Random) -> float:
        """Seconds to wait before retry number `retry` (1 for the first)."""
        base = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** (retry - 1))
        return base * rng.uniform(1.0 - self.jitter, 1.0 + self.jitter)


@dataclass(frozen=True)
class ClientTls:
    """TLS towards the cloud; mutual TLS when `cert` and `key` are given."""

    root_ca: str | None = None  # PEM CA bundle that signed the server's certificate; None: system roots
    cert: str | None = None  # PEM client certificate chain (mTLS)
    key: str | None = None  # PEM client private key (mTLS)
    server_name: str | None = None  # name to verify in the server certificate instead of the target host

    def __post_init__(self) -> None:
        # fail where the settings are read, not at the first offload
        if bool(self.cert) != bool(self.key):
            raise ValueError("mutual TLS needs both the client certificate and its key (cert and key)")
        for field, path in (("root_ca", self.root_ca), ("cert", self.cert), ("key", self.key)):
            if path and not Path(path).is_file():
                raise ValueError(f"TLS {field}: no file {path}")

    def credentials(self) -> grpc.ChannelCredentials:
        read = lambda path: Path(path).read_bytes() if path else None
        return grpc.ssl_channel_credentials(root_certificates=read(self.root_ca), private_key=read(self.key),
                                            certificate_chain=read(self.cert))


Encoding = Literal["pcm16", "float32", "flac", "opus"]
# libsndfile (container, codec, compression level) and wire enum of the compressed encodings. Opus's level
# sets its bitrate: libsndfile's default gives ~31 kb/s on our 16-kHz speech, 0.8 ~60 kb/s (a quarter of
# PCM's 256). The cloud's WER on the 150 `test` utterances of `bench hybrid`: PCM 17.3%, Opus by default 19.9%,
# at 0.8 17.8% (scripts/opus_wer.py), so the larger upload is worth it on slow links too.
_COMPRESSED = {"flac": ("FLAC", "PCM_16", None, slu_pb2.FLAC), "opus": ("OGG", "OPUS", 0.8, slu_pb2.OGG_OPUS)}


class CloudClient:
    """A reusable connection to one cloud server or a set of replicas (round robin)."""

    def __init__(
        self,
        targets: str | Sequence[str],
        deadline_s: float = 2.0,
        token: str | None = None,
        tls: ClientTls | None = None,
        retry: RetryPolicy = RetryPolicy(),
        client_id: str = "",
        encoding: Encoding = "pcm16",
        keepalive_s: float = 30.0,
        seed: int | None = None,
    ):
        # targets: "host:port", a gRPC target URI ("dns:///cloud.example:443"), or several "ip:port" replicas.
        # deadline_s: the budget of one understand() call, retries included.
        # encoding: pcm16 halves the upload against float32, at 16-bit precision (what microphones give);
        # flac (lossless) sends about 2/3 of pcm16 and opus (lossy) about 1/4, for slow uplinks, at an encoding
        # cost on the device (measured in the README's network table).
        self.target = channel_target(targets)
        self.deadline_s = deadline_s
        self.retry = retry
        self.client_id = client_id
        self.encoding = encoding
        self._metadata = _bearer(token) if token else ()
        self._rng = random.Random(seed)
        options = _channel_options(keepalive_s)
        if tls is not None:
            name = tls.server_name or _first_host(targets)
            if name:
                options.append(("grpc.ssl_target_name_override", name))
            self._channel = grpc.secure_channel(self.target, tls.credentials(), options=options)
        else:
            if token and not _is_loopback(targets):
                log.warning("sending a bearer token without TLS to %s", self.target)
            self._channel = grpc.insecure_channel(self.target, options=options)
        self._stub = slu_pb2_grpc.SpeechUnderstandingStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    def understand(self, waveform: np.ndarray, sample_rate: int, utterance_id: str = "",
                   pilot: SluResult | None = None, pilot_confidence: float = 0.0,
                   deadline_s: float | None = None, token: str | None = None) -> CloudOutcome:
        """Offload one utterance (1-D float in [-1, 1] or int16); see the module doc. Never raises.

        Audio that cannot be sent (not mono, NaN or infinite samples) is a REJECTED fallback with no RPC: the
        device answers locally instead of crashing on it. `token`: this call's bearer token instead of the
        client's (a gateway forwarding each caller's own).
        """
        started = time.monotonic()
        try:
            request = self.request(waveform, sample_rate, utterance_id, pilot, pilot_confidence)
        except ValueError as error:
            log.info("cloud fallback", extra={"fields": {"utterance_id": utterance_id, "reason": "rejected",
                                                         "attempts": 0, "detail": str(error)}})
            return CloudOutcome(None, FallbackReason.REJECTED, str(error), time.monotonic() - started, 0)
        deadline = started + (self.deadline_s if deadline_s is None else deadline_s)
        metadata = _bearer(token) if token is not None else self._metadata
        attempts, code, detail = 0, grpc.StatusCode.DEADLINE_EXCEEDED, "deadline passed before the first attempt"
        while attempts < self.retry.max_attempts:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            attempts += 1
            try:
                response = self._stub.Understand(request, timeout=remaining, metadata=metadata)
                return CloudOutcome(_cloud_result(response), None, "", time.monotonic() - started, attempts)
            except grpc.RpcError as error:
                code, detail = error.code(), error.details() or ""
            except Exception as error:  # e.g. "Cannot invoke RPC on closed channel!": still fall back
                code, detail = grpc.StatusCode.UNKNOWN, f"{type(error).__name__}: {error}"
            if code != grpc.StatusCode.UNAVAILABLE:
                break
            if time.monotonic() >= deadline and "connection refused" not in detail.lower():
                # the connection was still being set up when time ran out (a slow or partitioned link): gRPC
                # says UNAVAILABLE, the user-facing cause is the deadline. A refusal stays UNAVAILABLE even when
                # it arrives late (a loaded machine): nothing was listening, whatever the clock says
                code, detail = grpc.StatusCode.DEADLINE_EXCEEDED, f"deadline passed while connecting ({detail})"
                break
            wait = self.retry.backoff(attempts, self._rng)
            if time.monotonic() + wait >= deadline:
                break  # no time left for another try: report the real cause, UNAVAILABLE
            time.sleep(wait)
        reason = _REASONS.get(code, FallbackReason.ERROR)
        log.info("cloud fallback", extra={"fields": {"utterance_id": utterance_id, "reason": reason.value,
                                                     "attempts": attempts, "detail": detail}})
        return CloudOutcome(None, reason, detail, time.monotonic() - started, attempts)

    def request(self, waveform: np.ndarray, sample_rate: int, utterance_id: str = "",
                pilot: SluResult | None = None, pilot_confidence: float = 0.0) -> slu_pb2.UnderstandRequest:
        """The UnderstandRequest for one waveform (also what a streaming sender would chunk)."""
        encoding, data = encode_audio(waveform, self.encoding, sample_rate)
        metadata = slu_pb2.UtteranceMetadata(utterance_id=utterance_id, client_id=self.client_id)
        if pilot is not None:
            metadata.pilot.CopyFrom(slu_pb2.PilotHypothesis(
                transcript=pilot.text, intent=pilot.intent, confidence=pilot_confidence,
                slots=[slu_pb2.Slot(type=s.type, value=s.value) for s in pilot.slots]))
        return slu_pb2.UnderstandRequest(
            audio=slu_pb2.Audio(encoding=encoding, sample_rate=sample_rate, data=data), metadata=metadata)

    def serving(self, timeout_s: float = 1.0) -> bool:
        """Whether the cloud answers the standard gRPC health check with SERVING (a readiness probe)."""
        try:
            reply = self._health.Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)  # open without a token
        except grpc.RpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> CloudClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def encode_audio(waveform: np.ndarray, encoding: Encoding = "pcm16", sample_rate: int = 16000) -> tuple[int, bytes]:
    """(AudioEncoding, bytes) of a 1-D waveform: little-endian samples, or one FLAC / Ogg Opus file at
    `sample_rate`; float input is taken as [-1, 1]."""
    x = np.asarray(waveform)
    if x.ndim != 1:
        raise ValueError(f"expected a 1-D (mono) waveform, got shape {x.shape}")
    if x.dtype.kind == "f" and not np.all(np.isfinite(x)):  # NaN would become an arbitrary int16 value
        raise ValueError("waveform contains NaN or infinite samples")
    if encoding == "float32":
        if x.dtype == np.int16:
            x = x.astype(np.float32) / 32768.0
        return slu_pb2.FLOAT32, x.astype("<f4").tobytes()
    if encoding != "pcm16" and encoding not in _COMPRESSED:
        raise ValueError(f"encoding must be one of pcm16, float32, flac, opus, not {encoding!r}")
    if x.dtype != np.int16:
        x = np.round(np.clip(x.astype(np.float64), -1.0, 32767 / 32768) * 32768.0).astype(np.int16)
    if encoding == "pcm16":
        return slu_pb2.LINEAR16, x.astype("<i2").tobytes()
    container, codec, level, wire = _COMPRESSED[encoding]
    buffer = io.BytesIO()
    try:
        soundfile.write(buffer, x, sample_rate, format=container, subtype=codec, compression_level=level)
    except soundfile.LibsndfileError as error:  # e.g. Opus at a rate it does not code (8/12/16/24/48 kHz only)
        raise ValueError(f"cannot encode {sample_rate} Hz audio as {encoding}: {error}") from None
    return wire, buffer.getvalue()


def channel_target(targets: str | Sequence[str]) -> str:
    """One gRPC target for a server or replicas: several "ip:port" become "ipv4:ip1:p1,ip2:p2"."""
    if isinstance(targets, str):
        return targets
    targets = list(targets)
    if not targets:
        raise ValueError("no cloud targets")
    if len(targets) == 1:
        return targets[0]
    hosts = [_split_host(t)[0] for t in targets]
    try:
        versions = {ipaddress.ip_address(h).version for h in hosts}
    except ValueError:
        raise ValueError("several targets must be IP:port (ipv4:/ipv6: URIs); for host names give one DNS "
                         "name that resolves to every replica") from None
    if len(versions) != 1:
        raise ValueError("replicas must be all IPv4 or all IPv6")
    return f"ipv{versions.pop()}:" + ",".join(targets)


def _bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def _channel_options(keepalive_s: float) -> list[tuple[str, Any]]:
    return [
        ("grpc.lb_policy_name", "round_robin"),  # spread calls over every replica (or resolved address)
        ("grpc.keepalive_time_ms", int(keepalive_s * 1000)),  # ping an open connection this often
        ("grpc.keepalive_timeout_ms", 10_000),  # and drop it when a ping goes unanswered this long
        ("grpc.keepalive_permit_without_calls", 0),  # idle devices stay quiet (radio, battery)
        # Reconnect soon after a replica restarts; gRPC's default first backoff is 1 s, a whole deadline.
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 2_000),
    ]


def _cloud_result(r: slu_pb2.UnderstandResponse) -> CloudResult:
    result = SluResult(text=r.transcript, intent=r.intent, slots=tuple(Slot(s.type, s.value) for s in r.slots))
    t = r.timings
    return CloudResult(result, r.confidence, r.model_id, t.queue_ms, t.inference_ms, t.total_ms, t.batch_size)


def _split_host(target: str) -> tuple[str, str]:
    host, _, port = target.rpartition(":")
    return host.strip("[]"), port


def _first_host(targets: str | Sequence[str]) -> str | None:
    """The host to verify TLS against when the target URI has none usable (several replicas)."""
    if isinstance(targets, str) or len(targets) < 2:
        return None
    return _split_host(targets[0])[0]


def _is_loopback(targets: str | Sequence[str]) -> bool:
    items = [targets] if isinstance(targets, str) else list(targets)
    hosts = [_split_host(t.split("///")[-1])[0] for t in items]
    try:
        return all(h == "localhost" or ipaddress.ip_address(h).is_loopback for h in hosts)
    except ValueError:
        return False
