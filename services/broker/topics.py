"""Deleting a topic's queues on this broker (the operator's ``txmq topic delete``).

A function over a :class:`~services.broker.core.BrokerCore` (its queues and consumer
groups), run through the store bridge like any write: one WriteBatch removes the topic row,
every queue entry (``Queues.remove_topic``), and every consumer group's cursor and in-flight
deliveries of the topic (``ConsumerGroups.drop_topic``); the in-memory state follows in the
same operation. The messages themselves stay in the commit log until retention removes them
(nothing names them any more).

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
        if topic not in core.queues.topics:
            raise TopicNotFoundError(topic)
        groups = core.consumers.groups_in(topic)
        undecided = _undecided(core, topic)
        if undecided or (groups and not force):
            raise TopicInUseError(topic, groups if not force else [], undecided)
        entries = core.queues.remove_topic(w, topic)
        core.consumers.drop_topic(w, topic)
        return Deleted(entries, groups)
    return op
