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
    #: Deadline of each call the name server makes to a broker (Admin fan-out).
    broker_rpc_timeout_seconds: float = seconds(5.0, max=HOUR)
