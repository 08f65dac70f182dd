"""The Admin API's topics, and the route lookup that may create one: creating a topic's
queues across brokers (one creation at a time), expanding it onto a shard, deleting it;
never creating a topic that may be held by a shard not heard from (between leaders, or not
registered again since this name server started); never creating one beyond the caller's
``max_topics_per_principal`` (``services.common.auth.quota``: the user topics the live
brokers hold whose names its publish or admin-write rights cover — what the brokers
register, so every name server counts the same and a restart forgets nothing once they
registered again).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from txmq.errors import (AlreadyExistsError, BrokerNotFoundError, FailedPreconditionError, InvalidFieldError,
                         NoBrokerError, NoLeaderError, QuotaExceededError, TopicNotFoundError, TxmqError,
                         UnavailableError)
from txmq.names import is_system_topic, validate_receive_topic, validate_send_topic
from txmq.v1 import broker_pb2, common_pb2

from services.common.auth.acl import ADMIN_WRITE, PUBLISH, TOPIC
from services.common.auth.quota import Subject, refuse_beyond

from .brokercalls import BrokerCalls
from .registry import QueueRoute, Registry, registering, resolve_queue_count, should_auto_create

log = logging.getLogger(__name__)

#: The actions that create a topic (an auto-creating route lookup; CreateTopic).
TOPIC_ACTIONS = (PUBLISH, ADMIN_WRITE)


def _topic_type(fifo: bool) -> common_pb2.TopicType.ValueType:
    return common_pb2.TOPIC_TYPE_FIFO if fifo else common_pb2.TOPIC_TYPE_NORMAL


@dataclass(frozen=True, slots=True)
class TopicCreation:
    topic: str
    #: (broker name, its queue count of the topic), by broker name.
    brokers: list[tuple[str, int]]


class Topics:
    def __init__(self, registry: Registry, calls: BrokerCalls, *, default_queue_count: int,
                 auto_create_topics: bool, expected_brokers: int = 0, registration_grace_seconds: float = 0.0,
                 max_topics_per_principal: int = 1_000, quota_refusals: Any = None) -> None:
        self.registry = registry
        self.calls = calls
        self.default_queue_count = default_queue_count
        self.auto_create_topics = auto_create_topics
        self.expected_brokers = expected_brokers
        self.registration_grace_seconds = registration_grace_seconds
        self._started = time.monotonic()
        #: Until every expected shard has registered once, or the grace is over (then never again).
        self._waiting = expected_brokers > 0
        # One creation at a time: a second CreateTopic of the same topic sees the first's
        # queues and an auto-creating QueryRoute the route the first made.
        self._creating = asyncio.Lock()
        self.max_topics_per_principal = max_topics_per_principal
        #: Counts the refusals at max_topics_per_principal, if metered.
        self.quota_refusals = quota_refusals
        #: The live brokers' topic tables and the sorted user topics they hold (rebuilt when one changes).
        self._names: tuple[tuple[object, ...], list[tuple[str]]] = ((), [])

    async def route(self, topic: str, *, for_send: bool = False, subject: Subject | None = None) -> list[QueueRoute]:
        """QueryRoute: the topic's queues, auto-creating a user topic when configured and
        the caller is about to send (never for a subscription), within ``subject``'s quota. A
        topic only shards between leaders hold is NoLeaderError (retryable), never created elsewhere."""
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
                creation = await self._create(topic, self.default_queue_count, subject=subject)
                log.info("auto-created topic", extra={"fields": {"topic": topic, "brokers": dict(creation.brokers)}})
                queues = self.registry.route(topic)
        return queues

    async def create_topic(self, topic: str, queue_count: int, *, fifo: bool = False,
                           subject: Subject | None = None) -> TopicCreation:
        validate_send_topic(topic)
        total = resolve_queue_count(queue_count, self.default_queue_count)
        self._refuse_unheard(topic, "create")
        async with self._creating:
            creation = await self._create(topic, total, fifo=fifo, subject=subject)
        log.info("created topic", extra={"fields": {"topic": topic, "brokers": dict(creation.brokers),
                                                    "fifo": fifo}})
        return creation

    def _refuse_unheard(self, topic: str, what: str) -> None:
        """NoBrokerError (retryable) while shards of the cluster may not have registered
        since this name server started (``expected_brokers``): the topic may be on one of
        them, and creating it on the others would fork it."""
        if not self._waiting:
            return
        uptime = time.monotonic() - self._started
        heard = self.registry.shards_heard()
        if registering(uptime, self.registration_grace_seconds, heard, self.expected_brokers):
            raise NoBrokerError(
                f"cannot {what} topic {topic!r}",
                waiting=f"this name server started {uptime:.1f} s ago and has heard from {heard} of the "
                        f"{self.expected_brokers} expected shards (expected_brokers); the others register "
                        f"within a heartbeat, or are taken for gone {self.registration_grace_seconds:g} s "
                        f"after the start (registration_grace_seconds)")
        self._waiting = False
        fields = {"shards_heard": heard, "expected_brokers": self.expected_brokers, "after_seconds": round(uptime, 1)}
        if heard >= self.expected_brokers:
            log.info("every expected shard has registered: topics nobody holds are missing now", extra={"fields": fields})
        else:
            log.warning("registration grace over with expected shards silent: they are taken for gone",
                        extra={"fields": fields})

    def _refuse_leaderless(self, topic: str) -> None:
        """NoLeaderError when shards between leaders hold ``topic``: it exists, and its queues
        come back with their shard's next leader (creating them elsewhere would fork it)."""
        leaderless = self.registry.leaderless_shards(topic)
        if leaderless:
            raise NoLeaderError(topic, leaderless)

    def _topic_names(self) -> list[tuple[str]]:
        """The user topics the live brokers hold, sorted (what the topic quota counts)."""
        tables = tuple(b.topics for b in self.registry.live_brokers())
        held, names = self._names
        if len(held) != len(tables) or any(a is not b for a, b in zip(held, tables)):
            names = sorted((t,) for t in {t for table in tables for t in table} if not is_system_topic(t))
            self._names = (tables, names)
        return names

    async def _create(self, topic: str, total: int, *, fifo: bool = False,
                      subject: Subject | None = None) -> TopicCreation:
        plan = self.registry.plan_topic(topic, total)
        self._refuse_leaderless(topic)
        if subject is not None and not self.registry.route(topic):  # a new topic: within the quota
            try:
                refuse_beyond(subject, TOPIC_ACTIONS, TOPIC, self._topic_names(), self.max_topics_per_principal,
                              "max_topics_per_principal", "topics", f"topic {topic!r}")
            except QuotaExceededError:
                if self.quota_refusals is not None:
                    self.quota_refusals.inc()
                raise
        await self.calls.retain_live()
        todo = [share for share in plan if share.missing]
        results = await asyncio.gather(
            *(self.calls.call(share.broker_address, "CreateTopicQueues",
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
            if not self.calls.is_down(exc):
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
            answers, unreachable = await self.calls.fan_out(
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
            await self.calls.retain_live()
            fifo = self.registry.is_fifo(topic)
            result = await self.calls.call(broker.address, "CreateTopicQueues",
                                      broker_pb2.CreateTopicQueuesRequest(topic=topic, queue_count=count,
                                                                          topic_type=_topic_type(fifo)))
            self.registry.record_topic_queues(broker_name, topic, result.topic.queue_count or count, fifo=fifo)
            counts = {name: n for name, n in holding.items()}
            counts[broker_name] = result.topic.queue_count or count
        log.info("expanded topic", extra={"fields": {"topic": topic, "broker": broker_name, "brokers": counts}})
        return TopicCreation(topic, sorted(counts.items()))

    def list_topics(self) -> list[tuple[str, list[tuple[str, int]]]]:
        return self.registry.topics()
