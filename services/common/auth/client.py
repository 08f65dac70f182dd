"""Credentials on the services' own calls: a service identity's bearer token, read from a
file (a mounted Secret) and read again when the file changes, so a rotated token is used
from the next call on. With mTLS the client certificate is the identity and no token is
needed."""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable

import grpc

#: Only txmq's own services get the token (not etcd, which has its own authentication).
NATIVE_METHOD_PREFIX = "/txmq.v1."


class TokenFile:
    """The token in ``path`` (surrounding whitespace removed), looked at again at most every
    ``reload_seconds``; an unreadable or empty file raises OSError/ValueError on first read
    and keeps the last good token afterwards."""

    def __init__(self, path: str, reload_seconds: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.reload_seconds = reload_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._signature: tuple[int, int, int] | None = None
        self._token = self._read()
        self._checked = clock()

    def _read(self) -> str:
        st = os.stat(self.path)
        with open(self.path, encoding="utf-8") as handle:
            token = handle.read().strip()
        if not token:
            raise ValueError(f"{self.path}: the token file is empty")
        self._signature = (st.st_mtime_ns, st.st_size, st.st_ino)
        return token

    def token(self) -> str:
        now = self._clock()
        if now - self._checked >= self.reload_seconds:
            with self._lock:
                self._checked = now
                try:
                    st = os.stat(self.path)
                    if (st.st_mtime_ns, st.st_size, st.st_ino) != self._signature:
                        self._token = self._read()
                except (OSError, ValueError):
                    pass  # keep the last good token; the server says if it is no longer valid
        return self._token


def _with_token(details: Any, token: str) -> Any:
    metadata = [(k, v) for k, v in (details.metadata or ()) if k != "authorization"]
    metadata.append(("authorization", f"Bearer {token}"))
    return grpc.aio.ClientCallDetails(details.method, details.timeout, metadata,
                                      details.credentials, details.wait_for_ready)


class _Bearer:
    def __init__(self, token: Callable[[], str]) -> None:
        self._token = token

    def _details(self, details: Any) -> Any:
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        return _with_token(details, self._token()) if method.startswith(NATIVE_METHOD_PREFIX) else details


class _UnaryUnary(_Bearer, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _UnaryStream(_Bearer, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _StreamUnary(_Bearer, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return await continuation(self._details(details), request_iterator)


class _StreamStream(_Bearer, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return await continuation(self._details(details), request_iterator)


def bearer_interceptors(token: Callable[[], str]) -> list[grpc.aio.ClientInterceptor]:
    """asyncio client interceptors putting ``authorization: Bearer <token()>`` on every
    txmq call of a channel."""
    return [cls(token) for cls in (_UnaryUnary, _UnaryStream, _StreamUnary, _StreamStream)]
