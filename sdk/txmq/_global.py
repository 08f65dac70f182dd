"""Multi-message transactions: ``send_in_transaction([m1, m2, ...])`` of
:class:`txmq.TransactionProducer` and :class:`txmq.aio.AsyncTransactionProducer`.

The protocol (docs/features-design.md, "Multi-message transactions across shards"):

1. Every message gets its queue (and so its shard) first. The first message is sent as a
   half message that *begins* the global transaction ``G`` on its shard, the
   *coordinator*: ``G`` is its transaction id; it names the other shards (participants).
2. The other messages are sent as half messages tagged with ``G`` (a *part* each), on the
   shard chosen in step 1 — a part is never moved to another shard: a send that keeps
   failing there fails the whole transaction, which is then rolled back.
3. The local transaction (``listener.execute_local_transaction(first message, arg)``; the
   message's ``transaction_id`` is ``G``).
4. EndTransaction(G) on the coordinator: the decision of every message at once.

A check asks about ``G`` only (the first message, ``transaction_id`` = ``G``), never about
a part. Each message carries ``G`` and the message count in its properties, so a consumer
can reassemble the transaction (``ReceivedMessage.global_transaction_id`` / ``global_parts``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Protocol, Sequence

from . import _tracing as tracing
from ._calling import QueueRoute
from ._errors import InvalidFieldError, TxmqError
from ._ids import MessageId
from ._names import GLOBAL_PARTS_PROPERTY, GLOBAL_TRANSACTION_PROPERTY
from ._producing import OpenTransactions
from ._sending import Sender, Step, abandon, run, run_async, send_bound
from ._types import LocalTransactionState, Message, TransactionMessage, TransactionState, message_to_pb
from .v1 import broker_pb2, common_pb2

#: Most messages one global transaction may hold (the broker's participant limit is per shard).
MAX_MESSAGES = 1000

Ended = tuple[TransactionState | None, "TxmqError | None"]


class GlobalSender(Sender, Protocol):
    """What a multi-message transaction needs of ``txmq.TransactionProducer``."""
    producer_group: str
    client_id: str
    #: Half messages of transactions open here (a check of one is answered IN_PROGRESS).
    _open: OpenTransactions

    def _validate(self, message: Message) -> Message: ...
    def _pick_queue(self, topic: str, *, message_group: str = "") -> QueueRoute: ...
    def _perform(self, step: Step) -> Any: ...
    def _execute(self, half: TransactionMessage, arg: Any,
                 traced: tracing.Operation = ...) -> tuple[LocalTransactionState, Exception | None]: ...
    def _end(self, route: QueueRoute, topic: str, half: TransactionMessage,
             local_state: LocalTransactionState, traced: tracing.Operation | None = ...) -> Ended: ...


class AsyncGlobalSender(Sender, Protocol):
    """What a multi-message transaction needs of ``txmq.aio.AsyncTransactionProducer``."""
    producer_group: str
    client_id: str
    _open: OpenTransactions

    def _validate(self, message: Message) -> Message: ...
    def _pick_queue(self, topic: str, *, message_group: str = "") -> Awaitable[QueueRoute]: ...
    def _perform(self, step: Step) -> Awaitable[Any]: ...
    def _execute(self, half: TransactionMessage, arg: Any,
                 traced: tracing.Operation = ...) -> Awaitable[tuple[LocalTransactionState, Exception | None]]: ...
    def _end(self, route: QueueRoute, topic: str, half: TransactionMessage,
             local_state: LocalTransactionState, traced: tracing.Operation | None = ...) -> Awaitable[Ended]: ...


@dataclass(frozen=True, slots=True)
class GlobalTransactionResult:
    """The outcome of ``send_in_transaction`` with several messages.

    ``state`` is the global transaction's state on its coordinator after the
    EndTransaction (COMMITTED, ROLLED_BACK, or PREPARED after UNKNOWN), or None when the
    EndTransaction could not be delivered (``end_error`` says why; the checker then asks
    the producer group about ``global_transaction_id``). ``messages`` are the parts in the
    order given, each with its own transaction id and shard.
    """

    global_transaction_id: str
    local_state: LocalTransactionState
    state: TransactionState | None
    messages: tuple[TransactionMessage, ...]
    end_error: "TxmqError | None" = None
    #: The exception ``execute_local_transaction`` raised (the outcome is then UNKNOWN).
    local_error: BaseException | None = None


def validate_messages(messages: Sequence[Message]) -> list[Message]:
    messages = list(messages)
    if not messages:
        raise InvalidFieldError("messages", "a transaction needs at least one message")
    if len(messages) > MAX_MESSAGES:
        raise InvalidFieldError("messages", f"at most {MAX_MESSAGES} messages, got {len(messages)}")
    for m in messages:
        if GLOBAL_TRANSACTION_PROPERTY in getattr(m, "properties", {}):
            raise InvalidFieldError("properties", f"{GLOBAL_TRANSACTION_PROPERTY} is reserved: the broker sets it")
    return messages


def stamped(message: Message, parts: int, global_id: str = "") -> Message:
    """``message`` with the transaction's size (and, once known, its id) in its properties;
    every other field (delay, delivery time, message group, ...) as given."""
    properties = {**message.properties, GLOBAL_PARTS_PROPERTY: str(parts)}
    if global_id:
        properties[GLOBAL_TRANSACTION_PROPERTY] = global_id
    return dataclasses.replace(message, properties=properties)


def half_pb(producer: Any, message: Message, route: QueueRoute, host: str) -> common_pb2.Message:
    pb = message_to_pb(message, MessageId.new(route.broker_name, route.queue_id).encode(), route.queue_id,
                       common_pb2.MESSAGE_TYPE_TRANSACTION, int(time.time() * 1000), host)
    pb.producer_group = producer.producer_group
    pb.producer_client_id = producer.client_id
    if message.check_immunity_seconds:
        pb.check_immunity_seconds = message.check_immunity_seconds
    return pb


def send_entry(pb: common_pb2.Message, *, begin: bool = False, participants: Sequence[str] = (),
               global_id: str = "") -> broker_pb2.ProduceEntry:
    return broker_pb2.ProduceEntry(send_message=broker_pb2.SendMessageRequest(
        message=pb, begin_global=begin, global_participants=list(participants), global_transaction_id=global_id))


def half_of(message: Message, pb: common_pb2.Message, route: QueueRoute,
            sent: broker_pb2.SendMessageResponse) -> TransactionMessage:
    return TransactionMessage(message=message, message_id=sent.message_id or pb.message_id,
                              transaction_id=sent.transaction_id, broker_name=sent.broker_name or route.broker_name,
                              queue_id=route.queue_id)


def result_of(halves: list[TransactionMessage], local_state: LocalTransactionState,
              state: TransactionState | None, end_error: TxmqError | None,
              local_error: BaseException | None = None) -> GlobalTransactionResult:
    return GlobalTransactionResult(global_transaction_id=halves[0].transaction_id, local_state=local_state,
                                   state=state, messages=tuple(halves), end_error=end_error, local_error=local_error)


# --- sync --------------------------------------------------------------------------------

def _send_bound(producer: GlobalSender, route: QueueRoute, topic: str,
                entry: broker_pb2.ProduceEntry) -> broker_pb2.SendMessageResponse:
    """One half message on the shard ``route`` names, retried there with the same id."""
    return run(send_bound(producer, route, topic, entry), producer._perform)


def send_global(producer: GlobalSender, messages: Sequence[Message], arg: Any,
                host: str) -> GlobalTransactionResult:
    """Steps 1-4 of the module docstring with the sync producer (traced as one send: every
    message carries its context)."""
    messages = [producer._validate(m) for m in validate_messages(messages)]  # namespaced
    with tracing.send(messages[0], transactional=True, client_id=producer.client_id) as traced:
        return _send_global(producer, [traced.inject(m) for m in messages], arg, host, traced)


def _send_global(producer: GlobalSender, messages: list[Message], arg: Any, host: str,
                 traced: tracing.Operation) -> GlobalTransactionResult:
    routes = [producer._pick_queue(m.topic, message_group=m.message_group) for m in messages]
    stamped_messages = [stamped(m, len(messages)) for m in messages]
    pbs = [half_pb(producer, m, r, host) for m, r in zip(stamped_messages, routes)]
    # Until it ends, a check of G reaching this instance is answered IN_PROGRESS (as for an
    # open explicit transaction): the sends and the local transaction may outlast the timeout.
    producer._open.add(pbs[0].message_id)
    halves: list[TransactionMessage] = []
    try:
        try:
            first = _send_bound(producer, routes[0], messages[0].topic, send_entry(
                pbs[0], begin=True, participants=sorted({r.broker_name for r in routes[1:]})))
        except TxmqError:
            abandon(producer, pbs[0])  # if it was stored, its check is answered ROLLBACK
            raise
        gid = first.transaction_id
        halves.append(half_of(stamped(messages[0], len(messages), gid), pbs[0], routes[0], first))
        try:
            for m, pb, route in zip(messages[1:], pbs[1:], routes[1:]):
                sent = _send_bound(producer, route, m.topic, send_entry(pb, global_id=gid))
                halves.append(half_of(stamped(m, len(messages), gid), pb, route, sent))
        except TxmqError:
            abandon(producer, pbs[0])
            producer._end(routes[0], messages[0].topic, halves[0], LocalTransactionState.ROLLBACK)
            raise
        tracing.sent(traced, message_id=halves[0].message_id, queue_id=routes[0].queue_id,
                     broker_name=halves[0].broker_name, transaction_id=gid)
        local_state, local_error = producer._execute(halves[0], arg, traced)
        state, end_error = producer._end(routes[0], messages[0].topic, halves[0], local_state, traced)
    finally:
        producer._open.discard(pbs[0].message_id)
    return result_of(halves, local_state, state, end_error, local_error)


# --- asyncio -----------------------------------------------------------------------------

async def _send_bound_async(producer: AsyncGlobalSender, route: QueueRoute, topic: str,
                            entry: broker_pb2.ProduceEntry) -> broker_pb2.SendMessageResponse:
    """As :func:`_send_bound`."""
    return await run_async(send_bound(producer, route, topic, entry), producer._perform)


async def send_global_async(producer: AsyncGlobalSender, messages: Sequence[Message], arg: Any,
                            host: str) -> GlobalTransactionResult:
    """As :func:`send_global`; the parts after the first are sent concurrently."""
    messages = [producer._validate(m) for m in validate_messages(messages)]  # namespaced
    with tracing.send(messages[0], transactional=True, client_id=producer.client_id) as traced:
        return await _send_global_async(producer, [traced.inject(m) for m in messages], arg, host, traced)


async def _send_global_async(producer: AsyncGlobalSender, messages: list[Message], arg: Any, host: str,
                             traced: tracing.Operation) -> GlobalTransactionResult:
    routes = [await producer._pick_queue(m.topic, message_group=m.message_group) for m in messages]
    pbs = [half_pb(producer, stamped(m, len(messages)), r, host) for m, r in zip(messages, routes)]
    producer._open.add(pbs[0].message_id)  # checks answered IN_PROGRESS until it ends
    try:
        try:
            first = await _send_bound_async(producer, routes[0], messages[0].topic, send_entry(
                pbs[0], begin=True, participants=sorted({r.broker_name for r in routes[1:]})))
        except TxmqError:
            abandon(producer, pbs[0])
            raise
        head = half_of(stamped(messages[0], len(messages), first.transaction_id), pbs[0], routes[0], first)
        return await _parts_and_end_async(producer, messages, pbs, routes, head, arg, traced)
    finally:
        producer._open.discard(pbs[0].message_id)


async def _parts_and_end_async(producer: AsyncGlobalSender, messages: list[Message],
                               pbs: list[common_pb2.Message], routes: list[QueueRoute],
                               head: TransactionMessage, arg: Any,
                               traced: tracing.Operation) -> GlobalTransactionResult:
    gid = head.transaction_id
    sent = await asyncio.gather(*(_send_bound_async(producer, route, m.topic, send_entry(pb, global_id=gid))
                                  for m, pb, route in zip(messages[1:], pbs[1:], routes[1:])),
                                return_exceptions=True)
    failed = next((s for s in sent if isinstance(s, BaseException)), None)
    if failed is not None:
        abandon(producer, pbs[0])
        await producer._end(routes[0], messages[0].topic, head, LocalTransactionState.ROLLBACK)
        raise failed
    responses = [s for s in sent if not isinstance(s, BaseException)]  # every one: none failed
    halves = [head] + [half_of(stamped(m, len(messages), gid), pb, route, s)
                       for m, pb, route, s in zip(messages[1:], pbs[1:], routes[1:], responses)]
    tracing.sent(traced, message_id=head.message_id, queue_id=routes[0].queue_id, broker_name=head.broker_name,
                 transaction_id=gid)
    local_state, local_error = await producer._execute(head, arg, traced)
    state, end_error = await producer._end(routes[0], messages[0].topic, head, local_state, traced)
    return result_of(halves, local_state, state, end_error, local_error)
