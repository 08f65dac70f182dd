"""Name server configuration (``TXMQ_*`` environment variables or ``--flags``)."""

from __future__ import annotations

import dataclasses

from services.common.config import ServiceConfig

#: The most queues one CreateTopic may ask for.
MAX_QUEUE_COUNT = 1024


@dataclasses.dataclass(frozen=True)
class NameServerConfig(ServiceConfig):
    port: int = 9876
    #: A broker silent this long leaves the routes and ListBrokers.
    broker_expiry_seconds: float = 30.0
    #: A checker silent this long leaves ListCheckers.
    checker_expiry_seconds: float = 30.0
    #: Told to brokers and checkers when they register: how often to re-register.
    heartbeat_interval_seconds: float = 10.0
    #: QueryRoute of an unknown user topic creates it with ``default_queue_count`` queues.
    auto_create_topics: bool = False
    #: Queues of a topic created by auto-creation or by a CreateTopic asking for 0.
    default_queue_count: int = 4
    #: Deadline of each call the name server makes to a broker (Admin fan-out).
    broker_rpc_timeout_seconds: float = 5.0

    def validate(self) -> None:
        for name in ("broker_expiry_seconds", "checker_expiry_seconds",
                     "heartbeat_interval_seconds", "broker_rpc_timeout_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0 < self.default_queue_count <= MAX_QUEUE_COUNT:
            raise ValueError(f"default_queue_count must be 1..{MAX_QUEUE_COUNT}, "
                             f"got {self.default_queue_count}")
