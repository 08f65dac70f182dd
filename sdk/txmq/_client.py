"""What producers and consumers share: the name server list, the route cache, one gRPC
channel per broker address and the error mapping of every call.

Thread-safe. Channels are sync ``grpc`` channels, created on first use and closed by
:meth:`Client.close`.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TypeVar

import grpc

from ._auth import BearerToken, with_token
from ._errors import (BrokerNotFoundError, ClientClosedError, InvalidFieldError, TopicNotFoundError,
                      TxmqError, error_from_rpc)
from ._faults import FaultTable, OverloadBackoff, RetryAction, retry_action
from ._routes import RouteCache
from ._produce_stream import ProduceStream
from ._tls import TLS, ChannelTLS, sync_channel
from .v1 import broker_pb2_grpc, nameserver_pb2, nameserver_pb2_grpc

log = logging.getLogger(__name__)

#: gRPC message size limit both ways; above the brokers' largest body (4 MiB by default).
MAX_GRPC_MESSAGE_BYTES = 16 * 1024 * 1024

CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_BYTES),
    # Reconnect within about a second of a peer coming back (gRPC's default backoff grows
    # to 120 s, which would turn a broker restart or a failover into minutes).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)

#: Attempts of a call bound to its shard (:meth:`Client.call_bound`), the first retry after
#: BOUND_BACKOFF_SECONDS, doubling.
BOUND_ATTEMPTS = 3
BOUND_BACKOFF_SECONDS = 0.1

Resp = TypeVar("Resp")


@dataclass(frozen=True, slots=True)
class QueueRoute:
    """One queue of a topic: the broker holding it and its id there."""

    broker_name: str
    broker_address: str
    queue_id: int
    #: The broker is draining: consumers still read the queue, new sends go elsewhere.
    draining: bool = False


def parse_nameservers(nameservers: str | Sequence[str]) -> tuple[str, ...]:
    """``"h1:9876,h2:9876"`` or ``["h1:9876", "h2:9876"]`` → a tuple of addresses."""
    if isinstance(nameservers, str):
        items = nameservers.replace(";", ",").split(",")
    else:
        items = list(nameservers)
    addresses = tuple(a.strip() for a in items if isinstance(a, str) and a.strip())
    if not addresses:
        raise InvalidFieldError("nameservers", "at least one host:port is required")
    return addresses


def positive(name: str, value: float) -> float:
    if not isinstance(value, (int, float)) or not value > 0:
        raise InvalidFieldError(name, f"must be a positive number, got {value!r}")
    return float(value)


class Client:
    """Name servers with failover, routes cached per topic, channels per broker address."""

    def __init__(self, nameservers: str | Sequence[str], *, request_timeout_seconds: float,
                 route_refresh_seconds: float, what: str = "client", linger_seconds: float | None = None,
                 tls: TLS | None = None, token: str | None = None) -> None:
        self._nameservers = parse_nameservers(nameservers)
        if tls is not None and not isinstance(tls, TLS):
            raise InvalidFieldError("tls", f"must be a txmq.TLS, got {type(tls).__name__}")
        if token is not None:
            BearerToken(token)  # refuses a malformed token here, not at the first call
        #: Sent as ``authorization: Bearer`` on every call (clusters with auth on).
        self._token = token
        #: TLS material of every channel (None: plaintext).
        self._tls = ChannelTLS(tls) if tls is not None else None
        self._tls_generation = 0
        # Channels opened with older TLS files: calls in flight on them finish; closed with
        # the client (dropping a channel would cancel its calls).
        self._retired: list[grpc.Channel] = []
        self.request_timeout_seconds = positive("request_timeout_seconds", request_timeout_seconds)
        self.route_refresh_seconds = positive("route_refresh_seconds", route_refresh_seconds)
        self._what = what
        # Of the Produce streams (None: the module's LINGER_SECONDS).
        self._linger_seconds = linger_seconds
        self._lock = threading.Lock()
        self._closed = False
        # Start at a random name server so clients spread over them; stay on one that works.
        self._ns_index = random.randrange(len(self._nameservers))
        self._channels: dict[str, grpc.Channel] = {}
        self._broker_stubs: dict[str, broker_pb2_grpc.BrokerServiceStub] = {}
        self._ns_stubs: dict[str, nameserver_pb2_grpc.NameServerServiceStub] = {}
        self._streams: dict[str, ProduceStream] = {}
        self._broker_addresses: dict[str, str] = {}
        #: Which shards new sends avoid (shared by this client's producers and consumers).
        self.faults = FaultTable()
        self._routes: RouteCache[tuple[QueueRoute, ...]] = RouteCache(self.faults)

    # --- lifecycle ------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def check_open(self) -> None:
        if self._closed:
            raise ClientClosedError(self._what)

    def close(self) -> None:
        """Fails streams in flight with ClientClosedError and closes every channel. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            streams, self._streams = list(self._streams.values()), {}
            channels, self._channels = [*self._channels.values(), *self._retired], {}
            self._retired = []
        for stream in streams:
            stream.close()
        for channel in channels:
            channel.close()

    # --- channels and calls ---------------------------------------------------------------

    def _channel_locked(self, address: str) -> grpc.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = with_token(sync_channel(address, CHANNEL_OPTIONS, self._tls), self._token)
            self._channels[address] = channel
        return channel

    def new_channel(self, address: str) -> grpc.Channel:
        """A channel of its own (its caller closes it), with this client's TLS material and token."""
        return with_token(sync_channel(address, CHANNEL_OPTIONS, self._tls), self._token)

    def tls_generation(self) -> int:
        """Grows when the TLS files change on disk (0 without TLS): a holder of a channel of
        its own (:meth:`new_channel`) opens a new one when it does."""
        return 0 if self._tls is None else self._tls.current()

    def _check_tls(self) -> None:
        """When the TLS files changed on disk: new calls go on new channels made with them
        (the old ones are dropped, calls in flight on them finish; a Produce stream keeps its
        connection until it ends)."""
        if self._tls is None or self._tls.current() == self._tls_generation:
            return
        with self._lock:
            if self._tls.generation == self._tls_generation:
                return
            self._tls_generation = self._tls.generation
            self._retired.extend(self._channels.values())
            self._channels = {}
            self._broker_stubs = {}
            self._ns_stubs = {}
        log.info("TLS files changed: new channels use them")

    def broker(self, address: str) -> broker_pb2_grpc.BrokerServiceStub:
        self._check_tls()
        stub = self._broker_stubs.get(address)
        if stub is None:
            with self._lock:
                self.check_open()
                stub = self._broker_stubs.get(address)
                if stub is None:
                    stub = broker_pb2_grpc.BrokerServiceStub(self._channel_locked(address))
                    self._broker_stubs[address] = stub
        return stub

    def produce_stream(self, address: str) -> ProduceStream:
        """The one pipelined Produce stream of this client to a broker address."""
        stream = self._streams.get(address)
        if stream is None:
            with self._lock:
                self.check_open()
                stream = self._streams.get(address)
                if stream is None:
                    stub = broker_pb2_grpc.BrokerServiceStub(self._channel_locked(address))
                    stream = ProduceStream(stub.Produce, address, sole=lambda: len(self._streams) == 1,
                                           linger_seconds=self._linger_seconds, stub=stub)
                    self._streams[address] = stream
        return stream

    def call(self, method: Callable[..., Resp], request: Any, timeout: float | None = None) -> Resp:
        """One unary call; a failure raises the TxmqError it stands for."""
        self.check_open()
        try:
            return method(request, timeout=self.request_timeout_seconds if timeout is None else timeout)
        except grpc.RpcError as exc:
            if self._closed:
                raise ClientClosedError(self._what) from None
            raise error_from_rpc(exc) from None
        except ValueError:  # "Cannot invoke RPC on closed channel!"
            if self._closed:
                raise ClientClosedError(self._what) from None
            raise

    def call_bound(self, shard: str, method_of: Callable[[broker_pb2_grpc.BrokerServiceStub], Callable[..., Resp]],
                   request: Any, timeout: float | None = None) -> Resp:
        """A unary call bound to ``shard`` by an id (an ack, an invisibility change): retried
        on that shard with backoff while it fails transiently or the name servers do not
        list it (see ``_faults.retry_action``), asking its address again before each retry;
        recorded in the fault table."""
        attempt = 1
        overload = OverloadBackoff()
        while True:
            try:
                address = self.broker_address(shard, refresh=attempt > 1)
                response = self.call(method_of(self.broker(address)), request, timeout)
            except ClientClosedError:
                raise
            except TxmqError as err:
                pause = overload.delay(err)
                if pause is not None:  # nothing applied: the same request again, later
                    time.sleep(pause)
                    continue
                if err.retryable:
                    self.faults.failed(shard)
                if retry_action(err, bound=True) is RetryAction.FAIL or attempt >= BOUND_ATTEMPTS:
                    raise
                log.debug("call to %s failed (attempt %d of %d), retrying there: %s",
                          shard, attempt, BOUND_ATTEMPTS, err)
                time.sleep(BOUND_BACKOFF_SECONDS * 2 ** (attempt - 1))
                attempt += 1
                continue
            self.faults.succeeded(shard)
            return response

    def nameserver_call(self, name: str, request: Any) -> Any:
        """A NameServerService call (``name``: the method) on the name servers in turn, from
        the last one that answered; transient errors move to the next, other errors are the
        answer."""
        return self._nameserver_call(name, request)

    def _nameserver_call(self, name: str, request: Any) -> Any:
        """Tries the name servers in turn, from the last one that answered; transient errors
        move to the next, other errors are the answer."""
        self.check_open()
        self._check_tls()
        count = len(self._nameservers)
        start = self._ns_index
        error: TxmqError | None = None
        for i in range(count):
            index = (start + i) % count
            address = self._nameservers[index]
            stub = self._ns_stubs.get(address)
            if stub is None:
                with self._lock:
                    self.check_open()
                    stub = nameserver_pb2_grpc.NameServerServiceStub(self._channel_locked(address))
                    self._ns_stubs[address] = stub
            try:
                response = self.call(getattr(stub, name), request)
            except TxmqError as err:
                if not err.retryable:
                    raise
                log.debug("name server %s failed %s: %s", address, name, err)
                error = err
                continue
            self._ns_index = index
            return response
        assert error is not None
        raise error

    # --- routes ---------------------------------------------------------------------------

    def route(self, topic: str, *, refresh: bool = False, for_send: bool = True) -> tuple[QueueRoute, ...]:
        """The queues of a topic, cached for ``route_refresh_seconds`` (see ``txmq._routes``:
        sooner while a shard is avoided; the last route stands while no name server
        answers). Raises TopicNotFoundError when the topic has no queue on a live broker,
        NoLeaderError (retryable) when only replicated shards between leaders hold it (a
        fail-over). ``refresh``: ask now, and raise rather than fall back. ``for_send``: a
        producer's lookup, which a name server with ``auto_create_topics`` answers by
        creating the topic; consumers pass False (a subscription never creates a topic)."""
        if not refresh:  # the common case, once per send: no lookup closure built
            cached = self._routes.fresh(topic, self.route_refresh_seconds)
            if cached is not None:
                return cached
        return self._routes.lookup_blocking(topic, self.route_refresh_seconds,
                                            lambda: self._fetch_route(topic, for_send),
                                            key=(topic, for_send), refresh=refresh)

    def _fetch_route(self, topic: str, for_send: bool) -> tuple[QueueRoute, ...]:
        now = time.monotonic()
        response = self._nameserver_call("QueryRoute", nameserver_pb2.QueryRouteRequest(topic=topic,
                                                                                        for_send=for_send))
        routes = tuple(QueueRoute(q.broker_name, q.broker_address, q.queue_id, q.draining) for q in response.queues)
        if not routes:
            self._routes.forget(topic)
            raise TopicNotFoundError(topic)
        with self._lock:
            self._routes.store(topic, routes, now)
            for r in routes:
                self._broker_addresses[r.broker_name] = r.broker_address
        return routes

    def invalidate_route(self, topic: str) -> None:
        """Ask a name server again at the topic's next use (after an error)."""
        self._routes.invalidate(topic)

    def broker_address(self, broker_name: str, *, refresh: bool = False) -> str:
        """The address of a broker by name (from the routes seen, else ListBrokers)."""
        address = None if refresh else self._broker_addresses.get(broker_name)
        if address is not None:
            return address
        response = self._nameserver_call("ListBrokers", nameserver_pb2.ListBrokersRequest())
        live: dict[str, str] = {broker.name: broker.address for broker in response.brokers}
        with self._lock:
            self._broker_addresses.update(live)
            if broker_name not in live:
                self._broker_addresses.pop(broker_name, None)
        if broker_name not in live:
            raise BrokerNotFoundError(broker_name)
        return live[broker_name]
