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

import collections
import heapq
import logging
import os
import random
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Mapping

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

    # A query of the check schedule (the due index and its floors), so it stays beside it.
    def oldest_due_ms(self, group: str) -> int | None:
        return self._first_time("due", group, self._due_floor.get(group, NO_DUE_MS))


def _target(resolution: str) -> int:
    return STATE_COMMITTED if resolution == RESOLUTION_COMMIT else STATE_ROLLED_BACK
