"""What producers and consumers share: the name server list, the route cache, one gRPC
channel per broker address and the error mapping of every call.

Thread-safe. Channels are sync ``grpc`` channels, created on first use and closed by
:meth:`Client.close`.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Sequence, TypeVar

import grpc

from ._auth import BearerToken, with_token
from ._calling import (BOUND_ATTEMPTS, BOUND_BACKOFF_SECONDS, CHANNEL_OPTIONS,  # noqa: F401 - the client's values
                       MAX_ENTRIES_PER_REQUEST, MAX_GRPC_MESSAGE_BYTES, BoundCall, BrokerAddress, BrokerAddresses, NameServerCall, NameServers,
                       QueueRoute, Wait, parse_nameservers, positive, routes_of, bound_steps)
from ._errors import ClientClosedError, InvalidFieldError, TopicNotFoundError, TxmqError, error_from_rpc
from ._faults import FaultTable
from ._routes import RouteCache
from ._produce_stream import ProduceStream
from ._sending import run
from ._tls import TLS, ChannelTLS, sync_channel
from .v1 import broker_pb2_grpc, nameserver_pb2, nameserver_pb2_grpc

log = logging.getLogger(__name__)

Resp = TypeVar("Resp")


class Client:
    """Name servers with failover, routes cached per topic, channels per broker address."""

    def __init__(self, nameservers: str | Sequence[str], *, request_timeout_seconds: float,
                 route_refresh_seconds: float, what: str = "client", linger_seconds: float | None = None,
                 tls: TLS | None = None, token: str | None = None) -> None:
        self._nameservers = NameServers(nameservers)
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
        self._channels: dict[str, grpc.Channel] = {}
        self._broker_stubs: dict[str, broker_pb2_grpc.BrokerServiceStub] = {}
        self._ns_stubs: dict[str, nameserver_pb2_grpc.NameServerServiceStub] = {}
        self._streams: dict[str, ProduceStream] = {}
        self._broker_addresses = BrokerAddresses()
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
        list it (see ``_calling.bound_steps``), asking its address again before each retry;
        recorded in the fault table."""
        def perform(step: Any) -> Any:
            if type(step) is BoundCall:
                return self.call(method_of(self.broker(step.address)), request, timeout)
            if type(step) is BrokerAddress:
                return self.broker_address(step.shard, refresh=step.refresh)
            assert type(step) is Wait
            time.sleep(step.seconds)
            return None

        return run(bound_steps(self.faults, shard), perform)  # type: ignore[no-any-return]

    def nameserver_call(self, name: str, request: Any) -> Any:
        """A NameServerService call (``name``: the method) on the name servers in turn, from
        the last one that answered; transient errors move to the next, other errors are the
        answer."""
        return self._nameserver_call(name, request)

    def _nameserver_call(self, name: str, request: Any) -> Any:
        """Tries the name servers in turn, from the last one that answered; transient errors
        move to the next, other errors are the answer (``_calling.NameServers``)."""
        self.check_open()
        self._check_tls()
        return run(self._nameservers.steps(name, request), self._perform_nameserver)

    def _perform_nameserver(self, step: NameServerCall) -> Any:
        stub = self._ns_stubs.get(step.address)
        if stub is None:
            with self._lock:
                self.check_open()
                stub = nameserver_pb2_grpc.NameServerServiceStub(self._channel_locked(step.address))
                self._ns_stubs[step.address] = stub
        try:
            return self.call(getattr(stub, step.method), step.request)
        except TxmqError as err:
            if err.retryable:
                log.debug("name server %s failed %s: %s", step.address, step.method, err)
            raise

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
        routes = routes_of(response)
        if not routes:
            self._routes.forget(topic)
            raise TopicNotFoundError(topic)
        with self._lock:
            self._routes.store(topic, routes, now)
        self._broker_addresses.learn(routes)
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
        return self._broker_addresses.listed(response, broker_name)
