"""Draining a shard before it is removed (``txmq broker drain SHARD``).

While draining, the shard refuses new sends and half messages with ShardDrainingError
(UNAVAILABLE, retryable: producers, whose new sends are free to move, send them to another
shard with a new message id) and serves everything else as before: EndTransaction and check
answers for its pending transactions, the checker's claims, receives and acks. A send it
already stored (a retry with the same message id) is still answered, so a retry never turns
a stored message into an error.

The flag is a row of the store's ``meta`` family written like any other state change (on a
replicated shard through the replication log), so it holds across restarts and fail-overs;
the broker reports it in its heartbeat and the name servers mark the shard's queues
``draining`` in routes, so clients stop choosing it without a refused attempt.

:func:`drain_status` says what still keeps the shard from being removed: PREPARED
transactions (checked until decided), DISCARDED ones (an operator decides them: `txmq txn
resolve`), per consumer group and topic the messages not yet acknowledged, and topics
holding messages that no consumer group has read here. Only groups that have read from this
shard are known to it; system topics (dead letters, discards) are not counted.
"""

from __future__ import annotations

from typing import Any, Callable

from txmq.errors import ShardDrainingError

from .store import codec
from .store.db import Database, OpWrites

DRAINING_KEY = b"draining"


def is_draining(db: Database) -> bool:
    value = db.get("meta", DRAINING_KEY)
    return value is not None and codec.unframe(value, "meta", DRAINING_KEY) == b"1"


def set_draining_op(draining: bool) -> Callable[[OpWrites], bool]:
    def op(w: OpWrites) -> bool:
        w.put("meta", DRAINING_KEY, codec.frame(b"1" if draining else b"0"))
        return draining
    return op


def guard_send(db: Database, shard: str, op: Callable[[OpWrites], Any], message_id: str) -> Callable[[OpWrites], Any]:
    """``op`` (a send), refused while the shard drains unless it repeats a stored message."""
    def guarded(w: OpWrites) -> Any:
        if is_draining(db) and db.get("dedup", message_id.encode()) is None:
            raise ShardDrainingError(shard)
        return op(w)
    return guarded


def drain_status(db: Database, core: Any) -> dict[str, Any]:
    """What the shard still holds for producers and consumers (``core``: the BrokerCore)."""
    pending = sum(p for p, _d in core.counters.values())
    discarded = sum(d for _p, d in core.counters.values())
    backlog: dict[tuple[str, str], int] = {}
    read: set[tuple[str, int]] = set()
    for group, topic, queue_id, ack in core.consumers.snapshot():
        if topic.startswith("%"):
            continue
        read.add((topic, queue_id))
        left = max(core.queue_next.get((topic, queue_id), 0) - ack, 0)
        backlog[(group, topic)] = backlog.get((group, topic), 0) + left
    unread = sorted({topic for (topic, queue_id), end in core.queue_next.items()
                     if end > 0 and not topic.startswith("%") and (topic, queue_id) not in read})
    draining = is_draining(db)
    return {"draining": draining, "pending_transactions": pending, "discarded_transactions": discarded,
            "backlog": {k: v for k, v in sorted(backlog.items())}, "unread_topics": unread,
            "topics": dict(sorted(core.topics.items())),
            "empty": draining and pending == 0 and discarded == 0 and not unread and not any(backlog.values())}
