"""Credentials on the SDK's calls: ``authorization: Bearer <token>`` on every call of a
channel (the services check it when the cluster runs with auth on; see README "Security")."""

from __future__ import annotations

import collections
from typing import Any, Callable

import grpc

from ._errors import InvalidFieldError


class _Details(collections.namedtuple("_Details", ("method", "timeout", "metadata", "credentials",
                                                   "wait_for_ready", "compression")),
               grpc.ClientCallDetails):
    pass


class BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                  grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    def __init__(self, token: str) -> None:
        if not isinstance(token, str) or not token.strip() or any(c in token for c in "\r\n"):
            raise InvalidFieldError("token", "must be a non-empty string on one line")
        self._header = ("authorization", f"Bearer {token.strip()}")

    def _details(self, details: Any) -> Any:
        metadata = [(k, v) for k, v in (details.metadata or ()) if k != "authorization"]
        metadata.append(self._header)
        return _Details(details.method, details.timeout, metadata, details.credentials,
                        getattr(details, "wait_for_ready", None), getattr(details, "compression", None))

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return continuation(self._details(details), request_iterator)

    def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return continuation(self._details(details), request_iterator)


def with_token(channel: grpc.Channel, token: str | None) -> grpc.Channel:
    """``channel`` carrying ``token`` on every call when one is given."""
    return grpc.intercept_channel(channel, BearerToken(token)) if token else channel


# --- asyncio channels (txmq.aio, and the services' own calls) ------------------------------

def _aio_details(details: Any, token: str) -> Any:
    metadata = [(k, v) for k, v in (details.metadata or ()) if k != "authorization"]
    metadata.append(("authorization", f"Bearer {token}"))
    # grpc.aio takes any sequence of pairs here; the stubs name only its Metadata class.
    return grpc.aio.ClientCallDetails(details.method, details.timeout, metadata,  # type: ignore[arg-type]
                                      details.credentials, details.wait_for_ready)


class _AioBearer:
    def __init__(self, token: Callable[[], str], prefix: str) -> None:
        self._token = token
        self._prefix = prefix

    def _details(self, details: Any) -> Any:
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        return _aio_details(details, self._token()) if method.startswith(self._prefix) else details


class _AioUnaryUnary(_AioBearer, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _AioUnaryStream(_AioBearer, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _AioStreamUnary(_AioBearer, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return await continuation(self._details(details), request_iterator)


class _AioStreamStream(_AioBearer, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return await continuation(self._details(details), request_iterator)


def aio_bearer_interceptors(token: Callable[[], str], prefix: str = "") -> list[Any]:
    """asyncio client interceptors putting ``authorization: Bearer <token()>`` on every call
    of a channel whose method starts with ``prefix``."""
    return [cls(token, prefix) for cls in (_AioUnaryUnary, _AioUnaryStream, _AioStreamUnary, _AioStreamStream)]
