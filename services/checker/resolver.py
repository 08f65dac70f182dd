"""Checks answered with no producer online: the checker's resolver for the producer groups
configured with a decisions table (``resolver_groups``: ``GROUP=DSN_FILE``, see
``config.py``).

For such a group the checker holds a connection to the group's decisions table (a role
limited to it: ``txmq db init --resolver-role``) and, while **no producer of the group is
subscribed**, answers the group's checks of anchored transactions itself, with the same
protocol as the SDK (``txmq.decisions``): the fence under a lock timeout, the COMMIT row
read, the halves it lists committed on their brokers (EndTransaction, source CHECK) and
the row deleted once they all are COMMITTED. So a group whose whole fleet is down is still
decided correctly.

The resolver is a subscriber of the dispatcher like a producer stream (client id
``resolver@<checker>``, credit ``resolver_concurrency``): it subscribes a group when the
group has no producer stream, and leaves it (its unstarted checks handed back, nothing
spent) as soon as one subscribes. A check of a message that is not anchored is answered
UNKNOWN (only the group's own code can answer it). The DSN is read from its file at start
and never logged.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc

from txmq import LocalTransactionState, TransactionState
from txmq import decisions as core
from txmq.decisions import AsyncStorePool, drive_async
from txmq.errors import InvalidFieldError, TransactionStateError, error_from_rpc
from txmq.ids import TransactionId
from txmq.names import validate_group
from txmq.v1 import broker_pb2, checker_pb2, common_pb2

from .brokers import BrokerDirectory
from .config import CheckerConfig
from .dispatcher import Dispatcher
from .metrics import CheckerMetrics
from .streams import ProducerStream

log = logging.getLogger(__name__)

_RESULTS = {LocalTransactionState.COMMIT: common_pb2.CHECK_RESULT_COMMIT,
            LocalTransactionState.ROLLBACK: common_pb2.CHECK_RESULT_ROLLBACK,
            LocalTransactionState.UNKNOWN: common_pb2.CHECK_RESULT_UNKNOWN}


def _state(name: str) -> TransactionState | None:
    """``TRANSACTION_STATE_COMMITTED`` (or ``COMMITTED``) → the SDK's enum."""
    try:
        return TransactionState[name.removeprefix("TRANSACTION_STATE_")]
    except KeyError:
        return None


def parse_groups(entries: tuple[str, ...]) -> dict[str, str]:
    """``GROUP=DSN_FILE`` entries → {group: the DSN read from its file}."""
    groups: dict[str, str] = {}
    for entry in entries:
        group, sep, path = entry.partition("=")
        if not sep or not group or not path:
            raise ValueError(f"resolver_groups: {entry!r} is not GROUP=DSN_FILE")
        validate_group("resolver_groups", group)
        try:
            with open(path) as f:
                dsn = f.read().strip()
        except OSError as err:
            raise ValueError(f"resolver_groups: cannot read the DSN file of group {group!r}: {err.strerror}") from None
        if not dsn:
            raise ValueError(f"resolver_groups: the DSN file of group {group!r} is empty")
        groups[group] = dsn
    return groups


class _Group:
    def __init__(self, name: str, dsn: str, settings: core.DecisionSettings) -> None:
        self.name = name
        self.pool = AsyncStorePool(dsn)
        self.settings = settings
        self.stream: ProducerStream | None = None
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None


