"""Per-client concurrency limits: one client cannot take every slot of the server.

gRPC's own `maximum_concurrent_rpcs` bounds the whole server; HTTP/2's per-connection stream limit only
queues extra calls, and a client can open more connections. So the server counts RPCs in progress per
client and answers RESOURCE_EXHAUSTED beyond `max_streams_per_client`.

Who is "a client": the bearer token when token authentication is on (the interceptor checked it; one token
per device or tenant), else the verified TLS client certificate's common name (mutual TLS), else the peer's
IP address. Unverified claims (metadata.client_id, a token when auth is off) never pick the bucket, or a
client could dodge its limit by inventing a new name per call.
"""

from __future__ import annotations

import hashlib
from collections import Counter

import grpc
from pasu.cloud.auth import bearer_token


class ClientLimiter:
    """RPCs in progress per client key; used from the server's event loop only (no lock needed)."""

    def __init__(self, limit: int | None):
        if limit is not None and limit < 1:
            raise ValueError("max_streams_per_client must be at least 1 (or None: no limit)")
        self.limit = limit
        self._active: Counter[str] = Counter()

    def acquire(self, client: str) -> bool:
        """Count one more RPC of `client`; False (and nothing counted) when it is at its limit."""
        if self.limit is not None and self._active[client] >= self.limit:
            return False
        self._active[client] += 1
        return True

    def release(self, client: str) -> None:
        self._active[client] -= 1
        if self._active[client] <= 0:
            del self._active[client]  # idle clients cost no memory

    def active(self, client: str) -> int:
        return self._active.get(client, 0)


def client_key(context: grpc.aio.ServicerContext, token_verified: bool) -> str:
    """The limit bucket of the calling client (see the module doc); never holds a token in clear."""
    if token_verified:
        token = bearer_token(context.invocation_metadata())
        if token is not None:
            return "token:" + hashlib.sha256(token.encode()).hexdigest()[:16]
    names = context.auth_context().get("x509_common_name")
    if names:
        return "cert:" + next(iter(names)).decode("utf-8", "replace")
    return "peer:" + peer_host(context.peer())


def peer_host(peer: str) -> str:
    """The address of a gRPC peer string without its port: "ipv4:1.2.3.4:5" -> "1.2.3.4", "ipv6:[::1]:5" -> "::1"."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":  # "[::1]:5", or URL-quoted "%5B::1%5D:5" by newer gRPC releases
        return rest.rpartition(":")[0].replace("%5B", "[").replace("%5D", "]").strip("[]")
    return peer  # unix sockets and others: the whole string
