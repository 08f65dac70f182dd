"""Deleting a topic's queues on this broker (the operator's ``txmq topic delete``).

A function over a :class:`~services.broker.core.BrokerCore`, kept out of the core, run
through the store bridge like any write: one WriteBatch removes the topic row, every queue
entry, and every consumer group's cursor and in-flight deliveries of the topic; the
in-memory state follows in the same operation. The messages themselves stay in the commit
log until retention removes them (nothing names them any more).

Refused (TOPIC_IN_USE) while a consumer group has a position in the topic, unless forced,
and always while transactions of the topic are pending or discarded (their commit would
need the queue).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from txmq.errors import TopicInUseError, TopicNotFoundError
from txmq.names import validate_send_topic

from .core import BrokerCore
from .model import STATE_DISCARDED, STATE_PREPARED
from .store import codec
from .store.db import OpWrites


@dataclass(frozen=True, slots=True)
class Deleted:
    entries: int
    groups: list[str]


def _undecided(core: BrokerCore, topic: str) -> int:
    """Transactions of ``topic`` still PREPARED or DISCARDED (a scan of the transaction rows)."""
    count = 0
    for key, value in core.db.scan("txn"):
        row = codec.decode_txn(value, key)
        if row.topic == topic and row.state in (STATE_PREPARED, STATE_DISCARDED):
            count += 1
    return count


def delete_topic_op(core: BrokerCore, topic: str, force: bool) -> Callable[[OpWrites], Deleted]:
    validate_send_topic(topic)  # user topics only: %DLQ%/%DISCARD% go with their groups

    def op(w: OpWrites) -> Deleted:
        count = core.topics.get(topic)
        if count is None:
            raise TopicNotFoundError(topic)
        cursors = [(g, q) for (g, t, q) in list(core.consumers.cursors) if t == topic]
        groups = sorted({g for g, _q in cursors})
        undecided = _undecided(core, topic)
        if undecided or (groups and not force):
            raise TopicInUseError(topic, groups if not force else [], undecided)
        entries = 0
        for q in range(count):
            for key, _value in core.db.scan("cq", codec.queue_prefix(topic, q),
                                            codec.cq_key(topic, q, 2**63 - 1)):
                w.delete("cq", key)
                entries += 1
            core.queue_next.pop((topic, q), None)
        for group, q in cursors:
            cursor = core.consumers.cursors.pop((group, topic, q))
            w.delete("consumers", codec.consumer_key(group, topic, q))
            for offset in [*cursor.inflight, *cursor.settled]:
                w.delete("inflight", codec.inflight_key(group, topic, q, offset))
        del core.topics[topic]
        if topic in core.fifo_topics:
            core.fifo_topics.discard(topic)
            w.delete("meta", codec.topic_type_key(topic))
        w.delete("topics", topic.encode())
        w.on_durable(lambda: [fn(topic) for fn in core.topic_listeners])
        return Deleted(entries, groups)
    return op
