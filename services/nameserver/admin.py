"""The Admin API's work on the brokers: finding and resolving transactions (fan-out to
all, or routing by the broker a transaction id names), moving a shard's leadership, and
describing brokers, topics' queues, consumer groups and their dead letters. Topics
themselves are ``topics.py``; the calls to brokers ``brokercalls.py``.
"""

from __future__ import annotations

import logging
import math

import grpc

from txmq.errors import (ConsumerGroupNotFoundError, FailedPreconditionError, InvalidFieldError, TopicNotFoundError,
                          TxmqError, error_from_rpc)
from txmq.names import dlq_topic, validate_group, validate_namespace, validate_receive_topic
from txmq.v1 import broker_pb2, common_pb2, replication_pb2

from .brokercalls import BrokerCalls
from .registry import Registry

log = logging.getLogger(__name__)

_OPERATOR_RESOLUTIONS = (common_pb2.TRANSACTION_RESOLUTION_COMMIT, common_pb2.TRANSACTION_RESOLUTION_ROLLBACK)


class Admin:
    def __init__(self, registry: Registry, calls: BrokerCalls) -> None:
        self.registry = registry
        self.calls = calls

    # transactions

    async def list_transactions(self, producer_group: str, state: common_pb2.TransactionState.ValueType,
                                older_than_seconds: float, limit: int, namespace: str = "", key: str = "",
                                ) -> tuple[list[common_pb2.Transaction], list[str], list[str]]:
        """Every live broker's transactions matching the filter (``namespace`` and ``key``
        applied on each broker, before its limit), by prepared time; the brokers that did
        not answer, and those that had more than ``limit``, are returned beside them."""
        if producer_group:
            validate_group("producer_group", producer_group)
        if namespace:
            validate_namespace(namespace)
        if state not in common_pb2.TransactionState.values():
            raise InvalidFieldError("state", f"unknown transaction state {state}")
        if math.isnan(older_than_seconds) or older_than_seconds < 0:
            raise InvalidFieldError("older_than_seconds", f"must not be negative, got {older_than_seconds}")
        if limit < 0:
            raise InvalidFieldError("limit", f"must not be negative, got {limit}")
        request = broker_pb2.QueryTransactionsRequest(
            producer_group=producer_group, state=state, older_than_seconds=older_than_seconds, limit=limit,
            namespace=namespace, key=key)
        answers, unreachable = await self.calls.fan_out("QueryTransactions", request)
        rows: list[common_pb2.Transaction] = []
        truncated: list[str] = []
        for broker, result in answers:
            for row in result.transactions:
                if not row.broker_name:
                    row.broker_name = broker.name
                rows.append(row)
            if result.next_page_token:  # a full page: more may match there
                truncated.append(broker.name)
        rows.sort(key=lambda t: (t.prepared_at_ms, t.broker_name, t.transaction_id))
        return rows, unreachable, sorted(truncated)

    async def describe_transaction(self, transaction_id: str) -> broker_pb2.GetTransactionResponse:
        broker = self.calls.broker_of(transaction_id)
        return await self.calls.call(broker.address, "GetTransaction",
                                broker_pb2.GetTransactionRequest(transaction_id=transaction_id))

    async def resolve_transaction(self, transaction_id: str, resolution: common_pb2.TransactionResolution.ValueType,
                                  operator: str, reason: str) -> common_pb2.Transaction:
        if resolution not in _OPERATOR_RESOLUTIONS:
            raise InvalidFieldError("resolution", "must be TRANSACTION_RESOLUTION_COMMIT or "
                                    "TRANSACTION_RESOLUTION_ROLLBACK")
        if not operator.strip():
            raise InvalidFieldError("operator", "required: who decides")
        broker = self.calls.broker_of(transaction_id)
        await self.calls.call(broker.address, "EndTransaction", broker_pb2.EndTransactionRequest(
            transaction_id=transaction_id, resolution=resolution,
            source=common_pb2.TRANSACTION_SOURCE_OPERATOR, operator=operator.strip(), reason=reason))
        log.info("operator resolved transaction", extra={"fields": {
            "transaction_id": transaction_id, "broker": broker.name, "operator": operator.strip(),
            "resolution": common_pb2.TransactionResolution.Name(resolution)}})
        response = await self.calls.call(broker.address, "GetTransaction",
                                    broker_pb2.GetTransactionRequest(transaction_id=transaction_id))
        return response.transaction

    async def elect_leader(self, shard: str, replica_id: int) -> tuple[int, int]:
        """Asks ``shard``'s leader to hand its leadership to ``replica_id``."""
        broker = self.registry.live_broker(shard)
        replication = broker.replication
        if replication is None or replication.replication_factor <= 1:
            # Its broker serves no replication service: say so, not "not implemented" (which
            # the CLI would read as "this is not a txmq name server").
            raise FailedPreconditionError(f"shard {shard!r} has one replica (replication_factor 1): "
                                          "there is no leadership to move", shard=shard)
        try:
            response = await self.calls.clients.replication_stub(broker.address).TransferLeadership(
                replication_pb2.TransferLeadershipRequest(shard=shard, replica_id=replica_id), timeout=self.calls.timeout)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from None
        log.info("leadership moved on request", extra={"fields": {
            "shard": shard, "from": response.previous_replica_id, "to": replica_id, "log_end": response.log_end}})
        return response.previous_replica_id, response.log_end

    # brokers, topics and consumer groups

    async def describe_brokers(self) -> tuple[list[broker_pb2.GetBrokerStatsResponse], list[str]]:
        answers, unreachable = await self.calls.fan_out("GetBrokerStats", broker_pb2.GetBrokerStatsRequest())
        return sorted((r for _b, r in answers), key=lambda r: r.broker_name), unreachable

    async def describe_topic(self, topic: str) -> tuple[list[tuple[str, broker_pb2.QueueOffsets]],
                                                        list[broker_pb2.ConsumerQueueStatus], list[str]]:
        """A topic's queues (broker, offsets) and every group's position in them."""
        validate_receive_topic(topic)
        holders = {b.name for b in self.registry.live_brokers() if topic in b.topics}
        offsets, unreachable = await self.calls.fan_out("GetQueueOffsets", broker_pb2.GetQueueOffsetsRequest(topic=topic),
                                                   only=holders)
        if not offsets and not unreachable:
            raise TopicNotFoundError(topic)
        groups, more = await self.calls.fan_out("DescribeConsumerGroups",
                                           broker_pb2.DescribeConsumerGroupsRequest(topic=topic), only=holders)
        queues = [(b.name, q) for b, r in sorted(offsets, key=lambda a: a[0].name) for q in r.queues]
        consumers = [q for _b, r in groups for q in r.queues]
        return queues, consumers, sorted(set(unreachable) | set(more))

    async def consumer_groups(self, group: str, topic: str) -> tuple[list[broker_pb2.ConsumerQueueStatus],
                                                                    list[broker_pb2.GroupDeadLetters], list[str]]:
        if group:
            validate_group("consumer_group", group)
        if topic:
            validate_receive_topic(topic)
        answers, unreachable = await self.calls.fan_out(
            "DescribeConsumerGroups", broker_pb2.DescribeConsumerGroupsRequest(consumer_group=group, topic=topic))
        queues = sorted((q for _b, r in answers for q in r.queues),
                        key=lambda q: (q.consumer_group, q.topic, q.broker_name, q.queue_id))
        dead = [d for _b, r in answers for d in r.dead_letters]
        if group and not queues and not dead and not unreachable:
            raise ConsumerGroupNotFoundError(group)
        return queues, dead, unreachable

    async def list_dead_letters(self, group: str, limit: int) -> tuple[list[common_pb2.DeliveredMessage],
                                                                      list[str], bool]:
        validate_group("consumer_group", group)
        if limit < 0:
            raise InvalidFieldError("limit", f"must not be negative, got {limit}")
        limit = limit or 100
        topic = dlq_topic(group)
        await self.consumer_groups(group, "")  # NOT_FOUND for a group no broker knows
        messages: list[common_pb2.DeliveredMessage] = []
        unreachable: list[str] = []
        truncated = False
        for broker in self.registry.live_brokers():
            start = 0
            taken = 0
            try:
                while True:
                    page = await self.calls.call(broker.address, "ReadQueue", broker_pb2.ReadQueueRequest(
                        topic=topic, queue_id=0, start_offset=start, max_messages=min(limit - taken + 1, 256)))
                    for m in page.messages:
                        if taken == limit:
                            truncated = True
                            break
                        messages.append(m)
                        taken += 1
                    if truncated or page.next_offset >= page.max_offset or page.next_offset == start:
                        break
                    start = page.next_offset
            except TopicNotFoundError:
                continue  # nothing dead-lettered on that broker
            except TxmqError as exc:
                if not self.calls.is_down(exc):
                    raise
                unreachable.append(broker.name)
        messages.sort(key=lambda m: (m.visible_at_ms, m.broker_name, m.queue_offset))
        return messages, unreachable, truncated

    async def redrive_dead_letters(self, group: str, message_ids: list[str], every: bool,
                                   ) -> tuple[list[str], list[str], list[str], list[str]]:
        """(redriven, not found, expired, unreachable brokers)."""
        validate_group("consumer_group", group)
        if every == bool(message_ids):
            raise InvalidFieldError("message_ids", "name the messages to re-drive, or set all (not both)")
        await self.consumer_groups(group, "")  # NOT_FOUND for a group no broker knows
        answers, unreachable = await self.calls.fan_out(
            "ReturnDeadLetters", broker_pb2.ReturnDeadLettersRequest(consumer_group=group, message_ids=message_ids,
                                                                     all=every))
        redriven = [m for _b, r in answers for m in r.redriven]
        expired = [m for _b, r in answers for m in r.expired]
        missing = [m for m in message_ids if m not in set(redriven) | set(expired)]
        if redriven:
            log.info("dead letters re-driven", extra={"fields": {"consumer_group": group, "count": len(redriven)}})
        return redriven, missing, expired, unreachable
