"""The broker's domain, assembled: ``BrokerCore`` opens the store and holds the shared state,
issues sends and creates topics; the other parts are mixed in from their modules:

- ``base.py``: the shared state, identifiers and small staging helpers every part uses;
- ``model.py``: states, sources, resolutions and kinds as named types, and the results;
- ``schedule.py``: the due index of the checks and its per-group floors;
- ``transactions.py`` (over ``schedule.py``): the state machine (end, decide, discard);
- ``checks.py`` (over ``transactions.py``): check claims and reports, late answers;
- ``globaltx.py`` (over ``checks.py``): multi-message (global) transactions;
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
import logging
import random
from typing import Callable

from txmq.errors import DiskFullError, InvalidFieldError
from txmq.fifo import message_group_hash
from txmq.names import validate_send_topic

from . import idauth, ownership, validation
from .checks import ClaimSession
from .config import BrokerConfig
from .consumers import ConsumerGroups
from .delivery import DeliveryPart
from .globaltx import GlobalPart
from .model import STATE_PREPARED, STATE_ROLLED_BACK, Delivery, EndResult, ReceiveResult, SendResult
from .queries import QueriesPart
from .retention import RetentionPart
from .store import codec
from .store.codec import CqEntry, LogRecord, TxnRow
from .store.db import Database, OpWrites, now_ms
from .validation import parse_tag_filter

# Where they were before the split (tools and tests import them from here).
__all__ = ["BrokerCore", "Delivery", "EndResult", "ReceiveResult", "SendResult", "StoreIdentityError",
           "open_database", "parse_tag_filter"]

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


class BrokerCore(GlobalPart, DeliveryPart, RetentionPart, QueriesPart):
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
        self.fifo_topics: set[str] = set()
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
        # Called (once durable) when a global transaction's push or pull may be due (globaltx.py).
        self.global_listeners: list[Callable[[], None]] = []
        # Called (once durable) when a global transaction coordinated here ends: (result,).
        self.global_outcome_listeners: list[Callable[[str], None]] = []
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
        for key, _value in db.scan("meta", codec.TOPIC_TYPE_PREFIX, codec.TOPIC_TYPE_END):
            self.fifo_topics.add(key[len(codec.TOPIC_TYPE_PREFIX):].decode())
        for topic, count in self.topics.items():
            for q in range(count):
                last_cq = db.last_key("cq", codec.queue_prefix(topic, q))
                self.queue_next[(topic, q)] = codec.split_cq_key(last_cq)[2] + 1 if last_cq else 0
        for key, value in db.scan("counters"):
            self.counters[key.decode()] = list(codec.decode_counters(value, key))
        self.consumers.load(list(db.scan("consumers")), list(db.scan("inflight")))
        self.ids = idauth.open_authority(
            db, self.name, self.store_id, self.next_seq,
            [(g, t, q, o, e.attempt, e.epoch) for (g, t, q), c in self.consumers.cursors.items()
             for o, e in c.inflight.items()], self.clock, self._still_in_flight)
        self._load_due_floors()
        self._load_timers()
        self._load_globals()
        log.info("store opened", extra={"fields": {
            "data_dir": self.config.data_dir, "next_seq": self.next_seq, "topics": len(self.topics),
            "store_id": self.store_id}})

    def _still_in_flight(self, d: idauth.Delivery) -> bool:
        group, topic, queue, offset, attempt, epoch = d
        cursor = self.consumers.get(group, topic, queue)
        entry = cursor.inflight.get(offset) if cursor else None
        return entry is not None and (entry.attempt, entry.epoch) == (attempt, epoch)

    def close(self) -> None:
        self.db.close()

    # --- validation ----------------------------------------------------------------------

    def validate_message(self, r: LogRecord) -> LogRecord:
        """See :func:`validation.validate_message` (against this broker's topics)."""
        return validation.validate_message(r, self.config, self.topics, self.name, self.clock(),
                                           fifo=r.topic in self.fifo_topics)

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
            if record.kind == codec.KIND_NORMAL and record.deliver_at_ms > now:  # see timers.py
                self._send_scheduled(w, record, seq)
                self.next_seq = seq + 1
                return SendResult(record.message_id, record.queue_id, -1)
            if record.kind == codec.KIND_NORMAL:
                offset = self.queue_next[(record.topic, record.queue_id)]
                record.queue_offset = offset
                w.put("log", codec.log_key(seq), codec.encode_log_record(record))
                w.put("cq", codec.cq_key(record.topic, record.queue_id, offset),
                      codec.encode_cq_entry(CqEntry(seq, now, record.tag, message_group_hash(record.message_group))))
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
        # A repeat answers what the first send stored, but only to the same sender: another
        # topic's or producer group's message under this id is not this send's to learn of.
        row = self._read_txn(entry.seq) if entry.kind != codec.DEDUP_NORMAL else None
        ownership.same_message(record, self.read_message(entry.seq), row)
        if entry.kind == codec.DEDUP_NORMAL:
            return SendResult(record.message_id, entry.queue_id, entry.queue_offset, duplicate=True)
        state = row.state if row is not None else STATE_ROLLED_BACK
        return SendResult(record.message_id, row.queue_id if row else record.queue_id,
                          row.queue_offset if row else -1, self.txn_id(entry.seq), state, duplicate=True)

    # --- topics --------------------------------------------------------------------------

    def create_topic_op(self, topic: str, queue_count: int, fifo: bool | None = None) -> Callable[[OpWrites], int]:
        """Creates (or grows) ``topic``; ``fifo`` None keeps the type of an existing topic
        (NORMAL for a new one), and a type other than the existing one is refused."""
        validate_send_topic(topic)
        if not 0 < queue_count <= 1024:
            raise InvalidFieldError("queue_count", f"{queue_count} is outside 1..1024")

        def op(w: OpWrites) -> int:
            exists = topic in self.topics
            if exists and fifo is not None and fifo != (topic in self.fifo_topics):
                raise InvalidFieldError("topic_type", f"topic {topic!r} exists as "
                                        f"{'FIFO' if topic in self.fifo_topics else 'NORMAL'}")
            if not exists and fifo:
                self.fifo_topics.add(topic)
                w.put("meta", codec.topic_type_key(topic), b"")
            self._ensure_topic(w, topic, queue_count)
            return self.topics[topic]
        return op
