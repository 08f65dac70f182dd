"""Proxy configuration (``TXMQ_*`` environment variables or ``--flags``)."""

from __future__ import annotations

import dataclasses
import socket

from services.common.config import DAY, GiB, HOUR, MiB, ServiceConfig, bounded, count, nbytes, seconds


def default_proxy_name() -> str:
    """``proxy-<hostname>``: names this replica in logs and metrics."""
    return "proxy-" + socket.gethostname()


@dataclasses.dataclass(frozen=True)
class ProxyConfig(ServiceConfig):
    #: RocketMQ's own proxy port, so a client's default access point works unchanged.
    port: int = 8081
    #: This proxy's name in logs and in the client ids it reports (default: the host name).
    proxy_name: str = dataclasses.field(default_factory=default_proxy_name)
    #: A proxy call mostly waits on a broker, and the official Python client gives a send
    #: up at once on 42900 TOO_MANY_REQUESTS: the proxy takes a burst of this many calls
    #: and backs off on the brokers' own OVERLOADED refusals itself.
    max_concurrent_rpcs: int = count(20_000, max=1_000_000)
    max_pending_rpcs: int = count(40_000, min=100, max=1_000_000)
    #: One principal's share of max_concurrent_rpcs (half of it, as everywhere).
    max_concurrent_rpcs_per_principal: int = count(10_000, max=1_000_000)
    #: ReceiveMessage long polls waiting at once on one client connection; one more is
    #: answered 42900 TOO_MANY_REQUESTS naming this.
    max_long_polls_per_connection: int = count(1000, max=1_000_000)
    #: ReceiveMessage long polls of one principal waiting at once, all its connections
    #: together (auth on); one more is answered 42900 TOO_MANY_REQUESTS naming this.
    max_long_polls_per_principal: int = count(5000, max=1_000_000)
    #: Orphan checks (each with its half message) written to one client connection and not
    #: yet answered, all its clients and checkers together; more are held back (they stay
    #: due on the broker, nothing spent) until one is answered or forgotten.
    max_pending_checks_per_connection: int = count(128, max=1_000_000)
    #: The same for one principal, all its connections together (auth on): 32 connections
    #: at max_pending_checks_per_connection.
    max_pending_checks_per_principal: int = count(4096, max=1_000_000)
    #: Replay protection of signed requests (auth on): a signature whose x-mq-date-time
    #: stamp is further than this from the proxy's clock is refused UNAUTHORIZED (40100). The
    #: stamp is read in the access key's ``time_zone`` (the official Python and Java clients stamp
    #: local time). RocketMQ's own proxy checks no freshness; 900 s is SigV4's window.
    signature_max_skew_seconds: float = seconds(900.0, min=0, max=DAY, zero="no freshness check (RocketMQ's)")
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
    max_body_bytes: int = nbytes(4 * MiB, max=GiB)
    #: Fallback of the brokers' max_delivery_attempts (see above).
    max_delivery_attempts: int = count(16)
    #: How often the brokers' limits are read again.
    broker_limits_refresh_seconds: float = seconds(30.0, max=DAY)
    #: How long a topic route from the name servers is reused.
    route_ttl_seconds: float = seconds(5.0, max=DAY)
    #: How often the live brokers and checkers are listed again.
    directory_refresh_seconds: float = seconds(5.0, max=HOUR)
    #: Deadline of each call to a name server, broker or checker.
    rpc_timeout_seconds: float = seconds(5.0, max=HOUR)
    #: Producers: send attempts and the exponential backoff between them (advertised).
    producer_max_attempts: int = count(3, max=100)
    #: Producers: the first backoff between send attempts.
    producer_backoff_initial_seconds: float = seconds(0.01, max=HOUR)
    #: Producers: the longest backoff between send attempts.
    producer_backoff_max_seconds: float = seconds(1.0, max=HOUR)
    #: Push consumers: redelivery backoff after a failed consumption, advertised as the
    #: policy the client language honours (customized list for Python, exponential otherwise).
    consumer_backoff_initial_seconds: float = seconds(1.0, max=DAY)
    #: Push consumers: the longest redelivery backoff.
    consumer_backoff_max_seconds: float = seconds(600.0, max=DAY)
    #: Push consumers: each redelivery backoff is this many times the one before.
    consumer_backoff_multiplier: float = bounded(2.0, min=1, max=1000)
    #: Push consumers: long polling and batch size advertised in Settings.
    push_long_polling_seconds: float = seconds(20.0, max=HOUR)
    #: Push consumers: most messages per receive (advertised in Settings).
    receive_batch_size: int = count(32)
    #: Invisibility of a delivery when the client sets none (push consumers).
    default_invisible_duration_seconds: float = seconds(30.0, max=DAY)
    #: Push consumers (ReceiveMessage with auto_renew): the proxy renews a delivery's
    #: invisibility every half invisible duration until the client acks or nacks it or goes
    #: away, for at most this long after the delivery.
    auto_renew_max_seconds: float = seconds(1800.0, min=0, max=DAY, zero="never renew")
    #: Deliveries the proxy renews at once for one principal (each costs a broker call every
    #: half invisibility); a push receive beyond it is answered TOO_MANY_REQUESTS, nothing
    #: delivered, until the principal acks or nacks some.
    max_renewals_per_principal: int = count(10_000, max=10_000_000)
    #: Durations below this (Node.js push nacks send milliseconds) are raised to it.
    min_invisible_duration_seconds: float = seconds(1.0, max=HOUR)
    #: Longest invisibility a client may ask for (ChangeInvisibleDuration, receive).
    max_invisible_duration_seconds: float = seconds(12 * HOUR, max=DAY)
    #: Longest long poll the proxy holds; it also ends a poll before the client's deadline.
    max_long_polling_seconds: float = seconds(30.0, min=0, max=HOUR, zero="no long polling: receives answer at once")
    #: Most messages one ReceiveMessage returns.
    max_receive_batch: int = count(32)
    #: Settings of a client whose Telemetry streams all ended are forgotten after this long
    #: (a client reconnecting to this replica within it is checked at once).
    client_idle_expiry_seconds: float = seconds(600.0, max=DAY)
    #: Departed clients (every Telemetry stream ended, remembered for
    #: client_idle_expiry_seconds by their topics) kept per principal; beyond, the least
    #: recently departed is forgotten first (client ids are the clients' choice: one principal
    #: naming a new one per stream grew the proxy's memory by one client each for that long).
    max_departed_clients_per_principal: int = count(1000, max=1_000_000)
    #: Live clients (an open Telemetry stream; each has a check subscription on every
    #: checker) one principal may have on this replica, all its connections together (auth
    #: on); a Telemetry stream making one more is answered 42900 TOO_MANY_REQUESTS naming this.
    max_live_clients_per_principal: int = count(1000, max=1_000_000)
    #: Most producer groups (= topics) one client's check subscription names.
    max_groups_per_client: int = count(64)

    def validate(self) -> None:
        """Rules across fields (each field's own range is declared beside it)."""
        if not self.nameserver_addresses:
            raise ValueError("nameserver_addresses must name at least one name server")
        if not self.proxy_name or any(ch.isspace() for ch in self.proxy_name):
            raise ValueError(f"proxy_name must be set, without spaces, got {self.proxy_name!r}")
        if self.advertise_address and ":" not in self.advertise_address:
            raise ValueError(f"advertise_address must be host:port, got {self.advertise_address!r}")
        if self.max_body_bytes >= self.max_grpc_message_bytes:
            raise ValueError(f"max_body_bytes ({self.max_body_bytes}) must be below max_grpc_message_bytes "
                             f"({self.max_grpc_message_bytes}): the proxy relays whole bodies")
        if self.min_invisible_duration_seconds > self.max_invisible_duration_seconds:
            raise ValueError("min_invisible_duration_seconds must not exceed max_invisible_duration_seconds")
