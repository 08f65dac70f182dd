"""The Admin API's work: creating topics across brokers, and finding transactions on the
brokers (fan-out to all, or routing by the broker a transaction id names).

Calls to brokers fail with the txmq error the broker raised (``error_from_rpc``), so an
operator gets the same status through the name server as from the broker itself.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import grpc

from services.common.channels import ChannelPool
from txmq.errors import (AlreadyExistsError, BrokerNotFoundError, ConsumerGroupNotFoundError, NoBrokerError,
                          FailedPreconditionError, InvalidFieldError, NoLeaderError, TopicNotFoundError, TxmqError,
                          UnavailableError, error_from_rpc)
from txmq.ids import TransactionId
from txmq.names import dlq_topic, validate_group, validate_namespace, validate_receive_topic, validate_send_topic
from txmq.v1 import broker_pb2, broker_pb2_grpc, common_pb2, replication_pb2, replication_pb2_grpc

from .registry import (BrokerRecord, QueueRoute, Registry, registering, resolve_queue_count,
                       should_auto_create)

log = logging.getLogger(__name__)

_OPERATOR_RESOLUTIONS = (common_pb2.TRANSACTION_RESOLUTION_COMMIT, common_pb2.TRANSACTION_RESOLUTION_ROLLBACK)
# A broker failing with one of these is down or broken, not refusing the request.
def _topic_type(fifo: bool) -> common_pb2.TopicType.ValueType:
    return common_pb2.TOPIC_TYPE_FIFO if fifo else common_pb2.TOPIC_TYPE_NORMAL


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


@dataclass(frozen=True, slots=True)
class TopicCreation:
    topic: str
    #: (broker name, its queue count of the topic), by broker name.
    brokers: list[tuple[str, int]]


class Admin:
    def __init__(self, registry: Registry, clients: BrokerClients, *, default_queue_count: int,
                 auto_create_topics: bool, broker_rpc_timeout_seconds: float, expected_brokers: int = 0,
                 registration_grace_seconds: float = 0.0) -> None:
        self.registry = registry
        self.expected_brokers = expected_brokers
        self.registration_grace_seconds = registration_grace_seconds
        self._started = time.monotonic()
        self.clients = clients
        self.default_queue_count = default_queue_count
        self.auto_create_topics = auto_create_topics
        self.timeout = broker_rpc_timeout_seconds
        # One creation at a time: a second CreateTopic of the same topic sees the first's
        # queues and an auto-creating QueryRoute the route the first made.
        self._creating = asyncio.Lock()

    # topics

    async def route(self, topic: str, *, for_send: bool = False) -> list[QueueRoute]:
        """QueryRoute: the topic's queues, auto-creating a user topic when configured and
        the caller is about to send (never for a subscription). A topic only shards between
        leaders hold is NoLeaderError (retryable), never created elsewhere."""
        validate_receive_topic(topic)
        queues = self.registry.route(topic)
        if queues:
            return queues
        self._refuse_leaderless(topic)
        if not self.registry.live_brokers():
            # With no broker registered nobody can say the topic does not exist (a name
            # server just restarted hears from its brokers within a heartbeat): retryable.
            raise NoBrokerError(f"cannot route topic {topic!r}")
        self._refuse_unheard(topic, "route")
        if not for_send or not should_auto_create(topic, enabled=self.auto_create_topics):
            raise TopicNotFoundError(topic)
        async with self._creating:
            queues = self.registry.route(topic)
            if not queues:
                creation = await self._create(topic, self.default_queue_count)
                log.info("auto-created topic", extra={"fields": {"topic": topic, "brokers": dict(creation.brokers)}})
                queues = self.registry.route(topic)
        return queues

    async def create_topic(self, topic: str, queue_count: int, *, fifo: bool = False) -> TopicCreation:
        validate_send_topic(topic)
        total = resolve_queue_count(queue_count, self.default_queue_count)
        self._refuse_unheard(topic, "create")
        async with self._creating:
            creation = await self._create(topic, total, fifo=fifo)
        log.info("created topic", extra={"fields": {"topic": topic, "brokers": dict(creation.brokers),
                                                    "fifo": fifo}})
        return creation

    def _refuse_unheard(self, topic: str, what: str) -> None:
        """NoBrokerError (retryable) while shards of the cluster may not have registered
        since this name server started (``expected_brokers``): the topic may be on one of
        them, and creating it on the others would fork it."""
        uptime = time.monotonic() - self._started
        heard = self.registry.shards_heard()
        if registering(uptime, self.registration_grace_seconds, heard, self.expected_brokers):
            raise NoBrokerError(
                f"cannot {what} topic {topic!r}",
                waiting=f"this name server started {uptime:.1f} s ago and has heard from {heard} of the "
                        f"{self.expected_brokers} expected shards (expected_brokers); the others register "
                        f"within a heartbeat, or are taken for gone {self.registration_grace_seconds:g} s "
                        f"after the start (registration_grace_seconds)")

    def _refuse_leaderless(self, topic: str) -> None:
        """NoLeaderError when shards between leaders hold ``topic``: it exists, and its queues
        come back with their shard's next leader (creating them elsewhere would fork it)."""
        leaderless = self.registry.leaderless_shards(topic)
        if leaderless:
            raise NoLeaderError(topic, leaderless)

    async def _create(self, topic: str, total: int, *, fifo: bool = False) -> TopicCreation:
        plan = self.registry.plan_topic(topic, total)
        self._refuse_leaderless(topic)
        await self.clients.retain({b.address for b in self.registry.live_brokers()})
        todo = [share for share in plan if share.missing]
        results = await asyncio.gather(
            *(self._call(share.broker_address, "CreateTopicQueues",
                         broker_pb2.CreateTopicQueuesRequest(topic=topic, queue_count=share.queue_count,
                                                             topic_type=_topic_type(fifo)))
              for share in todo),
            return_exceptions=True)
        counts = {share.broker_name: share.present for share in plan}
        failures: list[tuple[str, str, TxmqError]] = []
        for share, result in zip(todo, results):
            if isinstance(result, TxmqError):
                failures.append((share.broker_name, share.broker_address, result))
                continue
            if isinstance(result, BaseException):
                raise result
            created = result.topic.queue_count or share.queue_count
            self.registry.record_topic_queues(share.broker_name, topic, created, fifo=fifo)
            counts[share.broker_name] = created
        if failures:
            name, address, exc = failures[0]
            if exc.code not in _BROKER_DOWN:
                raise exc  # the broker refused the request itself: the same error to the caller
            raise UnavailableError(
                f"broker {name!r} at {address} did not create its queues of topic {topic!r}: {exc.message}; "
                "retry CreateTopic to complete it",
                broker=name, address=address, topic=topic,
                failed_brokers=[n for n, _a, _e in failures])
        return TopicCreation(topic, sorted(counts.items()))

    async def delete_topic(self, topic: str, force: bool) -> tuple[list[str], int, list[str]]:
        """Every live broker holding ``topic`` deletes its queues; (brokers, entries deleted,
        consumer groups whose positions went). A broker refusing (TOPIC_IN_USE) refuses it all
        only when it refuses first: the check runs on each before any deletes."""
        validate_send_topic(topic)
        holders = {b.name for b in self.registry.live_brokers() if topic in b.topics}
        if not holders:
            self._refuse_leaderless(topic)
            raise TopicNotFoundError(topic)
        async with self._creating:
            answers, unreachable = await self._fan_out(
                "DeleteTopicQueues", broker_pb2.DeleteTopicQueuesRequest(topic=topic, force=force), only=holders)
        for broker, _r in answers:
            self.registry.forget_topic_queues(broker.name, topic)
        if unreachable:
            raise UnavailableError(f"brokers {', '.join(unreachable)} did not delete their queues of topic "
                                   f"{topic!r}; retry DeleteTopic to complete it", topic=topic,
                                   failed_brokers=unreachable)
        groups = sorted({g for _b, r in answers for g in r.consumer_groups})
        log.info("deleted topic", extra={"fields": {"topic": topic, "brokers": [b.name for b, _r in answers],
                                                    "force": force, "consumer_groups": groups}})
        return sorted(b.name for b, _r in answers), sum(r.entries_deleted for _b, r in answers), groups

    async def expand_topic(self, topic: str, broker_name: str, queue_count: int) -> TopicCreation:
        """Creates ``queue_count`` queues of the existing ``topic`` on ``broker_name``."""
        validate_send_topic(topic)
        if queue_count < 0:
            raise InvalidFieldError("queue_count", f"{queue_count} is negative")
        async with self._creating:
            live = {b.name: b for b in self.registry.live_brokers()}
            holding = {name: b.topics[topic] for name, b in live.items() if b.topics.get(topic, 0) > 0}
            if not holding:
                self._refuse_leaderless(topic)
                raise TopicNotFoundError(topic)
            broker = live.get(broker_name)
            if broker is None:
                raise BrokerNotFoundError(broker_name)
            if broker.draining:
                raise FailedPreconditionError(f"shard {broker_name!r} is draining: it takes no new queues",
                                              broker=broker_name)
            count = queue_count or max(holding.values())
            if holding.get(broker_name, 0) >= count:
                raise AlreadyExistsError(f"shard {broker_name!r} already holds {holding[broker_name]} queue(s) of "
                                         f"topic {topic!r}", topic=topic, broker=broker_name)
            await self.clients.retain({b.address for b in live.values()})
            fifo = self.registry.is_fifo(topic)
            result = await self._call(broker.address, "CreateTopicQueues",
                                      broker_pb2.CreateTopicQueuesRequest(topic=topic, queue_count=count,
                                                                          topic_type=_topic_type(fifo)))
            self.registry.record_topic_queues(broker_name, topic, result.topic.queue_count or count, fifo=fifo)
            counts = {name: n for name, n in holding.items()}
            counts[broker_name] = result.topic.queue_count or count
        log.info("expanded topic", extra={"fields": {"topic": topic, "broker": broker_name, "brokers": counts}})
        return TopicCreation(topic, sorted(counts.items()))

    def list_topics(self) -> list[tuple[str, list[tuple[str, int]]]]:
        return self.registry.topics()

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
        answers, unreachable = await self._fan_out("QueryTransactions", request)
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
        broker = self._broker_of(transaction_id)
        return await self._call(broker.address, "GetTransaction",
                                broker_pb2.GetTransactionRequest(transaction_id=transaction_id))

    async def resolve_transaction(self, transaction_id: str, resolution: common_pb2.TransactionResolution.ValueType,
                                  operator: str, reason: str) -> common_pb2.Transaction:
        if resolution not in _OPERATOR_RESOLUTIONS:
            raise InvalidFieldError("resolution", "must be TRANSACTION_RESOLUTION_COMMIT or "
                                    "TRANSACTION_RESOLUTION_ROLLBACK")
        if not operator.strip():
            raise InvalidFieldError("operator", "required: who decides")
        broker = self._broker_of(transaction_id)
        await self._call(broker.address, "EndTransaction", broker_pb2.EndTransactionRequest(
            transaction_id=transaction_id, resolution=resolution,
            source=common_pb2.TRANSACTION_SOURCE_OPERATOR, operator=operator.strip(), reason=reason))
        log.info("operator resolved transaction", extra={"fields": {
            "transaction_id": transaction_id, "broker": broker.name, "operator": operator.strip(),
            "resolution": common_pb2.TransactionResolution.Name(resolution)}})
        response = await self._call(broker.address, "GetTransaction",
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
            response = await self.clients.replication_stub(broker.address).TransferLeadership(
                replication_pb2.TransferLeadershipRequest(shard=shard, replica_id=replica_id), timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from None
        log.info("leadership moved on request", extra={"fields": {
            "shard": shard, "from": response.previous_replica_id, "to": replica_id, "log_end": response.log_end}})
        return response.previous_replica_id, response.log_end

    # brokers, topics and consumer groups

    async def describe_brokers(self) -> tuple[list[broker_pb2.GetBrokerStatsResponse], list[str]]:
        answers, unreachable = await self._fan_out("GetBrokerStats", broker_pb2.GetBrokerStatsRequest())
        return sorted((r for _b, r in answers), key=lambda r: r.broker_name), unreachable

    async def describe_topic(self, topic: str) -> tuple[list[tuple[str, broker_pb2.QueueOffsets]],
                                                        list[broker_pb2.ConsumerQueueStatus], list[str]]:
        """A topic's queues (broker, offsets) and every group's position in them."""
        validate_receive_topic(topic)
        holders = {b.name for b in self.registry.live_brokers() if topic in b.topics}
        offsets, unreachable = await self._fan_out("GetQueueOffsets", broker_pb2.GetQueueOffsetsRequest(topic=topic),
                                                   only=holders)
        if not offsets and not unreachable:
            raise TopicNotFoundError(topic)
        groups, more = await self._fan_out("DescribeConsumerGroups",
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
        answers, unreachable = await self._fan_out(
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
                    page = await self._call(broker.address, "ReadQueue", broker_pb2.ReadQueueRequest(
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
                if exc.code not in _BROKER_DOWN:
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
        answers, unreachable = await self._fan_out(
            "ReturnDeadLetters", broker_pb2.ReturnDeadLettersRequest(consumer_group=group, message_ids=message_ids,
                                                                     all=every))
        redriven = [m for _b, r in answers for m in r.redriven]
        expired = [m for _b, r in answers for m in r.expired]
        missing = [m for m in message_ids if m not in set(redriven) | set(expired)]
        if redriven:
            log.info("dead letters re-driven", extra={"fields": {"consumer_group": group, "count": len(redriven)}})
        return redriven, missing, expired, unreachable

    # plumbing

    async def fan_out(self, method: str, request: Any, only: set[str] | None = None,
                      tolerate: tuple[type[TxmqError], ...] = ()) -> tuple[list[tuple[BrokerRecord, Any]], list[str]]:
        """:meth:`_fan_out` for the other Admin parts (``groupops.py``)."""
        return await self._fan_out(method, request, only, tolerate)

    async def call_broker(self, address: str, method: str, request: Any) -> Any:
        """One BrokerService call (its refusal raised as the txmq error it stands for)."""
        return await self._call(address, method, request)

    @staticmethod
    def is_down(error: TxmqError) -> bool:
        """Whether a broker failing with ``error`` is down or broken (not refusing)."""
        return error.code in _BROKER_DOWN

    async def _fan_out(self, method: str, request: Any, only: set[str] | None = None,
                       tolerate: tuple[type[TxmqError], ...] = (),
                       ) -> tuple[list[tuple[BrokerRecord, Any]], list[str]]:
        """``method`` on every live broker (named in ``only`` when given): the answers and
        the names of the brokers that did not answer (refusals are raised, but those of the
        ``tolerate`` types, which count as no answer)."""
        brokers = [b for b in self.registry.live_brokers() if only is None or b.name in only]
        await self.clients.retain({b.address for b in self.registry.live_brokers()})
        results = await asyncio.gather(*(self._call(b.address, method, request) for b in brokers),
                                       return_exceptions=True)
        answers: list[tuple[BrokerRecord, Any]] = []
        unreachable: list[str] = []
        for broker, result in zip(brokers, results):
            if tolerate and isinstance(result, tolerate):
                continue
            if isinstance(result, TxmqError) and result.code in _BROKER_DOWN:
                log.warning("broker did not answer %s", method, extra={"fields": {
                    "broker": broker.name, "address": broker.address, "error": result.message}})
                unreachable.append(broker.name)
                continue
            if isinstance(result, BaseException):
                raise result
            answers.append((broker, result))
        return answers, unreachable


    def _broker_of(self, transaction_id: str) -> BrokerRecord:
        return self.registry.live_broker(TransactionId.decode(transaction_id).broker)

    async def _call(self, address: str, method: str, request: Any) -> Any:
        try:
            return await getattr(self.clients.stub(address), method)(request, timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from None
