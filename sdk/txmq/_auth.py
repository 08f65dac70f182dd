"""Credentials on the SDK's calls: ``authorization: Bearer <token>`` on every call of a
channel (the services check it when the cluster runs with auth on; see README "Security")."""

from __future__ import annotations

import collections
from typing import Any

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
