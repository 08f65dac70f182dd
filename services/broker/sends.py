"""Sends: a message validated against this broker's topics and limits, then stored — a
normal message into its queue at once (or into the timer index when it has a delivery
time ahead), a half message as a PREPARED transaction (``transactions.py``) — once per
message id: a repeat finds the dedup entry and answers what the first send got.

While free disk is under ``min_free_disk_bytes`` (watched by the server) every send is
refused with RESOURCE_EXHAUSTED before it runs.
"""

from __future__ import annotations

from typing import Callable

from txmq.errors import DiskFullError, TransactionStateError
from txmq.fifo import message_group_hash

from . import ownership, validation
from .base import BrokerContext
from .model import STATE_NAMES, STATE_PREPARED, STATE_ROLLED_BACK, SendResult
from .queues import Queues
from .store import codec
from .store.codec import CqEntry, LogRecord
from .store.db import OpWrites
from .timers import Timers
from .transactions import Transactions


class Sends:
    def __init__(self, ctx: BrokerContext, queues: Queues, transactions: Transactions, timers: Timers) -> None:
        self.ctx = ctx
        self.queues = queues
        self.transactions = transactions
        self.timers = timers
        #: Free disk is under the floor: sends are refused (set by the server's disk watch).
        self.disk_full = False
        self.free_disk_bytes = -1

    def validate_message(self, r: LogRecord) -> LogRecord:
        """See :func:`validation.validate_message` (against this broker's topics)."""
        ctx = self.ctx
        return validation.validate_message(r, ctx.config, self.queues.topics, ctx.name, ctx.clock(),
                                           fifo=r.topic in self.queues.fifo_topics)

    def check_disk(self) -> None:
        if self.disk_full:
            raise DiskFullError(self.free_disk_bytes, self.ctx.config.min_free_disk_bytes)

    def send_op(self, record: LogRecord, *, checked: bool = True) -> Callable[[OpWrites], SendResult]:
        """A normal or half message; ``record`` must have passed :meth:`validate_message`.
        ``checked`` False stores a half message with no check schedule (``globaltx.py``)."""
        self.check_disk()
        ctx = self.ctx

        def op(w: OpWrites) -> SendResult:
            mid_key = record.message_id.encode()
            previous = ctx.db.get("dedup", mid_key)
            if previous is not None:
                return self._duplicate(record, codec.decode_dedup(previous, mid_key))
            now = ctx.clock()
            seq = ctx.sequence.take()
            record.stored_ms = now
            if record.kind == codec.KIND_NORMAL and record.deliver_at_ms > now:  # see timers.py
                self.timers.send_scheduled(w, record, seq)
                return SendResult(record.message_id, record.queue_id, -1)
            if record.kind == codec.KIND_NORMAL:
                topic = record.topic
                offset = self.queues.append(w, topic, record.queue_id, CqEntry(
                    seq, now, record.tag, message_group_hash(record.message_group)), record.keys)
                record.queue_offset = offset
                w.put("log", codec.log_key(seq), codec.encode_log_record(record))
                w.put("dedup", mid_key, codec.encode_dedup(
                    codec.DedupEntry(codec.DEDUP_NORMAL, seq, record.queue_id, offset)))
                ctx.expire_dedup(w, now, record.message_id)
                w.on_durable(lambda: ctx.listeners.notify_stored(topic, codec.KIND_NORMAL))
                w.on_durable(lambda: ctx.listeners.notify_visible(topic))
                return SendResult(record.message_id, record.queue_id, offset)
            self.transactions.prepare(w, record, seq, now, checked=checked)
            w.on_durable(lambda: ctx.listeners.notify_stored(record.topic, codec.KIND_HALF))
            return SendResult(record.message_id, record.queue_id, -1, ctx.txn_id(seq), STATE_PREPARED)
        return op

    def _duplicate(self, record: LogRecord, entry: codec.DedupEntry) -> SendResult:
        # A repeat answers what the first send stored, but only to the same sender: another
        # topic's or producer group's message under this id is not this send's to learn of.
        row = self.ctx.read_txn(entry.seq) if entry.kind != codec.DEDUP_NORMAL else None
        ownership.same_message(record, self.ctx.read_message(entry.seq), row)
        if entry.kind == codec.DEDUP_NORMAL:
            return SendResult(record.message_id, entry.queue_id, entry.queue_offset, duplicate=True)
        if row is not None and row.state == STATE_ROLLED_BACK:
            # A half sent again after its transaction was rolled back (a check answered for
            # an attempt whose answer was lost, then its sender sent it again): told as a
            # success, the sender would run its local transaction and commit a message that
            # can never be delivered. Refused, it runs none.
            raise TransactionStateError(self.ctx.txn_id(entry.seq), STATE_NAMES[row.state],
                                        f"a half message sent again with message id {record.message_id!r}")
        state = row.state if row is not None else STATE_ROLLED_BACK
        return SendResult(record.message_id, row.queue_id if row else record.queue_id,
                          row.queue_offset if row else -1, self.ctx.txn_id(entry.seq), state, duplicate=True)
