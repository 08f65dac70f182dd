"""The consumers' RPCs of ``apache.rocketmq.v2.MessagingService`` — ``ReceiveMessage``,
``AckMessage``, ``ChangeInvisibleDuration`` (a nack), ``ForwardMessageToDeadLetterQueue`` —
RocketMQ protocol ⇄ the native brokers (``relay``), for ``service.MessagingServicer``, which
delegates them to ``ConsumerRpc``.

They share what a consumer holds on this replica: its long polls (per connection and per
principal, TOO_MANY_REQUESTS beyond), the invisibility bounds a receive and a nack are held
to, and a push consumer's deliveries kept invisible until acknowledged, nacked or
dead-lettered (``renew.Renewer``, at most ``max_renewals_per_principal`` per principal).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from services.common.auth import recheck
from services.common.limits import caller_limit

from .clients import client_id_of, client_of
from .codes import ProxyError, code_for, failure, status
from .config import ProxyConfig
from .convert import delivered_to_rmq, resource_name, seconds, validate_filter
from .metrics import ProxyMetrics
from .protocol import Code
from .protocol import definition_pb2 as pb
from .protocol import service_pb2 as spb
from .relay import Relay
from .renew import Renewer

#: A long poll ends this long before the client's deadline.
DEADLINE_MARGIN_SECONDS = 1.0


class ConsumerRpc:
    def __init__(self, config: ProxyConfig, relay: Relay, renewer: Renewer, metrics: ProxyMetrics) -> None:
        self.config = config
        self.relay = relay
        #: Push consumers' deliveries, kept invisible until acknowledged or nacked.
        self.renewer = renewer
        self.metrics = metrics
        self.long_polls = caller_limit(config, metrics, "max_long_polls_per_connection", "max_long_polls_per_principal")

    def _long_poll_seconds(self, request: spb.ReceiveMessageRequest, context: Any) -> float:
        wait = seconds(request.long_polling_timeout) if request.HasField("long_polling_timeout") else 0.0
        wait = min(max(wait, 0.0), self.config.max_long_polling_seconds)
        remaining = context.time_remaining()
        if remaining is not None:
            wait = max(0.0, min(wait, remaining - DEADLINE_MARGIN_SECONDS))
        return wait

    def _renewal_room(self, context: Any) -> int:
        """How many deliveries a push receive of the caller may take: each is renewed until
        acked (a broker call every half invisibility), at most max_renewals_per_principal
        for one principal; none left is TOO_MANY_REQUESTS, before anything is received."""
        room = self.renewer.room(client_of(context).principal)
        if room <= 0:
            limit = self.config.max_renewals_per_principal
            raise ProxyError(Code.TOO_MANY_REQUESTS,
                             f"{limit} deliveries are auto-renewed for this principal already: "
                             f"max_renewals_per_principal={limit} reached (ack or nack some first)")
        return room

    def _invisible_seconds(self, value: float) -> float:
        return min(max(value, self.config.min_invisible_duration_seconds), self.config.max_invisible_duration_seconds)

    async def receive(self, request: spb.ReceiveMessageRequest, context: Any) -> None:
        """Frames: status, then one message each, then the delivery timestamp. With
        ``auto_renew`` (push consumers) the deliveries stay invisible until the client acks
        or nacks them (see ``renew``)."""
        try:
            group = resource_name(request.group, "group")
            queue = request.message_queue
            topic = resource_name(queue.topic, "topic")
            expression, sql = validate_filter(request.filter_expression)
            invisible = self._invisible_seconds(
                seconds(request.invisible_duration) if request.HasField("invisible_duration")
                else self.config.default_invisible_duration_seconds)
            batch = min(max(request.batch_size, 1), self.config.max_receive_batch)
            if request.auto_renew and self.config.auto_renew_max_seconds > 0:
                batch = min(batch, self._renewal_room(context))
            wait = self._long_poll_seconds(request, context)
            # A long poll counts against its connection's and its principal's limits (42900 beyond).
            with self.long_polls.hold(context) if wait > 0 else contextlib.nullcontext():
                deliveries = await self.relay.receive(
                    group=group, topic=topic, broker=queue.broker.name, filter_expression=expression, sql=sql,
                    max_messages=batch, invisible_seconds=invisible, wait_seconds=wait,
                    client_id=client_id_of(context))
                recheck()  # its access key removed during the long poll: none of them written
        except Exception as exc:  # noqa: BLE001 - answered in band
            await context.write(failure(spb.ReceiveMessageResponse, exc, "ReceiveMessage"))
            return
        now_ms = int(time.time() * 1000)
        if deliveries:
            await context.write(spb.ReceiveMessageResponse(status=status()))
            for d in deliveries:
                await context.write(spb.ReceiveMessageResponse(message=delivered_to_rmq(d, now_ms)))
                self.metrics.messages_out.labels(topic).inc()
            if request.auto_renew:  # written: the client has them (a failed write renews nothing)
                client = client_of(context)
                for d in deliveries:
                    self.renewer.add(client, group, d.topic, d.receipt_handle, invisible, client.principal)
        else:
            await context.write(spb.ReceiveMessageResponse(status=pb.Status(
                code=Code.MESSAGE_NOT_FOUND, message="no new message")))
        stamp = spb.ReceiveMessageResponse()
        stamp.delivery_timestamp.FromMilliseconds(now_ms)
        await context.write(stamp)

    async def ack(self, request: spb.AckMessageRequest, context: Any) -> spb.AckMessageResponse:
        try:
            group = resource_name(request.group, "group")
            topic = resource_name(request.topic, "topic")
            principal = client_of(context).principal
            handles = [await self.renewer.finish(group, e.receipt_handle, topic=topic, principal=principal)
                       for e in request.entries]
            results = await self.relay.ack(group, topic, handles)
        except Exception as exc:  # noqa: BLE001 - answered in band
            self.metrics.acks.labels(Code.Name(code_for(exc))).inc(len(request.entries))
            return failure(spb.AckMessageResponse, exc, "AckMessage")
        response = spb.AckMessageResponse()
        for entry, error in zip(request.entries, results):
            response.entries.append(spb.AckMessageResultEntry(
                message_id=entry.message_id, receipt_handle=entry.receipt_handle, status=status(error)))
            self.metrics.acks.labels("ok" if error is None else Code.Name(code_for(error))).inc()
        codes = {e.status.code for e in response.entries}
        if codes <= {Code.OK}:
            response.status.CopyFrom(status())
        elif len(response.entries) == 1:
            response.status.CopyFrom(response.entries[0].status)
        else:
            response.status.CopyFrom(pb.Status(code=Code.MULTIPLE_RESULTS, message="some entries failed"))
        return response

    async def change_invisible(self, request: spb.ChangeInvisibleDurationRequest,
                               context: Any) -> spb.ChangeInvisibleDurationResponse:
        """Always answers with a receipt handle (the new one, or the one sent): the Python
        client adopts it before reading the status. Tiny durations are raised to
        ``min_invisible_duration_seconds`` (Node.js sends milliseconds as seconds). A push
        consumer's nack: the proxy stops renewing the delivery."""
        try:
            group = resource_name(request.group, "group")
            topic = resource_name(request.topic, "topic")
            current = await self.renewer.finish(group, request.receipt_handle, topic=topic,
                                                principal=client_of(context).principal)
            handle = await self.relay.change_invisible(group, topic, current,
                                                       self._invisible_seconds(seconds(request.invisible_duration)))
        except Exception as exc:  # noqa: BLE001 - answered in band
            failed = failure(spb.ChangeInvisibleDurationResponse, exc, "ChangeInvisibleDuration")
            failed.receipt_handle = request.receipt_handle
            return failed
        return spb.ChangeInvisibleDurationResponse(status=status(), receipt_handle=handle)

    async def dead_letter(self, request: spb.ForwardMessageToDeadLetterQueueRequest,
                          context: Any) -> spb.ForwardMessageToDeadLetterQueueResponse:
        """The consumer gave up on a delivery (FIFO consumers, after their local retries):
        the broker the receipt handle names moves it to ``%DLQ%<group>`` now (native
        DeadLetterMessage). A stale or mangled handle answers INVALID_RECEIPT_HANDLE.
        Non-FIFO messages need no call: the broker dead-letters them itself after
        ``max_delivery_attempts`` deliveries."""
        try:
            group = resource_name(request.group, "group")
            topic = resource_name(request.topic, "topic")
            if not request.receipt_handle:
                raise ProxyError(Code.INVALID_RECEIPT_HANDLE, "receipt_handle is required")
            handle = await self.renewer.finish(group, request.receipt_handle, topic=topic,
                                               principal=client_of(context).principal)
            await self.relay.dead_letter(group, topic, handle)
        except Exception as exc:  # noqa: BLE001 - answered in band
            self.metrics.dead_letters.labels(Code.Name(code_for(exc))).inc()
            return failure(spb.ForwardMessageToDeadLetterQueueResponse, exc, "ForwardMessageToDeadLetterQueue")
        self.metrics.dead_letters.labels("ok").inc()
        return spb.ForwardMessageToDeadLetterQueueResponse(status=status())
