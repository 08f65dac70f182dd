"""Retention: expiring deduplication entries and removing commit-log records (with their
queue entries and transaction rows) older than ``retention_seconds`` that nobody needs
any more: no pending or discarded transaction, no consumer group that has not
acknowledged past them, never the newest entry of a queue (it carries the next offset).
"""

from __future__ import annotations

from typing import Callable

from txmq.names import GLOBAL_TRANSACTION_PROPERTY

from .base import BrokerContext
from .consumers import ConsumerGroups
from .model import KIND_HALF, KIND_NORMAL, STATE_COMMITTED, STATE_DISCARDED, STATE_PREPARED
from .queues import Queues
from .store import codec, globalcodec
from .store.codec import LogRecord
from .store.db import OpWrites


class Retention:
    def __init__(self, ctx: BrokerContext, queues: Queues, consumers: ConsumerGroups) -> None:
        self.ctx = ctx
        self.queues = queues
        self.consumers = consumers

    def retention_op(self, max_records: int = 10_000) -> Callable[[OpWrites], dict[str, int]]:
        def op(w: OpWrites) -> dict[str, int]:
            w.sync = False
            ctx = self.ctx
            now = ctx.clock()
            stats = {"dedup_expired": 0, "records_deleted": 0}
            for key, _ in ctx.db.scan("dedup_exp", b"", codec.expiry_key(now, "")):
                if stats["dedup_expired"] >= max_records:
                    break
                _t, mid = codec.split_expiry_key(key)
                w.delete("dedup_exp", key)
                w.delete("dedup", mid.encode())
                stats["dedup_expired"] += 1
            cutoff = now - int(ctx.config.retention_seconds * 1000)
            max_deleted = 0
            scanned = 0
            for key, value in ctx.db.scan("log"):
                scanned += 1
                if scanned > max_records:
                    break
                record = codec.decode_log_record(value, key)
                if record.stored_ms >= cutoff:
                    break
                seq = codec.log_seq(key)
                if not self._expirable(w, seq, record):
                    continue
                gid = record.properties.get(GLOBAL_TRANSACTION_PROPERTY)
                if gid:  # a part of a global transaction: its index row goes with its row
                    w.delete("global", globalcodec.member_key(gid, seq))
                w.delete("log", key)
                max_deleted = max(max_deleted, seq)
                stats["records_deleted"] += 1
            if max_deleted:
                w.put("meta", b"seq_floor", codec.encode_u64(max(max_deleted + 1, ctx.sequence.next)))
            return stats
        return op

    def _expirable(self, w: OpWrites, seq: int, record: LogRecord) -> bool:
        """Stages the removal of a record's queue entry and row when no one needs it."""
        if record.kind == KIND_NORMAL:
            topic, queue_id, offset = record.topic, record.queue_id, record.queue_offset
        else:
            row = self.ctx.read_txn(seq)
            if row is not None and row.state in (STATE_PREPARED, STATE_DISCARDED):
                return False
            if row is not None and row.state == STATE_COMMITTED:
                topic, queue_id, offset = row.topic, row.queue_id, row.queue_offset
            else:
                w.delete("txn", codec.txn_key(seq))
                return True
        if offset < 0:
            return False  # a delay / timer message still waiting for its time (see timers.py)
        if topic not in self.queues.topics:  # deleted (topics.py): its queue entries are gone already
            if record.kind == KIND_HALF:
                w.delete("txn", codec.txn_key(seq))
            return True
        if offset >= self.queues.next_offset(topic, queue_id) - 1:
            return False  # the newest entry of a queue stays: it carries the next offset
        for cursor in self.consumers.groups_of(topic, queue_id):
            if cursor.ack_offset() <= offset:
                return False
        w.delete("cq", codec.cq_key(topic, queue_id, offset))
        self.queues.unindex(w, topic, queue_id, offset, record.keys)
        if record.kind == KIND_HALF:
            w.delete("txn", codec.txn_key(seq))
        return True
