"""Bearer-token authentication for the cloud server, as a grpc.aio server interceptor.

Clients send `authorization: Bearer <token>` metadata. The token is compared with every accepted token
using `hmac.compare_digest` (constant time, and no early exit on the first match), so response timing says
nothing about how much of a guess was right. Health checks stay open: load balancers and orchestrators
probe without credentials, and serving status reveals nothing.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Sequence

import grpc

HEALTH_PREFIX = "/grpc.health.v1.Health/"


def bearer_token(metadata: Sequence[tuple[str, str | bytes]] | None) -> str | None:
    """The token of the first `authorization: Bearer <token>` entry (scheme case-insensitive), else None."""
    for key, value in metadata or ():
        if key.lower() != "authorization":
            continue
        text = value.decode("latin-1") if isinstance(value, bytes) else value
        scheme, _, token = text.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    return None


def token_matches(presented: str, accepted: Sequence[str]) -> bool:
    """Constant-time membership test: every accepted token is compared, whatever the outcome."""
    given = presented.encode()
    found = False
    for token in accepted:
        found |= hmac.compare_digest(given, token.encode())
    return found


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):
    """Rejects calls without an accepted bearer token with UNAUTHENTICATED (health checks exempt)."""

    def __init__(self, tokens: Sequence[str], exempt_prefixes: Sequence[str] = (HEALTH_PREFIX,),
                 on_reject: Callable[[str], None] | None = None):
        if not tokens:
            raise ValueError("token authentication needs at least one accepted token")
        self._tokens = tuple(tokens)
        self._exempt = tuple(exempt_prefixes)
        self._on_reject = on_reject  # called with the full method name, for metrics and logs

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or details.method.startswith(self._exempt):
            return handler
        token = bearer_token(details.invocation_metadata)
        if token is not None and token_matches(token, self._tokens):
            return handler
        if self._on_reject is not None:
            self._on_reject(details.method)
        reason = "missing bearer token" if token is None else "invalid bearer token"
        return _rejecting(handler, reason)


def _rejecting(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind (unary/stream) as `handler` that aborts with UNAUTHENTICATED.

    Same kind matters: gRPC reads the request(s) according to the handler's shape.
    """

    async def reject(_request: object, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    kinds = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    make = kinds[(bool(handler.request_streaming), bool(handler.response_streaming))]
    return make(reject, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
