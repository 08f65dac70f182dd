"""Name server configuration (``TXMQ_*`` environment variables or ``--flags``)."""

from __future__ import annotations

import dataclasses

from services.common.config import DAY, HOUR, ServiceConfig, count, seconds

#: The most queues one CreateTopic may ask for.
MAX_QUEUE_COUNT = 1024


@dataclasses.dataclass(frozen=True)
class NameServerConfig(ServiceConfig):
    port: int = 9876
    #: A broker silent this long leaves the routes and ListBrokers.
    broker_expiry_seconds: float = seconds(30.0, max=DAY)
    #: A checker silent this long leaves ListCheckers.
    checker_expiry_seconds: float = seconds(30.0, max=DAY)
    #: Told to brokers and checkers when they register: how often to re-register.
    heartbeat_interval_seconds: float = seconds(10.0, max=HOUR)
    #: QueryRoute of an unknown user topic creates it with ``default_queue_count`` queues.
    auto_create_topics: bool = False
    #: Queues of a topic created by auto-creation or by a CreateTopic asking for 0.
    default_queue_count: int = count(4, max=MAX_QUEUE_COUNT)
    #: The shards (distinct broker names) of the cluster. Until that many have registered
    #: since this name server started, and for at most ``registration_grace_seconds``, a
    #: topic no registered broker holds is not known to be missing: it may be on a shard not
    #: heard from yet (a name server remembers nothing across a restart). QueryRoute answers
    #: it NoBrokerError (retryable) instead of auto-creating it or TopicNotFound, and
    #: CreateTopic is refused the same way: creating it on the registered shards would fork
    #: it. 0: unknown, no wait (a topic nobody holds is missing as soon as a broker is live).
    expected_brokers: int = count(0, min=0, zero="unknown: no wait")
    #: The longest that wait lasts after a start: past it, the shards still silent are taken
    #: for gone. A live broker registers again within its heartbeat interval (plus a 3 s
    #: beat timeout), so at least twice ``heartbeat_interval_seconds`` + 3 s.
    registration_grace_seconds: float = seconds(30.0, max=HOUR)
    #: Deadline of each call the name server makes to a broker (Admin fan-out).
    broker_rpc_timeout_seconds: float = seconds(5.0, max=HOUR)
    #: User topics the live brokers hold whose names one principal's rights (publish or
    #: admin-write) cover: a CreateTopic or an auto-creating route lookup making one more is
    #: refused with RESOURCE_EXHAUSTED naming this (QUOTA_EXCEEDED); existing topics keep
    #: working, a deleted one frees its place. Not counted: service identities, auth off, a
    #: principal whose right covers every topic (``cluster`` or ``topic:*``).
    max_topics_per_principal: int = count(1_000, max=10_000_000)
