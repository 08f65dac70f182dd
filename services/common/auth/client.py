"""Credentials on the services' own calls: a service identity's bearer token, read from a
file (a mounted Secret) and read again when the file changes, so a rotated token is used
from the next call on. With mTLS the client certificate is the identity and no token is
needed."""

from __future__ import annotations

import os
import threading
import time
from typing import Callable

import grpc

from txmq.auth import aio_bearer_interceptors

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


def bearer_interceptors(token: Callable[[], str]) -> list[grpc.aio.ClientInterceptor]:
    """asyncio client interceptors putting ``authorization: Bearer <token()>`` on every
    txmq call of a channel."""
    return aio_bearer_interceptors(token, NATIVE_METHOD_PREFIX)
