"""The replication stream's transport: one TCP connection per follower session, carrying
length-prefixed frames (``store/replog.py`` draws them), instead of a gRPC stream.

Why not gRPC: a replica's CPU per transaction was mostly gRPC's per-message machinery
(grpc.aio's read and write of every stream message, its poller thread, the HTTP/2 framing:
~300 µs user + 200 µs system per message on a follower, measured in README "Replication
performance"), while what a message carries is already one ``bytes`` value the leader
encoded once. A frame costs a ``write`` on one side and a buffered read on the other.

What stays the same as on the gRPC port:

- **TLS**: when the broker has a certificate, the port serves TLS only, with the same
  files, the same client-certificate rule (``tls_client_auth``) and the same reloading
  (``services.common.tls.StreamServerTLS``: looked at before every handshake); a follower
  presents the process's certificate and checks the leader's, as its channels do.
- **Authentication**: with auth on (``auth_files``), the follower is a principal — its
  bearer token in the hello (``auth_token_file``) or its client certificate's names — and
  must be a service identity (``INTERNAL``, as every replication RPC): otherwise the
  answer is a REFUSED frame (UNAUTHENTICATED / PERMISSION_DENIED) and the connection closes.
  An open session is decided again before each frame the leader sends once the credential
  files were reloaded (one comparison otherwise; the leader sends at least a heartbeat
  every ``election_poll_seconds``): a follower identity removed, or no longer a service
  identity, ends its session the same way, and its reconnection is refused at its hello.
- **Bad input** (a frame too long, an unknown kind, a malformed hello, no hello within
  ``HELLO_TIMEOUT_SECONDS``) gets a REFUSED frame naming what was wrong (INVALID_ARGUMENT,
  DEADLINE_EXCEEDED) and the connection is closed; nothing else changes.

The port is ``replication_port`` (default 10912, RocketMQ's HA port; 0 in tests: an
ephemeral port), opened only on a replicated broker; the leader advertises
``host:port`` in its etcd leader key, and followers dial that.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from typing import Any, Awaitable, Callable

import grpc

from txmq.errors import PermissionDeniedError, UnauthenticatedError

from services.common import tls
from services.common.auth.interceptor import AuthInterceptor, authorize
from services.common.auth.policy import INTERNAL_ACTION, Need
from services.common.auth.store import Credentials, Principal
from services.common.runtime import StartupError

from .store import replog

log = logging.getLogger(__name__)

#: Largest frame a follower reads (a batch is at most replication_batch_bytes plus one entry).
MAX_LEADER_FRAME_BYTES = 64 * 1024 * 1024
#: Largest frame a leader reads: hellos and acks are small.
MAX_FOLLOWER_FRAME_BYTES = 64 * 1024
#: A connection must complete TLS (a failed handshake never reaches the handler: the peer
#: gets TLS's alert) and send its hello within this time each.
HELLO_TIMEOUT_SECONDS = 10.0
#: Connections the port holds at once (followers need one each; the rest is refused).
MAX_CONNECTIONS = 64
#: What the refusals count as (``Policy(INTERNAL)`` of the gRPC replication methods).
METHOD = "/txmq.v1.ReplicationService/Replicate"


class Refused(Exception):
    """A refusal, sent as a REFUSED frame, or received as one."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


_CODES = {code.value[0]: code for code in grpc.StatusCode}


