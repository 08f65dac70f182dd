"""The broker's domain: messages, transactions and their state machine, consumer
deliveries, the check schedule, retention.

Request methods validate their input (raising ``TxmqError`` before anything runs) and
return an *operation*, which the store applies on the thread that owns it (the event
loop). An operation first reads and decides, raising if it refuses, and only then stages
its writes and changes in-memory state, so a refused request changes nothing and an
accepted one is one WriteBatch (see ``store/db.py``). Operations run one at a time, each
seeing every earlier one's writes.
"""

from __future__ import annotations

import collections
import heapq
import logging
import os
import random
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Mapping

from txmq._errors import (DiskFullError, InvalidFieldError, InvalidIdError, MessageTooLargeError,
                          PropertiesTooLargeError, QueueNotFoundError, ReceiptHandleNotFoundError,
                          StaleClaimError, TopicNotFoundError, TransactionNotFoundError,
                          TransactionStateError, TxmqError, WrongBrokerError)
from txmq._ids import MessageId, ReceiptHandle, TransactionId
from txmq._names import (dlq_topic, discard_topic, validate_group, validate_name,
                         validate_receive_topic, validate_send_topic)

from .config import BrokerConfig
from .consumers import ConsumerGroups, Cursor
from .store import codec
from .store.codec import (STATE_COMMITTED, STATE_DISCARDED, STATE_NAMES, STATE_PREPARED,
                          STATE_ROLLED_BACK, CqEntry, LogRecord, TxnRow)
from .store.db import Database, OpWrites, now_ms

log = logging.getLogger(__name__)

RESOLUTION_COMMIT = "COMMIT"
RESOLUTION_ROLLBACK = "ROLLBACK"
RESOLUTION_UNKNOWN = "UNKNOWN"
_FOREIGN_ID = re.compile(r"[A-Za-z0-9_.:=+/-]{1,128}")
_MAX_KEY_BYTES = 1024


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


@dataclass(slots=True, frozen=True)
class SendResult:
    message_id: str
    queue_id: int
    queue_offset: int
    transaction_id: str = ""
    state: int = 0
    duplicate: bool = False


@dataclass(slots=True, frozen=True)
class EndResult:
    transaction_id: str
    state: int
    source: int
    ended_ms: int
    queue_offset: int


@dataclass(slots=True, frozen=True)
class Delivery:
    topic: str
    queue_id: int
    offset: int
    log_seq: int
    attempt: int
    deadline_ms: int
    visible_ms: int
    receipt_handle: str


@dataclass(slots=True, frozen=True)
class ReceiveResult:
    deliveries: list[Delivery]
    # When the earliest in-flight delivery of the polled queues becomes visible again.
    next_deadline_ms: int | None


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
    #: The answering producer's group; a late answer without a claim token must name it.
    producer_group: str = ""


@dataclass(slots=True, frozen=True)
class ClaimedCheck:
    row: TxnRow
    due_ms: int
    attempt: int


@dataclass(slots=True)
class ClaimBatch:
    checks: list[ClaimedCheck]
    #: A served group has more due than this claim took (claim again at once).
    more_due: bool = False
    #: The session's groups are not known at this version: nothing claimed, send them.
    groups_needed: bool = False


@dataclass(slots=True)
class ClaimSession:
    """A checker's claim session: its groups and their capacity, at a version."""

    version: int
    groups: dict[str, int]


#: Claim sessions kept (the least recently used is forgotten; its checker sends its groups again).
MAX_CLAIM_SESSIONS = 1024
#: Most groups one claim session may name.
MAX_SESSION_GROUPS = 100_000
#: The due floor of a group with no due key.
NO_DUE_MS = 2**62


def parse_tag_filter(expression: str) -> frozenset[str] | None:
    """``"*"`` or empty → None (everything); ``"A || B"`` → {"A", "B"}."""
    text = (expression or "").strip()
    if text in ("", "*"):
        return None
    tags = frozenset(part.strip() for part in text.split("||"))
    if not tags or any(not t for t in tags):
        raise InvalidFieldError("filter_expression", f"{expression!r} is not '*' or 'TagA || TagB'")
    return tags


