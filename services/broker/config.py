"""Broker configuration (``TXMQ_*`` environment variables or ``--flags``)."""

from __future__ import annotations

import dataclasses

from services.common.config import ServiceConfig

FLUSH_MODES = ("sync", "async")


@dataclasses.dataclass(frozen=True)
class BrokerConfig(ServiceConfig):
    port: int = 10911
    #: Unique and stable across restarts; named in every id this broker issues.
    broker_name: str = "broker-0"
    #: host:port clients dial; defaults to ``<host>:<bound port>`` (127.0.0.1 for 0.0.0.0).
    advertise_address: str = ""
    #: Every name server (comma-separated host:port); the broker registers with each.
    nameserver_addresses: tuple[str, ...] = ()
    heartbeat_interval_seconds: float = 10.0
    data_dir: str = "./data/broker-0"
    #: ``sync``: nothing is acknowledged before the WAL holding it is synced (the writes made
    #: during one sync share the next: group commit); ``async``: the OS flushes.
    flush: str = "sync"
    #: With flush=sync, the write-ahead log in use is pre-sized to this at start, so syncs
    #: overwrite allocated blocks instead of growing the file (cheaper; 0: off).
    wal_prefill_bytes: int = 64 * 1024 * 1024
    #: Write-ahead logs kept at most (older ones are flushed to tables and reused): bounds
    #: what a restart replays. 0: RocksDB's default (four times all the memtables).
    max_wal_bytes: int = 256 * 1024 * 1024
    max_body_bytes: int = 4 * 1024 * 1024
    max_properties: int = 128
    max_properties_bytes: int = 32 * 1024
    max_keys: int = 32
    max_tag_bytes: int = 255
    #: Records older than this are deleted once no consumer group needs them.
    retention_seconds: float = 72 * 3600.0
    retention_interval_seconds: float = 60.0
    #: How long a message id stays deduplicated after its transaction's decision.
    dedup_retention_seconds: float = 24 * 3600.0
    #: Sends are refused with RESOURCE_EXHAUSTED while free disk is below this.
    min_free_disk_bytes: int = 512 * 1024 * 1024
    disk_check_interval_seconds: float = 1.0
    #: First check of a transaction this long after it was prepared (broker clock).
    transaction_timeout_seconds: float = 6.0
    check_interval_seconds: float = 30.0
    check_backoff_multiplier: float = 2.0
    check_interval_max_seconds: float = 300.0
    #: Fraction of random spread added to each check interval.
    check_jitter: float = 0.1
    #: Checks a producer received without deciding before a transaction is discarded.
    check_max: int = 15
    #: An IN_PROGRESS answer cannot defer a transaction beyond this age.
    max_transaction_lifetime_seconds: float = 24 * 3600.0
    #: Deliveries of one message to one group before it goes to %DLQ%<group>.
    max_delivery_attempts: int = 16
    default_invisible_duration_seconds: float = 30.0
    max_invisible_duration_seconds: float = 12 * 3600.0
    min_invisible_duration_seconds: float = 0.05
    max_long_polling_seconds: float = 30.0
    max_receive_batch: int = 256
    # --- replication (docs/replication.md) -------------------------------------------------
    #: Replicas of this shard (``broker_name``). 1: a single broker, no etcd (the embedded
    #: default); 3 in production.
    replication_factor: int = 1
    #: This replica's stable id within its shard, 0 .. replication_factor-1.
    replica_id: int = 0
    #: A write that must not be lost is acknowledged only once durable on every in-sync
    #: replica, and only while at least this many (the leader included) are in sync.
    min_insync_replicas: int = 2
    #: etcd client endpoints (host:port, comma-separated); required when replicated.
    etcd_endpoints: tuple[str, ...] = ()
    #: Key prefix of this cluster's keys in etcd.
    etcd_prefix: str = "/txmq"
    #: The leader's etcd lease (whole seconds, at least 1): a leader silent this long loses
    #: its shard to an in-sync follower.
    leader_lease_seconds: float = 4.0
    #: How often a replica looks at etcd for its shard's leader and in-sync set.
    election_poll_seconds: float = 0.25
    #: A follower this far behind its leader (or silent this long) leaves the in-sync set.
    replica_lag_max_seconds: float = 5.0
    #: Largest batch of entries in one replication stream message.
    replication_batch_bytes: int = 1024 * 1024
    #: Replication log entries kept for followers catching up (older ones need a checkpoint).
    replication_log_entries: int = 200_000

    def validate(self) -> None:
        if self.flush not in FLUSH_MODES:
            raise ValueError(f"flush must be one of {FLUSH_MODES}, got {self.flush!r}")
        if not self.broker_name:
            raise ValueError("broker_name must be set")
        for name in ("max_body_bytes", "check_max", "max_delivery_attempts"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("wal_prefill_bytes", "max_wal_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")
        if not 1 <= self.replication_factor <= 9:
            raise ValueError(f"replication_factor must be 1..9, got {self.replication_factor}")
        if self.replication_factor > 1:
            if not 0 <= self.replica_id < self.replication_factor:
                raise ValueError(f"replica_id must be 0..replication_factor-1={self.replication_factor - 1}, "
                                 f"got {self.replica_id}")
            if not 1 <= self.min_insync_replicas <= self.replication_factor:
                raise ValueError(f"min_insync_replicas must be 1..replication_factor={self.replication_factor}, "
                                 f"got {self.min_insync_replicas}")
            if not self.etcd_endpoints:
                raise ValueError("etcd_endpoints must be set when replication_factor > 1")
            if not (self.leader_lease_seconds >= 1 and self.leader_lease_seconds == int(self.leader_lease_seconds)):
                raise ValueError(f"leader_lease_seconds must be a whole number ≥ 1 (an etcd lease TTL), "
                                 f"got {self.leader_lease_seconds}")
        for f in dataclasses.fields(self):
            if f.name.endswith("_seconds") and getattr(self, f.name) < 0:
                raise ValueError(f"{f.name} must not be negative, got {getattr(self, f.name)}")
