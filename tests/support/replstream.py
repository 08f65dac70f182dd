"""A blocking client of a broker's replication port (``services/broker/transport.py``) for
tests: send a hello or any bytes, and read back the frames the broker answers until it
closes the connection or goes quiet."""

from __future__ import annotations

import socket
import ssl
from typing import Any

import grpc

from services.broker.store import replog
from services.broker.transport import Refused

from .processes import ServiceProcess


def replication_address(proc: ServiceProcess) -> tuple[str, int]:
    port = int(proc.ready_info["replication_port"])
    assert port > 0, f"{proc.name} has no replication port"
    return proc.host, port


def split_frames(buffer: bytes, frames: list[tuple[int, bytes]]) -> bytes:
    """Appends every complete frame at the start of ``buffer`` to ``frames`` as (kind,
    body); returns the incomplete rest."""
    while len(buffer) >= replog.FRAME_HEAD.size:
        length, kind = replog.FRAME_HEAD.unpack_from(buffer)
        if len(buffer) < 4 + length:
            break
        frames.append((kind, buffer[replog.FRAME_HEAD.size:4 + length]))
        buffer = buffer[4 + length:]
    return buffer


def exchange(address: tuple[str, int], data: bytes, *, timeout: float = 3.0,
             context: ssl.SSLContext | None = None, server_hostname: str | None = None,
             max_frames: int = 4) -> tuple[list[tuple[int, bytes]], bool]:
    """Sends ``data``, then reads frames: (the frames, whether the broker closed the
    connection). Stops after ``max_frames`` or ``timeout`` seconds of silence."""
    raw = socket.create_connection(address, timeout=timeout)
    sock: Any = raw
    try:
        if context is not None:
            sock = context.wrap_socket(raw, server_hostname=server_hostname or address[0])
        if data:
            sock.sendall(data)
        frames: list[tuple[int, bytes]] = []
        buffer = b""
        closed = False
        while len(frames) < max_frames:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            except (ConnectionResetError, ssl.SSLError):
                closed = True
                break
            if not chunk:
                closed = True
                break
            buffer = split_frames(buffer + chunk, frames)
        return frames, closed
    finally:
        sock.close()


def refusal(frames: list[tuple[int, bytes]]) -> Refused | None:
    """The REFUSED frame among ``frames``, as the exception the broker's client raises."""
    for kind, body in frames:
        if kind == replog.REFUSED:
            code, message = replog.decode_refused(body)
            return Refused({c.value[0]: c for c in grpc.StatusCode}[code], message)
    return None


def open_session(address: tuple[str, int], shard: str, replica_id: int, epoch: int, *, token: str = "",
                 log_end: int = 0, last_epoch: int = 0, **kwargs: Any) -> list[tuple[int, bytes]]:
    """Says hello as replica ``replica_id``; raises :class:`Refused` when the broker refuses,
    else returns the frames it sent."""
    frames, _closed = exchange(address, replog.encode_hello(shard, replica_id, epoch, log_end, last_epoch, token),
                               **kwargs)
    refused = refusal(frames)
    if refused is not None:
        raise refused
    return frames
