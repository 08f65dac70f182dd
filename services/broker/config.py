"""Broker configuration (``TXMQ_*`` environment variables or ``--flags``)."""

from __future__ import annotations

import dataclasses

from services.common.config import (DAY, MINUTE, GiB, HOUR, KiB, MiB, TiB, YEAR, ServiceConfig, bounded, choice,
                                    count, nbytes, seconds, tcp_port)

FLUSH_MODES = ("sync", "async")
#: The most replicas of one shard.
MAX_REPLICAS = 9


@dataclasses.dataclass(frozen=True)
class BrokerConfig(ServiceConfig):
    port: int = 10911
    #: Unique and stable across restarts; named in every id this broker issues.
    broker_name: str = "broker-0"
    #: host:port clients dial; defaults to ``<host>:<bound port>`` (127.0.0.1 for 0.0.0.0).
    advertise_address: str = ""
    #: Every name server (comma-separated host:port); the broker registers with each.
    nameserver_addresses: tuple[str, ...] = ()
    #: How often the broker re-registers with every name server (until a name server tells it its own interval).
    heartbeat_interval_seconds: float = seconds(10.0, max=HOUR)
    #: The RocksDB store: created when missing; it belongs to this broker_name only.
    data_dir: str = "./data/broker-0"
    #: ``sync``: nothing is acknowledged before the WAL holding it is synced (the writes made
    #: during one sync share the next: group commit); ``async``: the OS flushes.
    flush: str = choice("sync", FLUSH_MODES)
    #: With flush=sync, the write-ahead log in use is pre-sized to this at start, so syncs
    #: overwrite allocated blocks instead of growing the file (cheaper; 0: off).
    wal_prefill_bytes: int = nbytes(64 * MiB, min=0, max=64 * GiB, zero="no pre-sizing")
    #: Write-ahead logs kept at most (older ones are flushed to tables and reused): bounds
    #: what a restart replays.
    max_wal_bytes: int = nbytes(256 * MiB, min=0, max=TiB,
                                zero="RocksDB's default (four times all the memtables)")
    #: Largest message body (below max_grpc_message_bytes).
    max_body_bytes: int = nbytes(4 * MiB, max=GiB)
    #: Most user properties on one message.
    max_properties: int = count(128, max=65535)
    #: Most bytes of one message's property names and values together.
    max_properties_bytes: int = nbytes(32 * KiB, max=GiB)
    #: Most keys on one message.
    max_keys: int = count(32, max=65535)
    #: Longest tag (consumers filter on it).
    max_tag_bytes: int = nbytes(255, max=65535)
    #: Records older than this are deleted once no consumer group needs them.
    retention_seconds: float = seconds(72 * HOUR, min=0, max=YEAR,
                                       zero="records are deleted as soon as no consumer group needs them")
    #: How often retention looks for expired records and deduplication entries.
    retention_interval_seconds: float = seconds(60.0, max=DAY)
    #: How long a message id stays deduplicated after its transaction's decision.
    dedup_retention_seconds: float = seconds(DAY, min=0, max=YEAR,
                                             zero="an id is forgotten at the next retention round")
    #: Sends are refused with RESOURCE_EXHAUSTED while free disk is below this.
    min_free_disk_bytes: int = nbytes(512 * MiB, min=0, max=2**63 - 1, zero="sends are never refused for disk space")
    #: How often free disk is measured (sends are refused below min_free_disk_bytes).
    disk_check_interval_seconds: float = seconds(1.0, max=HOUR)
    #: First check of a transaction this long after it was prepared (broker clock).
    transaction_timeout_seconds: float = seconds(6.0, max=DAY)
    #: Second check this long after the first (later ones back off, see check_backoff_multiplier).
    check_interval_seconds: float = seconds(30.0, max=DAY)
    #: Each further check waits this many times longer than the one before (1: no backoff).
    check_backoff_multiplier: float = bounded(2.0, min=1, max=100)
    #: Longest wait between two checks of one transaction, however far backoff went.
    check_interval_max_seconds: float = seconds(300.0, max=DAY)
    #: Fraction of random spread added to each check interval.
    check_jitter: float = bounded(0.1, min=0, max=1, zero="no jitter")
    #: Checks a producer received without deciding before a transaction is discarded.
    check_max: int = count(15)
    #: An IN_PROGRESS answer cannot defer a transaction beyond this age.
    max_transaction_lifetime_seconds: float = seconds(DAY, max=YEAR)
    #: The furthest ahead a delay / timer message may be scheduled (RocketMQ's
    #: timerMaxDelaySec, 3 days).
    max_delivery_delay_seconds: float = seconds(3 * DAY, max=10 * YEAR)
    #: Deliveries of one message to one group before it goes to %DLQ%<group>.
    max_delivery_attempts: int = count(16)
    #: Invisibility of a delivery whose receive asks for none.
    default_invisible_duration_seconds: float = seconds(30.0, max=DAY)
    #: Longest invisibility a receive or ChangeInvisibleDuration may ask for.
    max_invisible_duration_seconds: float = seconds(12 * HOUR, max=DAY)
    #: Shorter invisibilities asked for are raised to this.
    min_invisible_duration_seconds: float = seconds(0.05, min=0, max=HOUR, zero="no floor")
    #: Longest a receive waits for a message when none is ready.
    max_long_polling_seconds: float = seconds(30.0, min=0, max=HOUR, zero="no long polling: receives answer at once")
    #: Most messages one receive returns.
    max_receive_batch: int = count(256)
    #: Receives waiting (long polling) at once on one connection; one more is refused with
    #: RESOURCE_EXHAUSTED naming this (a proxy multiplexes its clients' polls on one).
    max_long_polls_per_connection: int = count(1000, max=1_000_000)
    #: Receives of one principal waiting at once, all its connections together (auth on; a
    #: proxy's for a principal are that principal's); one more is refused with
    #: RESOURCE_EXHAUSTED (PRINCIPAL_LIMIT) naming this.
    max_long_polls_per_principal: int = count(5000, max=1_000_000)
    #: Sends on Produce streams applied and not yet answered (waiting for their WAL sync),
    #: all streams together; a send beyond it is refused in band, in its own entry, with a
    #: retryable OVERLOADED naming this (nothing applied; the SDK backs off and sends the
    #: same message id again). EndTransactions are never refused so: they finish work.
    max_pending_produce_entries: int = count(10_000, max=1_000_000)
    # --- replication (docs/replication.md) -------------------------------------------------
    #: Replicas of this shard (``broker_name``). 1: a single broker, no etcd (the embedded
    #: default); 3 in production.
    replication_factor: int = count(1, max=MAX_REPLICAS)
    #: This replica's stable id within its shard, 0 .. replication_factor-1.
    replica_id: int = count(0, min=0, max=MAX_REPLICAS - 1, zero="the shard's first replica")
    #: A write that must not be lost is acknowledged only once durable on every in-sync
    #: replica, and only while at least this many (the leader included) are in sync.
    min_insync_replicas: int = count(2, max=MAX_REPLICAS)
    #: etcd client endpoints (host:port, comma-separated); required when replicated.
    #: https://host:port: TLS, presenting the broker's certificate (TXMQ_TLS_*).
    etcd_endpoints: tuple[str, ...] = ()
    #: Key prefix of this cluster's keys in etcd.
    etcd_prefix: str = "/txmq"
    #: etcd's password authentication: this broker's etcd user (empty: none, or mTLS, where
    #: etcd takes the user from the certificate's common name; docs/security.md).
    etcd_user: str = ""
    #: The file holding etcd_user's password (read again when it changes).
    etcd_password_file: str = ""
    #: The leader's etcd lease (whole seconds, at least 1): a leader silent this long loses
    #: its shard to an in-sync follower.
    leader_lease_seconds: float = seconds(4.0, min=1, max=HOUR)
    #: How often a replica looks at etcd for its shard's leader and in-sync set.
    election_poll_seconds: float = seconds(0.25, max=MINUTE)
    #: A follower this far behind its leader (or silent this long) leaves the in-sync set.
    replica_lag_max_seconds: float = seconds(5.0, max=HOUR)
    #: Largest batch of entries in one replication stream message.
    replication_batch_bytes: int = nbytes(MiB, max=GiB)
    #: Replication log entries kept for followers catching up (older ones need a checkpoint).
    replication_log_entries: int = count(200_000, max=100_000_000)
    #: TCP port of the replication stream (length-prefixed frames, TLS and auth as on
    #: ``port``; services/broker/transport.py), opened only when replicated. RocketMQ's HA
    #: port. The leader advertises ``<host of advertise_address>:<bound port>`` in etcd.
    replication_port: int = tcp_port(10912)

    #: A consumer group's receiver that made no receive of a topic for this long is no
    #: longer live there (Kafka's session timeout): a reset of the group's offsets in that
    #: topic is refused while any receiver is live (or waits in a long poll), unless forced.
    consumer_session_seconds: float = seconds(30.0, max=DAY)
    #: Consumers (client ids, chosen by the clients) and checkers the broker remembers for
    #: that, in memory; the least recently seen that waits in no long poll is forgotten first.
    max_tracked_clients: int = count(10_000, max=1_000_000)
    # --- per-principal quotas (docs/security.md, "One tenant's share of what tenants share") -
    #: Consumer groups with positions on this broker whose names one principal's rights
    #: (subscribe or admin-write) cover: a receive or offset reset making one more is refused
    #: with RESOURCE_EXHAUSTED naming this (QUOTA_EXCEEDED); existing groups keep working. Not
    #: counted: service identities, auth off, a principal whose right covers every group
    #: (``cluster`` or ``consumer_group:*``). Each group holds cursors, its %DLQ% topic, series.
    max_consumer_groups_per_principal: int = count(2_000, max=10_000_000)
    #: (consumer group, topic) pairs with positions on this broker counted the same way (by
    #: the group's name): each holds a cursor per queue of the topic here.
    max_subscriptions_per_principal: int = count(20_000, max=100_000_000)
    #: Producer groups with transactions on this broker (a counters row and metric series each,
    #: kept for good) whose names one principal's check right covers: a half message naming one
    #: more is refused likewise.
    max_producer_groups_per_principal: int = count(2_000, max=10_000_000)

    def validate(self) -> None:
        """Rules across fields (each field's own range is declared beside it)."""
        if not self.broker_name:
            raise ValueError("broker_name must be set")
        if self.advertise_address:
            host, sep, port = self.advertise_address.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or host.endswith(":") \
                    and not host.startswith("["):
                raise ValueError(f"advertise_address must be host:port (the address clients dial, with its port), "
                                 f"got {self.advertise_address!r}")
        if self.max_body_bytes >= self.max_grpc_message_bytes:
            raise ValueError(f"max_body_bytes ({self.max_body_bytes}) must be below max_grpc_message_bytes "
                             f"({self.max_grpc_message_bytes}): a body travels in one gRPC message")
        if self.max_transaction_lifetime_seconds < self.transaction_timeout_seconds:
            raise ValueError(f"max_transaction_lifetime_seconds ({self.max_transaction_lifetime_seconds:g}) must not be "
                             f"below transaction_timeout_seconds ({self.transaction_timeout_seconds:g}): every "
                             "transaction would be discarded at its first check")
        if not self.min_invisible_duration_seconds <= self.default_invisible_duration_seconds \
                <= self.max_invisible_duration_seconds:
            raise ValueError(f"default_invisible_duration_seconds ({self.default_invisible_duration_seconds:g}) must be "
                             f"within min_invisible_duration_seconds ({self.min_invisible_duration_seconds:g}) and "
                             f"max_invisible_duration_seconds ({self.max_invisible_duration_seconds:g})")
        if self.replication_factor > 1:
            if not 0 <= self.replica_id < self.replication_factor:
                raise ValueError(f"replica_id must be 0..replication_factor-1={self.replication_factor - 1}, "
                                 f"got {self.replica_id}")
            if not 1 <= self.min_insync_replicas <= self.replication_factor:
                raise ValueError(f"min_insync_replicas must be 1..replication_factor={self.replication_factor}, "
                                 f"got {self.min_insync_replicas}")
            if not self.etcd_endpoints:
                raise ValueError("etcd_endpoints must be set when replication_factor > 1")
            if bool(self.etcd_user) != bool(self.etcd_password_file):
                raise ValueError("etcd_user and etcd_password_file go together (both set, or neither)")
            if self.leader_lease_seconds != int(self.leader_lease_seconds):
                raise ValueError(f"leader_lease_seconds must be a whole number (an etcd lease TTL), "
                                 f"got {self.leader_lease_seconds}")
