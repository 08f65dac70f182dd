"""The transaction state machine: a transaction is decided (PREPARED or DISCARDED →
COMMITTED or ROLLED_BACK) by its producer, a check answer or an operator, first decision
wins; one whose checks are spent is discarded to ``%DISCARD%<group>``, where it can still
be decided. A commit makes the message visible in its queue in the same batch.
"""

from __future__ import annotations

from typing import Callable

from txmq.errors import InvalidFieldError, TransactionNotFoundError, TransactionStateError
from txmq.fifo import message_group_hash
from txmq.names import discard_topic

from .model import (RESOLUTION_COMMIT, RESOLUTION_ROLLBACK, RESOLUTION_UNKNOWN, STATE_COMMITTED,
                    STATE_DISCARDED, STATE_NAMES, STATE_PREPARED, STATE_ROLLED_BACK, EndResult)
from .schedule import SchedulePart
from .timers import TimersPart
from .store import codec
from .store.codec import CqEntry, TxnRow
from .store.db import OpWrites


class TransactionsPart(SchedulePart, TimersPart):
    """End, decide, discard."""

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
            # Whether the caller may end this group's transaction is decided for every caller,
            # named group or not, by the auth interceptor (ownership.py); here only a group
            # that was named must be the transaction's (also with auth off).
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
            tag, deliver_at, message_group = self._visibility_of(row.seq)
            if deliver_at > now:  # a timer message: visible at its delivery time
                self._schedule(w, deliver_at, row.seq)
            else:
                offset = self.queue_next[(row.topic, row.queue_id)]
                w.put("cq", codec.cq_key(row.topic, row.queue_id, offset),
                      codec.encode_cq_entry(CqEntry(row.seq, now, tag, message_group_hash(message_group))))
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

    def _visibility_of(self, seq: int) -> tuple[str, int, str]:
        """The tag, delivery time (0: at once) and message group of a message in the log."""
        value = self.db.get("log", codec.log_key(seq))
        return codec.decode_log_routing(value, codec.log_key(seq)) if value is not None else ("", 0, "")

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


def _target(resolution: str) -> int:
    return STATE_COMMITTED if resolution == RESOLUTION_COMMIT else STATE_ROLLED_BACK
