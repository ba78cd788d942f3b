"""Prometheus metrics of the cloud server, exposed as text on an HTTP port (`/metrics`).

Each server owns its own CollectorRegistry (not prometheus_client's global one), so several servers in one
process (tests, a local replica set) count separately.
"""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from pasu.cloud.batching import BatchObserver

# Seconds: an utterance takes ~0.05-2 s to decode; the tail up to 10 s shows overload.
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


class ServerMetrics(BatchObserver):
    """Requests by status, latency, queue depth, batch size, deadline drops; fed by the server and batcher."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter("pasu_cloud_requests", "Finished RPCs by method and gRPC status code",
                                ["method", "code"], registry=r)
        self.latency = Histogram("pasu_cloud_request_seconds", "Server-side RPC latency (receipt to answer)",
                                 ["method"], buckets=LATENCY_BUCKETS, registry=r)
        self.in_flight = Gauge("pasu_cloud_in_flight", "RPCs being handled", registry=r)
        self.queue_depth_gauge = Gauge("pasu_cloud_queue_depth", "Requests waiting for a batch", registry=r)
        self.batch_size = Histogram("pasu_cloud_batch_size", "Utterances per recognize_batch call",
                                    buckets=BATCH_BUCKETS, registry=r)
        self.inference = Histogram("pasu_cloud_inference_seconds", "Duration of recognize_batch calls",
                                   buckets=LATENCY_BUCKETS, registry=r)
        self.expired_requests = Counter("pasu_cloud_expired", "Requests dropped unrun: deadline passed in queue",
                                        registry=r)
        self.audio_seconds = Counter("pasu_cloud_audio_seconds", "Audio seconds recognized",
                                     registry=r)
        self._http: WSGIServer | None = None
        self._http_thread: threading.Thread | None = None

    # --- BatchObserver ---
    def queue_depth(self, depth: int) -> None:
        self.queue_depth_gauge.set(depth)

    def batch(self, size: int, seconds: float) -> None:
        self.batch_size.observe(size)
        self.inference.observe(seconds)

    def expired(self, count: int) -> None:
        self.expired_requests.inc(count)

    # --- server ---
    def request_done(self, method: str, code: str, seconds: float) -> None:
        self.requests.labels(method=method, code=code).inc()
        self.latency.labels(method=method).observe(seconds)

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """One sample's current value (0 when absent), e.g. value("pasu_cloud_batch_size_count")."""
        return self.registry.get_sample_value(name, labels or {}) or 0.0

    def serve_http(self, host: str, port: int) -> int:
        """Serve /metrics on host:port (0: any free port) in a daemon thread; returns the bound port."""
        self._http, self._http_thread = start_http_server(port, addr=host, registry=self.registry)
        return int(self._http.server_port)

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
