"""The transaction state machine: a half message prepares a transaction (PREPARED, due
for its first check); it is decided (PREPARED or DISCARDED → COMMITTED or ROLLED_BACK) by
its producer, a check answer or an operator, first decision wins; one whose checks are
spent is discarded to ``%DISCARD%<group>``, where it can still be decided. A commit makes
the message visible in its queue in the same batch.

Every decision passes :meth:`Transactions.decide` and every discard
:meth:`Transactions.discard`, whoever makes it (an EndTransaction, a check report, a
global transaction deciding its parts); what must happen with them elsewhere is a hook
(``on_decide``, ``on_discard``) called in the same batch, after the row's own writes. An
EndTransaction is first put to the ``end_guards``, which may refuse it.

Also here, as they move in the same batches: the per-group counters (pending, discarded)
and the ``pending`` index of PREPARED transactions by age, with its in-memory floor.
"""

from __future__ import annotations

from typing import Callable

from txmq.errors import InvalidFieldError, TransactionNotFoundError, TransactionStateError
from txmq.fifo import message_group_hash
from txmq.names import discard_topic

from .base import BrokerContext, first_time
from .model import (RESOLUTION_COMMIT, RESOLUTION_ROLLBACK, RESOLUTION_UNKNOWN, STATE_COMMITTED,
                    STATE_DISCARDED, STATE_NAMES, STATE_PREPARED, STATE_ROLLED_BACK, EndResult)
from .queues import Queues
from .schedule import CheckSchedule
from .store import codec
from .store.codec import CqEntry, LogRecord, TxnRow
from .store.db import OpWrites
from .timers import Timers

#: A decision made: (the batch, the row as decided, the state it was in before, source).
DecideHook = Callable[[OpWrites, TxnRow, int, int], None]
#: A discard made: (the batch, the row as discarded, the reason).
DiscardHook = Callable[[OpWrites, TxnRow, str], None]
#: An EndTransaction about to run: (transaction id, its seq, the resolution); raises to refuse.
EndGuard = Callable[[str, int, str], None]


