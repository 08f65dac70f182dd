"""Broker configuration (``TXMQ_*`` environment variables or ``--flags``)."""

from __future__ import annotations

import dataclasses

from services.common.config import (DAY, GiB, HOUR, KiB, MiB, TiB, YEAR, ServiceConfig, bounded, choice,
                                    count, nbytes, seconds)

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
    heartbeat_interval_seconds: float = seconds(10.0, max=HOUR)
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
    max_properties: int = count(128, max=65535)
    max_properties_bytes: int = nbytes(32 * KiB, max=GiB)
    max_keys: int = count(32, max=65535)
    max_tag_bytes: int = nbytes(255, max=65535)
    #: Records older than this are deleted once no consumer group needs them.
    retention_seconds: float = seconds(72 * HOUR, min=0, max=YEAR,
                                       zero="records are deleted as soon as no consumer group needs them")
    retention_interval_seconds: float = seconds(60.0, max=DAY)
    #: How long a message id stays deduplicated after its transaction's decision.
    dedup_retention_seconds: float = seconds(DAY, min=0, max=YEAR,
                                             zero="an id is forgotten at the next retention round")
    #: Sends are refused with RESOURCE_EXHAUSTED while free disk is below this.
    min_free_disk_bytes: int = nbytes(512 * MiB, min=0, max=2**63 - 1, zero="sends are never refused for disk space")
    disk_check_interval_seconds: float = seconds(1.0, max=HOUR)
    #: First check of a transaction this long after it was prepared (broker clock).
    transaction_timeout_seconds: float = seconds(6.0, max=DAY)
    check_interval_seconds: float = seconds(30.0, max=DAY)
    #: Each further check waits this many times longer than the one before (1: no backoff).
    check_backoff_multiplier: float = bounded(2.0, min=1, max=100)
    check_interval_max_seconds: float = seconds(300.0, max=DAY)
    #: Fraction of random spread added to each check interval.
    check_jitter: float = bounded(0.1, min=0, max=1, zero="no jitter")
    #: Checks a producer received without deciding before a transaction is discarded.
    check_max: int = count(15)
    #: An IN_PROGRESS answer cannot defer a transaction beyond this age.
    max_transaction_lifetime_seconds: float = seconds(DAY, max=YEAR)
    #: Deliveries of one message to one group before it goes to %DLQ%<group>.
    max_delivery_attempts: int = count(16)
    #: Invisibility of a delivery whose receive asks for none.
    default_invisible_duration_seconds: float = seconds(30.0, max=DAY)
    max_invisible_duration_seconds: float = seconds(12 * HOUR, max=DAY)
    #: Shorter invisibilities asked for are raised to this.
    min_invisible_duration_seconds: float = seconds(0.05, min=0, max=HOUR, zero="no floor")
    max_long_polling_seconds: float = seconds(30.0, min=0, max=HOUR, zero="no long polling: receives answer at once")
    max_receive_batch: int = count(256)

    def validate(self) -> None:
        """Rules across fields (each field's own range is declared beside it)."""
        if not self.broker_name:
            raise ValueError("broker_name must be set")
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