class Connection:
    """One end of a replication session: whole frames in, whole frames out."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_frame_bytes: int,
                 *, follower: bool) -> None:
        self.reader = reader
        self.writer = writer
        self.max_frame_bytes = max_frame_bytes
        #: The follower's end: a REFUSED frame is its leader's refusal (on the leader's
        #: end it is only a frame no follower sends).
        self.follower = follower
        #: On the leader's end with auth on: decides the follower again (raises Refused).
        self.standing: Callable[[], None] | None = None

    async def read(self) -> tuple[int, bytes]:
        """The next frame: (kind, body). IncompleteReadError at the end of the stream,
        FrameError for one too long or empty; on a follower's end :class:`Refused` for a
        REFUSED frame."""
        head = await self.reader.readexactly(replog.FRAME_HEAD.size)
        length, kind = replog.FRAME_HEAD.unpack(head)
        if length < 1 or length > self.max_frame_bytes:
            raise replog.FrameError(f"frame of {length} bytes (at most {self.max_frame_bytes})")
        body = await self.reader.readexactly(length - 1) if length > 1 else b""
        if kind == replog.REFUSED and self.follower:
            code, message = replog.decode_refused(body)
            raise Refused(_CODES.get(code, grpc.StatusCode.UNKNOWN), message)
        return kind, body

    def send(self, frame: bytes) -> None:
        """Writes ``frame``; raises :class:`Refused` instead once the follower's credentials
        were revoked (``ReplicationListener``: the session ends with that refusal)."""
        if self.standing is not None:
            self.standing()
        self.writer.write(frame)

    async def drain(self) -> None:
        await self.writer.drain()

    def refuse(self, refused: Refused) -> None:
        with contextlib.suppress(Exception):
            self.writer.write(replog.encode_refused(refused.code.value[0], refused.message))

    def peer(self) -> str:
        peer = self.writer.get_extra_info("peername")
        return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)

    def certificate_names(self) -> list[str]:
        return tls.peer_certificate_names(self.writer.get_extra_info("ssl_object"))

    async def close(self) -> None:
        writer = self.writer
        with contextlib.suppress(Exception):
            writer.close()  # also after a failed TLS handshake, which leaves it "closing"
            await asyncio.wait_for(writer.wait_closed(), 1.0)


Session = Callable[[Connection, tuple[str, int, int, int, int, str]], Awaitable[None]]


class ReplicationListener:
    """The leader side's port: accepts a follower, (TLS,) reads its hello, authenticates
    it, and hands the connection to ``session`` (``ReplicaNode.replicate``)."""

    def __init__(self, config: Any, session: Session, auth: AuthInterceptor | None,
                 on_refused: Callable[[str], None] = lambda _code: None) -> None:
        self.config = config
        self.session = session
        self.auth = auth
        #: Told the status code name of every refusal (``txmq_replication_sessions_refused_total``).
        self.on_refused = on_refused
        self.tls = tls.stream_server_tls(config)
        self.port = 0
        self.connections = 0
        #: Sessions refused so far, by status code name.
        self.refused: dict[str, int] = {}
        self._server: asyncio.AbstractServer | None = None
        self._last_log = 0.0
        self._handlers: set[asyncio.Task[Any]] = set()

    async def start(self) -> int:
        host, port = self.config.host, self.config.replication_port
        try:
            self._server = await asyncio.start_server(
                self._accept, host or None, port, limit=MAX_FOLLOWER_FRAME_BYTES, reuse_address=True,
                ssl=self.tls.listening_context() if self.tls is not None else None,
                ssl_handshake_timeout=HELLO_TIMEOUT_SECONDS if self.tls is not None else None)
        except OSError as exc:
            raise StartupError(f"replication_port (TXMQ_REPLICATION_PORT): cannot bind {host}:{port}: "
                               f"{exc.strerror or exc}") from exc
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._handlers):
                task.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)

    def _noted(self, refused: Refused, peer: str) -> None:
        name = refused.code.name
        self.refused[name] = self.refused.get(name, 0) + 1
        self.on_refused(name)
        now = time.monotonic()
        if now - self._last_log >= 1.0:  # one line a second at most: refusals are cheap to cause
            self._last_log = now
            log.warning("replication connection refused", extra={"fields": {
                "peer": peer, "code": name, "error": refused.message[:300], "refused": dict(self.refused)}})

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self.connections += 1
        conn = Connection(reader, writer, MAX_FOLLOWER_FRAME_BYTES, follower=False)
        try:
            if self.connections > MAX_CONNECTIONS:
                raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"more than {MAX_CONNECTIONS} replication connections at once")
            try:
                hello = await asyncio.wait_for(self._hello(conn), HELLO_TIMEOUT_SECONDS)
            except TimeoutError:
                raise Refused(grpc.StatusCode.DEADLINE_EXCEEDED,
                              f"no hello within {HELLO_TIMEOUT_SECONDS:g} s") from None
            self._authenticate(conn, hello[5])
            await self.session(conn, hello)
        except Refused as refused:
            self._noted(refused, conn.peer())
            conn.refuse(refused)
        except replog.FrameError as exc:
            refusal = Refused(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            self._noted(refusal, conn.peer())
            conn.refuse(refusal)
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError, OSError) as exc:
            log.debug("replication connection ended", extra={"fields": {"peer": conn.peer(), "error": str(exc)[:200]}})
        except asyncio.CancelledError:
            pass
        except Exception:  # one connection's failure must not reach the server
            log.exception("replication session failed")
        finally:
            self.connections -= 1
            await conn.close()
            self._handlers.discard(task)

    async def _hello(self, conn: Connection) -> tuple[str, int, int, int, int, str]:
        kind, body = await conn.read()
        if kind != replog.HELLO:
            raise replog.FrameError(f"the first frame must be a hello, not {replog.KIND_NAMES.get(kind, kind)}")
        return replog.decode_hello(body)

    def _authenticate(self, conn: Connection, token: str) -> None:
        """With auth on, the follower must be a service identity (its token or certificate),
        and stay one: ``conn.standing`` decides it again whenever the files were reloaded."""
        if self.auth is None:
            return
        store = self.auth.store
        seen = store.current()
        principal = self._principal(conn, token, seen)

        def standing() -> None:
            nonlocal seen
            credentials = store.current()
            if credentials is seen:
                return
            if self._principal(conn, token, credentials) != principal:
                raise Refused(grpc.StatusCode.UNAUTHENTICATED, f"the credentials of this session no longer name "
                                                               f"principal {principal.name!r} (reloaded)")
            seen = credentials  # a refusal stays: every later frame is refused again
        conn.standing = standing

    def _principal(self, conn: Connection, token: str, credentials: Credentials) -> Principal:
        """The service identity the follower's token or certificate names under ``credentials``."""
        assert self.auth is not None
        names = conn.certificate_names()
        if token:
            principal = credentials.principal_for_token(token)
            problem = "the bearer token is not known (revoked, mistyped, or from another cluster)"
        elif names:
            principal = credentials.principal_for_certificate(names)
            problem = f"client certificate {names[0]!r} is not a known principal"
        else:
            principal, problem = None, "credentials required: a token in the hello or a client certificate"
        try:
            if principal is None:
                raise UnauthenticatedError(problem)
            authorize(credentials, principal, METHOD, [Need((INTERNAL_ACTION,), "cluster")])
            return principal
        except (UnauthenticatedError, PermissionDeniedError) as error:
            self.auth.refused[error.reason] = self.auth.refused.get(error.reason, 0) + 1
            code = grpc.StatusCode.UNAUTHENTICATED if isinstance(error, UnauthenticatedError) \
                else grpc.StatusCode.PERMISSION_DENIED
            raise Refused(code, error.message) from None


async def connect(address: str, timeout: float) -> Connection:
    """A follower's connection to its leader's replication port, with the process's TLS."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    material = tls.stream_client_context()
    if material is None:
        opening = asyncio.open_connection(host, int(port), limit=2**20)
    else:
        context, server_name = material
        opening = asyncio.open_connection(host, int(port), ssl=context, server_hostname=server_name or host,
                                          ssl_handshake_timeout=timeout, limit=2**20)
    reader, writer = await asyncio.wait_for(opening, timeout)
    return Connection(reader, writer, MAX_LEADER_FRAME_BYTES, follower=True)
