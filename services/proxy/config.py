"""Proxy configuration (``TXMQ_*`` environment variables or ``--flags``)."""

from __future__ import annotations

import dataclasses
import socket

from services.common.config import ServiceConfig


def default_proxy_name() -> str:
    """``proxy-<hostname>``: names this replica in logs and metrics."""
    return "proxy-" + socket.gethostname()


@dataclasses.dataclass(frozen=True)
class ProxyConfig(ServiceConfig):
    #: RocketMQ's own proxy port, so a client's default access point works unchanged.
    port: int = 8081
    proxy_name: str = dataclasses.field(default_factory=default_proxy_name)
    #: Every name server (comma-separated host:port).
    nameserver_addresses: tuple[str, ...] = ()
    #: host:port the clients are told to dial for data and Telemetry (a route's broker
    #: endpoints). Empty: echo the access point the client used (right behind a Kubernetes
    #: Service or a load balancer: every replica serves every request).
    advertise_address: str = ""
    #: The brokers' limits, advertised to clients in Telemetry Settings and enforced on
    #: sends. The proxy reads the live brokers' own values (GetBrokerStats, the smallest of
    #: them, every ``broker_limits_refresh_seconds``); these are the fallback while no
    #: broker answers.
    max_body_bytes: int = 4 * 1024 * 1024
    max_delivery_attempts: int = 16
    broker_limits_refresh_seconds: float = 30.0
    #: How long a topic route from the name servers is reused.
    route_ttl_seconds: float = 5.0
    #: How often the live brokers and checkers are listed again.
    directory_refresh_seconds: float = 5.0
    #: Deadline of each call to a name server, broker or checker.
    rpc_timeout_seconds: float = 5.0
    #: Producers: send attempts and the exponential backoff between them (advertised).
    producer_max_attempts: int = 3
    producer_backoff_initial_seconds: float = 0.01
    producer_backoff_max_seconds: float = 1.0
    #: Push consumers: redelivery backoff after a failed consumption, advertised as the
    #: policy the client language honours (customized list for Python, exponential otherwise).
    consumer_backoff_initial_seconds: float = 1.0
    consumer_backoff_max_seconds: float = 600.0
    consumer_backoff_multiplier: float = 2.0
    #: Push consumers: long polling and batch size advertised in Settings.
    push_long_polling_seconds: float = 20.0
    receive_batch_size: int = 32
    #: Invisibility of a delivery when the client sets none (push consumers).
    default_invisible_duration_seconds: float = 30.0
    #: Push consumers (ReceiveMessage with auto_renew): the proxy renews a delivery's
    #: invisibility every half invisible duration until the client acks or nacks it or goes
    #: away, for at most this long after the delivery (0: never renew).
    auto_renew_max_seconds: float = 1800.0
    #: Durations below this (Node.js push nacks send milliseconds) are raised to it.
    min_invisible_duration_seconds: float = 1.0
    max_invisible_duration_seconds: float = 12 * 3600.0
    #: Longest long poll the proxy holds; it also ends a poll before the client's deadline.
    max_long_polling_seconds: float = 30.0
    #: Most messages one ReceiveMessage returns.
    max_receive_batch: int = 32
    #: Settings of a client whose Telemetry streams all ended are forgotten after this long
    #: (a client reconnecting to this replica within it is checked at once).
    client_idle_expiry_seconds: float = 600.0
    #: Most producer groups (= topics) one client's check subscription names.
    max_groups_per_client: int = 64

    def validate(self) -> None:
        if not self.nameserver_addresses:
            raise ValueError("nameserver_addresses must name at least one name server")
        if not self.proxy_name or any(ch.isspace() for ch in self.proxy_name):
            raise ValueError(f"proxy_name must be set, without spaces, got {self.proxy_name!r}")
        if self.advertise_address and ":" not in self.advertise_address:
            raise ValueError(f"advertise_address must be host:port, got {self.advertise_address!r}")
        for name in ("max_body_bytes", "max_delivery_attempts", "producer_max_attempts", "receive_batch_size",
                     "max_receive_batch", "max_groups_per_client"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("route_ttl_seconds", "directory_refresh_seconds", "rpc_timeout_seconds",
                     "producer_backoff_initial_seconds", "producer_backoff_max_seconds",
                     "consumer_backoff_initial_seconds", "consumer_backoff_max_seconds",
                     "default_invisible_duration_seconds", "min_invisible_duration_seconds",
                     "max_invisible_duration_seconds", "client_idle_expiry_seconds",
                     "broker_limits_refresh_seconds"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.consumer_backoff_multiplier < 1:
            raise ValueError(f"consumer_backoff_multiplier must be at least 1, got {self.consumer_backoff_multiplier}")
        if self.auto_renew_max_seconds < 0:
            raise ValueError(f"auto_renew_max_seconds must not be negative, got {self.auto_renew_max_seconds}")
        if self.push_long_polling_seconds < 0 or self.max_long_polling_seconds < 0:
            raise ValueError("long polling durations must not be negative")
        if self.min_invisible_duration_seconds > self.max_invisible_duration_seconds:
            raise ValueError("min_invisible_duration_seconds must not exceed max_invisible_duration_seconds")
