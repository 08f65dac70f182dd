"""Consumer groups as an operator sees them: each group's position, lag, in-flight and
retrying deliveries per queue, its dead letters, and giving dead letters back to it.

Functions over a :class:`~services.broker.core.BrokerCore` (its consumer cursors, queues
and store): the reads stage nothing; :func:`return_dead_letters_op`
is an operation run through the store bridge like any write.

Re-driving a dead letter gives it back to **its group alone**: the message's original
position (topic, queue, offset) becomes an in-flight delivery of the group again with
attempt 0, due now, so the group's next receive delivers it (attempt 1) and the other
groups of the topic see nothing. Its entry in ``%DLQ%<group>`` is overwritten with a
tombstone (an entry naming no record, which readers skip), so queue offsets stay
contiguous and the DLQ's next offset survives a restart.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from txmq.names import DLQ_PREFIX, dlq_topic, validate_group, validate_receive_topic

from .consumers import Position
from .core import BrokerCore
from .model import KIND_HALF
from .store import codec
from .store.codec import CqEntry
from .store.db import Database, OpWrites

#: A DLQ entry that was re-driven: it names no commit-log record (sequences start at 1).
TOMBSTONE_SEQ = 0


@dataclass(frozen=True, slots=True)
class QueueStatus:
    group: str
    topic: str
    queue_id: int
    ack_offset: int
    next_offset: int
    max_offset: int
    lag_messages: int
    lag_seconds: float
    inflight: int
    retrying: int


@dataclass(frozen=True, slots=True)
class Returned:
    redriven: list[str]
    not_found: list[str]
    expired: list[str]


#: Dead letters of one group counted at most (a metrics scrape reads them all).
MAX_DEAD_COUNTED = 100_000


def describe_groups(core: BrokerCore, group: str = "", topic: str = "", max_dead: int = MAX_DEAD_COUNTED,
                    ) -> tuple[list[QueueStatus], dict[str, int]]:
    """Every (group, topic, queue) position on this broker matching the filters, and the
    number of dead letters (not re-driven, counted up to ``max_dead``) per group. On the
    event loop (another thread uses :func:`describe_positions` on a snapshot)."""
    if group:
        validate_group("consumer_group", group)
    if topic:
        validate_receive_topic(topic)
    queues = core.queues
    return describe_positions(core.db, core.consumers.positions(), queues.topics, queues.queue_next, core.clock(),
                              group, topic, max_dead)


def describe_positions(db: Database, positions: Iterable[Position], topics: Iterable[str],
                       queue_next: Mapping[tuple[str, int], int], now: int, group: str = "", topic: str = "",
                       max_dead: int = MAX_DEAD_COUNTED) -> tuple[list[QueueStatus], dict[str, int]]:
    """:func:`describe_groups` from copies of the positions, topics and queue ends (the
    store is only read, so any thread may call it)."""
    out = []
    for p in positions:
        if (group and p.group != group) or (topic and p.topic != topic):
            continue
        end = queue_next.get((p.topic, p.queue_id), 0)
        out.append(QueueStatus(
            p.group, p.topic, p.queue_id, p.ack_offset, p.next_offset, end, max(end - p.ack_offset, 0),
            _oldest_unacked_age(db, p.topic, p.queue_id, p.ack_offset, end, now), p.inflight, p.retrying))
    dead = {}
    for name in topics:
        if not name.startswith(DLQ_PREFIX):
            continue
        g = name[len(DLQ_PREFIX):]
        if group and g != group:
            continue
        dead[g] = sum(1 for _ in itertools.islice(_dead_letters(db, queue_next, g), max_dead))
    return out, dead


def count_dead_letters(core: BrokerCore, group: str, max_dead: int = MAX_DEAD_COUNTED) -> int:
    """The group's dead letters here not re-driven (counted up to ``max_dead``)."""
    return sum(1 for _ in itertools.islice(_dead_letters(core.db, core.queues.queue_next, group), max_dead))


def _oldest_unacked_age(db: Database, topic: str, q: int, ack: int, end: int, now: int) -> float:
    if ack >= end:
        return 0.0
    for _key, value in db.scan("cq", codec.cq_key(topic, q, ack), codec.cq_key(topic, q, end)):
        return max(now - codec.decode_cq_entry(value).visible_ms, 0) / 1000
    return 0.0


def _dead_letters(db: Database, queue_next: Mapping[tuple[str, int], int], group: str,
                  ) -> Iterable[tuple[int, CqEntry]]:
    """(DLQ offset, entry) of the group's dead letters not re-driven yet."""
    topic = dlq_topic(group)
    if (topic, 0) not in queue_next:
        return
    end = queue_next[(topic, 0)]
    for key, value in db.scan("cq", codec.cq_key(topic, 0, 0), codec.cq_key(topic, 0, end)):
        entry = codec.decode_cq_entry(value, key)
        if entry.log_seq != TOMBSTONE_SEQ:
            yield codec.split_cq_key(key)[2], entry


def return_dead_letters_op(core: BrokerCore, group: str, message_ids: list[str], every: bool,
                           ) -> Callable[[OpWrites], Returned]:
    """Gives the group's dead letters named by ``message_ids`` (all with ``every``) back
    to the group (see the module docstring)."""
    validate_group("consumer_group", group)
    wanted = set(message_ids)

    def op(w: OpWrites) -> Returned:
        now = core.clock()
        dlq = dlq_topic(group)
        redriven: list[str] = []
        expired: list[str] = []
        woken: set[str] = set()
        for dlq_offset, entry in list(_dead_letters(core.db, core.queues.queue_next, group)):
            record = core.read_message(entry.log_seq)
            message_id = record.message_id if record is not None else f"{dlq}@{dlq_offset}"
            if not every and message_id not in wanted:
                continue
            position = _original_position(core, entry.log_seq, record)
            tombstone = codec.encode_cq_entry(CqEntry(TOMBSTONE_SEQ, entry.visible_ms, ""))
            if position is None or core.db.get("cq", codec.cq_key(*position)) is None:
                w.put("cq", codec.cq_key(dlq, 0, dlq_offset), tombstone)
                expired.append(message_id)
                continue
            topic, q, offset = position
            cursor = core.deliveries.cursor(w, group, topic, q)  # created as a receive would
            if offset not in cursor.inflight:
                cursor.settled.discard(offset)  # a FIFO topic's dead letter past the cursor
                attempt = cursor.first_attempt(offset) - 1  # 0, or a delivery a reset revoked
                cursor.track(offset, attempt, now)
                w.put("inflight", codec.inflight_key(group, topic, q, offset), codec.encode_inflight(attempt, now))
            w.put("cq", codec.cq_key(dlq, 0, dlq_offset), tombstone)
            redriven.append(message_id)
            woken.add(topic)
        for topic in woken:
            w.on_durable(functools.partial(core.listeners.notify_visible, topic))  # wakes long polls
        found = set(redriven) | set(expired)
        return Returned(redriven, sorted(wanted - found) if not every else [], expired)
    return op


def _original_position(core: BrokerCore, seq: int, record: codec.LogRecord | None) -> tuple[str, int, int] | None:
    """Where a dead-lettered message sits in the topic it was sent to."""
    if record is None:
        return None
    if record.kind == KIND_HALF:
        row = core.ctx.read_txn(seq)  # the committed transaction's queue offset
        if row is None or row.queue_offset < 0:
            return None
        return row.topic, row.queue_id, row.queue_offset
    return record.topic, record.queue_id, record.queue_offset
