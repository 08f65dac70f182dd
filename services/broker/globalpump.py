"""The leader's side of multi-message transactions that needs the network (see
``globaltx.py``): pushing a decided (or discarded) global transaction's decision to its
participants (ApplyGlobalTransaction) and, for this shard's PREPARED parts still undecided
after ``transaction_timeout_seconds``, asking their coordinator (ResolveGlobalTransaction,
naming this shard; a DISCARDED answer discards the parts here and ends the asking).

It runs on whatever term serves now (``current`` gives (core, bridge), or None while this
replica does not lead), so a restarted broker or a new leader goes on from the rows in the
store: nothing of it is remembered outside them. Brokers are found by name through the
name servers' ListBrokers (the serving replica of each shard); a failed call is tried
again after ``check_interval_seconds``, with the address asked again.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

import grpc

from txmq.errors import TransactionNotFoundError, error_from_rpc
from txmq.ids import TransactionId
from txmq.v1 import broker_pb2, broker_pb2_grpc, common_pb2, nameserver_pb2, nameserver_pb2_grpc

from services.common.aio import wait_event
from services.common.channels import ChannelPool

from . import failpoints
from .config import BrokerConfig
from .globaltx import OUTCOMES
from .model import STATE_COMMITTED, STATE_DISCARDED, STATE_ROLLED_BACK, Source

log = logging.getLogger(__name__)

_STATE_PB: dict[int, common_pb2.TransactionState.ValueType]
_STATE_PB = {STATE_COMMITTED: common_pb2.TRANSACTION_STATE_COMMITTED,
             STATE_ROLLED_BACK: common_pb2.TRANSACTION_STATE_ROLLED_BACK,
             STATE_DISCARDED: common_pb2.TRANSACTION_STATE_DISCARDED}
_DECIDED_FROM_PB = {v: k for k, v in _STATE_PB.items()}
_SOURCE_PB: dict[int, common_pb2.TransactionSource.ValueType]
_SOURCE_PB = {Source.CLIENT: common_pb2.TRANSACTION_SOURCE_CLIENT, Source.CHECK: common_pb2.TRANSACTION_SOURCE_CHECK,
              Source.OPERATOR: common_pb2.TRANSACTION_SOURCE_OPERATOR, Source.BROKER: common_pb2.TRANSACTION_SOURCE_BROKER}
_SOURCE_FROM_PB = {v: k for k, v in _SOURCE_PB.items()}


class GlobalPump:
    def __init__(self, config: BrokerConfig, current: Callable[[], tuple[Any, Any] | None],
                 metrics: Any = None) -> None:
        self._config = config
        self._metrics = metrics
        self._current = current
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._channels = ChannelPool()
        self._addresses: dict[str, str] = {}
        self._retry_ms = int(config.check_interval_seconds * 1000)
        self._timeout = max(config.check_interval_seconds * 4, 1.0)
        #: (G id, shard) → when a failed push may be tried again (broker clock, ms).
        self._push_after: dict[tuple[str, str], int] = {}

    def _count(self, kind: str, result: str) -> None:
        if self._metrics is not None:
            (self._metrics.record_global_push if kind == "push" else self._metrics.record_global_pull)(result)

    def wake(self) -> None:
        self._wake.set()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="global-transactions")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self._channels.close()

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            wait: float | None = 1.0  # not leading: look again (a new term wakes us too)
            pair = self._current()
            if pair is not None:
                core, bridge = pair
                try:
                    wait = await self._round(core, bridge)
                except asyncio.CancelledError:
                    raise
                except Exception:  # a lost leadership or a refused write: try again
                    log.warning("global transaction round failed", exc_info=True)
                    wait = self._retry_ms / 1000
            await wait_event(self._wake, wait)

    async def _round(self, core: Any, bridge: Any) -> float | None:
        """One round of due pushes and pulls; returns how long to sleep (None: until woken)."""
        now = core.clock()
        calls = []
        for gid, state, source, left in core.pushes():
            for shard in left:
                if self._push_after.get((gid, shard), 0) <= now:
                    calls.append(self._push(core, bridge, gid, shard, state, source))
        calls.extend(self._pull(core, bridge, gid) for gid in core.due_pulls(now))
        if calls:
            await asyncio.gather(*calls)
        waits = []
        if core.pushes():
            waits.append(self._retry_ms / 1000)
        else:
            self._push_after.clear()
        nxt = core.next_pull_ms()
        if nxt is not None:
            waits.append(max(nxt - core.clock(), 0) / 1000)
        return min(waits) if waits else None

    async def _stub(self, shard: str) -> broker_pb2_grpc.BrokerServiceAsyncStub:
        address = self._addresses.get(shard)
        if address is None:
            await self._refresh()
            address = self._addresses.get(shard)
            if address is None:
                raise LookupError(f"broker {shard!r} is not registered with any name server")
        return broker_pb2_grpc.BrokerServiceStub(self._channels.get(address))

    async def _refresh(self) -> None:
        for ns in self._config.nameserver_addresses:
            try:
                stub = nameserver_pb2_grpc.NameServerServiceStub(self._channels.get(ns))
                response = await stub.ListBrokers(nameserver_pb2.ListBrokersRequest(), timeout=self._timeout)
            except grpc.RpcError as err:
                log.debug("ListBrokers on %s failed: %s", ns, err)
                continue
            self._addresses = {b.name: b.address for b in response.brokers}
            return

    async def _push(self, core: Any, bridge: Any, gid: str, shard: str, state: int, source: int) -> None:
        failpoints.hit("push.before")
        try:
            stub = await self._stub(shard)
            await stub.ApplyGlobalTransaction(broker_pb2.ApplyGlobalTransactionRequest(
                global_transaction_id=gid, state=_STATE_PB[state], source=_SOURCE_PB.get(source, common_pb2.TRANSACTION_SOURCE_UNSPECIFIED),
                producer_group=core.resolve_global(gid).producer_group), timeout=self._timeout)
        except (grpc.RpcError, LookupError) as err:
            log.info("push of global transaction %s to %s failed, trying again: %s", gid, shard,
                     err.details() if isinstance(err, grpc.RpcError) else err)
            self._addresses.pop(shard, None)
            self._push_after[(gid, shard)] = core.clock() + self._retry_ms
            self._count("push", "failed")
            return
        failpoints.hit("push.after")
        self._count("push", "acknowledged")
        self._push_after.pop((gid, shard), None)
        await bridge.run(core.push_done_op(gid, shard, state))

    async def _pull(self, core: Any, bridge: Any, gid: str) -> None:
        failpoints.hit("pull.before")
        shard = gid_shard(gid)
        try:
            stub = await self._stub(shard)
            answer = await stub.ResolveGlobalTransaction(
                broker_pb2.ResolveGlobalTransactionRequest(global_transaction_id=gid,
                                                           participant=self._config.broker_name),
                timeout=self._timeout)
        except (grpc.RpcError, LookupError) as err:
            if isinstance(err, grpc.RpcError) and isinstance(error_from_rpc(err), TransactionNotFoundError):
                log.warning("global transaction %s is unknown to its coordinator %s: rolling its parts back",
                            gid, shard)
                self._count("pull", "unknown")
                await bridge.run(core.apply_global_op(gid, STATE_ROLLED_BACK, Source.BROKER))
                return
            log.info("asking %s about global transaction %s failed, trying again: %s", shard, gid,
                     err.details() if isinstance(err, grpc.RpcError) else err)
            self._addresses.pop(shard, None)
            core.pull_later(gid, self._retry_ms)
            self._count("pull", "failed")
            return
        state = _DECIDED_FROM_PB.get(answer.state)
        self._count("pull", "prepared" if state is None else OUTCOMES.get(state, "prepared"))
        if state is None:  # PREPARED: its check decides it, ask again later
            core.pull_later(gid, self._retry_ms)
            return
        await bridge.run(core.apply_global_op(gid, state, _SOURCE_FROM_PB.get(answer.source, Source.BROKER),
                                              answer.producer_group))


def gid_shard(gid: str) -> str:
    return TransactionId.decode(gid).broker
