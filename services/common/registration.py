"""Registration with every name server, repeated as the heartbeat (brokers and checkers).

Each name server is independent (RocketMQ's design): a registration failing on one does
not delay the others, and a name server that comes back learns everything at the next beat.

A name server drops a member after ``expiry_seconds`` without a beat (a few missed beats),
and says in every answer how often it expects one: a member beats at the shortest interval
any name server asks for (or its own ``heartbeat_interval_seconds`` when that is shorter),
so the name servers' settings alone decide how soon a dead broker leaves the routes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

import grpc

from txmq.v1 import nameserver_pb2_grpc

from .aio import wait_event
from .channels import ChannelPool

log = logging.getLogger(__name__)

Call = Callable[["nameserver_pb2_grpc.NameServerServiceAsyncStub"], Awaitable[object]]  # a type-checking-only name


class Heartbeat:
    def __init__(self, nameservers: tuple[str, ...], interval_seconds: float,
                 register: Call, unregister: Call, timeout_seconds: float = 3.0) -> None:
        self.nameservers = nameservers
        self.interval = interval_seconds
        self.register = register
        self.unregister = unregister
        self.timeout = timeout_seconds
        self._channels = ChannelPool()
        self._kick: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._failing: set[str] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def _stubs(self) -> dict[str, nameserver_pb2_grpc.NameServerServiceAsyncStub]:
        # From the pool at each use: it opens new channels when the TLS files change.
        return {a: nameserver_pb2_grpc.NameServerServiceStub(self._channels.get(a)) for a in self.nameservers}

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._kick = asyncio.Event()
        await self.beat()
        self._task = asyncio.create_task(self._run(), name="heartbeat")

    def kick(self) -> None:
        """Registers again now (any thread): a topic was created, a group appeared."""
        if self._loop is not None and self._kick is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._kick.set)

    async def beat(self) -> None:
        await asyncio.gather(*(self._one(a, self.register) for a in self.nameservers))

    async def _one(self, address: str, call: Call) -> None:
        try:
            answer = await asyncio.wait_for(call(self._stubs[address]), self.timeout)
            asked = getattr(answer, "heartbeat_interval_seconds", 0.0)
            if 0 < asked < self.interval:
                log.info("beating at the interval a name server asks for", extra={"fields": {
                    "nameserver": address, "interval_seconds": asked, "was_seconds": self.interval}})
                self.interval = asked
            if address in self._failing:
                self._failing.discard(address)
                log.info("name server reachable again", extra={"fields": {"nameserver": address}})
        except (TimeoutError, grpc.aio.AioRpcError, OSError) as exc:
            if address not in self._failing:
                self._failing.add(address)
                log.warning("name server unreachable", extra={"fields": {"nameserver": address,
                                                                          "error": str(exc)[:200]}})

    async def _run(self) -> None:
        assert self._kick is not None
        while True:
            await wait_event(self._kick, self.interval)
            self._kick.clear()
            await self.beat()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        await asyncio.gather(*(self._one(a, self.unregister) for a in self.nameservers))
        await self._channels.close()
