"""Deleting a consumer group's state on this broker (the operator's ``txmq group delete``,
Kafka's ``deleteConsumerGroups``, RocketMQ's ``deleteSubscriptionGroup``).

One operation, so one WriteBatch through the normal write path (a replicated shard's
followers apply it like any other write, and a new leader's domain loads what it left):
every cursor of the group (each (topic, queue)), its in-flight deliveries with the settled
and revoked rows beside them, its offset-reset records (``meta`` ``group_reset/<group>...``);
in memory the same, with the clients of the group this broker remembers
(``Receivers.forget_group``). The group's names leave ``ConsumerGroups.names``, so the
per-principal quotas (``quotas.py``) count it no more, and its metric series (lag per
topic, computed from the cursors at each scrape) go with the cursors.

Its ``%DLQ%<group>`` topic and the dead letters in it are **kept** unless ``dead_letters``:
they stay readable (``txmq dlq``) and re-drivable, and its dead-letter gauge stays. With
``dead_letters`` the topic goes like a deleted topic (``Queues.remove_topic``), with any
cursor another group had in it.

Receipt handles of the deleted deliveries name a delivery that no longer exists: an ack
answers NOT_FOUND (``ReceiptHandleNotFoundError``), like one of an acknowledged delivery.
A later receive of the group starts it as a new group (``Deliveries.cursor``: at each
queue's oldest retained message). So that no such handle can ever name a delivery made
after the deletion (the same offset delivered again with the same attempt number), what
was in flight per queue is kept as one small ``meta`` row (``codec.revoked_key``: offset →
attempt, nothing else; no cursor, so no quota counts it): the group's next first cursor
there takes it as revoked deliveries (``resets.py``'s rule), their attempts counting on.

Refused (``GroupNotEmptyError``) while the group has live consumers here (``receivers.py``:
a receive waiting, or one within ``consumer_session_seconds``), unless forced; a dry run
counts the same and writes nothing.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Callable

from txmq.errors import GroupNotEmptyError
from txmq.names import dlq_topic, validate_group

from .core import BrokerCore
from .groups import count_dead_letters
from .receivers import Receiver
from .store import codec
from .store.db import OpWrites

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GroupDeletion:
    topics: list[str]
    cursors: int
    inflight: int
    resets: int
    clients: int
    dead_letters: int
    dead_letter_topic_deleted: bool
    live: list[Receiver]
    applied: bool


def reset_keys(core: BrokerCore, group: str) -> list[bytes]:
    """The ``meta`` keys of the group's offset-reset records."""
    prefix = codec.RESET_PREFIX + group.encode() + codec.SEP
    return [key for key, _value in core.db.scan("meta", prefix, prefix[:-1] + bytes([prefix[-1] + 1]))]


def delete_group_op(core: BrokerCore, group: str, *, dry_run: bool = True, force: bool = False,
                    dead_letters: bool = False, operator: str = "",
                    reason: str = "") -> Callable[[OpWrites], GroupDeletion]:
    """The deletion (see the module docstring) as an operation; the arguments are checked now."""
    validate_group("consumer_group", group)

    def op(w: OpWrites) -> GroupDeletion:
        now = core.clock()
        consumers = core.consumers
        live = core.receivers.of_group(group, now)
        keys = sorted(key for key in consumers.cursors if key[0] == group)
        inflight = sum(len(consumers.cursors[key].inflight) for key in keys)
        resets = reset_keys(core, group)
        clients = core.receivers.known(group)
        dlq = dlq_topic(group)
        has_dlq = dlq in core.queues.topics
        dead = count_dead_letters(core, group) if has_dlq else 0
        drop_dlq = dead_letters and has_dlq
        topics = sorted({t for _g, t, _q in keys})

        def result(applied: bool) -> GroupDeletion:
            return GroupDeletion(topics, len(keys), inflight, len(resets), clients, dead, drop_dlq, live, applied)
        if dry_run:
            return result(False)
        if live and not force:
            raise GroupNotEmptyError(group, sorted({r.client_id for r in live}))
        for key in keys:
            _group, topic, q = key
            cursor = consumers.remove(key)
            w.delete("consumers", codec.consumer_key(group, topic, q))
            for offset in {*cursor.inflight, *cursor.settled, *cursor.revoked}:
                w.delete("inflight", codec.inflight_key(group, topic, q, offset))
            revoked = dict(cursor.revoked)
            for offset, entry in cursor.inflight.items():
                revoked[offset] = max(entry.attempt, revoked.get(offset, 0))
            if revoked:
                w.put("meta", codec.revoked_key(group, topic, q), codec.encode_revoked(revoked))
        for reset in resets:
            w.delete("meta", reset)
        if drop_dlq:
            core.queues.remove_topic(w, dlq)
            consumers.drop_topic(w, dlq)
        core.receivers.forget_group(group)
        for topic in topics:  # a forced deletion's waiting receives start the group anew
            w.on_durable(functools.partial(core.listeners.notify_visible, topic))
        w.on_durable(lambda: log.warning("consumer group deleted", extra={"fields": {
            "consumer_group": group, "operator": operator, "reason": reason, "forced": bool(live),
            "topics": topics, "cursors": len(keys), "inflight": inflight, "dead_letters_deleted": drop_dlq}}))
        return result(True)
    return op
