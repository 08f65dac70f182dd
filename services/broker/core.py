"""The broker's domain, assembled: ``BrokerCore`` opens the store and holds the shared state,
issues sends, runs the transaction state machine (end, decide, discard), creates topics and
schedules the checks; the other parts are mixed in from their modules:

- ``base.py``: the shared state, identifiers and small staging helpers every part uses;
- ``model.py``: states, sources, resolutions and kinds as named types, and the results;
- ``validation.py``: a message's fields against the limits, the tag filter;
- ``delivery.py``: receive, redelivery, DLQ, ack, change-invisible, dead-letter, queue reads;
- ``retention.py``: expiring dedup entries and old records;
- ``queries.py``: transactions, counters and records read back.

Request methods validate their input (raising ``TxmqError`` before anything runs) and
return an *operation*, which the store applies on the thread that owns it (the event
loop). An operation first reads and decides, raising if it refuses, and only then stages
its writes and changes in-memory state, so a refused request changes nothing and an
accepted one is one WriteBatch (see ``store/db.py``). Operations run one at a time, each
seeing every earlier one's writes.
"""

from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass
from typing import Callable, Iterable

from txmq._errors import (DiskFullError, InvalidFieldError, StaleClaimError, TransactionNotFoundError,
                          TransactionStateError, TxmqError)
from txmq._names import discard_topic, validate_group, validate_send_topic

from . import validation
from .config import BrokerConfig
from .consumers import ConsumerGroups
from .delivery import DeliveryPart
from .model import (RESOLUTION_COMMIT, RESOLUTION_ROLLBACK, RESOLUTION_UNKNOWN, STATE_COMMITTED,
                    STATE_DISCARDED, STATE_NAMES, STATE_PREPARED, STATE_ROLLED_BACK, Delivery, EndResult,
                    ReceiveResult, SendResult)
from .queries import QueriesPart
from .retention import RetentionPart
from .store import codec
from .store.codec import CqEntry, LogRecord, TxnRow
from .store.db import Database, OpWrites, now_ms
from .validation import parse_tag_filter

# Where they were before the split (service.py, tools and tests import them from here).
__all__ = ["BrokerCore", "CheckReport", "ClaimedCheck", "Delivery", "EndResult", "ReceiveResult",
           "SendResult", "StoreIdentityError", "open_database", "parse_tag_filter"]

log = logging.getLogger(__name__)


class StoreIdentityError(Exception):
    """The data directory belongs to another broker name."""


def open_database(config: BrokerConfig, on_fatal: Callable[[BaseException], None] | None = None) -> Database:
    """The broker's store as its configuration says (replicated when the shard has more
    than one replica)."""
    synced = config.flush == "sync"
    return Database(config.data_dir, sync=synced, on_fatal=on_fatal,
                    wal_prefill_bytes=config.wal_prefill_bytes if synced else 0,
                    max_wal_bytes=config.max_wal_bytes, replicated=config.replication_factor > 1,
                    replog_keep_entries=config.replication_log_entries)


OUTCOME_DELIVERED = 1
OUTCOME_ANSWERED = 2
OUTCOME_UNDELIVERED = 3
CHECK_COMMIT = 1
CHECK_ROLLBACK = 2
CHECK_UNKNOWN = 3
CHECK_IN_PROGRESS = 4
CHECK_RESULTS = (CHECK_COMMIT, CHECK_ROLLBACK, CHECK_UNKNOWN, CHECK_IN_PROGRESS)


@dataclass(slots=True, frozen=True)
class CheckReport:
    """What became of one claimed check (broker.proto CheckReport)."""

    transaction_id: str
    claim_token: str
    outcome: int
    result: int = 0
    retry_after_seconds: float = 0.0
    answer_timeout_seconds: float = 0.0


@dataclass(slots=True, frozen=True)
class ClaimedCheck:
    row: TxnRow
    due_ms: int
    attempt: int


