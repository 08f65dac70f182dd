"""The native side of the proxy: name servers (routes, live brokers and checkers) and a
channel per broker.

Nothing here is shared with other replicas: every answer comes from the name servers
(cached briefly) or from the id a request carries (a transaction id or receipt handle names
its broker).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, TypeVar

import grpc

from services.common.auth.delegation import on_behalf_metadata
from services.common.channels import ChannelPool
from txmq.errors import BrokerNotFoundError, TopicNotFoundError, TxmqError, UnavailableError, error_from_rpc
from txmq.faults import Abandoned, FaultTable
from txmq.routes import RouteCache
from txmq.v1 import broker_pb2, broker_pb2_grpc, common_pb2, nameserver_pb2, nameserver_pb2_grpc

from .config import ProxyConfig

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Limits:
    """The limits the proxy advertises and enforces: the live brokers' (the smallest of
    each), or the proxy's configuration while no broker has told them."""

    max_body_bytes: int
    max_delivery_attempts: int
    #: "brokers" or "config".
    source: str


async def call(coro: Awaitable[T]) -> T:
    """Awaits a native RPC; a failed call becomes the ``TxmqError`` it stands for."""
    try:
        return await coro
    except grpc.aio.AioRpcError as exc:
        raise error_from_rpc(exc) from None


