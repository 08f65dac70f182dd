"""The proxy's domain: what each RocketMQ operation does on the native services.

- A send goes to the queue chosen from a hash of the client's message id, so a retried
  send (same id, any replica) reaches the same broker, which deduplicates it, unless that
  broker's shard is failing: the upstream's fault table (``txmq.faults``, the SDK's) makes
  new sends skip it, and a send that fails with a retryable error (nothing acknowledged) is
  sent again to another shard the table lets take traffic (the client's message id does not
  name a shard, so it is kept); with none (every shard failing at once: both leaders of two
  shards lost together) it stays on its shard, backed off, until the shard's next leader,
  as the SDK's sends do. A half message attempt left behind (moved from or given up on) may
  have been stored with its answer lost: that orphan's check is answered ROLLBACK by this
  replica (``CheckManager``), never asked of the client, whose checker would find the
  message id committed and commit it twice.
- EndTransaction goes to the broker the transaction id names; Ack, ChangeInvisibleDuration
  and dead-lettering to the broker the receipt handle names. No state is kept here: any
  replica serves any of them.
- A receive long-polls the broker the client's queue names (any queue of it: RocketMQ
  consumers pop from a broker, not from one queue), or, for a queue not in the route, a
  broker holding the topic.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import time
from typing import Awaitable, Callable, Sequence, TypeVar

from txmq.errors import (InvalidIdError, NoLeaderError, TopicNotFoundError, TransactionStateError, TxmqError,
                         error_from_entry)
from txmq.faults import FaultTable, OverloadBackoff, RetryAction, retry_action
from txmq.fifo import group_queue_index, group_route
from txmq.ids import ReceiptHandle, TransactionId
from txmq.v1 import broker_pb2, broker_pb2_grpc, common_pb2, nameserver_pb2

from .config import ProxyConfig
from .upstream import Upstream, call

#: Refusals after which a send is retried with a fresh route (the route was stale).
_STALE_ROUTE = {"TOPIC_NOT_FOUND", "QUEUE_NOT_FOUND", "BROKER_NOT_FOUND"}
#: A half's states a check's ROLLBACK still decides (see ``_refuse_rolled_back_orphan``).
_UNDECIDED = (common_pb2.TRANSACTION_STATE_PREPARED, common_pb2.TRANSACTION_STATE_DISCARDED)
#: Attempts of one send, over different shards while there are usable ones.
SEND_ATTEMPTS = 3
#: Attempts of a call bound to the shard an id names (EndTransaction, acks, invisibility,
#: dead-lettering), the first retry after BOUND_BACKOFF_SECONDS, doubling.
BOUND_ATTEMPTS = 3
BOUND_BACKOFF_SECONDS = 0.1

log = logging.getLogger(__name__)

R = TypeVar("R")


def _shard_of(queue: nameserver_pb2.QueueRoute) -> str:
    return queue.broker_name


def _start(queues: Sequence[nameserver_pb2.QueueRoute], message_id: str) -> int:
    """Where a send's choice of queue starts: a hash of its message id (random without one)."""
    if not message_id:
        return random.randrange(len(queues))
    digest = hashlib.sha256(message_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") % len(queues)


def pick_queue(queues: Sequence[nameserver_pb2.QueueRoute], message_id: str,
               faults: FaultTable | None = None,
               exclude: frozenset[str] | set[str] = frozenset()) -> nameserver_pb2.QueueRoute:
    """The queue of a send: stable for a message id (retries meet their first attempt)
    while its shard is healthy; the next usable one (``faults``, not in ``exclude``)
    otherwise, or, with none usable, the one back soonest (a send is never refused because
    every shard failed once)."""
    start = _start(queues, message_id)
    if faults is None:
        return queues[start]
    return faults.choose(queues, _shard_of, start, exclude)


def pick_other(queues: Sequence[nameserver_pb2.QueueRoute], message_id: str, faults: FaultTable,
               exclude: frozenset[str] | set[str]) -> nameserver_pb2.QueueRoute | None:
    """Where a send that failed on the shards in ``exclude`` moves: as ``pick_queue``, but
    only to a shard the fault table lets take traffic now; None when there is none (every
    shard is failing, e.g. two shards' leaders lost at once: the send stays on its own)."""
    return faults.choose_usable(queues, _shard_of, _start(queues, message_id), exclude)


def same_queue(queues: Sequence[nameserver_pb2.QueueRoute],
               queue: nameserver_pb2.QueueRoute) -> nameserver_pb2.QueueRoute | None:
    """``queue`` as ``queues`` (a newer route) have it, at its shard's current address; any
    queue of its shard when that one is gone; None when the route does not list the shard."""
    same_shard = [q for q in queues if q.broker_name == queue.broker_name]
    for q in same_shard:
        if q.queue_id == queue.queue_id:
            return q
    return same_shard[0] if same_shard else None


class Relay:
    def __init__(self, config: ProxyConfig, upstream: Upstream) -> None:
        self.config = config
        self.upstream = upstream
        #: FIFO topic → the queues its groups are placed over (see txmq.fifo.group_route).
        self.group_routes: dict[str, Sequence[nameserver_pb2.QueueRoute]] = {}

    def _stub(self, address: str) -> broker_pb2_grpc.BrokerServiceAsyncStub:
        return broker_pb2_grpc.BrokerServiceStub(self.upstream.channel(address))

    async def send(self, message: common_pb2.Message) -> broker_pb2.SendMessageResponse:
        """Sends ``message`` (its client message id kept throughout) on the queue
        ``pick_queue`` chooses. A retryable failure (nothing acknowledged) moves it to a
        shard the fault table lets take traffic (``pick_other``); with none (every shard
        failing at once: both leaders of two shards lost together) it stays on its shard,
        backed off, and is sent again at the address of the shard's next leader (the route
        waits while the shard is between leaders), where moving would only spend its
        attempts, and then its client's, on dead leaders in milliseconds. NOT_LEADER,
        LEADERSHIP_LOST and a message group's send stay on their shard too, backed off. A
        half message attempt left on a shard it moved from, or given up on, is
        ``abandoned`` there (its orphan's check is answered ROLLBACK); one that succeeds on
        its shard in the end is not."""
        faults = self.upstream.faults
        half = message.type == common_pb2.MESSAGE_TYPE_TRANSACTION
        failed_on: set[str] = set()
        #: The queue of the last attempt, and where the next one goes (its shard's queue in
        #: the route then; None: ``pick_queue``'s choice).
        last: nameserver_pb2.QueueRoute | None = None
        target: nameserver_pb2.QueueRoute | None = None
        #: The shard of the last half message attempt that failed with nothing known (it may
        #: be stored there): abandoned once the send moves away from it or gives up, never
        #: while it waits to be sent there again (a check meanwhile would roll back a half
        #: its retry then finds stored and the client commits).
        unknown_on: str | None = None
        attempt = 1
        overload = OverloadBackoff()
        deadline = time.monotonic() + self.config.rpc_timeout_seconds
        try:
            while True:
                queues: Sequence[nameserver_pb2.QueueRoute] = await self._route_awaiting_leader(message.topic,
                                                                                                deadline)
                if not queues:
                    raise TopicNotFoundError(message.topic)
                if message.message_group:  # its group's queue, always (as txmq.Producer)
                    queues = self.group_routes[message.topic] = group_route(
                        self.group_routes.get(message.topic), queues, lambda q: (q.broker_name, q.queue_id))
                    queue = queues[group_queue_index(message.message_group, len(queues))]
                else:
                    queues = [q for q in queues if not q.draining] or queues  # a draining shard takes no new sends
                    queue = ((same_queue(queues, target) if target is not None else None)
                             or pick_queue(queues, message.message_id, faults, failed_on))
                if last is not None and queue.broker_name != last.broker_name:
                    faults.rerouted()
                    if unknown_on is not None:
                        self.upstream.abandoned.add((unknown_on, message.message_id))
                        unknown_on = None
                last = queue
                message.queue_id = queue.queue_id
                started = time.monotonic()
                try:
                    response = await call(self._stub(queue.broker_address).SendMessage(
                        broker_pb2.SendMessageRequest(message=message), timeout=self.config.rpc_timeout_seconds))
                except TxmqError as exc:
                    pause = overload.delay(exc)
                    if pause is not None:  # nothing applied: the same request again, later
                        await asyncio.sleep(pause)
                        continue
                    action = retry_action(exc, bound=False)
                    if action is RetryAction.ELSEWHERE:
                        faults.failed(queue.broker_name)
                        if message.message_group:
                            action = RetryAction.SAME_SHARD  # a group's message never moves: order would break
                        elif half:
                            unknown_on = queue.broker_name
                    elif action is RetryAction.FAIL and exc.reason not in _STALE_ROUTE:
                        raise
                    if attempt >= SEND_ATTEMPTS:
                        raise
                    self.upstream.forget_route(message.topic)
                    target = None  # a stale route: chosen again from the new one
                    if action is RetryAction.ELSEWHERE:
                        failed_on.add(queue.broker_name)
                        # None when no other shard is usable: every one is failing, and bouncing
                        # between them would spend the attempts in milliseconds; staying waits
                        # for this shard's next leader.
                        target = pick_other(queues, message.message_id, faults, failed_on)
                    if action is not RetryAction.FAIL and target is None:  # it stays: give it a moment
                        target = queue
                        await asyncio.sleep(BOUND_BACKOFF_SECONDS * 2 ** (attempt - 1))
                    attempt += 1
                    continue
                faults.succeeded(queue.broker_name, time.monotonic() - started)
                if half:
                    unknown_on = None
                    key = (queue.broker_name, message.message_id)
                    if (response.duplicate and response.transaction_state in _UNDECIDED
                            and key in self.upstream.orphans_rolled_back):
                        await self._refuse_rolled_back_orphan(message, response)
                    self.upstream.abandoned.discard(key)
                return response
        except BaseException:
            if unknown_on is not None:  # given up on
                self.upstream.abandoned.add((unknown_on, message.message_id))
            raise

    async def _refuse_rolled_back_orphan(self, message: common_pb2.Message,
                                         response: broker_pb2.SendMessageResponse) -> None:
        """A half sent again on a shard where this replica already answered its orphan's
        check ROLLBACK, and found there still undecided: that answer has not reached the
        broker yet (or was lost). Told as a success, the client would run its local
        transaction and commit a message the answer then rolls back. The answer is made
        good here (EndTransaction ROLLBACK, as the check's) and the client hears what it
        would have heard had the answer arrived first: FAILED_PRECONDITION, the half
        ROLLED_BACK."""
        try:
            await self.end(response.transaction_id, message.message_id, common_pb2.TRANSACTION_RESOLUTION_ROLLBACK,
                           common_pb2.TRANSACTION_SOURCE_CHECK, message.producer_group)
        except TxmqError as exc:  # the check's answer (in flight) or the next check decides it
            log.warning("rolling back a repeated orphan failed", extra={"fields": {
                "transaction_id": response.transaction_id, "error": str(exc)[:200]}})
        log.warning("a half sent again after its orphan's check was answered ROLLBACK: refused", extra={"fields": {
            "transaction_id": response.transaction_id, "message_id": message.message_id}})
        raise TransactionStateError(response.transaction_id, "ROLLED_BACK",
                                    f"a half message sent again with message id {message.message_id!r} "
                                    f"(its orphan's check was answered ROLLBACK)")

    async def _route_awaiting_leader(self, topic: str, deadline: float) -> list[nameserver_pb2.QueueRoute]:
        """The topic's queues; while the shards holding it are between leaders (NoLeaderError,
        a fail-over under way) asked again with backoff until ``deadline``, as the SDK's sends
        wait, then that error (HA_NOT_AVAILABLE: the clients retry it)."""
        pause = BOUND_BACKOFF_SECONDS
        while True:
            try:
                return await self.upstream.route(topic)
            except NoLeaderError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                await asyncio.sleep(min(pause, left))
                pause = min(pause * 2, 1.0)

    async def end(self, transaction_id: str, message_id: str, resolution: common_pb2.TransactionResolution.ValueType,
                  source: common_pb2.TransactionSource.ValueType, producer_group: str) -> broker_pb2.EndTransactionResponse | None:
        """EndTransaction on the shard the transaction id names, retried there with backoff
        while it is down. None when it still was: the decision is left to the check, which
        asks the producer again (RocketMQ's proxy sends EndTransaction one-way for the same
        reason); a refusal is raised. ``producer_group`` is the client's (its topic): the
        broker refuses it for another group's transaction."""
        broker = TransactionId.decode(transaction_id).broker
        request = broker_pb2.EndTransactionRequest(
            transaction_id=transaction_id, message_id=message_id, resolution=resolution, source=source,
            producer_group=producer_group)
        try:
            return await self._bound(broker, lambda stub: stub.EndTransaction(
                request, timeout=self.config.rpc_timeout_seconds))
        except TxmqError as exc:
            if retry_action(exc, bound=True) is RetryAction.FAIL:
                raise
            log.warning("EndTransaction not delivered: the check will decide", extra={"fields": {
                "broker": broker, "transaction_id": transaction_id, "error": str(exc)[:200]}})
            return None

    async def _bound(self, broker: str, send: Callable[[broker_pb2_grpc.BrokerServiceAsyncStub], Awaitable[R]]) -> R:
        """A call bound to ``broker`` by an id, retried there with backoff while it fails
        transiently or the name servers do not list it (``retry_action(bound=True)``)."""
        attempt = 1
        overload = OverloadBackoff()
        while True:
            try:
                stub = await self.upstream.broker(broker)
                return await call(send(stub))
            except TxmqError as exc:
                pause = overload.delay(exc)
                if pause is not None:
                    await asyncio.sleep(pause)
                    continue
                if exc.retryable:
                    self.upstream.faults.failed(broker)
                if retry_action(exc, bound=True) is RetryAction.FAIL or attempt >= BOUND_ATTEMPTS:
                    raise
            await asyncio.sleep(BOUND_BACKOFF_SECONDS * 2 ** (attempt - 1))
            attempt += 1

    async def brokers_of(self, topic: str) -> dict[str, str]:
        """Broker name → address of the brokers holding ``topic``, in name order (for
        consumers: a missing topic is not created)."""
        queues = await self.upstream.route(topic, for_send=False)
        if not queues:
            raise TopicNotFoundError(topic)
        return dict(sorted({q.broker_name: q.broker_address for q in queues}.items()))

    async def receive(self, *, group: str, topic: str, broker: str, filter_expression: str, max_messages: int,
                      invisible_seconds: float, wait_seconds: float, sql: bool = False, client_id: str = "",
                      ) -> list[common_pb2.DeliveredMessage]:
        """``client_id``: the RocketMQ client's, which the broker shows as the receiver (and
        counts as live for an offset reset) instead of this proxy's address."""
        brokers = await self.brokers_of(topic)
        address = brokers.get(broker) or random.choice(list(brokers.values()))
        response = await call(self._stub(address).ReceiveMessages(broker_pb2.ReceiveMessagesRequest(
            consumer_group=group, topic=topic, queue_id=-1, filter_expression=filter_expression,
            filter_type=broker_pb2.FILTER_TYPE_SQL92 if sql else broker_pb2.FILTER_TYPE_TAG,
            max_messages=max_messages, invisible_duration_seconds=invisible_seconds,
            long_polling_timeout_seconds=wait_seconds, client_id=client_id),
            timeout=wait_seconds + self.config.rpc_timeout_seconds))
        return list(response.messages)

    async def ack(self, group: str, topic: str, handles: Sequence[str]) -> list[TxmqError | None]:
        """One result per handle, in order; handles are grouped by the broker they name."""
        results: list[TxmqError | None] = [None] * len(handles)
        by_broker: dict[str, list[int]] = {}
        for i, text in enumerate(handles):
            try:
                by_broker.setdefault(ReceiptHandle.decode(text).broker, []).append(i)
            except InvalidIdError as exc:
                results[i] = exc
        for broker, indexes in by_broker.items():
            request = broker_pb2.AckMessagesRequest(
                consumer_group=group, topic=topic, receipt_handles=[handles[i] for i in indexes])
            try:
                response = await self._bound(broker, lambda stub: stub.AckMessages(
                    request, timeout=self.config.rpc_timeout_seconds))
            except TxmqError as exc:
                for i in indexes:
                    results[i] = exc
                continue
            for i, status in zip(indexes, response.entries):
                results[i] = None if status.code == 0 else error_from_entry(status)
        return results

    async def change_invisible(self, group: str, topic: str, handle: str, seconds: float) -> str:
        broker = ReceiptHandle.decode(handle).broker
        request = broker_pb2.ChangeInvisibleDurationRequest(
            consumer_group=group, topic=topic, receipt_handle=handle, invisible_duration_seconds=seconds)
        response = await self._bound(broker, lambda stub: stub.ChangeInvisibleDuration(
            request, timeout=self.config.rpc_timeout_seconds))
        return response.receipt_handle

    async def dead_letter(self, group: str, topic: str, handle: str) -> broker_pb2.DeadLetterMessageResponse:
        """Moves one in-flight delivery to ``%DLQ%<group>`` now, on the broker the handle names."""
        broker = ReceiptHandle.decode(handle).broker
        request = broker_pb2.DeadLetterMessageRequest(consumer_group=group, topic=topic, receipt_handle=handle)
        return await self._bound(broker, lambda stub: stub.DeadLetterMessage(
            request, timeout=self.config.rpc_timeout_seconds))
