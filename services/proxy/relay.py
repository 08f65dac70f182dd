"""The proxy's domain: what each RocketMQ operation does on the native services.

- A send goes to the queue chosen from a hash of the client's message id, so a retried
  send (same id, any replica) reaches the same broker, which deduplicates it.
- EndTransaction goes to the broker the transaction id names; Ack, ChangeInvisibleDuration
  and dead-lettering to the broker the receipt handle names. No state is kept here: any
  replica serves any of them.
- A receive long-polls the broker the client's queue names (any queue of it: RocketMQ
  consumers pop from a broker, not from one queue), or, for a queue not in the route, a
  broker holding the topic.
"""

from __future__ import annotations

import hashlib
import random
from typing import Sequence

from txmq._errors import InvalidIdError, TopicNotFoundError, TxmqError, error_from_entry
from txmq._ids import ReceiptHandle, TransactionId
from txmq.v1 import broker_pb2, broker_pb2_grpc, common_pb2, nameserver_pb2

from .config import ProxyConfig
from .upstream import Upstream, call

#: Errors after which a send is retried once with a fresh route (the route was stale).
_STALE_ROUTE = {"TOPIC_NOT_FOUND", "QUEUE_NOT_FOUND", "BROKER_NOT_FOUND", "UNAVAILABLE"}


def pick_queue(queues: Sequence[nameserver_pb2.QueueRoute], message_id: str) -> nameserver_pb2.QueueRoute:
    """The queue of a send: stable for a message id (retries meet their first attempt)."""
    if not message_id:
        return random.choice(list(queues))
    digest = hashlib.sha256(message_id.encode()).digest()
    return queues[int.from_bytes(digest[:8], "big") % len(queues)]


class Relay:
    def __init__(self, config: ProxyConfig, upstream: Upstream) -> None:
        self.config = config
        self.upstream = upstream

    def _stub(self, address: str) -> broker_pb2_grpc.BrokerServiceStub:
        return broker_pb2_grpc.BrokerServiceStub(self.upstream.channel(address))

    async def send(self, message: common_pb2.Message) -> broker_pb2.SendMessageResponse:
        for attempt in (1, 2):
            queues = await self.upstream.route(message.topic)
            if not queues:
                raise TopicNotFoundError(message.topic)
            queue = pick_queue(queues, message.message_id)
            message.queue_id = queue.queue_id
            try:
                return await call(self._stub(queue.broker_address).SendMessage(
                    broker_pb2.SendMessageRequest(message=message), timeout=self.config.rpc_timeout_seconds))
            except TxmqError as exc:
                if attempt == 2 or exc.reason not in _STALE_ROUTE:
                    raise
                self.upstream.forget_route(message.topic)
        raise AssertionError("unreachable")

    async def end(self, transaction_id: str, message_id: str, resolution: int,
                  source: int) -> broker_pb2.EndTransactionResponse:
        broker = TransactionId.decode(transaction_id).broker
        stub = await self.upstream.broker(broker)
        return await call(stub.EndTransaction(broker_pb2.EndTransactionRequest(
            transaction_id=transaction_id, message_id=message_id, resolution=resolution, source=source),
            timeout=self.config.rpc_timeout_seconds))

    async def brokers_of(self, topic: str) -> dict[str, str]:
        """Broker name → address of the brokers holding ``topic``, in name order."""
        queues = await self.upstream.route(topic)
        if not queues:
            raise TopicNotFoundError(topic)
        return dict(sorted({q.broker_name: q.broker_address for q in queues}.items()))

    async def receive(self, *, group: str, topic: str, broker: str, filter_expression: str, max_messages: int,
                      invisible_seconds: float, wait_seconds: float) -> list[common_pb2.DeliveredMessage]:
        brokers = await self.brokers_of(topic)
        address = brokers.get(broker) or random.choice(list(brokers.values()))
        response = await call(self._stub(address).ReceiveMessages(broker_pb2.ReceiveMessagesRequest(
            consumer_group=group, topic=topic, queue_id=-1, filter_expression=filter_expression,
            max_messages=max_messages, invisible_duration_seconds=invisible_seconds,
            long_polling_timeout_seconds=wait_seconds), timeout=wait_seconds + self.config.rpc_timeout_seconds))
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
            try:
                stub = await self.upstream.broker(broker)
                response = await call(stub.AckMessages(broker_pb2.AckMessagesRequest(
                    consumer_group=group, topic=topic, receipt_handles=[handles[i] for i in indexes]),
                    timeout=self.config.rpc_timeout_seconds))
            except TxmqError as exc:
                for i in indexes:
                    results[i] = exc
                continue
            for i, status in zip(indexes, response.entries):
                results[i] = None if status.code == 0 else error_from_entry(status)
        return results

    async def change_invisible(self, group: str, topic: str, handle: str, seconds: float) -> str:
        broker = ReceiptHandle.decode(handle).broker
        stub = await self.upstream.broker(broker)
        response = await call(stub.ChangeInvisibleDuration(broker_pb2.ChangeInvisibleDurationRequest(
            consumer_group=group, topic=topic, receipt_handle=handle, invisible_duration_seconds=seconds),
            timeout=self.config.rpc_timeout_seconds))
        return response.receipt_handle

    async def dead_letter(self, group: str, topic: str, handle: str) -> broker_pb2.DeadLetterMessageResponse:
        """Moves one in-flight delivery to ``%DLQ%<group>`` now, on the broker the handle names."""
        broker = ReceiptHandle.decode(handle).broker
        stub = await self.upstream.broker(broker)
        return await call(stub.DeadLetterMessage(broker_pb2.DeadLetterMessageRequest(
            consumer_group=group, topic=topic, receipt_handle=handle), timeout=self.config.rpc_timeout_seconds))
