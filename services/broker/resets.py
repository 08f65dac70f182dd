"""Resetting a consumer group's position in a topic's queues on this broker: to the
earliest or latest offset, to a time, to given offsets, or by a shift (Kafka's
``kafka-consumer-groups --reset-offsets``, RocketMQ's ``resetOffsetByTime``).

A reset to offset P in a queue makes the group's cursor as if everything below P had been
acknowledged and nothing from P on delivered: ``next_offset`` P, nothing in flight, nothing
settled past it. It is one operation, so one WriteBatch through the normal write path (a
replicated shard's followers apply it like any other). What was in flight is **revoked**:
each delivery's row becomes a revoked row keeping its attempt, so its receipt handle no
longer acknowledges anything (NOT_FOUND), and the offset's next delivery counts its attempts
on from it — no handle issued before the reset can ever name a delivery made after it. A
FIFO topic's order holds from P: nothing is in flight, so each message group's first
message from P is delivered first.

Refused (``ConsumersLiveError``) while the group has live consumers of the topic here
(``receivers.py``), unless forced; a dry run computes the same answer and writes nothing.
The last reset of (group, topic) is kept with who did it, when and why (``meta``
``group_reset/...``), shown by ``DescribeConsumerGroups``, and logged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Mapping

from txmq.errors import ConsumersLiveError, InvalidFieldError, QueueNotFoundError
from txmq.names import validate_group, validate_receive_topic

from .consumers import Cursor
from .core import BrokerCore
from .store import codec
from .store.db import OpWrites

log = logging.getLogger(__name__)

#: The targets (broker.proto ResetTarget numbers, stored in the reset record).
EARLIEST, LATEST, TIME, OFFSET, SHIFT = 1, 2, 3, 4, 5
TARGET_NAMES = {EARLIEST: "earliest", LATEST: "latest", TIME: "time", OFFSET: "offset", SHIFT: "shift"}


@dataclass(frozen=True, slots=True)
class QueueReset:
    queue_id: int
    current_offset: int
    new_offset: int
    min_offset: int
    max_offset: int
    inflight_invalidated: int


@dataclass(frozen=True, slots=True)
class LiveConsumer:
    client_id: str
    address: str
    last_seen_ms: int
    waiting: bool


@dataclass(frozen=True, slots=True)
class ResetResult:
    queues: list[QueueReset]
    live: list[LiveConsumer]
    applied: bool


def reset_op(core: BrokerCore, group: str, topic: str, target: int, *, timestamp_ms: int = 0,
             offsets: Mapping[int, int] | None = None, shift: int = 0, dry_run: bool = True,
             force: bool = False, operator: str = "", reason: str = "") -> Callable[[OpWrites], ResetResult]:
    """The reset (see the module docstring) as an operation; the arguments are checked now."""
    validate_group("consumer_group", group)
    validate_receive_topic(topic)
    count = core.queues.count(topic)
    if target not in TARGET_NAMES:
        raise InvalidFieldError("target", f"must be one of earliest, latest, time, offset, shift (got {target})")
    if target == TIME and timestamp_ms <= 0:
        raise InvalidFieldError("timestamp_ms", "a reset to a time needs the time (ms since the epoch)")
    if target == OFFSET:
        if not offsets:
            raise InvalidFieldError("offsets", "a reset to offsets needs at least one queue:offset")
        for q, offset in offsets.items():
            if not 0 <= q < count:
                raise QueueNotFoundError(topic, q)
            if offset < 0:
                raise InvalidFieldError("offsets", f"queue {q}: offset {offset} is negative")
    if not dry_run and not operator:
        raise InvalidFieldError("operator", "required: who resets the offsets (recorded with the reset)")
    queues = sorted(offsets) if target == OFFSET and offsets else list(range(count))

    def op(w: OpWrites) -> ResetResult:
        now = core.clock()
        live = [LiveConsumer(r.client_id, r.address, r.topics.get(topic, 0), bool(r.waiting.get(topic)))
                for r in core.receivers.live(group, topic, now)]
        planned = [_plan(core, group, topic, q, target, timestamp_ms, (offsets or {}).get(q, 0), shift)
                   for q in queues]
        if dry_run:
            return ResetResult(planned, live, False)
        if live and not force:
            raise ConsumersLiveError(group, topic, [c.client_id for c in live])
        done = [_apply(core, w, group, topic, plan) for plan in planned]
        w.put("meta", codec.reset_key(group, topic), codec.encode_reset(codec.ResetRecord(
            now, operator, reason, target, timestamp_ms if target == TIME else shift if target == SHIFT else 0)))
        w.on_durable(lambda: core.listeners.notify_visible(topic))  # waiting receives read from the new position
        w.on_durable(lambda: log.warning("consumer group offsets reset", extra={"fields": {
            "consumer_group": group, "topic": topic, "target": TARGET_NAMES[target], "operator": operator,
            "reason": reason, "forced": bool(live),
            "queues": {q.queue_id: [q.current_offset, q.new_offset] for q in done}}}))
        return ResetResult(done, live, True)
    return op


def _plan(core: BrokerCore, group: str, topic: str, q: int, target: int, timestamp_ms: int, offset: int,
          shift: int) -> QueueReset:
    low, high = core.queues.first_offset(topic, q), core.queues.next_offset(topic, q)
    cursor = core.consumers.get(group, topic, q)
    current = cursor.ack_offset() if cursor is not None else low
    if target == EARLIEST:
        new = low
    elif target == LATEST:
        new = high
    elif target == TIME:
        new = _offset_at(core, topic, q, low, high, timestamp_ms)
    elif target == OFFSET:
        new = offset
    else:
        new = current + shift
    new = min(max(new, low), high)
    return QueueReset(q, current, new, low, high, len(cursor.inflight) if cursor is not None else 0)


def _offset_at(core: BrokerCore, topic: str, q: int, low: int, high: int, timestamp_ms: int) -> int:
    """The first offset of the queue whose message became visible at or after
    ``timestamp_ms`` (``high`` when none): a binary search, queue entries being appended
    in visibility order."""
    def visible_at(offset: int) -> tuple[int, int] | None:
        for key, value in core.db.scan("cq", codec.cq_key(topic, q, offset), codec.cq_key(topic, q, high)):
            return codec.split_cq_key(key)[2], codec.decode_cq_entry(value, key).visible_ms
        return None

    lo, hi = low, high
    while lo < hi:
        mid = (lo + hi) // 2
        found = visible_at(mid)
        if found is None or found[1] >= timestamp_ms:  # none visible from mid on, or at or after the time
            hi = mid
        else:
            lo = found[0] + 1
    return lo


def _apply(core: BrokerCore, w: OpWrites, group: str, topic: str, plan: QueueReset) -> QueueReset:
    """Stages the group's new cursor in one queue (see the module docstring)."""
    q = plan.queue_id
    old = core.deliveries.cursor(w, group, topic, q)
    revoked = dict(old.revoked)
    for offset, entry in old.inflight.items():
        revoked[offset] = max(entry.attempt, revoked.get(offset, 0))
    for offset in old.settled:
        w.delete("inflight", codec.inflight_key(group, topic, q, offset))
    for offset in [o for o in revoked if o < plan.min_offset]:
        del revoked[offset]  # gone to retention: never delivered again
        w.delete("inflight", codec.inflight_key(group, topic, q, offset))
    for offset, attempt in revoked.items():
        w.put("inflight", codec.inflight_key(group, topic, q, offset),
              codec.encode_inflight(attempt, codec.REVOKED_DEADLINE))
    core.consumers.cursors[(group, topic, q)] = Cursor(plan.new_offset, revoked=revoked)
    w.put("consumers", codec.consumer_key(group, topic, q), codec.encode_u64(plan.new_offset))
    return QueueReset(q, plan.current_offset, plan.new_offset, plan.min_offset, plan.max_offset, len(old.inflight))


def last_reset(core: BrokerCore, group: str, topic: str) -> codec.ResetRecord | None:
    """The last reset of ``group``'s offsets in ``topic`` on this broker (None: never)."""
    value = core.db.get("meta", codec.reset_key(group, topic))
    return codec.decode_reset(value, codec.reset_key(group, topic)) if value is not None else None