class Upstream:
    def __init__(self, config: ProxyConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        # Name servers, brokers and checkers; no message size limit of its own (the brokers
        # and the proxy's own server enforce theirs).
        self._channels = ChannelPool(max_message_bytes=-1)
        #: broker name → address, from ListBrokers and routes.
        self.brokers: dict[str, str] = {}
        #: Topics whose last route said FIFO.
        self.fifo_topics: set[str] = set()
        #: checker address → name.
        self.checkers: dict[str, str] = {}
        #: Which shards new sends avoid (the SDK's fault table).
        self.faults = FaultTable()
        # Topic routes as the SDK's clients keep them (``txmq._routes``: the last route
        # stands while no name server answers; a burst's lookups share one call).
        self._routes: RouteCache[list[nameserver_pb2.QueueRoute]] = RouteCache(self.faults, clock=clock)
        #: (shard, client message id) of half message attempts given up on: their orphans'
        #: checks are answered ROLLBACK here (see ``relay`` and ``checks``).
        self.abandoned: Abandoned[tuple[str, str]] = Abandoned()
        #: Those of ``abandoned`` whose orphan's check this replica answered ROLLBACK: the
        #: answer may still be on its way to the broker when the client sends the half again
        #: (same shard, same id), and the broker then answers the repeat as the PREPARED
        #: half it still is. Such a repeat is never told as a success (``relay.send``).
        self.orphans_rolled_back: Abandoned[tuple[str, str]] = Abandoned()
        self.on_checkers_changed: list[Callable[[], None]] = []
        self._task: asyncio.Task[None] | None = None
        self._failing: set[str] = set()
        self.limits = Limits(config.max_body_bytes, config.max_delivery_attempts, "config")
        self._limits_due = 0.0

    @property
    def _ns(self) -> dict[str, nameserver_pb2_grpc.NameServerServiceAsyncStub]:
        # From the pool at each use: it opens new channels when the TLS files change.
        return {a: nameserver_pb2_grpc.NameServerServiceStub(self._channels.get(a))
                for a in self.config.nameserver_addresses}

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        await self.refresh()
        await self.refresh_limits()
        self._task = asyncio.create_task(self._run(), name="directory-refresh")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.config.directory_refresh_seconds)
            try:
                await self.refresh()
                if self.clock() >= self._limits_due:
                    await self.refresh_limits()
            except Exception:  # keep refreshing
                log.exception("directory refresh failed")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._channels.close()

    # --- name servers --------------------------------------------------------------------

    async def _ask(self, method: str, request: Any) -> list[Any]:
        """Asks every name server; returns the answers of those that answered."""
        async def one(address: str) -> Any:
            try:
                answer = await getattr(self._ns[address], method)(request, timeout=self.config.rpc_timeout_seconds)
            except grpc.aio.AioRpcError as exc:
                if address not in self._failing:
                    self._failing.add(address)
                    log.warning("name server unreachable", extra={"fields": {
                        "nameserver": address, "error": str(exc.details())[:200]}})
                return None
            if address in self._failing:
                self._failing.discard(address)
                log.info("name server reachable again", extra={"fields": {"nameserver": address}})
            return answer
        answers = await asyncio.gather(*(one(a) for a in self._ns))
        return [a for a in answers if a is not None]

    async def refresh(self) -> None:
        brokers = await self._ask("ListBrokers", nameserver_pb2.ListBrokersRequest())
        if brokers:
            live: dict[str, tuple[int, str]] = {}
            for answer in brokers:
                for info in answer.brokers:
                    known = live.get(info.name)
                    if known is None or info.last_heartbeat_ms > known[0]:
                        live[info.name] = (info.last_heartbeat_ms, info.address)
            self.brokers = {name: address for name, (_, address) in live.items()}
        checkers = await self._ask("ListCheckers", nameserver_pb2.ListCheckersRequest())
        if checkers:
            found = {c.address: c.name for answer in checkers for c in answer.checkers}
            if found != self.checkers:
                self.checkers = found
                for notify in self.on_checkers_changed:
                    notify()

    async def refresh_limits(self) -> Limits:
        """Reads the live brokers' limits (GetBrokerStats): the smallest body limit and
        delivery attempts over the brokers that answer. The previous values stay while none
        answers (the configuration's until one ever has)."""
        self._limits_due = self.clock() + self.config.broker_limits_refresh_seconds

        async def one(address: str) -> broker_pb2.GetBrokerStatsResponse | None:
            try:
                return await broker_pb2_grpc.BrokerServiceStub(self._channel(address)).GetBrokerStats(
                    broker_pb2.GetBrokerStatsRequest(), timeout=self.config.rpc_timeout_seconds)
            except grpc.aio.AioRpcError:
                return None
        answers = [a for a in await asyncio.gather(*(one(a) for a in set(self.brokers.values())))
                   if a is not None]
        bodies = [a.max_body_bytes for a in answers if a.max_body_bytes > 0]
        attempts = [a.max_delivery_attempts for a in answers if a.max_delivery_attempts > 0]
        if bodies or attempts:
            limits = Limits(min(bodies) if bodies else self.limits.max_body_bytes,
                            min(attempts) if attempts else self.limits.max_delivery_attempts, "brokers")
            if limits != self.limits:
                log.info("broker limits", extra={"fields": {
                    "max_body_bytes": limits.max_body_bytes, "max_delivery_attempts": limits.max_delivery_attempts,
                    "brokers": len(answers)}})
                self.limits = limits
        return self.limits

    async def route(self, topic: str, *, for_send: bool = True) -> list[nameserver_pb2.QueueRoute]:
        """The topic's queues (name server QueryRoute), reused for ``route_ttl_seconds``
        (at most ``FAULT_ROUTE_REFRESH_SECONDS`` while a shard is avoided; the last route
        stands while no name server answers). Raises TopicNotFoundError (or INVALID_NAME)
        as the name server does."""
        # The sends of a burst share one lookup (on a cold proxy every official client's
        # first send would otherwise ask the name servers).
        return await self._routes.lookup(topic, self.config.route_ttl_seconds,
                                         lambda: self._query_route(topic, for_send), key=(topic, for_send))

    async def _query_route(self, topic: str, for_send: bool) -> list[nameserver_pb2.QueueRoute]:
        now = self.clock()
        last: TxmqError | None = None
        for stub in self._ns.values():
            try:
                # A lookup that may create the topic is the client's (the name server counts it
                # against that principal's max_topics_per_principal); the others are the proxy's.
                response = await stub.QueryRoute(nameserver_pb2.QueryRouteRequest(topic=topic, for_send=for_send),
                                                 timeout=self.config.rpc_timeout_seconds,
                                                 metadata=on_behalf_metadata() if for_send else None)
            except grpc.aio.AioRpcError as exc:
                last = error_from_rpc(exc)
                if last.retryable:
                    continue  # another name server may answer
                if isinstance(last, TopicNotFoundError):
                    self._routes.forget(topic)
                raise last from None
            queues = list(response.queues)
            if response.topic_type == common_pb2.TOPIC_TYPE_FIFO:
                self.fifo_topics.add(topic)
            else:
                self.fifo_topics.discard(topic)
            for q in queues:
                self.brokers.setdefault(q.broker_name, q.broker_address)
            if len(self._routes) > 10_000:
                self._routes.clear()
            self._routes.store(topic, queues, now)
            return queues
        raise last or UnavailableError("no name server configured")

    def forget_route(self, topic: str) -> None:
        """Ask a name server again at the topic's next use (after an error)."""
        self._routes.invalidate(topic)

    # --- brokers -------------------------------------------------------------------------

    def _channel(self, address: str) -> grpc.aio.Channel:
        return self._channels.get(address)

    async def broker(self, name: str) -> broker_pb2_grpc.BrokerServiceAsyncStub:
        """A stub for the broker ``name`` (listed again once if it is not known yet)."""
        address = self.brokers.get(name)
        if address is None:
            await self.refresh()
            address = self.brokers.get(name)
            if address is None:
                raise BrokerNotFoundError(name)
        return broker_pb2_grpc.BrokerServiceStub(self._channel(address))

    def channel(self, address: str) -> grpc.aio.Channel:
        return self._channel(address)
