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
        for f in dataclasses.fields(self):
            if f.name.endswith("_seconds") and getattr(self, f.name) < 0:
                raise ValueError(f"{f.name} must not be negative, got {getattr(self, f.name)}")
