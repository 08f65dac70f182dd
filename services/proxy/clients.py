"""The clients connected to this replica: their Telemetry streams and latest Settings.

A client is its client id *and* the principal it authenticated as (:class:`ClientKey`):
client ids are chosen by the clients, so two principals naming the same one are two
clients — one can neither take the other's checks, nor end its subscriptions and renewals
(NotifyClientTermination).

Per connection, never shared between replicas: a stream knows its client's topics from the
Settings the client sent (on this stream, or on an earlier stream of the same client id
to this replica). A client that reconnects to another replica without re-sending Settings
is unknown there until its next Settings (the Python client re-sends every 300 s); nothing
is checked through it meanwhile and nothing is spent (checks only count once written).

Writes to a stream never block the caller: each stream has an outbox its writer drains; an
item may carry callbacks run as its write starts (from then on the client may have it, even if
the write's completion is never seen: the client can cancel the stream meanwhile) and once it
was written (a check counts as received then).

A client's check topics are those of its Settings it may ``check`` (the producer group of a
RocketMQ producer is its topic), decided at each Settings and again whenever the credential
files are reloaded (:meth:`ClientRegistry.revise`): a revoked right takes the topic's checks
away from the clients already connected (their check subscriptions follow), and a stream whose
credentials no longer name its principal (an access key removed) ends UNAUTHENTICATED.

A client whose last stream ended is **departed**: remembered by its topics (so it is checked at
once if it comes back within ``client_idle_expiry_seconds``) and by nothing else — no check in
flight, subscription draining or renewal reads its record (they hold its :class:`ClientKey`).
Client ids being the clients' choice, one principal keeps at most
``max_departed_clients_per_principal`` departed clients here; the least recently departed beyond
it is forgotten (:func:`forgotten`), as if its idle expiry had passed. A principal has at most
``max_live_clients_per_principal`` live clients here (auth on; a service identity is not
counted): each costs a check subscription on every checker and its Settings, and client ids
and connections are the principal's to multiply, so a stream that would make one more is
refused (TOO_MANY_REQUESTS in band) with nothing remembered; a live client's further streams,
and a departed one's return within its principal's limit, are not refused.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, NamedTuple, TypeAlias

from txmq.errors import PermissionDeniedError, TxmqError, UnauthenticatedError

from services.common.auth import Caller, CredentialStore, current_principal, may
from services.common.auth.acl import CHECK, PRODUCER_GROUP, allows
from services.common.auth.store import Credentials
from services.common.limits import PrincipalLimit, principal_key

from .convert import publishing_topics
from .protocol import definition_pb2, service_pb2

log = logging.getLogger(__name__)

OnWritten = Callable[[], None] | None
Command: TypeAlias = service_pb2.TelemetryCommand
#: A queued command and its callbacks: (command, on_writing, on_written).
Outgoing = tuple[Command, OnWritten, OnWritten]

#: Commands queued for one stream beyond which offers are refused (a stuck client).
OUTBOX_LIMIT = 1024
#: Departed clients kept per principal by default (``max_departed_clients_per_principal``).
MAX_DEPARTED_PER_PRINCIPAL = 1000
#: Live clients per principal by default (``max_live_clients_per_principal``).
MAX_LIVE_PER_PRINCIPAL = 1000


class ClientKey(NamedTuple):
    """A client of this replica: the principal it authenticated as (None with auth off) and
    the client id it chose (the ``x-mq-client-id`` header)."""

    principal: str | None
    client_id: str


#: The header an official client names itself in (its client id).
CLIENT_ID_HEADER = "x-mq-client-id"


def client_id_of(context: Any) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == CLIENT_ID_HEADER:
            return value if isinstance(value, str) else value.decode()
    return ""


def client_of(context: Any) -> ClientKey:
    """The client of a call: its client id, scoped to the principal it authenticated as."""
    principal = current_principal()
    return ClientKey(principal.name if principal is not None else None, client_id_of(context))


def checkable(credentials: Credentials, principal: str | None, topics: tuple[str, ...]) -> tuple[str, ...]:
    """The topics of ``topics`` whose checks ``principal`` may be sent under ``credentials``
    (its producer group is the topic; None: auth off, all of them)."""
    if principal is None:
        return topics
    known = credentials.principals.get(principal)
    if known is None:
        return ()
    return topics if known.service else tuple(t for t in topics if allows(
        credentials.rules, principal, CHECK, PRODUCER_GROUP, t))


def forgotten(departed: Collection[ClientKey], limit: int) -> list[ClientKey]:
    """Which of one principal's departed clients (least recently departed first) to forget
    so that at most ``limit`` stay: the least recently departed ones."""
    return list(itertools.islice(departed, max(len(departed) - limit, 0)))


class TelemetryStream:
    def __init__(self, stream_id: int, key: ClientKey, peer: str = "", caller: Caller | None = None) -> None:
        self.id = stream_id
        self.key = key
        self.client_id = key.client_id
        #: The client's connection (gRPC peer): limits per connection count against it.
        self.peer = peer
        #: Who opened it (None: auth off), decided again when the credentials are reloaded.
        self.caller = caller
        #: Why the proxy ended it (its credentials revoked), if it did.
        self.refusal: TxmqError | None = None
        self.closed = False
        self._outbox: asyncio.Queue[Outgoing | None] = asyncio.Queue()

    def __repr__(self) -> str:
        return f"<TelemetryStream {self.id} {self.client_id!r}>"

    def offer(self, command: Command, on_written: OnWritten = None, on_writing: OnWritten = None) -> bool:
        """Queues a command for the client; False if the stream is closed or stuck."""
        if self.closed or self._outbox.qsize() >= OUTBOX_LIMIT:
            return False
        self._outbox.put_nowait((command, on_writing, on_written))
        return True

    async def next(self) -> Outgoing | None:
        """The next command to write, or None once the stream is closed."""
        if self.closed:
            return None
        return await self._outbox.get()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._outbox.put_nowait(None)


@dataclass
class ClientState:
    key: ClientKey
    # Not its Settings: a client's last Settings (megabytes, if it likes) was kept for
    # client_idle_expiry_seconds after it left, per client id it chose; only these are read.
    topics: tuple[str, ...] = ()
    #: The topics its last Settings published (``topics``: those it may check).
    published: tuple[str, ...] = ()
    client_type: int = 0
    streams: dict[int, TelemetryStream] = field(default_factory=dict)
    #: Monotonic time the last stream ended (None while one is open).
    idle_since: float | None = None
    #: The principal this live client counts against (``max_live_clients_per_principal``).
    live_as: str | None = None


class ClientRegistry:
    def __init__(self, idle_expiry_seconds: float, monotonic: Callable[[], float] = time.monotonic,
                 max_departed_per_principal: int = MAX_DEPARTED_PER_PRINCIPAL,
                 max_live_per_principal: int = MAX_LIVE_PER_PRINCIPAL, refused: Any = None) -> None:
        self.idle_expiry = idle_expiry_seconds
        self.monotonic = monotonic
        self.max_departed = max_departed_per_principal
        #: Live clients per principal (``refused``: its refusals counter).
        self.live = PrincipalLimit("max_live_clients_per_principal", max_live_per_principal, refused)
        self.clients: dict[ClientKey, ClientState] = {}
        #: Principal → its departed clients (no live stream), least recently departed first;
        #: every client without a live stream is here.
        self._departed: dict[str | None, dict[ClientKey, None]] = {}
        self._ids = itertools.count(1)
        #: The credential store (None: auth off), and the snapshot ``revise`` last decided under.
        self.store: CredentialStore | None = None
        self._seen: Credentials | None = None
        #: Called with a client when its live streams or published topics change.
        self.on_change: list[Callable[[ClientKey], None]] = []
        #: Called with a client when it went away from this replica: its last Telemetry
        #: stream ended, or it announced its termination.
        self.on_gone: list[Callable[[ClientKey], None]] = []

    def _changed(self, key: ClientKey) -> None:
        for notify in self.on_change:
            notify(key)

    def open_stream(self, key: ClientKey, peer: str = "", caller: Caller | None = None) -> TelemetryStream:
        """Raises ``PrincipalLimitError`` for a client going live beyond its principal's
        ``max_live_clients_per_principal`` (nothing changed)."""
        state = self.clients.get(key)
        if state is None or not state.streams:
            live_as = principal_key(caller)
            if live_as is not None:
                self.live.take(live_as)
            if state is None:
                state = self.clients[key] = ClientState(key)
            state.live_as = live_as
        stream = TelemetryStream(next(self._ids), key, peer, caller)
        state.streams[stream.id] = stream
        if state.idle_since is not None:
            self._returned(key)
        state.idle_since = None
        if len(state.streams) == 1:
            self._changed(key)
        return stream

    def update_settings(self, stream: TelemetryStream, settings: definition_pb2.Settings) -> None:
        state = self.clients.get(stream.key)
        if state is None or stream.closed:  # read after its stream ended: the client left
            return
        # Checks (with their half messages) only for the topics the client may answer for.
        state.published = publishing_topics(settings)
        state.client_type = settings.client_type
        self._set_topics(state, tuple(t for t in state.published if may(CHECK, PRODUCER_GROUP, t)))

    def _set_topics(self, state: ClientState, topics: tuple[str, ...]) -> None:
        if topics != state.topics:
            state.topics = topics
            log.info("producer topics", extra={"fields": {"client_id": state.key.client_id, "topics": list(topics)}})
            self._changed(state.key)

    def revise(self) -> None:
        """Once the credential files were reloaded: each stream's credentials are decided
        again (one that names its principal no more ends with the refusal), and each
        client's check topics (a topic its principal may no longer check leaves them)."""
        if self.store is None:
            return
        credentials = self.store.current()
        if credentials is self._seen:
            return
        self._seen = credentials
        for state in list(self.clients.values()):
            for stream in list(state.streams.values()):
                try:
                    if stream.caller is not None:
                        stream.caller.current()
                except (UnauthenticatedError, PermissionDeniedError) as error:
                    log.warning("telemetry stream ended: credentials revoked", extra={"fields": {
                        "client_id": stream.client_id, "error": error.message}})
                    stream.refusal = error
                    self.close_stream(stream)
            self._set_topics(state, checkable(credentials, state.key.principal, state.published))

    def close_stream(self, stream: TelemetryStream) -> None:
        stream.close()
        state = self.clients.get(stream.key)
        if state is None or state.streams.pop(stream.id, None) is None:
            return
        if not state.streams:
            if state.live_as is not None:
                self.live.give_back(state.live_as)
                state.live_as = None
            state.idle_since = self.monotonic()
            self._depart(stream.key)
            self._changed(stream.key)
            for notify in self.on_gone:
                notify(stream.key)

    def terminate(self, key: ClientKey) -> None:
        """NotifyClientTermination: the client is going away; its streams end soon. Its
        checks are no longer routed here (streams still open may stay for the rest)."""
        state = self.clients.get(key)
        if state is not None and state.topics:
            state.topics = state.published = ()
            self._changed(key)
        for notify in self.on_gone:
            notify(key)

    def producers(self) -> dict[ClientKey, tuple[str, ...]]:
        """Client → published topics, for clients with a live stream and topics."""
        return {c.key: c.topics for c in self.clients.values() if c.streams and c.topics}

    def stream_for(self, key: ClientKey, topic: str) -> TelemetryStream | None:
        """A live stream of the client that publishes ``topic``."""
        state = self.clients.get(key)
        if state is None or topic not in state.topics:
            return None
        for stream in reversed(list(state.streams.values())):  # the newest first
            if not stream.closed:
                return stream
        return None

    def stream_count(self) -> dict[int, int]:
        """Live streams by client type (for metrics)."""
        out: dict[int, int] = {}
        for c in self.clients.values():
            if c.streams:
                out[c.client_type] = out.get(c.client_type, 0) + len(c.streams)
        return out

    def counts(self) -> tuple[int, int]:
        """(live, departed) clients remembered here (for metrics)."""
        departed = sum(len(order) for order in self._departed.values())
        return len(self.clients) - departed, departed

    def _depart(self, key: ClientKey) -> None:
        """The client's last stream ended: the most recently departed of its principal's,
        whose least recently departed beyond ``max_departed`` are forgotten."""
        order = self._departed.setdefault(key.principal, {})
        order.pop(key, None)
        order[key] = None
        for gone in forgotten(order, self.max_departed):
            del order[gone]
            del self.clients[gone]
            log.debug("departed client forgotten", extra={"fields": {
                "client_id": gone.client_id, "limit": f"max_departed_clients_per_principal={self.max_departed}"}})

    def _returned(self, key: ClientKey) -> None:
        order = self._departed.get(key.principal)
        if order is not None:
            order.pop(key, None)
            if not order:
                del self._departed[key.principal]

    def sweep(self) -> None:
        now = self.monotonic()
        for principal, order in list(self._departed.items()):
            while order:  # least recently departed first: the first one still kept ends it
                key = next(iter(order))
                idle_since = self.clients[key].idle_since
                if idle_since is None or now - idle_since < self.idle_expiry:
                    break
                del order[key]
                del self.clients[key]
            if not order:
                del self._departed[principal]

    def close(self) -> None:
        for state in self.clients.values():
            for stream in list(state.streams.values()):
                stream.close()