class BrokerCore(DeliveryPart, RetentionPart, QueriesPart):
    def __init__(self, config: BrokerConfig, clock: Callable[[], int] = now_ms,
                 on_fatal: Callable[[BaseException], None] | None = None, db: Database | None = None) -> None:
        self.config = config
        self.name = config.broker_name
        self.clock = clock
        #: The store: handed in by the server (which also gives it to the bridge and, on a
        #: replicated shard, to replication), or opened here (tools and tests).
        self.db = db if db is not None else open_database(config, on_fatal)
        self.consumers = ConsumerGroups()
        self.topics: dict[str, int] = {}
        self.queue_next: dict[tuple[str, int], int] = {}
        self.counters: dict[str, list[int]] = {}
        self.disk_full = False
        self.free_disk_bytes = -1
        # Called (once durable) when messages become visible in a topic; the service
        # wakes long polls with it.
        self.visible_listeners: list[Callable[[str], None]] = []
        # Called (once durable) when a topic is created, for re-registration.
        self.topic_listeners: list[Callable[[str], None]] = []
        # Called (once durable) for every transaction decision: (group, resolution, source).
        self.end_listeners: list[Callable[[str, int, int], None]] = []
        # Called (once durable) for every discard: (group,).
        self.discard_listeners: list[Callable[[str], None]] = []
        # Called (once durable) for every message stored: (topic, kind).
        self.stored_listeners: list[Callable[[str, int], None]] = []
        self._random = random.Random()
        # Per group, a time below which the due (pending) index holds no key: scans start
        # there instead of at the group's prefix (see claim_op).
        self._due_floor: dict[str, int] = {}
        self._pending_floor: dict[str, int] = {}
        self._open()

    # --- start-up ------------------------------------------------------------------------

    def _open(self) -> None:
        db = self.db
        name = db.get("meta", b"broker_name")
        if name is None:
            self.store_id = random.getrandbits(32) or 1
            db.call(lambda w: (w.put("meta", b"broker_name", codec.frame(self.name.encode())),
                               w.put("meta", b"store_id", codec.encode_u64(self.store_id))))
        else:
            stored_name = codec.unframe(name, "meta", b"broker_name").decode()
            if stored_name != self.name:
                db.close()
                raise StoreIdentityError(
                    f"data dir {self.config.data_dir} belongs to broker {stored_name!r}, not {self.name!r}")
            self.store_id = codec.decode_u64(db.get("meta", b"store_id") or b"", "meta", b"store_id")
        last = db.last_key("log")
        floor = db.get("meta", b"seq_floor")
        self.next_seq = max(codec.log_seq(last) + 1 if last else 1,
                            codec.decode_u64(floor, "meta") if floor else 1)
        for key, value in db.scan("topics"):
            self.topics[key.decode()] = codec.decode_u64(value, "topic", key)
        for topic, count in self.topics.items():
            for q in range(count):
                last_cq = db.last_key("cq", codec.queue_prefix(topic, q))
                self.queue_next[(topic, q)] = codec.split_cq_key(last_cq)[2] + 1 if last_cq else 0
        for key, value in db.scan("counters"):
            self.counters[key.decode()] = list(codec.decode_counters(value, key))
        self.consumers.load(list(db.scan("consumers")), list(db.scan("inflight")))
        log.info("store opened", extra={"fields": {
            "data_dir": self.config.data_dir, "next_seq": self.next_seq, "topics": len(self.topics),
            "store_id": self.store_id}})

    def close(self) -> None:
        self.db.close()

    # --- validation ----------------------------------------------------------------------

    def validate_message(self, r: LogRecord) -> LogRecord:
        """See :func:`validation.validate_message` (against this broker's topics)."""
        return validation.validate_message(r, self.config, self.topics, self.name)

    def check_disk(self) -> None:
        if self.disk_full:
            raise DiskFullError(self.free_disk_bytes, self.config.min_free_disk_bytes)

    # --- sends ---------------------------------------------------------------------------

    def send_op(self, record: LogRecord) -> Callable[[OpWrites], SendResult]:
        """A normal or half message; ``record`` must have passed :meth:`validate_message`."""
        self.check_disk()

        def op(w: OpWrites) -> SendResult:
            db = self.db
            previous = db.get("dedup", record.message_id.encode())
            if previous is not None:
                return self._duplicate(record, codec.decode_dedup(previous, record.message_id.encode()))
            now = self.clock()
            seq = self.next_seq
            record.stored_ms = now
            mid_key = record.message_id.encode()
            if record.kind == codec.KIND_NORMAL:
                offset = self.queue_next[(record.topic, record.queue_id)]
                record.queue_offset = offset
                w.put("log", codec.log_key(seq), codec.encode_log_record(record))
                w.put("cq", codec.cq_key(record.topic, record.queue_id, offset),
                      codec.encode_cq_entry(CqEntry(seq, now, record.tag)))
                w.put("dedup", mid_key, codec.encode_dedup(
                    codec.DedupEntry(codec.DEDUP_NORMAL, seq, record.queue_id, offset)))
                w.put("dedup_exp", codec.expiry_key(now + int(self.config.dedup_retention_seconds * 1000),
                                                    record.message_id), b"")
                self.next_seq = seq + 1
                self.queue_next[(record.topic, record.queue_id)] = offset + 1
                topic = record.topic
                w.on_durable(lambda: (self._notify_stored(topic, codec.KIND_NORMAL), self._notify_visible(topic)))
                return SendResult(record.message_id, record.queue_id, offset)
            delay = record.check_immunity_seconds or self.config.transaction_timeout_seconds
            row = TxnRow(seq=seq, state=STATE_PREPARED, producer_group=record.producer_group,
                         producer_client_id=record.producer_client_id, topic=record.topic,
                         queue_id=record.queue_id, message_id=record.message_id, prepared_ms=now,
                         next_due_ms=now + int(delay * 1000), body_size=len(record.body))
            w.put("log", codec.log_key(seq), codec.encode_log_record(record))
            w.put("txn", codec.txn_key(seq), codec.encode_txn(row))
            self._due_put(w, row.producer_group, row.next_due_ms, seq)
            w.put("pending", codec.group_time_key(row.producer_group, now, seq), b"")
            self._pending_floor[row.producer_group] = min(self._pending_floor.get(row.producer_group, 0), now)
            w.put("dedup", mid_key, codec.encode_dedup(codec.DedupEntry(codec.DEDUP_TXN, seq)))
            self._count(w, row.producer_group, pending=+1)
            self.next_seq = seq + 1
            w.on_durable(lambda: self._notify_stored(record.topic, codec.KIND_HALF))
            return SendResult(record.message_id, record.queue_id, -1, self.txn_id(seq), STATE_PREPARED)
        return op

    def _duplicate(self, record: LogRecord, entry: codec.DedupEntry) -> SendResult:
        if entry.kind == codec.DEDUP_NORMAL:
            return SendResult(record.message_id, entry.queue_id, entry.queue_offset, duplicate=True)
        row = self._read_txn(entry.seq)
        state = row.state if row is not None else STATE_ROLLED_BACK
        return SendResult(record.message_id, row.queue_id if row else record.queue_id,
                          row.queue_offset if row else -1, self.txn_id(entry.seq), state, duplicate=True)

    # --- transactions --------------------------------------------------------------------

    def end_op(self, transaction_id: str, resolution: str, source: int, *, message_id: str = "",
               producer_group: str = "", operator: str = "", reason: str = "",
               ) -> Callable[[OpWrites], EndResult]:
        seq = self.parse_txn_id(transaction_id)
        if resolution not in (RESOLUTION_COMMIT, RESOLUTION_ROLLBACK, RESOLUTION_UNKNOWN):
            raise InvalidFieldError("resolution", "must be COMMIT, ROLLBACK or UNKNOWN")
        if source not in (codec.SOURCE_CLIENT, codec.SOURCE_CHECK, codec.SOURCE_OPERATOR):
            raise InvalidFieldError("source", "must be CLIENT, CHECK or OPERATOR")
        if source == codec.SOURCE_OPERATOR and resolution != RESOLUTION_UNKNOWN and not operator:
            raise InvalidFieldError("operator", "an operator decision must say who decides")
        if len(operator.encode()) > 255 or len(reason.encode()) > 4096:
            raise InvalidFieldError("operator/reason", "operator ≤ 255 bytes, reason ≤ 4096 bytes")

        def op(w: OpWrites) -> EndResult:
            row = self._read_txn(seq)
            if row is None:
                raise TransactionNotFoundError(transaction_id)
            if message_id and message_id != row.message_id:
                raise InvalidFieldError("message_id", f"{message_id!r} is not the message of {transaction_id}")
            if producer_group and producer_group != row.producer_group:
                raise InvalidFieldError("producer_group",
                                        f"{producer_group!r} is not the group of {transaction_id}")
            if resolution == RESOLUTION_UNKNOWN or row.state == _target(resolution):
                return self._end_result(row)
            if row.state in (STATE_COMMITTED, STATE_ROLLED_BACK):
                raise TransactionStateError(transaction_id, STATE_NAMES[row.state], resolution)
            self._decide(w, row, _target(resolution), source, operator=operator, reason=reason)
            return self._end_result(row)
        return op

    def _end_result(self, row: TxnRow) -> EndResult:
        return EndResult(self.txn_id(row.seq), row.state, row.source, row.ended_ms, row.queue_offset)

    def _decide(self, w: OpWrites, row: TxnRow, state: int, source: int, *, operator: str = "",
                reason: str = "") -> None:
        """PREPARED|DISCARDED → COMMITTED|ROLLED_BACK, in the caller's batch."""
        now = self.clock()
        was = row.state
        if was == STATE_PREPARED:
            w.delete("due", codec.group_time_key(row.producer_group, row.next_due_ms, row.seq))
            w.delete("pending", codec.group_time_key(row.producer_group, row.prepared_ms, row.seq))
        if state == STATE_COMMITTED:
            offset = self.queue_next[(row.topic, row.queue_id)]
            w.put("cq", codec.cq_key(row.topic, row.queue_id, offset),
                  codec.encode_cq_entry(CqEntry(row.seq, now, self._tag_of(row.seq))))
            self.queue_next[(row.topic, row.queue_id)] = offset + 1
            row.queue_offset = offset
            topic = row.topic
            w.on_durable(lambda: self._notify_visible(topic))
        row.state = state
        row.source = source
        row.ended_ms = now
        row.next_due_ms = 0
        row.claim_token = ""
        if operator:
            row.operator = operator
        if reason:
            row.reason = reason
        w.put("txn", codec.txn_key(row.seq), codec.encode_txn(row))
        w.put("dedup_exp", codec.expiry_key(now + int(self.config.dedup_retention_seconds * 1000),
                                            row.message_id), b"")
        self._count(w, row.producer_group, pending=-1 if was == STATE_PREPARED else 0,
                    discarded=-1 if was == STATE_DISCARDED else 0)
        group = row.producer_group
        w.on_durable(lambda: [fn(group, state, source) for fn in self.end_listeners])

    def _tag_of(self, seq: int) -> str:
        value = self.db.get("log", codec.log_key(seq))
        return codec.decode_log_tag(value, codec.log_key(seq)) if value is not None else ""

    def discard(self, w: OpWrites, row: TxnRow, reason: str) -> None:
        """PREPARED → DISCARDED: the message goes to %DISCARD%<group>; it can still be decided."""
        now = self.clock()
        topic = discard_topic(row.producer_group)
        self._ensure_topic(w, topic, 1)
        offset = self.queue_next[(topic, 0)]
        w.delete("due", codec.group_time_key(row.producer_group, row.next_due_ms, row.seq))
        w.delete("pending", codec.group_time_key(row.producer_group, row.prepared_ms, row.seq))
        w.put("cq", codec.cq_key(topic, 0, offset),
              codec.encode_cq_entry(CqEntry(row.seq, now, self._tag_of(row.seq))))
        self.queue_next[(topic, 0)] = offset + 1
        row.state = STATE_DISCARDED
        row.source = codec.SOURCE_BROKER
        row.discarded_ms = now
        row.discard_reason = reason
        row.next_due_ms = 0  # the claim token stays: a late answer from the group still counts
        w.put("txn", codec.txn_key(row.seq), codec.encode_txn(row))
        self._count(w, row.producer_group, pending=-1, discarded=+1)
        group = row.producer_group
        w.on_durable(lambda: (self._notify_visible(topic), [fn(group) for fn in self.discard_listeners]))

    def create_topic_op(self, topic: str, queue_count: int) -> Callable[[OpWrites], int]:
        validate_send_topic(topic)
        if not 0 < queue_count <= 1024:
            raise InvalidFieldError("queue_count", f"{queue_count} is outside 1..1024")

        def op(w: OpWrites) -> int:
            self._ensure_topic(w, topic, queue_count)
            return self.topics[topic]
        return op

    # --- checks --------------------------------------------------------------------------

    def claim_op(self, groups: Iterable[str], max_checks: int, lease_seconds: float,
                 ) -> Callable[[OpWrites], list[ClaimedCheck]]:
        groups = sorted(set(groups))
        for g in groups:
            validate_group("producer_groups", g)
        if max_checks <= 0:
            raise InvalidFieldError("max_checks", "must be positive")
        if not 0 < lease_seconds <= 3600:
            raise InvalidFieldError("lease_seconds", f"{lease_seconds} is outside (0, 3600]")

        def op(w: OpWrites) -> list[ClaimedCheck]:
            now = self.clock()
            claimed: list[ClaimedCheck] = []
            for group in groups:
                # Start at the group's floor, not its prefix: the claimed keys before it are
                # deleted, and a scan from the prefix would walk their tombstones every time
                # (a claim's cost must grow with due work, never with work already done).
                start = codec.group_time_key(group, self._due_floor.get(group, 0), 0)
                upper = codec.group_time_key(group, now + 1, 0)
                floor = now + 1
                for key, _ in self.db.scan("due", start, upper):
                    _g, due_ms, seq = codec.split_group_time_key(key)
                    if len(claimed) >= max_checks:
                        floor = due_ms
                        break
                    row = self._read_txn(seq)
                    if row is None or row.state != STATE_PREPARED or row.next_due_ms != due_ms:
                        w.delete("due", key)  # stale index entry
                        continue
                    spent = self._spent(row, now)
                    if spent:
                        self.discard(w, row, spent)
                        continue
                    row.next_due_ms = now + int(lease_seconds * 1000)
                    row.claim_token = os.urandom(8).hex()
                    w.delete("due", key)
                    self._due_put(w, group, row.next_due_ms, seq)
                    w.put("txn", codec.txn_key(seq), codec.encode_txn(row))
                    claimed.append(ClaimedCheck(row, due_ms, row.checks_delivered + 1))
                # The leases staged above are due at now + lease (possibly below ``floor``).
                self._due_floor[group] = min(floor, now + int(lease_seconds * 1000))
            return claimed
        return op

    def _due_put(self, w: OpWrites, group: str, due_ms: int, seq: int) -> None:
        """Every insert into the due index goes here: it keeps the group's floor below it."""
        w.put("due", codec.group_time_key(group, due_ms, seq), b"")
        # A group without a floor yet (after a start or a fail-over) may have older due
        # keys on disk: its floor stays 0 until a claim has scanned from the start.
        self._due_floor[group] = min(self._due_floor.get(group, 0), due_ms)

    def _spent(self, row: TxnRow, now: int) -> str:
        """Why a PREPARED transaction must be discarded now ('' when it must not)."""
        cfg = self.config
        if now >= row.prepared_ms + int(cfg.max_transaction_lifetime_seconds * 1000):
            return (f"max_transaction_lifetime_seconds={cfg.max_transaction_lifetime_seconds:g} exceeded "
                    f"without a decision")
        if row.checks_delivered >= cfg.check_max:
            return (f"check budget spent: {row.checks_delivered} checks received by the group "
                    f"(check_max={cfg.check_max}), none decided")
        return ""

    def report_op(self, reports: list[CheckReport]) -> Callable[[OpWrites], list[tuple[Exception | None, int]]]:
        """Outcomes of claimed checks (see broker.proto CheckOutcome)."""
        parsed: list[int | Exception] = []
        for r in reports:
            try:
                if r.outcome not in (OUTCOME_DELIVERED, OUTCOME_ANSWERED, OUTCOME_UNDELIVERED):
                    raise InvalidFieldError("outcome", "must be DELIVERED, ANSWERED or UNDELIVERED")
                if r.outcome == OUTCOME_ANSWERED and r.result not in CHECK_RESULTS:
                    raise InvalidFieldError("result", "must be COMMIT, ROLLBACK, UNKNOWN or IN_PROGRESS")
                if r.retry_after_seconds < 0 or r.answer_timeout_seconds < 0:
                    raise InvalidFieldError("retry_after_seconds", "must not be negative")
                parsed.append(self.parse_txn_id(r.transaction_id))
            except Exception as exc:  # noqa: BLE001 - reported per entry
                parsed.append(exc)

        def op(w: OpWrites) -> list[tuple[Exception | None, int]]:
            now = self.clock()
            rows: dict[int, TxnRow | None] = {}
            out: list[tuple[Exception | None, int]] = []
            for r, seq in zip(reports, parsed):
                if isinstance(seq, Exception):
                    out.append((seq, 0))
                    continue
                if seq not in rows:
                    rows[seq] = self._read_txn(seq)
                row = rows[seq]
                try:
                    if row is None:
                        raise TransactionNotFoundError(r.transaction_id)
                    self._apply_report(w, row, r, now)
                    out.append((None, row.state))
                except TxmqError as exc:
                    out.append((exc, row.state if row is not None else 0))
            return out
        return op

    def _apply_report(self, w: OpWrites, row: TxnRow, r: CheckReport, now: int) -> None:
        if not r.claim_token or r.claim_token != row.claim_token:
            raise StaleClaimError(self.txn_id(row.seq), "not the transaction's current claim (never sent, "
                                  "superseded by a later claim, or the transaction was decided)")
        cfg = self.config
        if r.outcome == OUTCOME_ANSWERED:
            row.checks_answered += 1
            if r.result in (CHECK_COMMIT, CHECK_ROLLBACK):
                if row.state in (STATE_PREPARED, STATE_DISCARDED):
                    self._decide(w, row, STATE_COMMITTED if r.result == CHECK_COMMIT else STATE_ROLLED_BACK,
                                 codec.SOURCE_CHECK)
                return
            if row.state != STATE_PREPARED:
                w.put("txn", codec.txn_key(row.seq), codec.encode_txn(row))
                return
            if r.result == CHECK_IN_PROGRESS:
                row.checks_delivered = max(row.checks_delivered - 1, 0)  # IN_PROGRESS spends nothing
                end = row.prepared_ms + int(cfg.max_transaction_lifetime_seconds * 1000)
                retry_ms = int(max(r.retry_after_seconds, 0.001) * 1000)
                row.in_progress_until_ms = min(now + retry_ms, end)
                self._reschedule(w, row, row.in_progress_until_ms)
                return
            row.unknown_answers += 1
            spent = self._spent(row, now)
            if spent:
                self.discard(w, row, spent)
            else:
                w.put("txn", codec.txn_key(row.seq), codec.encode_txn(row))
            return
        if row.state != STATE_PREPARED:
            raise StaleClaimError(self.txn_id(row.seq), f"the transaction is {STATE_NAMES[row.state]}")
        if r.outcome == OUTCOME_DELIVERED:
            row.checks_delivered += 1
            answer_ms = int(r.answer_timeout_seconds * 1000)
            if row.checks_delivered >= cfg.check_max:
                wait_ms = answer_ms or int(cfg.check_interval_seconds * 1000)
                self._reschedule(w, row, now + max(wait_ms, 1))
            else:
                # Never due again before the answer may still come: a new claim would
                # make that answer stale.
                self._reschedule(w, row, now + max(self.next_check_delay_ms(row.checks_delivered), answer_ms))
        else:  # UNDELIVERED: nobody took it, nothing spent; due again now
            row.claim_token = ""
            self._reschedule(w, row, now)

    def _reschedule(self, w: OpWrites, row: TxnRow, due_ms: int) -> None:
        w.delete("due", codec.group_time_key(row.producer_group, row.next_due_ms, row.seq))
        row.next_due_ms = due_ms
        self._due_put(w, row.producer_group, due_ms, row.seq)
        w.put("txn", codec.txn_key(row.seq), codec.encode_txn(row))

    def next_check_delay_ms(self, delivered: int) -> int:
        cfg = self.config
        base = cfg.check_interval_seconds * (cfg.check_backoff_multiplier ** max(delivered - 1, 0))
        base = min(base, max(cfg.check_interval_max_seconds, cfg.check_interval_seconds))
        return int(base * (1 + cfg.check_jitter * self._random.random()) * 1000)

    # A query of the check schedule (the due index and its floors), so it stays beside it.
    def oldest_due_ms(self, group: str) -> int | None:
        return self._first_time("due", group, self._due_floor.get(group, 0))


def _target(resolution: str) -> int:
    return STATE_COMMITTED if resolution == RESOLUTION_COMMIT else STATE_ROLLED_BACK
