"""What the asyncio producers and consumers share: the name servers, the route cache, one
``grpc.aio`` channel per address, the pipelined Produce stream per broker and the error
mapping of every call: the asyncio driver of the client core ``txmq._calling`` (the
name servers' failover, calls bound to a shard, brokers' addresses), as ``txmq._client``
is its blocking driver (same constants, same routes, same fault table).

Not thread-safe: use a client from the event loop it was first used on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable, Sequence, TypeVar

import grpc

from .._calling import (CHANNEL_OPTIONS, BoundCall, BrokerAddress, BrokerAddresses, NameServerCall, NameServers,
                        QueueRoute, Wait, bound_steps, positive, routes_of)
from .._errors import ClientClosedError, InvalidFieldError, TopicNotFoundError, TxmqError, error_from_rpc
from .._faults import FaultTable
from .._routes import RouteCache
from .._auth import BearerToken, aio_bearer_interceptors
from .._tls import TLS, ChannelTLS
from .._sending import run_async
from ..v1 import broker_pb2_grpc, nameserver_pb2, nameserver_pb2_grpc
from ._stream import AsyncProduceStream

log = logging.getLogger(__name__)

Resp = TypeVar("Resp")


class AsyncClient:
    """Name servers with failover, routes cached per topic, channels per address."""

    def __init__(self, nameservers: str | Sequence[str], *, request_timeout_seconds: float,
                 route_refresh_seconds: float, what: str = "client", tls: TLS | None = None,
                 token: str | None = None) -> None:
        self._nameservers = NameServers(nameservers)
        if tls is not None and not isinstance(tls, TLS):
            raise InvalidFieldError("tls", f"must be a txmq.TLS, got {type(tls).__name__}")
        #: TLS material of every channel (None: plaintext), reread when its files change.
        self._tls = ChannelTLS(tls) if tls is not None else None
        if token is not None:
            BearerToken(token)  # refuses a malformed token here, not at the first call
        #: ``authorization: Bearer`` on every call when the cluster runs with auth on.
        self._interceptors = aio_bearer_interceptors(lambda: token.strip()) if token else None
        self._tls_generation = 0
        # Channels opened with older TLS files: calls in flight on them finish.
        self._retired: list[grpc.aio.Channel] = []
        self.request_timeout_seconds = positive("request_timeout_seconds", request_timeout_seconds)
        self.route_refresh_seconds = positive("route_refresh_seconds", route_refresh_seconds)
        self._what = what
        self._closed = False
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._broker_stubs: dict[str, broker_pb2_grpc.BrokerServiceAsyncStub] = {}
        self._ns_stubs: dict[str, nameserver_pb2_grpc.NameServerServiceAsyncStub] = {}
        self._streams: dict[str, AsyncProduceStream] = {}
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

    async def close(self) -> None:
        """Fails requests in flight with ClientClosedError and closes every channel. Idempotent."""
        if self._closed:
            return
        self._closed = True
        streams, self._streams = list(self._streams.values()), {}
        channels, self._channels = [*self._channels.values(), *self._retired], {}
        self._retired = []
        for stream in streams:
            await stream.close()
        for channel in channels:
            await channel.close()

    # --- channels and calls ---------------------------------------------------------------

    def channel(self, address: str) -> grpc.aio.Channel:
        self.check_open()
        self._check_tls()
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = self.new_channel(address)
        return channel

    def new_channel(self, address: str) -> grpc.aio.Channel:
        """A channel of its own (its caller closes it), with this client's TLS material."""
        if self._tls is None:
            return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS, interceptors=self._interceptors)
        self._tls.current()
        return self._tls.aio_channel(address, CHANNEL_OPTIONS, self._interceptors)

    def tls_generation(self) -> int:
        """Grows when the TLS files change on disk (0 without TLS)."""
        return 0 if self._tls is None else self._tls.current()

    def _check_tls(self) -> None:
        """When the TLS files changed on disk, new calls go on new channels made with them
        (as the sync client does)."""
        if self._tls is None or self._tls.current() == self._tls_generation:
            return
        self._tls_generation = self._tls.generation
        self._retired.extend(self._channels.values())
        self._channels, self._broker_stubs, self._ns_stubs = {}, {}, {}
        log.info("TLS files changed: new channels use them")

    def broker(self, address: str) -> broker_pb2_grpc.BrokerServiceAsyncStub:
        self._check_tls()
        stub = self._broker_stubs.get(address)
        if stub is None:
            stub = self._broker_stubs[address] = broker_pb2_grpc.BrokerServiceStub(self.channel(address))
        return stub

    def produce_stream(self, address: str) -> AsyncProduceStream:
        """The one pipelined Produce stream of this client to a broker address."""
        self.check_open()
        stream = self._streams.get(address)
        if stream is None:
            stub = self.broker(address)
            stream = self._streams[address] = AsyncProduceStream(stub.Produce, address, stub=stub)
        return stream

    async def call(self, method: Callable[..., Awaitable[Resp]], request: Any, timeout: float | None = None) -> Resp:
        """One unary call; a failure raises the TxmqError it stands for."""
        self.check_open()
        try:
            return await method(request, timeout=self.request_timeout_seconds if timeout is None else timeout)
        except grpc.RpcError as exc:
            if self._closed:
                raise ClientClosedError(self._what) from None
            raise error_from_rpc(exc) from None
        except asyncio.CancelledError:
            if self._closed:
                raise ClientClosedError(self._what) from None
            raise

    async def call_bound(self, shard: str,
                         method_of: Callable[[broker_pb2_grpc.BrokerServiceAsyncStub], Callable[..., Awaitable[Resp]]],
                         request: Any, timeout: float | None = None) -> Resp:
        """A unary call bound to ``shard`` by an id (an ack, an invisibility change): retried
        there with backoff while it fails transiently (``txmq._calling.bound_steps``)."""
        async def perform(step: Any) -> Any:
            if type(step) is BoundCall:
                return await self.call(method_of(self.broker(step.address)), request, timeout)
            if type(step) is BrokerAddress:
                return await self.broker_address(step.shard, refresh=step.refresh)
            assert type(step) is Wait
            await asyncio.sleep(step.seconds)
            return None

        return await run_async(bound_steps(self.faults, shard), perform)

    async def nameserver_call(self, name: str, request: Any) -> Any:
        """Tries the name servers in turn, from the last one that answered; transient errors
        move to the next, other errors are the answer (``txmq._calling.NameServers``)."""
        self.check_open()
        self._check_tls()
        return await run_async(self._nameservers.steps(name, request), self._perform_nameserver)

    async def _perform_nameserver(self, step: NameServerCall) -> Any:
        stub = self._ns_stubs.get(step.address)
        if stub is None:
            stub = self._ns_stubs[step.address] = nameserver_pb2_grpc.NameServerServiceStub(self.channel(step.address))
        try:
            return await self.call(getattr(stub, step.method), step.request)
        except TxmqError as err:
            if err.retryable:
                log.debug("name server %s failed %s: %s", step.address, step.method, err)
            raise

    # --- routes ---------------------------------------------------------------------------

    async def route(self, topic: str, *, refresh: bool = False, for_send: bool = True) -> tuple[QueueRoute, ...]:
        """The queues of a topic, cached like the sync client's (``txmq._client.Client.route``,
        ``txmq._routes``); ``for_send=False`` (consumers): a missing topic is never auto-created."""
        return await self._routes.lookup(topic, self.route_refresh_seconds, lambda: self._fetch_route(topic, for_send),
                                         key=(topic, for_send), refresh=refresh)

    async def _fetch_route(self, topic: str, for_send: bool) -> tuple[QueueRoute, ...]:
        now = time.monotonic()
        response = await self.nameserver_call("QueryRoute", nameserver_pb2.QueryRouteRequest(topic=topic,
                                                                                              for_send=for_send))
        routes = routes_of(response)
        if not routes:
            self._routes.forget(topic)
            raise TopicNotFoundError(topic)
        self._routes.store(topic, routes, now)
        self._broker_addresses.learn(routes)
        return routes

    def invalidate_route(self, topic: str) -> None:
        self._routes.invalidate(topic)

    async def broker_address(self, broker_name: str, *, refresh: bool = False) -> str:
        """The address of a broker by name (from the routes seen, else ListBrokers)."""
        address = None if refresh else self._broker_addresses.get(broker_name)
        if address is not None:
            return address
        response = await self.nameserver_call("ListBrokers", nameserver_pb2.ListBrokersRequest())
        return self._broker_addresses.listed(response, broker_name)
