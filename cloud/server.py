"""The cloud side of PASU: a grpc.aio server that batches offloaded utterances into one recognizer.

Why grpc.aio rather than the thread-pool server: a request that waits for a batch slot costs a coroutine,
not a thread, so the only bound on waiting work is our own admission control (`max_queue`, answered with
RESOURCE_EXHAUSTED) instead of a thread pool silently queueing; batching concurrent requests is a few
awaits on one loop; and deadlines, cancellation and graceful stop come from the aio server itself. The
model runs in one worker thread (torch releases the GIL), so the loop keeps accepting and rejecting while
a batch decodes.

    CloudServer  = SpeechUnderstandingService (deadlines, stream timeouts, responses)
                   with validation.py (parsing, audio checks) and limits.py (calls per client)
                 + MicroBatcher (queue bound, batching) around a Recognizer
                   (+ the text second pass, TextIntentPass, when `text_intent` names a classifier)
                 + TokenAuthInterceptor, TLS credentials, health, reflection, ServerMetrics
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import math
import signal
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import numpy as np
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from pasu.cloud.auth import TokenAuthInterceptor
from pasu.cloud.batching import BatchingOptions, DeadlineExpired, MicroBatcher, QueueFull
from pasu.cloud.config import ServerConfig
from pasu.cloud.limits import ClientLimiter, client_key
from pasu.cloud.metrics import ServerMetrics
from pasu.cloud.validation import (
    AudioLimits,
    RpcFailure,
    check_duration,
    check_format,
    check_metadata,
    decode_audio,
    lenient_parser,
    parsed,
    received_seconds,
)
from pasu.models.recognizer import Recognition, Recognizer, TextIntentPass
from pasu.models.text_intent import TextIntentClassifier
from pasu.protos import slu_pb2, slu_pb2_grpc
from pasu.torch_threads import adopt_torch_threads

log = logging.getLogger("pasu.cloud")

SERVICE_NAME = slu_pb2.DESCRIPTOR.services_by_name["SpeechUnderstanding"].full_name  # "pasu.v1.SpeechUnderstanding"


# --- The service ------------------------------------------------------------------------------------------


class SpeechUnderstandingService(slu_pb2_grpc.SpeechUnderstandingServicer):
    """Validates, queues into the batcher, answers; records metrics and one log line per RPC."""

    def __init__(self, recognizer: Recognizer, batcher: MicroBatcher[Recognition], config: ServerConfig,
                 metrics: ServerMetrics):
        self.recognizer = recognizer
        self.batcher = batcher
        self.config = config
        self.metrics = metrics
        self.limits = AudioLimits(recognizer.sample_rate, config.min_audio_seconds, config.max_audio_seconds)
        self.clients = ClientLimiter(config.max_streams_per_client)
        self._token_auth = bool(config.tokens())

    async def Understand(self, request: slu_pb2.UnderstandRequest,
                         context: grpc.aio.ServicerContext) -> slu_pb2.UnderstandResponse:
        async with self._rpc("Understand", context) as call:
            request = parsed(request)
            check_metadata(request.metadata)
            audio = request.audio
            waveform = decode_audio(audio.encoding, audio.sample_rate, audio.data, self.limits)
            return await self._understand(waveform, request.metadata, call)

    async def StreamingUnderstand(self, request_iterator: AsyncIterator[slu_pb2.StreamRequest],
                                  context: grpc.aio.ServicerContext) -> AsyncIterator[slu_pb2.StreamResponse]:
        async with self._rpc("StreamingUnderstand", context) as call:
            config: slu_pb2.StreamConfig | None = None
            width, chunks, received = 0, [], 0
            messages = _timed(request_iterator, self.config.stream_idle_timeout_s, self.config.max_stream_seconds)
            async for message in messages:
                message = parsed(message)
                kind = message.WhichOneof("request")
                if config is None:
                    if kind != "config":
                        raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, "the first message must be a StreamConfig")
                    config = message.config
                    check_metadata(config.metadata)
                    width = check_format(config.encoding, config.sample_rate, self.limits)  # fail before audio
                elif kind == "config":
                    raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, "StreamConfig sent twice")
                elif kind == "end":
                    break
                elif kind == "audio":
                    chunks.append(message.audio)
                    received += len(message.audio)
                    check_duration(received, width, self.limits)  # stop a runaway stream early
                    if config.send_acks:
                        yield slu_pb2.StreamResponse(ack=slu_pb2.StreamAck(
                            received_bytes=received, received_seconds=received_seconds(config.encoding, received,
                                                                                      self.limits)))
            if config is None:
                raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, "empty stream: no StreamConfig")
            waveform = decode_audio(config.encoding, config.sample_rate, b"".join(chunks), self.limits)
            yield slu_pb2.StreamResponse(result=await self._understand(waveform, config.metadata, call))

    @contextlib.asynccontextmanager
    async def _rpc(self, method: str, context: grpc.aio.ServicerContext) -> AsyncIterator[_Call]:
        """One RPC's bookkeeping around its handler: admission per client, the status an RpcFailure or a
        cancellation sets (a failure becomes the client's error), metrics and the log line at the end."""
        call = _Call(method, context, self.metrics, self.config.log_content)
        try:
            call.admit(self.clients, client_key(context, self._token_auth))
            yield call
        except RpcFailure as failure:
            call.code = failure.code
            await context.abort(failure.code, failure.message)
        except asyncio.CancelledError:
            call.cancelled()
            raise
        finally:
            call.finish()

    async def _understand(self, waveform: np.ndarray, metadata: slu_pb2.UtteranceMetadata,
                          call: _Call) -> slu_pb2.UnderstandResponse:
        call.fields.update(utterance_id=metadata.utterance_id, client_id=metadata.client_id,
                           audio_s=round(len(waveform) / self.limits.sample_rate, 3))
        remaining = call.context.time_remaining()
        if remaining is not None and remaining <= 0:
            raise RpcFailure(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline passed before the request was queued")
        try:
            outcome = await self.batcher.submit(waveform, remaining)
        except QueueFull as full:
            raise RpcFailure(grpc.StatusCode.RESOURCE_EXHAUSTED, str(full)) from None
        except DeadlineExpired:
            raise RpcFailure(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline passed before inference") from None
        except Exception:
            log.exception("inference failed", extra={"fields": {"utterance_id": metadata.utterance_id}})
            raise RpcFailure(grpc.StatusCode.INTERNAL, "inference failed") from None
        self.metrics.audio_seconds.inc(len(waveform) / self.limits.sample_rate)
        result = outcome.result
        call.fields.update(queue_ms=round(outcome.queue_ms, 1), inference_ms=round(outcome.inference_ms, 1),
                           batch_size=outcome.batch_size)
        call.content.update(transcript=result.text, intent=result.intent,
                            pilot=metadata.pilot.transcript if metadata.HasField("pilot") else None)
        return slu_pb2.UnderstandResponse(
            transcript=result.text,
            intent=result.intent,
            slots=[slu_pb2.Slot(type=s.type, value=s.value) for s in result.slots],
            confidence=_unit(result.confidence),
            model_id=self.recognizer.model_id,
            utterance_id=metadata.utterance_id,
            timings=slu_pb2.ServerTimings(queue_ms=outcome.queue_ms, inference_ms=outcome.inference_ms,
                                          total_ms=call.elapsed_ms(), batch_size=outcome.batch_size),
        )


async def _timed(messages: AsyncIterator[Any], idle_s: float, total_s: float) -> AsyncIterator[Any]:
    """`messages`, ended with OUT_OF_RANGE when the client goes quiet for `idle_s` or streams past `total_s`.

    Without this a stream that never sends its config, or never ends, holds a slot of the server (and of its
    client's limit) until the client's deadline, and a client may set none.
    """
    loop = asyncio.get_running_loop()
    ends_at = loop.time() + total_s
    iterator = aiter(messages)
    while True:
        left = ends_at - loop.time()
        try:
            message = await asyncio.wait_for(anext(iterator), min(idle_s, max(left, 0.0)))
        except StopAsyncIteration:
            return
        except TimeoutError:
            if left <= idle_s:
                raise RpcFailure(grpc.StatusCode.OUT_OF_RANGE,
                                 f"stream open longer than the {total_s:g} s limit without EndOfAudio") from None
            raise RpcFailure(grpc.StatusCode.OUT_OF_RANGE,
                             f"no stream message for {idle_s:g} s: send audio in real time and end with "
                             "EndOfAudio") from None
        yield message


def _unit(confidence: float) -> float:
    """A confidence in [0, 1]: a model that produced NaN (degenerate input) reports 0, not NaN."""
    return min(max(confidence, 0.0), 1.0) if math.isfinite(confidence) else 0.0


class _Call:
    """Bookkeeping of one RPC: status for metrics, one structured log line at the end."""

    def __init__(self, method: str, context: grpc.aio.ServicerContext, metrics: ServerMetrics, log_content: bool):
        self.method = method
        self.context = context
        self.metrics = metrics
        self.log_content = log_content
        self.code = grpc.StatusCode.OK
        self.started = time.perf_counter()
        remaining = context.time_remaining()
        self.deadline = None if remaining is None else self.started + remaining
        self.fields: dict[str, Any] = {}
        self.content: dict[str, Any] = {}  # user content: logged only with log_content
        self._admitted: tuple[ClientLimiter, str] | None = None
        metrics.in_flight.inc()

    def admit(self, limiter: ClientLimiter, client: str) -> None:
        """Count this RPC against its client's limit; RESOURCE_EXHAUSTED when the client is at it."""
        if not limiter.acquire(client):
            raise RpcFailure(grpc.StatusCode.RESOURCE_EXHAUSTED,
                             f"too many concurrent calls from this client (limit {limiter.limit})")
        self._admitted = (limiter, client)

    def elapsed_ms(self) -> float:
        return (time.perf_counter() - self.started) * 1000.0

    def cancelled(self) -> None:
        """The aio server cancelled the handler: its deadline passed, the client left, or the server stopped."""
        # gRPC cancels at the deadline, so a deadline cancel finds us at or just past it (10 ms of clock slack).
        expired = self.deadline is not None and time.perf_counter() >= self.deadline - 0.01
        self.code = grpc.StatusCode.DEADLINE_EXCEEDED if expired else grpc.StatusCode.CANCELLED

    def finish(self) -> None:
        if self._admitted is not None:
            limiter, client = self._admitted
            limiter.release(client)
        self.metrics.in_flight.dec()
        seconds = time.perf_counter() - self.started
        self.metrics.request_done(self.method, self.code.name, seconds)
        fields = {"method": self.method, "code": self.code.name, "total_ms": round(seconds * 1000.0, 1),
                  "peer": self.context.peer(), **self.fields}
        if self.log_content:
            fields.update(self.content)
        log.info("rpc", extra={"fields": fields})


# --- The server -------------------------------------------------------------------------------------------


class CloudServer:
    """One grpc.aio server around one recognizer; `start()` / `stop(grace)` on a running event loop."""

    def __init__(self, recognizer: Recognizer, config: ServerConfig = ServerConfig()):
        self.recognizer = _with_second_pass(recognizer, config)
        self.config = config
        self.metrics = ServerMetrics()
        self.batcher: MicroBatcher[Recognition] = MicroBatcher(
            self.recognizer.recognize_batch,  # the second pass runs in the batch: inference_ms includes it
            BatchingOptions(config.max_batch_size, config.max_batch_wait_ms, config.max_queue),
            observer=self.metrics,
            # one inference thread that honours the process's torch thread count (see pasu.torch_threads)
            executor=concurrent.futures.ThreadPoolExecutor(1, "pasu-infer", initializer=adopt_torch_threads))
        self.health = health.aio.HealthServicer()
        self.port: int | None = None  # bound gRPC port, after start()
        self.metrics_port: int | None = None  # bound /metrics port, after start(), when enabled
        self._server: grpc.aio.Server | None = None

    async def start(self) -> int:
        """Bind, start serving, report SERVING; returns the bound gRPC port."""
        c = self.config
        tokens = c.tokens()
        interceptors = [TokenAuthInterceptor(tokens, on_reject=self._rejected)] if tokens else []
        server = grpc.aio.server(interceptors=interceptors, options=_channel_options(c),
                                 maximum_concurrent_rpcs=c.max_concurrent_rpcs)
        _add_service(SpeechUnderstandingService(self.recognizer, self.batcher, c, self.metrics), server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection([SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
        address = f"{c.host}:{c.port}"
        if c.tls is not None:
            self.port = server.add_secure_port(address, _server_credentials(c))
        else:
            self.port = server.add_insecure_port(address)
        if self.port == 0:
            raise RuntimeError(f"could not bind {address}")
        self.batcher.start()
        await server.start()
        self._server = server
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        if c.metrics_port is not None:
            self.metrics_port = self.metrics.serve_http(c.host, c.metrics_port)
        log.info("serving", extra={"fields": {
            "address": f"{c.host}:{self.port}", "metrics_port": self.metrics_port, "model_id": self.recognizer.model_id,
            "tls": c.tls is not None, "mtls": bool(c.tls and c.tls.client_ca), "auth": bool(tokens),
            "max_batch_size": c.max_batch_size, "max_queue": c.max_queue}})
        return self.port

    async def stop(self, grace: float | None = None) -> None:
        """Graceful stop: NOT_SERVING, refuse new RPCs, let in-flight ones finish within `grace` seconds."""
        if self._server is None:
            return
        await self.health.enter_graceful_shutdown()  # load balancers drain us first
        log.info("stopping", extra={"fields": {"grace_s": grace}})
        await self._server.stop(grace)  # in-flight RPCs still need the batcher: close it after
        await self.batcher.close()
        self.metrics.close()
        self._server = None
        log.info("stopped")

    async def wait_for_termination(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()

    def _rejected(self, method: str) -> None:
        self.metrics.request_done(method.rsplit("/", 1)[-1], grpc.StatusCode.UNAUTHENTICATED.name, 0.0)
        log.info("rpc", extra={"fields": {"method": method.rsplit("/", 1)[-1], "code": "UNAUTHENTICATED"}})


def _with_second_pass(recognizer: Recognizer, config: ServerConfig) -> Recognizer:
    """`recognizer`, followed by the text-intent classifier that `config.text_intent` names, if any."""
    folder = config.text_intent_folder()
    if folder is None:
        reason = "text_intent: null" if config.text_intent is None else "no models/shipped/text_intent"
        log.info("text-intent second pass off", extra={"fields": {"reason": reason}})
        return recognizer
    second = TextIntentPass(recognizer, TextIntentClassifier.load(folder))
    log.info("text-intent second pass on", extra={"fields": {"folder": str(folder), "model_id": second.model_id}})
    return second


def _add_service(service: SpeechUnderstandingService, server: grpc.aio.Server) -> None:
    """Register the service like the generated `add_SpeechUnderstandingServicer_to_server`, with lenient parsing.

    Request bytes that are not a valid message reach the handler as `Malformed` (INVALID_ARGUMENT) instead of
    failing in gRPC's deserializer (UNKNOWN, an error traceback in the log, and no metrics).
    """
    handlers = {
        "Understand": grpc.unary_unary_rpc_method_handler(
            service.Understand, request_deserializer=lenient_parser(slu_pb2.UnderstandRequest),
            response_serializer=slu_pb2.UnderstandResponse.SerializeToString),
        "StreamingUnderstand": grpc.stream_stream_rpc_method_handler(
            service.StreamingUnderstand, request_deserializer=lenient_parser(slu_pb2.StreamRequest),
            response_serializer=slu_pb2.StreamResponse.SerializeToString),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


def _channel_options(c: ServerConfig) -> list[tuple[str, Any]]:
    return [
        ("grpc.max_receive_message_length", c.max_message_bytes),
        ("grpc.max_send_message_length", c.max_message_bytes),
        # Devices ping every 30 s on open calls to notice dead links; accept pings that often instead of
        # answering them with GOAWAY "too_many_pings" (the default minimum interval is 5 minutes).
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.so_reuseport", 0),  # a second server on a taken port must fail, not share it
    ]


def _server_credentials(c: ServerConfig) -> grpc.ServerCredentials:
    assert c.tls is not None
    cert, key, client_ca = c.tls.read()
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=client_ca,
                                       require_client_auth=client_ca is not None)


# --- Running it -------------------------------------------------------------------------------------------


def serve(recognizer: Recognizer, config: ServerConfig) -> int:
    """Serve until SIGTERM or SIGINT, then stop gracefully (config.shutdown_grace_s); the process's main."""
    return asyncio.run(_serve(recognizer, config))


async def _serve(recognizer: Recognizer, config: ServerConfig) -> int:
    server = CloudServer(recognizer, config)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(config.shutdown_grace_s)
    return 0


class ServerThread:
    """A CloudServer on its own event loop in a background thread: for tests and in-process demos.

        with ServerThread(recognizer, ServerConfig(port=0, metrics_port=None)) as server:
            channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    """

    def __init__(self, recognizer: Recognizer, config: ServerConfig = ServerConfig(port=0, metrics_port=None)):
        self.server = CloudServer(recognizer, config)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="pasu-cloud", daemon=True)

    @property
    def port(self) -> int:
        assert self.server.port is not None, "not started"
        return self.server.port

    @property
    def metrics(self) -> ServerMetrics:
        return self.server.metrics

    def start(self, timeout: float = 30.0) -> ServerThread:
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self.server.start(), self._loop).result(timeout)
        except BaseException:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)
            raise
        return self

    def stop_async(self, grace: float | None = None) -> concurrent.futures.Future:
        """Begin a graceful stop; the future completes when the server has stopped."""
        return asyncio.run_coroutine_threadsafe(self.server.stop(grace), self._loop)

    def stop(self, grace: float | None = None, timeout: float = 30.0) -> None:
        if self._thread.is_alive():
            self.stop_async(grace).result(timeout)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop(grace=0)


# --- Logs -------------------------------------------------------------------------------------------------


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and the record's `fields` (extra=...)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            **getattr(record, "fields", {}),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(debug: bool = False) -> None:
    """JSON lines on stderr for the whole process; ESPnet's per-utterance beam search chatter only in debug."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    logging.getLogger("espnet").setLevel(logging.DEBUG if debug else logging.ERROR)