class Resolver:
    def __init__(self, config: CheckerConfig, dispatcher: Dispatcher, directory: BrokerDirectory,
                 metrics: CheckerMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self.dispatcher = dispatcher
        self.directory = directory
        self.client_id = f"resolver@{config.checker_name}"
        settings = core.DecisionSettings(table=config.resolver_table,
                                         check_lock_timeout_seconds=config.resolver_lock_timeout_seconds,
                                         in_progress_retry_seconds=config.resolver_in_progress_retry_seconds,
                                         repair_after_seconds=config.resolver_repair_after_seconds,
                                         fence_retention_seconds=config.resolver_fence_retention_seconds,
                                         idle_in_transaction_timeout_seconds=None, statement_timeout_seconds=None)
        self.groups = {g: _Group(g, dsn, settings) for g, dsn in parse_groups(config.resolver_groups).items()}
        self._checks: set[asyncio.Task[None]] = set()
        self._running: asyncio.Semaphore | None = None
        if self.groups:
            import psycopg  # noqa: F401 - fail at start, not at the first check, when it is missing

    async def refresh(self) -> None:
        """Subscribes the groups that have no producer stream, leaves those that have one."""
        if self._running is None:
            self._running = asyncio.Semaphore(self.config.resolver_concurrency)
        for group in self.groups.values():
            members = self.dispatcher.membership.by_group.get(group.name, {})
            producers = [s for s in members.values() if s is not group.stream]
            if not producers and (group.stream is None or group.stream.closed):
                group.stream = self.dispatcher.subscribe(self.client_id, [group.name], self.config.resolver_concurrency)
                group.stream.set_waiter(group.wake.set)
                group.task = asyncio.ensure_future(self._serve(group, group.stream))
                log.info("resolver answers the group's checks (no producer subscribed)",
                         extra={"fields": {"group": group.name}})
            elif producers and group.stream is not None and not group.stream.closed:
                stream, group.stream = group.stream, None
                self.dispatcher.unsubscribe(stream)  # its unstarted checks go to the producers
                log.info("resolver leaves the group to its producers", extra={"fields": {"group": group.name}})

    async def _serve(self, group: _Group, stream: ProducerStream) -> None:
        while not stream.closed:
            response = stream.pop()
            if response is None:
                group.wake.clear()
                await group.wake.wait()
                continue
            if response.WhichOneof("command") == "check":
                task = asyncio.ensure_future(self._answer(group, stream, response.check))
                self._checks.add(task)
                task.add_done_callback(self._checks.discard)

    async def _answer(self, group: _Group, stream: ProducerStream, check: checker_pb2.CheckRequest) -> None:
        assert self._running is not None
        try:
            async with self._running:
                if stream.closed:
                    return
                try:
                    self.dispatcher.received(stream, check.check_id)
                except InvalidFieldError:
                    return  # not started in time: handed back to the broker, nothing spent
                try:
                    result, retry_after = await self._decide(group, check)
                except Exception:  # the check stays unanswered: it is claimed again
                    log.exception("resolver cannot answer a check", extra={"fields": {
                        "group": group.name, "transaction_id": check.transaction_id}})
                    return
                if stream.closed:
                    return
                try:
                    # Named by its transaction, an answer that comes after its check expired
                    # and was forgotten (a decision slower than the answer timeout and the
                    # lease, as on a loaded machine) is a late answer: it still decides.
                    self.dispatcher.answered(stream, check.check_id, result, retry_after,
                                             transaction_id=check.transaction_id, broker_name=check.broker_name,
                                             producer_group=group.name)
                except InvalidFieldError:
                    pass  # refused as a late answer too: nothing more to tell the broker
        finally:
            # Whatever became of the check, its unit of credit comes back: a unit kept would
            # be a check the group can never be sent again.
            if not stream.closed:
                self.dispatcher.grant(stream, 1)

    async def _decide(self, group: _Group,
                      check: checker_pb2.CheckRequest) -> tuple[common_pb2.CheckResult.ValueType, float]:
        properties = dict(check.message.properties)
        if not core.is_anchored(properties):
            self.metrics.resolver_answer(group.name, "not_anchored")
            return common_pb2.CHECK_RESULT_UNKNOWN, 0.0
        key = core.transaction_key_of(properties)
        steps = core.answer_check(group.settings, group.name, key, check.transaction_id)
        verdict = await drive_async(steps, self._performer(group))
        self.metrics.resolver_answer(group.name, verdict.source.value)
        log.debug("resolver answered a check", extra={"fields": {
            "group": group.name, "transaction_id": check.transaction_id, "source": verdict.source.value}})
        if isinstance(verdict.answer, LocalTransactionState):
            return _RESULTS[verdict.answer], 0.0
        return common_pb2.CHECK_RESULT_IN_PROGRESS, float(verdict.answer.retry_after_seconds)

    def _performer(self, group: _Group) -> Any:
        """How the flows of ``txmq.decisions`` run here: statements on the group's own
        connection, ends on the brokers, an acknowledged row deleted at once."""
        async def perform(step: Any) -> Any:
            if type(step) is core.Statement:
                return await group.pool.run(step)
            if type(step) is core.Ends:
                return await asyncio.gather(*(self._end(group.name, t, step.decision) for t in step.transaction_ids))
            assert type(step) is core.Acknowledged
            try:
                await group.pool.run(core.delete_acknowledged_statement(group.settings, group.name, [step.key]))
            except core.DatabaseError as err:
                log.warning("resolver cannot delete a decision row (the next sweep repairs it)",
                            extra={"fields": {"group": group.name, "error": str(err)[:200]}})
            return None

        return perform

    async def sweep(self) -> None:
        """Sweeps the tables of the groups the resolver serves now (``core.sweep``)."""
        for group in self.groups.values():
            if group.stream is not None and not group.stream.closed:
                repaired = await drive_async(core.sweep(group.settings, group.name), self._performer(group))
                if repaired:
                    log.info("resolver repaired decision rows", extra={"fields": {"group": group.name,
                                                                                    "rows": repaired}})

    async def _end(self, group: str, transaction_id: str,
                   decision: LocalTransactionState) -> tuple[TransactionState | None, Exception | None]:
        """EndTransaction (source CHECK) on the broker the id names, through its link."""
        broker = TransactionId.decode(transaction_id).broker
        link = self.directory.links.get(broker)
        if link is None:
            return None, None
        request = broker_pb2.EndTransactionRequest(
            transaction_id=transaction_id, resolution=common_pb2.TRANSACTION_RESOLUTION_COMMIT
            if decision is LocalTransactionState.COMMIT else common_pb2.TRANSACTION_RESOLUTION_ROLLBACK,
            source=common_pb2.TRANSACTION_SOURCE_CHECK, producer_group=group)
        try:
            response = await link.stub.EndTransaction(request, timeout=self.config.rpc_timeout_seconds)
        except grpc.aio.AioRpcError as exc:
            error = error_from_rpc(exc)
            if isinstance(error, TransactionStateError):
                return _state(str(getattr(error, "state", ""))), error
            return None, error
        return _state(common_pb2.TransactionState.Name(response.state)), None

    async def close(self) -> None:
        for group in self.groups.values():
            if group.stream is not None:
                self.dispatcher.unsubscribe(group.stream)
                group.stream = None
            group.wake.set()
            if group.task is not None:
                group.task.cancel()
        for task in list(self._checks):
            task.cancel()
        await asyncio.gather(*self._checks, *(g.task for g in self.groups.values() if g.task), return_exceptions=True)
        for group in self.groups.values():
            await group.pool.close()

