"""The consumers' RPCs of BrokerService — ``ReceiveMessages`` (its long poll, and the acks a
receive carries), ``AckMessages``, ``ChangeInvisibleDuration``, ``DeadLetterMessage`` —
proto ⇄ domain for ``service.BrokerServicer``, which delegates them to ``ConsumerRpc``.

A receive that waits holds a place of the caller's long polls (per connection and per
principal) and shows its consumer waiting (``receivers.py``) until it answers; it answers
before the caller's deadline, and takes nothing under rights revoked while it waited. The
domain is ``delivery.py``; a receive's new names are held to the caller's quotas
(``quotas.py``).
"""

from __future__ import annotations

import asyncio
from typing import Any, Sequence

from txmq.errors import InvalidFieldError, TxmqError
from txmq.v1 import broker_pb2, common_pb2

from services.common.auth import recheck
from services.common.auth.quota import caller_subject
from services.common.errors import OK, entry_status
from services.common.limits import CallerLimit

from .bridge import StoreBridge
from .convert import delivered_to_proto
from .core import BrokerCore
from .filters import MessageFilter, parse_filter
from .metrics import BrokerMetrics
from .model import ReceiveResult
from .quotas import Quotas
from .store.db import Op

#: A long poll answers (possibly empty) this long before the caller's deadline.
DEADLINE_MARGIN_SECONDS = 0.2


class ConsumerRpc:
    def __init__(self, core: BrokerCore, bridge: StoreBridge, metrics: BrokerMetrics, quotas: Quotas,
                 long_polls: CallerLimit) -> None:
        self.core = core
        self.bridge = bridge
        self.metrics = metrics
        self.quotas = quotas
        #: The receives waiting now, per connection and per principal.
        self.long_polls = long_polls

    async def receive(self, request: broker_pb2.ReceiveMessagesRequest,
                      context: Any) -> broker_pb2.ReceiveMessagesResponse:
        if request.filter_type not in broker_pb2.FilterType.values():
            raise InvalidFieldError("filter_type", f"unknown filter type {request.filter_type}")
        tags = parse_filter(request.filter_expression, request.filter_type == broker_pb2.FILTER_TYPE_SQL92)
        # Everything is checked (the first receive built, a long-poll slot held) before the
        # carried acks are applied: a refused receive applies none of them.
        first = self._receive_op(request, tags)
        wait = min(max(request.long_polling_timeout_seconds, 0.0), self.core.config.max_long_polling_seconds)
        remaining = context.time_remaining()
        if remaining is not None:
            # Answer (possibly empty) before the caller's deadline, never after it.
            wait = max(0.0, min(wait, remaining - DEADLINE_MARGIN_SECONDS))
        receivers = self.core.receivers
        receiver = receivers.received(request.consumer_group, request.topic, request.client_id, context.peer(),
                                      self.core.clock())
        if wait <= 0:
            return await self._receive(request, tags, 0.0, first)
        with self.long_polls.hold(context):
            receivers.wait_begins(receiver, request.topic)
            try:
                return await self._receive(request, tags, wait, first)
            finally:
                receivers.wait_ends(receiver, request.topic, self.core.clock())

    def _receive_op(self, request: broker_pb2.ReceiveMessagesRequest, tags: MessageFilter) -> Op:
        subject = caller_subject()
        receive = self.core.receive_op(request.consumer_group, request.topic, request.queue_id, tags,
                                       request.max_messages, request.invisible_duration_seconds)
        return self.quotas.subscribing(subject, request.consumer_group, request.topic, receive)

    async def _receive(self, request: broker_pb2.ReceiveMessagesRequest, tags: MessageFilter,
                       wait: float, op: Op) -> broker_pb2.ReceiveMessagesResponse:
        """Applies the carried acks, then receives (waiting up to ``wait`` for messages)."""
        acks = (await self._ack(request.consumer_group, request.topic, request.ack_receipt_handles, "receive")
                if request.ack_receipt_handles else [])
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        topic = request.topic
        while True:
            # A long poll that waited takes nothing under rights revoked meanwhile.
            recheck()
            version = self.bridge.version(topic)
            result: ReceiveResult = await self.bridge.run(op, sync=False)
            left = deadline - loop.time()
            if result.deliveries or left <= 0:
                break
            if result.next_deadline_ms is not None:
                left = min(left, max((result.next_deadline_ms - self.core.clock()) / 1000, 0.001))
            await self.bridge.wait_visible(topic, version, left)
            op = self._receive_op(request, tags)
        response = await self._deliveries(request.consumer_group, result)
        response.ack_entries.extend(acks)
        return response

    async def _deliveries(self, group: str, result: ReceiveResult) -> broker_pb2.ReceiveMessagesResponse:
        response = broker_pb2.ReceiveMessagesResponse()
        gone: list[str] = []
        for d in result.deliveries:
            record = self.core.read_message(d.log_seq)
            if record is None:
                gone.append(d.receipt_handle)  # removed by retention
                continue
            response.messages.append(delivered_to_proto(
                self.core, d.topic, d.queue_id, d.offset, d.log_seq, d.visible_ms, record,
                attempt=d.attempt, receipt_handle=d.receipt_handle, invisible_until_ms=d.deadline_ms))
            self.metrics.record_delivered(d.topic, 1)
        if gone:
            await self.bridge.run(self.core.ack_op(group, "", gone), sync=False)
        return response

    async def ack(self, request: broker_pb2.AckMessagesRequest) -> broker_pb2.AckMessagesResponse:
        return broker_pb2.AckMessagesResponse(
            entries=await self._ack(request.consumer_group, request.topic, request.receipt_handles, "ack"))

    async def _ack(self, group: str, topic: str, handles: Sequence[str], via: str) -> list[common_pb2.EntryStatus]:
        """Acknowledges ``handles`` (AckMessages, and the acks a ReceiveMessages carries): one
        batch that replicates without holding the answer; one status per handle, in order."""
        results = await self.bridge.run(self.core.ack_op(group, topic, list(handles)), sync=False)
        entries = [entry_status(r) if isinstance(r, TxmqError) else
                   (OK if r is None else entry_status(TxmqError(str(r)))) for r in results]
        self.metrics.record_acks(via, [e.code for e in entries])
        return entries

    async def change_invisible(self, request: broker_pb2.ChangeInvisibleDurationRequest
                               ) -> broker_pb2.ChangeInvisibleDurationResponse:
        op = self.core.change_invisible_op(request.consumer_group, request.topic, request.receipt_handle,
                                           request.invisible_duration_seconds)
        handle, deadline = await self.bridge.run(op, sync=False)
        return broker_pb2.ChangeInvisibleDurationResponse(receipt_handle=handle, invisible_until_ms=deadline)

    async def dead_letter(self, request: broker_pb2.DeadLetterMessageRequest) -> broker_pb2.DeadLetterMessageResponse:
        op = self.core.dead_letter_op(request.consumer_group, request.topic, request.receipt_handle)
        topic, offset = await self.bridge.run(op, sync=False)
        return broker_pb2.DeadLetterMessageResponse(dead_letter_topic=topic, queue_offset=offset)