class Transactions:
    """Prepare, end, decide, discard; the counters and the pending index."""

    def __init__(self, ctx: BrokerContext, queues: Queues, schedule: CheckSchedule, timers: Timers) -> None:
        self.ctx = ctx
        self.queues = queues
        self.schedule = schedule
        self.timers = timers
        #: Producer group → [pending, discarded], moved in the batch that moves them.
        self.counters: dict[str, list[int]] = {
            key.decode(): list(codec.decode_counters(value, key)) for key, value in ctx.db.scan("counters")}
        #: Per group, a time below which the pending index holds no key.
        self._pending_floor: dict[str, int] = {}
        #: Counters rows deleted so far (a producer group's deletion): with their number it
        #: versions the groups' names (``quotas.py``).
        self.groups_removed = 0
        self.on_decide: list[DecideHook] = []
        self.on_discard: list[DiscardHook] = []
        self.end_guards: list[EndGuard] = []

    # --- prepare ---------------------------------------------------------------------------

    def prepare(self, w: OpWrites, record: LogRecord, seq: int, now: int, *, checked: bool = True) -> TxnRow:
        """Stages a half message and its PREPARED row, due for its first check after the
        message's check immunity or ``transaction_timeout_seconds`` (``checked`` False: no
        check schedule, a part of a global transaction, asked about only as its whole)."""
        delay = record.check_immunity_seconds or self.ctx.config.transaction_timeout_seconds
        row = TxnRow(seq=seq, state=STATE_PREPARED, producer_group=record.producer_group,
                     producer_client_id=record.producer_client_id, topic=record.topic,
                     queue_id=record.queue_id, message_id=record.message_id, prepared_ms=now,
                     next_due_ms=now + int(delay * 1000) if checked else 0, body_size=len(record.body))
        group = row.producer_group
        w.put("log", codec.log_key(seq), codec.encode_log_record(record))
        w.put("txn", codec.txn_key(seq), codec.encode_txn(row))
        if checked:
            self.schedule.put(w, group, row.next_due_ms, seq)
        w.put("pending", codec.group_time_key(group, now, seq), b"")
        self._pending_floor[group] = min(self._pending_floor.get(group, 0), now)
        w.put("dedup", record.message_id.encode(), codec.encode_dedup(codec.DedupEntry(codec.DEDUP_TXN, seq)))
        self._count(w, group, pending=+1)
        return row

    # --- end -------------------------------------------------------------------------------

    def end_op(self, transaction_id: str, resolution: str, source: int, *, message_id: str = "",
               producer_group: str = "", operator: str = "", reason: str = "",
               ) -> Callable[[OpWrites], EndResult]:
        seq = self.ctx.parse_txn_id(transaction_id)
        if resolution not in (RESOLUTION_COMMIT, RESOLUTION_ROLLBACK, RESOLUTION_UNKNOWN):
            raise InvalidFieldError("resolution", "must be COMMIT, ROLLBACK or UNKNOWN")
        if source not in (codec.SOURCE_CLIENT, codec.SOURCE_CHECK, codec.SOURCE_OPERATOR):
            raise InvalidFieldError("source", "must be CLIENT, CHECK or OPERATOR")
        if source == codec.SOURCE_OPERATOR and resolution != RESOLUTION_UNKNOWN and not operator:
            raise InvalidFieldError("operator", "an operator decision must say who decides")
        if len(operator.encode()) > 255 or len(reason.encode()) > 4096:
            raise InvalidFieldError("operator/reason", "operator ≤ 255 bytes, reason ≤ 4096 bytes")

        def op(w: OpWrites) -> EndResult:
            for guard in self.end_guards:
                guard(transaction_id, seq, resolution)
            row = self.ctx.read_txn(seq)
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
                return self.end_result(row)
            if row.state in (STATE_COMMITTED, STATE_ROLLED_BACK):
                raise TransactionStateError(transaction_id, STATE_NAMES[row.state], resolution)
            self.decide(w, row, _target(resolution), source, operator=operator, reason=reason)
            return self.end_result(row)
        return op

    def end_result(self, row: TxnRow) -> EndResult:
        return EndResult(self.ctx.txn_id(row.seq), row.state, row.source, row.ended_ms, row.queue_offset)

    # --- decide and discard ----------------------------------------------------------------

    def decide(self, w: OpWrites, row: TxnRow, state: int, source: int, *, operator: str = "",
               reason: str = "") -> None:
        """PREPARED|DISCARDED → COMMITTED|ROLLED_BACK, in the caller's batch; then the
        ``on_decide`` hooks."""
        ctx = self.ctx
        now = ctx.clock()
        was = row.state
        if was == STATE_PREPARED:
            self._unindex(w, row)
        if state == STATE_COMMITTED:
            tag, deliver_at, message_group, keys = self._visibility_of(row.seq)
            if deliver_at > now:  # a timer message: visible at its delivery time
                self.timers.schedule(w, deliver_at, row.seq)
            else:
                topic = row.topic
                row.queue_offset = self.queues.append(
                    w, topic, row.queue_id, CqEntry(row.seq, now, tag, message_group_hash(message_group)), keys)
                w.on_durable(lambda: ctx.listeners.notify_visible(topic))
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
        ctx.expire_dedup(w, now, row.message_id)
        self._count(w, row.producer_group, pending=-1 if was == STATE_PREPARED else 0,
                    discarded=-1 if was == STATE_DISCARDED else 0)
        group = row.producer_group
        w.on_durable(lambda: ctx.listeners.notify_end(group, state, source))
        for hook in self.on_decide:
            hook(w, row, was, source)

    def discard(self, w: OpWrites, row: TxnRow, reason: str) -> None:
        """PREPARED → DISCARDED: the message goes to %DISCARD%<group>; it can still be
        decided. Then the ``on_discard`` hooks."""
        ctx = self.ctx
        now = ctx.clock()
        topic = discard_topic(row.producer_group)
        self.queues.ensure_topic(w, topic, 1)
        self._unindex(w, row)
        self.queues.append(w, topic, 0, CqEntry(row.seq, now, self._tag_of(row.seq)))
        row.state = STATE_DISCARDED
        row.source = codec.SOURCE_BROKER
        row.discarded_ms = now
        row.discard_reason = reason
        row.next_due_ms = 0  # the claim token stays: a late answer from the group still counts
        w.put("txn", codec.txn_key(row.seq), codec.encode_txn(row))
        self._count(w, row.producer_group, pending=-1, discarded=+1)
        group = row.producer_group
        w.on_durable(lambda: ctx.listeners.notify_visible(topic))
        w.on_durable(lambda: ctx.listeners.notify_discard(group))
        for hook in self.on_discard:
            hook(w, row, reason)

    def _unindex(self, w: OpWrites, row: TxnRow) -> None:
        """A PREPARED row leaves the due and pending indexes."""
        self.schedule.remove(w, row)
        w.delete("pending", codec.group_time_key(row.producer_group, row.prepared_ms, row.seq))

    def _count(self, w: OpWrites, group: str, pending: int = 0, discarded: int = 0) -> None:
        counts = self.counters.setdefault(group, [0, 0])
        counts[0] += pending
        counts[1] += discarded
        w.put("counters", group.encode(), codec.encode_counters(counts[0], counts[1]))

    def forget_group(self, w: OpWrites, group: str) -> None:
        """Stages the deletion of a producer group's counters row (``producerdelete.py``,
        which refuses it while the group has a transaction not ended)."""
        if self.counters.pop(group, None) is not None:
            w.delete("counters", group.encode())
            self.groups_removed += 1
        self._pending_floor.pop(group, None)

    def _tag_of(self, seq: int) -> str:
        value = self.ctx.db.get("log", codec.log_key(seq))
        return codec.decode_log_tag(value, codec.log_key(seq)) if value is not None else ""

    def _visibility_of(self, seq: int) -> tuple[str, int, str, tuple[str, ...]]:
        """The tag, delivery time (0: at once), message group and keys of a message in the log."""
        value = self.ctx.db.get("log", codec.log_key(seq))
        return codec.decode_log_routing_keys(value, codec.log_key(seq)) if value is not None else ("", 0, "", ())

    # --- the pending index -----------------------------------------------------------------

    def pending_floor(self, group: str) -> int:
        """A time below which the group's pending index holds no key (0: unknown)."""
        return self._pending_floor.get(group, 0)

    def oldest_pending_ms(self, group: str) -> int | None:
        """When the group's oldest PREPARED transaction was prepared (None: there is none).
        On the event loop only: it moves the floor up to what it found."""
        found = first_time(self.ctx.db, "pending", group, self.pending_floor(group))
        if found is not None:
            self._pending_floor[group] = found  # nothing older remains: start there next time
        return found


def _target(resolution: str) -> int:
    return STATE_COMMITTED if resolution == RESOLUTION_COMMIT else STATE_ROLLED_BACK