class BrokerCore:
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
        # ... and the sequence at that time below which it holds none (a burst's keys share
        # one due time: the claims start past the ones they took, not at their tombstones).
        self._due_floor_seq: dict[str, int] = {}
        self._pending_floor: dict[str, int] = {}
        # The floors as a heap, so a claim finds the groups with due work without looking
        # at idle ones; claim sessions by id; the turn that orders the groups of a claim.
        self._floor_heap: list[tuple[int, str]] = []
        self._claim_sessions: collections.OrderedDict[str, ClaimSession] = collections.OrderedDict()
        self._claim_turn = 0
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
        self._load_due_floors()
        log.info("store opened", extra={"fields": {
            "data_dir": self.config.data_dir, "next_seq": self.next_seq, "topics": len(self.topics),
            "store_id": self.store_id}})

    def close(self) -> None:
        self.db.close()

    # --- identifiers ---------------------------------------------------------------------

    def txn_id(self, seq: int) -> str:
        return TransactionId(self.name, self.store_id, seq).encode()

    def parse_txn_id(self, text: str) -> int:
        tid = TransactionId.decode(text)
        if tid.broker != self.name:
            raise WrongBrokerError("transaction id", text, tid.broker, self.name)
        if tid.store_id != self.store_id:
            raise InvalidIdError("transaction id", text, "issued by an earlier store of this broker")
        return tid.sequence

    def receipt(self, topic: str, queue_id: int, offset: int, attempt: int) -> str:
        return ReceiptHandle(self.name, self.store_id, topic, queue_id, offset, attempt).encode()

    def parse_receipt(self, text: str) -> ReceiptHandle:
        handle = ReceiptHandle.decode(text)
        if handle.broker != self.name:
            raise WrongBrokerError("receipt handle", text, handle.broker, self.name)
        if handle.store_id != self.store_id:
            raise ReceiptHandleNotFoundError(text)
        return handle

    # --- validation ----------------------------------------------------------------------

    def validate_message(self, r: LogRecord) -> LogRecord:
        cfg = self.config
        validate_send_topic(r.topic)
        count = self.topics.get(r.topic)
        if count is None:
            raise TopicNotFoundError(r.topic)
        if not 0 <= r.queue_id < count:
            raise QueueNotFoundError(r.topic, r.queue_id)
        if len(r.body) > cfg.max_body_bytes:
            raise MessageTooLargeError(len(r.body), cfg.max_body_bytes)
        if len(r.tag.encode()) > cfg.max_tag_bytes:
            raise PropertiesTooLargeError("tag bytes", len(r.tag.encode()), cfg.max_tag_bytes)
        if "||" in r.tag or r.tag.strip() != r.tag:
            raise InvalidFieldError("tag", "must not contain '||' or surrounding spaces")
        if len(r.keys) > cfg.max_keys:
            raise PropertiesTooLargeError("key count", len(r.keys), cfg.max_keys)
        for key in r.keys:
            if len(key.encode()) > _MAX_KEY_BYTES:
                raise PropertiesTooLargeError("key bytes", len(key.encode()), _MAX_KEY_BYTES)
        if len(r.properties) > cfg.max_properties:
            raise PropertiesTooLargeError("property count", len(r.properties), cfg.max_properties)
        size = sum(len(k.encode()) + len(v.encode()) for k, v in r.properties.items())
        if size > cfg.max_properties_bytes:
            raise PropertiesTooLargeError("properties bytes", size, cfg.max_properties_bytes)
        if any(not k or len(k.encode()) > 0xFFFF for k in r.properties):
            raise InvalidFieldError("properties", "property names must be 1-65535 bytes")
        if r.message_id:
            if MessageId.looks_like(r.message_id):
                mid = MessageId.decode(r.message_id)
                if mid.broker != self.name:
                    raise WrongBrokerError("message id", r.message_id, mid.broker, self.name)
            elif not _FOREIGN_ID.fullmatch(r.message_id):
                raise InvalidIdError("message id", r.message_id, "use 1-128 characters [A-Za-z0-9_.:=+/-]")
        else:
            r.message_id = MessageId.new(self.name, r.queue_id).encode()
        if r.kind == codec.KIND_HALF:
            validate_group("producer_group", r.producer_group)
            if len(r.producer_client_id.encode()) > 255:
                raise InvalidFieldError("producer_client_id", "longer than 255 bytes")
            if not 0 <= r.check_immunity_seconds <= cfg.max_transaction_lifetime_seconds:
                raise InvalidFieldError(
                    "check_immunity_seconds",
                    f"{r.check_immunity_seconds} is outside 0..max_transaction_lifetime_seconds="
                    f"{cfg.max_transaction_lifetime_seconds}")
        if len(r.born_host.encode()) > 255:
            raise InvalidFieldError("born_host", "longer than 255 bytes")
        return r

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

    def _count(self, w: OpWrites, group: str, pending: int = 0, discarded: int = 0) -> None:
        counts = self.counters.setdefault(group, [0, 0])
        counts[0] += pending
        counts[1] += discarded
        w.put("counters", group.encode(), codec.encode_counters(counts[0], counts[1]))

    def _read_txn(self, seq: int) -> TxnRow | None:
        value = self.db.get("txn", codec.txn_key(seq))
        return codec.decode_txn(value, codec.txn_key(seq)) if value is not None else None

    def _notify_stored(self, topic: str, kind: int) -> None:
        for fn in self.stored_listeners:
            fn(topic, kind)

    def _notify_visible(self, topic: str) -> None:
        for fn in self.visible_listeners:
            fn(topic)

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

    def _ensure_topic(self, w: OpWrites, topic: str, queue_count: int) -> bool:
        if self.topics.get(topic, 0) >= queue_count:
            return False
        old = self.topics.get(topic, 0)
        self.topics[topic] = queue_count
        for q in range(old, queue_count):
            self.queue_next.setdefault((topic, q), 0)
        w.put("topics", topic.encode(), codec.encode_u64(queue_count))
        w.on_durable(lambda: [fn(topic) for fn in self.topic_listeners])
        return True

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
        """A claim without a session: ``groups`` named in full, each up to ``max_checks``."""
        groups = set(groups)
        for g in groups:
            validate_group("producer_groups", g)
        self._validate_claim(max_checks, lease_seconds)
        batch = self._claim({g: max_checks for g in groups}, {}, max_checks, lease_seconds)
        return lambda w: batch(w).checks

    def session_claim_op(self, session_id: str, groups_version: int, groups: Mapping[str, int] | None,
                         limits: Mapping[str, int], max_checks: int, lease_seconds: float,
                         ) -> Callable[[OpWrites], ClaimBatch]:
        """A claim in a session (broker.proto ClaimChecksRequest): ``groups`` (group →
        capacity) only when the checker's list changed; without it the session's list at
        ``groups_version`` is used, or the batch asks for it (``groups_needed``)."""
        if not session_id or len(session_id) > 128:
            raise InvalidFieldError("session_id", "1 to 128 characters")
        self._validate_claim(max_checks, lease_seconds)
        if groups is not None:
            if len(groups) > MAX_SESSION_GROUPS:
                raise InvalidFieldError("groups", f"at most {MAX_SESSION_GROUPS} groups, got {len(groups)}")
            for g, capacity in groups.items():
                validate_group("groups", g)
                if capacity < 0:
                    raise InvalidFieldError("groups", f"capacity of {g!r} is negative: {capacity}")
        for g, limit in limits.items():
            if limit < 0:
                raise InvalidFieldError("limits", f"limit of {g!r} is negative: {limit}")
        sessions = self._claim_sessions
        if groups is not None:
            sessions[session_id] = ClaimSession(groups_version, dict(groups))
            while len(sessions) > MAX_CLAIM_SESSIONS:
                sessions.popitem(last=False)
        session = sessions.get(session_id)
        if session is None or session.version != groups_version:
            return lambda w: ClaimBatch([], groups_needed=True)
        sessions.move_to_end(session_id)
        return self._claim(session.groups, limits, max_checks, lease_seconds)

    @staticmethod
    def _validate_claim(max_checks: int, lease_seconds: float) -> None:
        if max_checks <= 0:
            raise InvalidFieldError("max_checks", "must be positive")
        if not 0 < lease_seconds <= 3600:
            raise InvalidFieldError("lease_seconds", f"{lease_seconds} is outside (0, 3600]")

    def _claim(self, capacity: Mapping[str, int], limits: Mapping[str, int], max_checks: int,
               lease_seconds: float) -> Callable[[OpWrites], ClaimBatch]:
        """Claims due checks of the groups in ``capacity``, each at most its limit (its
        capacity unless ``limits`` names it), sharing ``max_checks`` fairly: the groups with
        due work, in an order that turns by one every claim, each get an equal share of what
        the groups before them left. Only groups whose earliest due time has come are
        touched (the floors kept in memory), so a claim costs nothing per idle group."""
        lease_ms = int(lease_seconds * 1000)

        def op(w: OpWrites) -> ClaimBatch:
            now = self.clock()
            batch = ClaimBatch([])
            scans: list[tuple[str, int, Iterator[ClaimedCheck]]] = []
            floors: dict[str, tuple[int, int]] = {}
            for group in self._pop_due_groups(now):
                limit = min(limits.get(group, capacity.get(group, 0)), capacity.get(group, 0))
                if limit > 0:
                    # Set here: a scan the batch fills up before never runs a line.
                    floors[group] = (self._due_floor[group], self._due_floor_seq.get(group, 0))
                    scans.append((group, limit, self._claim_group(w, group, now, lease_ms, floors)))
                else:  # due, but not served here (or no capacity now): it stays due
                    self._set_floor(group, self._due_floor[group], self._due_floor_seq.get(group, 0))
            if scans:
                turn = self._claim_turn % len(scans)
                scans = scans[turn:] + scans[:turn]
            self._claim_turn += 1
            # Round-robin: one check from each group in turn, so every group with due work
            # gets an equal share of the batch, up to its limit.
            taken: dict[str, int] = {}
            active = scans
            while active and len(batch.checks) < max_checks:
                still = []
                for group, limit, scan in active:
                    if len(batch.checks) >= max_checks:
                        still.append((group, limit, scan))
                        continue
                    check = next(scan, None)
                    if check is None:
                        continue
                    batch.checks.append(check)
                    taken[group] = taken.get(group, 0) + 1
                    if taken[group] < limit:
                        still.append((group, limit, scan))
                active = still
            for group, limit, _scan in scans:
                floor = floors[group]
                if taken.get(group):
                    floor = min(floor, (now + lease_ms, 0))  # the leases staged, due at now + lease
                self._set_floor(group, *floor)
                if floors[group][0] <= now and taken.get(group, 0) < limit:
                    batch.more_due = True  # the batch was full before this group's limit
            return batch
        return op

    def _claim_group(self, w: OpWrites, group: str, now: int, lease_ms: int,
                     floors: dict[str, tuple[int, int]]) -> Iterator[ClaimedCheck]:
        """Claims the group's due checks one by one, oldest first, as they are pulled;
        ``floors[group]`` (where the scan starts) is kept at a (time, seq) below every due
        key not yet claimed."""
        # Start at the group's floor, not its prefix: the claimed keys before it are
        # deleted, and a scan from the prefix would walk their tombstones every time (a
        # claim's cost must grow with due work, never with work already done).
        start = codec.group_time_key(group, *floors[group])
        for key, _ in self.db.scan("due", start, group.encode() + b"\x01"):
            _g, due_ms, seq = codec.split_group_time_key(key)
            if due_ms > now:
                floors[group] = (due_ms, seq)
                return  # the earliest key left (the scan sees no key this batch staged)
            floors[group] = (due_ms, seq + 1)
            row = self._read_txn(seq)
            if row is None or row.state != STATE_PREPARED or row.next_due_ms != due_ms:
                w.delete("due", key)  # stale index entry
                continue
            spent = self._spent(row, now)
            if spent:
                self.discard(w, row, spent)
                continue
            row.next_due_ms = now + lease_ms
            row.claim_token = os.urandom(8).hex()
            w.delete("due", key)
            self._due_put(w, group, row.next_due_ms, seq)
            w.put("txn", codec.txn_key(seq), codec.encode_txn(row))
            yield ClaimedCheck(row, due_ms, row.checks_delivered + 1)
        floors[group] = (NO_DUE_MS, 0)

    def _due_put(self, w: OpWrites, group: str, due_ms: int, seq: int) -> None:
        """Every insert into the due index goes here: it keeps the group's floor below it."""
        w.put("due", codec.group_time_key(group, due_ms, seq), b"")
        if (due_ms, seq) < (self._due_floor.get(group, NO_DUE_MS), self._due_floor_seq.get(group, 0)):
            self._set_floor(group, due_ms, seq)

    def _set_floor(self, group: str, floor_ms: int, floor_seq: int = 0) -> None:
        """The group's due floor (no due key below (time, seq)), and its place in the heap
        of floors the claims pop due groups from."""
        self._due_floor[group] = floor_ms
        self._due_floor_seq[group] = floor_seq
        if floor_ms < NO_DUE_MS:
            heap = self._floor_heap
            heapq.heappush(heap, (floor_ms, group))
            if len(heap) > 4 * len(self._due_floor) + 1024:  # superseded entries: rebuild
                heap[:] = [(f, g) for g, f in self._due_floor.items() if f < NO_DUE_MS]
                heapq.heapify(heap)

    def _pop_due_groups(self, now: int) -> list[str]:
        """Groups whose floor has come, taken off the heap (the claim puts each back)."""
        heap, due, seen = self._floor_heap, [], set()
        while heap and heap[0][0] <= now:
            floor_ms, group = heapq.heappop(heap)
            if group not in seen and self._due_floor.get(group) == floor_ms:
                seen.add(group)
                due.append(group)
        return due

    def checks_waiting(self, group: str, now: int, limit: int = 100_000) -> int:
        """Due checks of the group not claimed (waiting for a producer with free credit),
        counted up to ``limit``; nothing is read for a group whose floor lies ahead."""
        floor = self._due_floor.get(group, NO_DUE_MS)
        if floor > now:
            return 0
        count = 0
        start = codec.group_time_key(group, floor, self._due_floor_seq.get(group, 0))
        for _ in self.db.scan("due", start, codec.group_time_key(group, now + 1, 0)):
            count += 1
            if count >= limit:
                break
        return count

    def _load_due_floors(self) -> None:
        """At start: each group's earliest due time (one seek per group with due keys)."""
        start = b""
        while True:
            first = next(iter(self.db.scan("due", start)), None)
            if first is None:
                return
            group, due_ms, seq = codec.split_group_time_key(first[0])
            self._set_floor(group, due_ms, seq)
            start = group.encode() + b"\x01"

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

    def report_op(self, reports: list[CheckReport],
                  ) -> Callable[[OpWrites], list[tuple[Exception | None, int, bool]]]:
        """Outcomes of claimed checks (see broker.proto CheckOutcome): per report (the
        refusal or None, the transaction's state after it, whether it was a late answer)."""
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

        def op(w: OpWrites) -> list[tuple[Exception | None, int, bool]]:
            now = self.clock()
            rows: dict[int, TxnRow | None] = {}
            out: list[tuple[Exception | None, int, bool]] = []
            for r, seq in zip(reports, parsed):
                if isinstance(seq, Exception):
                    out.append((seq, 0, False))
                    continue
                if seq not in rows:
                    rows[seq] = self._read_txn(seq)
                row = rows[seq]
                try:
                    if row is None:
                        raise TransactionNotFoundError(r.transaction_id)
                    late = self._apply_report(w, row, r, now)
                    out.append((None, row.state, late))
                except TxmqError as exc:
                    out.append((exc, row.state if row is not None else 0, False))
            return out
        return op

    def _apply_report(self, w: OpWrites, row: TxnRow, r: CheckReport, now: int) -> bool:
        """Applies one report; True when it was a late answer (not on the current claim)
        that decided the transaction."""
        if not r.claim_token or r.claim_token != row.claim_token:
            if r.outcome != OUTCOME_ANSWERED:
                raise StaleClaimError(self.txn_id(row.seq), "not the transaction's current claim (never sent, "
                                      "superseded by a later claim, or the transaction was decided)")
            return self._late_answer(w, row, r)
        cfg = self.config
        if r.outcome == OUTCOME_ANSWERED:
            row.checks_answered += 1
            if r.result in (CHECK_COMMIT, CHECK_ROLLBACK):
                if row.state in (STATE_PREPARED, STATE_DISCARDED):
                    self._decide(w, row, STATE_COMMITTED if r.result == CHECK_COMMIT else STATE_ROLLED_BACK,
                                 codec.SOURCE_CHECK)
                return False
            if row.state != STATE_PREPARED:
                w.put("txn", codec.txn_key(row.seq), codec.encode_txn(row))
                return False
            if r.result == CHECK_IN_PROGRESS:
                row.checks_delivered = max(row.checks_delivered - 1, 0)  # IN_PROGRESS spends nothing
                end = row.prepared_ms + int(cfg.max_transaction_lifetime_seconds * 1000)
                retry_ms = int(max(r.retry_after_seconds, 0.001) * 1000)
                row.in_progress_until_ms = min(now + retry_ms, end)
                self._reschedule(w, row, row.in_progress_until_ms)
                return False
            row.unknown_answers += 1
            spent = self._spent(row, now)
            if spent:
                self.discard(w, row, spent)
            else:
                w.put("txn", codec.txn_key(row.seq), codec.encode_txn(row))
            return False
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
        return False

    def _late_answer(self, w: OpWrites, row: TxnRow, r: CheckReport) -> bool:
        """An answer on a claim that is no longer current (the answer timeout passed, the
        check was claimed again, the checker restarted) or on none (it reached another
        checker). COMMIT/ROLLBACK decide a transaction nobody decided yet, and are accepted
        as they are by one decided the same way; one decided otherwise refuses them. Nothing
        is spent; a late UNKNOWN or IN_PROGRESS changes nothing. True when it decided."""
        if r.producer_group and r.producer_group != row.producer_group:
            raise InvalidFieldError("producer_group", f"{r.producer_group!r} is not the group of "
                                                      f"{self.txn_id(row.seq)}")
        if not r.claim_token and not r.producer_group:
            raise InvalidFieldError("producer_group", "an answer without a claim token must name the "
                                                      "transaction's group")
        if r.result not in (CHECK_COMMIT, CHECK_ROLLBACK):
            return False
        target = STATE_COMMITTED if r.result == CHECK_COMMIT else STATE_ROLLED_BACK
        if row.state in (STATE_PREPARED, STATE_DISCARDED):
            row.checks_answered += 1
            self._decide(w, row, target, codec.SOURCE_CHECK)
            return True
        if row.state != target:
            raise TransactionStateError(self.txn_id(row.seq), STATE_NAMES[row.state],
                                        RESOLUTION_COMMIT if r.result == CHECK_COMMIT else RESOLUTION_ROLLBACK)
        return False

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

    # --- consumers -----------------------------------------------------------------------

    def receive_op(self, group: str, topic: str, queue_id: int, tags: frozenset[str] | None,
                   max_messages: int, invisible_seconds: float) -> Callable[[OpWrites], ReceiveResult]:
        cfg = self.config
        validate_group("consumer_group", group)
        validate_receive_topic(topic)
        count = self.topics.get(topic)
        if count is None:
            raise TopicNotFoundError(topic)
        if queue_id >= count or queue_id < -1:
            raise QueueNotFoundError(topic, queue_id)
        if max_messages <= 0:
            raise InvalidFieldError("max_messages", "must be positive")
        max_messages = min(max_messages, cfg.max_receive_batch)
        if invisible_seconds == 0:
            invisible_seconds = cfg.default_invisible_duration_seconds
        if not 0 < invisible_seconds <= cfg.max_invisible_duration_seconds:
            raise InvalidFieldError("invisible_duration_seconds",
                                    f"{invisible_seconds} is outside (0, max_invisible_duration_seconds="
                                    f"{cfg.max_invisible_duration_seconds}]")
        invisible_ms = int(max(invisible_seconds, cfg.min_invisible_duration_seconds) * 1000)
        queues = [queue_id] if queue_id >= 0 else list(range(count))
        if len(queues) > 1:
            start = self._random.randrange(len(queues))
            queues = queues[start:] + queues[:start]

        def op(w: OpWrites) -> ReceiveResult:
            w.sync = False  # a lost receive only means an earlier redelivery
            now = self.clock()
            out: list[Delivery] = []
            next_deadline: int | None = None
            for q in queues:
                cursor = self._cursor(w, group, topic, q)
                if len(out) < max_messages:
                    self._redeliver(w, group, topic, q, cursor, now, invisible_ms, max_messages, out)
                if len(out) < max_messages:
                    self._deliver_new(w, group, topic, q, cursor, now, invisible_ms, tags, max_messages, out)
                d = cursor.next_deadline_ms()
                if d is not None and (next_deadline is None or d < next_deadline):
                    next_deadline = d
            return ReceiveResult(out, next_deadline)
        return op

    def _cursor(self, w: OpWrites, group: str, topic: str, q: int) -> Cursor:
        cursor = self.consumers.get(group, topic, q)
        if cursor is None:
            first = self.db.first_key("cq", codec.queue_prefix(topic, q))
            start = codec.split_cq_key(first)[2] if first else self.queue_next.get((topic, q), 0)
            cursor = Cursor(start)
            self.consumers.cursors[(group, topic, q)] = cursor
            w.put("consumers", codec.consumer_key(group, topic, q), codec.encode_u64(start))
        return cursor

    def _redeliver(self, w: OpWrites, group: str, topic: str, q: int, cursor: Cursor, now: int,
                   invisible_ms: int, limit: int, out: list[Delivery]) -> None:
        expired = cursor.pop_expired(now)
        for i, (offset, entry) in enumerate(expired):
            if len(out) >= limit:
                for rest_offset, rest in expired[i:]:
                    cursor.push_back(rest_offset, rest)
                return
            key = codec.inflight_key(group, topic, q, offset)
            value = self.db.get("cq", codec.cq_key(topic, q, offset))
            if value is None:  # expired by retention: nothing left to deliver
                del cursor.inflight[offset]
                w.delete("inflight", key)
                continue
            cq = codec.decode_cq_entry(value)
            if entry.attempt >= self.config.max_delivery_attempts:
                self._to_dlq(w, group, cq)
                del cursor.inflight[offset]
                w.delete("inflight", key)
                continue
            attempt = entry.attempt + 1
            cursor.track(offset, attempt, now + invisible_ms)
            w.put("inflight", key, codec.encode_inflight(attempt, now + invisible_ms))
            out.append(Delivery(topic, q, offset, cq.log_seq, attempt, now + invisible_ms, cq.visible_ms,
                                self.receipt(topic, q, offset, attempt)))

    def _to_dlq(self, w: OpWrites, group: str, cq: CqEntry) -> None:
        topic = dlq_topic(group)
        self._ensure_topic(w, topic, 1)
        offset = self.queue_next[(topic, 0)]
        w.put("cq", codec.cq_key(topic, 0, offset), codec.encode_cq_entry(
            CqEntry(cq.log_seq, self.clock(), cq.tag)))
        self.queue_next[(topic, 0)] = offset + 1
        w.on_durable(lambda: self._notify_visible(topic))

    def _deliver_new(self, w: OpWrites, group: str, topic: str, q: int, cursor: Cursor, now: int,
                     invisible_ms: int, tags: frozenset[str] | None, limit: int,
                     out: list[Delivery]) -> None:
        end = self.queue_next.get((topic, q), 0)
        start = cursor.next_offset
        if start >= end:
            return
        offset = start
        for key, value in self.db.scan("cq", codec.cq_key(topic, q, start), codec.cq_key(topic, q, end)):
            if len(out) >= limit:
                break
            o = codec.split_cq_key(key)[2]
            cq = codec.decode_cq_entry(value, key)
            offset = o + 1
            if tags is not None and cq.tag not in tags:
                continue  # filtered out: never delivered to this group
            deadline = now + invisible_ms
            cursor.track(o, 1, deadline)
            w.put("inflight", codec.inflight_key(group, topic, q, o), codec.encode_inflight(1, deadline))
            out.append(Delivery(topic, q, o, cq.log_seq, 1, deadline, cq.visible_ms,
                                self.receipt(topic, q, o, 1)))
        if offset != start:
            cursor.next_offset = offset
            w.put("consumers", codec.consumer_key(group, topic, q), codec.encode_u64(offset))

    def ack_op(self, group: str, topic: str, handles: list[str],
               ) -> Callable[[OpWrites], list[Exception | None]]:
        validate_group("consumer_group", group)
        parsed: list[ReceiptHandle | Exception] = []
        for text in handles:
            try:
                handle = self.parse_receipt(text)
                if topic and handle.topic != topic:
                    raise InvalidFieldError("topic", f"receipt handle is for topic {handle.topic!r}")
                parsed.append(handle)
            except Exception as exc:  # noqa: BLE001 - reported per entry
                parsed.append(exc)

        def op(w: OpWrites) -> list[Exception | None]:
            w.sync = False  # a lost ack only means a redelivery (at least once)
            results: list[Exception | None] = []
            for text, handle in zip(handles, parsed):
                if isinstance(handle, Exception):
                    results.append(handle)
                    continue
                cursor = self.consumers.get(group, handle.topic, handle.queue_id)
                entry = cursor.inflight.get(handle.offset) if cursor else None
                if cursor is None or entry is None or entry.attempt != handle.attempt:
                    results.append(ReceiptHandleNotFoundError(text))
                    continue
                del cursor.inflight[handle.offset]
                w.delete("inflight", codec.inflight_key(group, handle.topic, handle.queue_id, handle.offset))
                results.append(None)
            return results
        return op

    def change_invisible_op(self, group: str, topic: str, handle_text: str, seconds: float,
                            ) -> Callable[[OpWrites], tuple[str, int]]:
        validate_group("consumer_group", group)
        handle = self.parse_receipt(handle_text)
        cfg = self.config
        if not 0 <= seconds <= cfg.max_invisible_duration_seconds:
            raise InvalidFieldError("invisible_duration_seconds",
                                    f"{seconds} is outside 0..max_invisible_duration_seconds="
                                    f"{cfg.max_invisible_duration_seconds}")
        delay_ms = int(max(seconds, cfg.min_invisible_duration_seconds) * 1000)

        def op(w: OpWrites) -> tuple[str, int]:
            w.sync = False
            cursor = self.consumers.get(group, handle.topic, handle.queue_id)
            entry = cursor.inflight.get(handle.offset) if cursor else None
            if cursor is None or entry is None or entry.attempt != handle.attempt:
                raise ReceiptHandleNotFoundError(handle_text)
            deadline = self.clock() + delay_ms
            cursor.track(handle.offset, entry.attempt, deadline)
            w.put("inflight", codec.inflight_key(group, handle.topic, handle.queue_id, handle.offset),
                  codec.encode_inflight(entry.attempt, deadline))
            topic_ = handle.topic
            w.on_durable(lambda: self._notify_visible(topic_))
            return self.receipt(handle.topic, handle.queue_id, handle.offset, entry.attempt), deadline
        return op

    def queue_offsets(self, topic: str) -> list[tuple[int, int, int]]:
        """(queue, oldest retained offset, next offset) for each queue of ``topic``."""
        validate_receive_topic(topic)
        count = self.topics.get(topic)
        if count is None:
            raise TopicNotFoundError(topic)
        out = []
        for q in range(count):
            first = self.db.first_key("cq", codec.queue_prefix(topic, q))
            end = self.queue_next.get((topic, q), 0)
            out.append((q, codec.split_cq_key(first)[2] if first else end, end))
        return out

    def read_queue(self, topic: str, queue_id: int, start: int, end: int, limit: int,
                   ) -> tuple[list[tuple[int, CqEntry]], int]:
        """Committed entries of one queue from ``start`` (by offset, touching no group);
        returns them and the offset to continue from."""
        validate_receive_topic(topic)
        count = self.topics.get(topic)
        if count is None:
            raise TopicNotFoundError(topic)
        if not 0 <= queue_id < count:
            raise QueueNotFoundError(topic, queue_id)
        if start < 0 or end < 0:
            raise InvalidFieldError("start_offset/end_offset", "must not be negative")
        if limit <= 0:
            raise InvalidFieldError("max_messages", "must be positive")
        limit = min(limit, self.config.max_receive_batch * 4)
        stop = self.queue_next.get((topic, queue_id), 0)
        if end:
            stop = min(stop, end)
        entries: list[tuple[int, CqEntry]] = []
        next_offset = start
        if start < stop:
            for key, value in self.db.scan("cq", codec.cq_key(topic, queue_id, start),
                                           codec.cq_key(topic, queue_id, stop)):
                if len(entries) >= limit:
                    break
                offset = codec.split_cq_key(key)[2]
                entries.append((offset, codec.decode_cq_entry(value, key)))
                next_offset = offset + 1
            else:
                next_offset = max(next_offset, stop)
        return entries, next_offset

    def dead_letter_op(self, group: str, topic: str, handle_text: str) -> Callable[[OpWrites], tuple[str, int]]:
        """Moves one in-flight delivery to %DLQ%<group> now (the consumer gave up on it)."""
        validate_group("consumer_group", group)
        handle = self.parse_receipt(handle_text)
        if topic and handle.topic != topic:
            raise InvalidFieldError("topic", f"receipt handle is for topic {handle.topic!r}")

        def op(w: OpWrites) -> tuple[str, int]:
            cursor = self.consumers.get(group, handle.topic, handle.queue_id)
            entry = cursor.inflight.get(handle.offset) if cursor else None
            if cursor is None or entry is None or entry.attempt != handle.attempt:
                raise ReceiptHandleNotFoundError(handle_text)
            value = self.db.get("cq", codec.cq_key(handle.topic, handle.queue_id, handle.offset))
            if value is None:
                raise ReceiptHandleNotFoundError(handle_text)  # expired by retention
            dlq = dlq_topic(group)
            self._ensure_topic(w, dlq, 1)
            offset = self.queue_next[(dlq, 0)]
            self._to_dlq(w, group, codec.decode_cq_entry(value))
            del cursor.inflight[handle.offset]
            w.delete("inflight", codec.inflight_key(group, handle.topic, handle.queue_id, handle.offset))
            return dlq, offset
        return op

    def last_txn_id(self) -> str:
        key = self.db.last_key("txn")
        return self.txn_id(codec.log_seq(key)) if key else ""

    def read_message(self, seq: int) -> LogRecord | None:
        value = self.db.get("log", codec.log_key(seq))
        return codec.decode_log_record(value, codec.log_key(seq)) if value is not None else None

    # --- retention -----------------------------------------------------------------------

    def retention_op(self, max_records: int = 10_000) -> Callable[[OpWrites], dict[str, int]]:
        def op(w: OpWrites) -> dict[str, int]:
            w.sync = False
            now = self.clock()
            stats = {"dedup_expired": 0, "records_deleted": 0}
            for key, _ in self.db.scan("dedup_exp", b"", codec.expiry_key(now, "")):
                if stats["dedup_expired"] >= max_records:
                    break
                _t, mid = codec.split_expiry_key(key)
                w.delete("dedup_exp", key)
                w.delete("dedup", mid.encode())
                stats["dedup_expired"] += 1
            cutoff = now - int(self.config.retention_seconds * 1000)
            max_deleted = 0
            scanned = 0
            for key, value in self.db.scan("log"):
                scanned += 1
                if scanned > max_records:
                    break
                record = codec.decode_log_record(value, key)
                if record.stored_ms >= cutoff:
                    break
                seq = codec.log_seq(key)
                if not self._expirable(w, seq, record):
                    continue
                w.delete("log", key)
                max_deleted = max(max_deleted, seq)
                stats["records_deleted"] += 1
            if max_deleted:
                w.put("meta", b"seq_floor", codec.encode_u64(max(max_deleted + 1, self.next_seq)))
            return stats
        return op

    def _expirable(self, w: OpWrites, seq: int, record: LogRecord) -> bool:
        """Stages the removal of a record's queue entry and row when no one needs it."""
        if record.kind == codec.KIND_NORMAL:
            topic, queue_id, offset = record.topic, record.queue_id, record.queue_offset
        else:
            row = self._read_txn(seq)
            if row is not None and row.state in (STATE_PREPARED, STATE_DISCARDED):
                return False
            if row is not None and row.state == STATE_COMMITTED:
                topic, queue_id, offset = row.topic, row.queue_id, row.queue_offset
            else:
                w.delete("txn", codec.txn_key(seq))
                return True
        if offset >= self.queue_next.get((topic, queue_id), 0) - 1:
            return False  # the newest entry of a queue stays: it carries the next offset
        for cursor in self.consumers.groups_of(topic, queue_id):
            if cursor.ack_offset() <= offset:
                return False
        w.delete("cq", codec.cq_key(topic, queue_id, offset))
        if record.kind == codec.KIND_HALF:
            w.delete("txn", codec.txn_key(seq))
        return True

    # --- queries (any thread; committed state) -------------------------------------------

    def get_txn(self, transaction_id: str) -> TxnRow:
        seq = self.parse_txn_id(transaction_id)
        value = self.db.get("txn", codec.txn_key(seq))
        if value is None:
            raise TransactionNotFoundError(transaction_id)
        return codec.decode_txn(value, codec.txn_key(seq))

    def query_txns(self, group: str, state: int, older_than_seconds: float, limit: int,
                   page_token: str) -> tuple[list[TxnRow], str]:
        if group:
            validate_name("producer_group", group)
        limit = min(limit if limit > 0 else 100, 10_000)
        now = self.clock()
        max_prepared = now - int(older_than_seconds * 1000) if older_than_seconds > 0 else None
        rows: list[TxnRow] = []
        after = self.parse_txn_id(page_token) if page_token else 0
        if group and state == STATE_PREPARED:
            upper = codec.group_time_key(group, (max_prepared if max_prepared is not None else now) + 1, 0)
            start = codec.group_time_key(group, self._pending_floor.get(group, 0), 0)
            source: Iterable[int] = (codec.split_group_time_key(k)[2]
                                     for k, _ in self.db.scan("pending", start, upper))
        else:
            source = (codec.log_seq(k) for k, _ in self.db.scan("txn", codec.txn_key(after + 1)))
        for seq in source:
            if seq <= after and not (group and state == STATE_PREPARED):
                continue
            value = self.db.get("txn", codec.txn_key(seq))
            if value is None:
                continue
            row = codec.decode_txn(value, codec.txn_key(seq))
            if group and row.producer_group != group:
                continue
            if state and row.state != state:
                continue
            if max_prepared is not None and row.prepared_ms > max_prepared:
                continue
            if group and state == STATE_PREPARED and seq <= after:
                continue
            rows.append(row)
            if len(rows) >= limit:
                return rows, self.txn_id(seq)
        return rows, ""

    def oldest_due_ms(self, group: str) -> int | None:
        return self._first_time("due", group, self._due_floor.get(group, NO_DUE_MS))

    def oldest_pending_ms(self, group: str) -> int | None:
        found = self._first_time("pending", group, self._pending_floor.get(group, 0))
        if found is not None:
            self._pending_floor[group] = found  # nothing older remains: start there next time
        return found

    def _first_time(self, cf: str, group: str, floor: int) -> int | None:
        start = codec.group_time_key(group, floor, 0)
        for key, _ in self.db.scan(cf, start, codec.group_time_key(group, 2**63, 0)):
            return codec.split_group_time_key(key)[1]
        return None

    def recount(self) -> dict[str, tuple[int, int]]:
        """(pending, discarded) per group from the transaction table: what the counters
        must equal."""
        out: dict[str, list[int]] = {}
        for key, value in self.db.scan("txn"):
            row = codec.decode_txn(value, key)
            counts = out.setdefault(row.producer_group, [0, 0])
            if row.state == STATE_PREPARED:
                counts[0] += 1
            elif row.state == STATE_DISCARDED:
                counts[1] += 1
        return {g: (c[0], c[1]) for g, c in out.items()}


def _target(resolution: str) -> int:
    return STATE_COMMITTED if resolution == RESOLUTION_COMMIT else STATE_ROLLED_BACK

