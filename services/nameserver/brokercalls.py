"""The name server's calls to its brokers: one channel per broker address, one call, or
one call on every live broker (the Admin API's fan-out).

Calls to brokers fail with the txmq error the broker raised (``error_from_rpc``), so an
operator gets the same status through the name server as from the broker itself.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc

from services.common.channels import ChannelPool
from txmq.errors import TxmqError, error_from_rpc
from txmq.ids import TransactionId
from txmq.v1 import broker_pb2_grpc, replication_pb2_grpc

from .registry import BrokerRecord, Registry

log = logging.getLogger(__name__)

# A broker failing with one of these is down or broken, not refusing the request.
_BROKER_DOWN = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
                grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)


class BrokerClients:
    """One grpc.aio channel per broker address, opened on first use."""

    def __init__(self, max_message_bytes: int) -> None:
        self._channels = ChannelPool(max_message_bytes)
        self._stubs: dict[str, tuple[grpc.aio.Channel, broker_pb2_grpc.BrokerServiceAsyncStub]] = {}

    def replication_stub(self, address: str) -> replication_pb2_grpc.ReplicationServiceAsyncStub:
        return replication_pb2_grpc.ReplicationServiceStub(self._channels.get(address))

    def stub(self, address: str) -> broker_pb2_grpc.BrokerServiceAsyncStub:
        channel = self._channels.get(address)  # a new one when the TLS files changed
        stub = self._stubs.get(address)
        if stub is None or stub[0] is not channel:
            stub = self._stubs[address] = (channel, broker_pb2_grpc.BrokerServiceStub(channel))
        return stub[1]

    async def retain(self, addresses: set[str]) -> None:
        """Closes the channels of addresses no live broker has any more."""
        for address in await self._channels.retain(addresses):
            self._stubs.pop(address, None)

    async def close(self) -> None:
        self._stubs.clear()
        await self._channels.close()


class BrokerCalls:
    """BrokerService calls with the name server's deadline, to one broker or to all."""

    def __init__(self, registry: Registry, clients: BrokerClients, *, timeout_seconds: float) -> None:
        self.registry = registry
        self.clients = clients
        self.timeout = timeout_seconds

    async def call(self, address: str, method: str, request: Any) -> Any:
        """One BrokerService call (its refusal raised as the txmq error it stands for)."""
        try:
            return await getattr(self.clients.stub(address), method)(request, timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from None

    async def fan_out(self, method: str, request: Any, only: set[str] | None = None,
                      tolerate: tuple[type[TxmqError], ...] = (),
                      ) -> tuple[list[tuple[BrokerRecord, Any]], list[str]]:
        """``method`` on every live broker (named in ``only`` when given): the answers and
        the names of the brokers that did not answer (refusals are raised, but those of the
        ``tolerate`` types, which count as no answer)."""
        brokers = [b for b in self.registry.live_brokers() if only is None or b.name in only]
        await self.retain_live()
        results = await asyncio.gather(*(self.call(b.address, method, request) for b in brokers),
                                       return_exceptions=True)
        answers: list[tuple[BrokerRecord, Any]] = []
        unreachable: list[str] = []
        for broker, result in zip(brokers, results):
            if tolerate and isinstance(result, tolerate):
                continue
            if isinstance(result, TxmqError) and self.is_down(result):
                log.warning("broker did not answer %s", method, extra={"fields": {
                    "broker": broker.name, "address": broker.address, "error": result.message}})
                unreachable.append(broker.name)
                continue
            if isinstance(result, BaseException):
                raise result
            answers.append((broker, result))
        return answers, unreachable

    async def retain_live(self) -> None:
        """Closes the channels of addresses no live broker has any more."""
        await self.clients.retain({b.address for b in self.registry.live_brokers()})

    def broker_of(self, transaction_id: str) -> BrokerRecord:
        """The live broker a transaction id names."""
        return self.registry.live_broker(TransactionId.decode(transaction_id).broker)

    @staticmethod
    def is_down(error: TxmqError) -> bool:
        """Whether a broker failing with ``error`` is down or broken (not refusing)."""
        return error.code in _BROKER_DOWN
