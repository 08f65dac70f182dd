"""Resetting a consumer group's offsets, sans I/O: :func:`reset_request` builds the
``ResetOffsetsRequest`` from what an operator asks for (checking it first, naming the
field), :func:`reset_result` reads the answer into a :class:`ResetResult`. The sync
:meth:`txmq.Admin.reset_offsets`, the CLI (``txmq group reset``) and an asyncio Admin send
the same request and read the same answer; only the call differs.

Exactly one target: ``to_earliest``, ``to_latest``, ``to_time`` (a timezone-aware datetime:
the first message of each queue that became visible then or later), ``to_offsets``
(``{queue: offset}`` when the topic is on one broker, ``{(broker, queue): offset}``
otherwise), or ``shift`` (each queue's acknowledged offset plus ``shift``, negative to go
back). New offsets are clamped to what each queue retains.
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass
from typing import Mapping, Union

from ._errors import InvalidFieldError
from .v1 import admin_pb2, broker_pb2

OffsetKey = Union[int, tuple[str, int]]

_TO_OFFSET = re.compile(r"^(?:(?P<broker>[^/:\s]+)/)?(?P<queue>\d+):(?P<offset>\d+)$")


@dataclass(frozen=True, slots=True)
class QueueChange:
    """One queue's position before and after (``lag_*`` = messages left to the group)."""

    broker_name: str
    queue_id: int
    current_offset: int
    new_offset: int
    min_offset: int
    max_offset: int
    lag_before: int
    lag_after: int
    inflight_invalidated: int
    #: The offset asked for (``to_offsets``, or the current offset plus ``shift``); None
    #: for the other targets, which name no offset.
    asked_offset: int | None = None

    @property
    def lag_change(self) -> int:
        """Messages the group will receive again (positive) or skip (negative)."""
        return self.lag_after - self.lag_before

    @property
    def clamped(self) -> bool:
        """The offset asked for is outside what the queue retains (``min_offset`` ..
        ``max_offset``): the new offset is the nearest end instead."""
        return self.asked_offset is not None and self.asked_offset != self.new_offset


@dataclass(frozen=True, slots=True)
class LiveConsumer:
    client_id: str
    address: str
    broker_name: str
    waiting: bool
    last_seen_ms: int


@dataclass(frozen=True, slots=True)
class ResetResult:
    """What a reset did (``applied``) or would do (a dry run): per queue, current → new."""

    consumer_group: str
    topic: str
    applied: bool
    queues: tuple[QueueChange, ...]
    live_consumers: tuple[LiveConsumer, ...]
    operator: str
    unreachable_brokers: tuple[str, ...]


def parse_to_offset(text: str) -> tuple[str, int, int]:
    """``"3:1200"`` → ("", 3, 1200); ``"broker-1/3:1200"`` → ("broker-1", 3, 1200)."""
    match = _TO_OFFSET.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise InvalidFieldError("to_offset", f"{text!r} is not QUEUE:OFFSET or BROKER/QUEUE:OFFSET")
    return match.group("broker") or "", int(match.group("queue")), int(match.group("offset"))


def reset_request(consumer_group: str, topic: str, *, to_earliest: bool = False, to_latest: bool = False,
                  to_time: _dt.datetime | None = None, to_offsets: Mapping[OffsetKey, int] | None = None,
                  shift: int | None = None, dry_run: bool = True, force: bool = False, reason: str = "",
                  operator: str = "") -> admin_pb2.ResetOffsetsRequest:
    """The request for one reset (see the module docstring); InvalidFieldError naming the
    field for a request the cluster would refuse anyway."""
    if not consumer_group:
        raise InvalidFieldError("consumer_group", "required")
    if not topic:
        raise InvalidFieldError("topic", "required")
    chosen = [name for name, given in (("to_earliest", to_earliest), ("to_latest", to_latest),
                                       ("to_time", to_time is not None), ("to_offsets", bool(to_offsets)),
                                       ("shift", shift is not None)) if given]
    if len(chosen) != 1:
        raise InvalidFieldError("target", "choose exactly one of to_earliest, to_latest, to_time, to_offsets, shift"
                                + (f" (got {', '.join(chosen)})" if chosen else ""))
    request = admin_pb2.ResetOffsetsRequest(consumer_group=consumer_group, topic=topic, dry_run=dry_run,
                                            force=force, reason=reason, operator=operator)
    if to_earliest:
        request.target = broker_pb2.RESET_TARGET_EARLIEST
    elif to_latest:
        request.target = broker_pb2.RESET_TARGET_LATEST
    elif to_time is not None:
        if not isinstance(to_time, _dt.datetime) or to_time.tzinfo is None:
            raise InvalidFieldError("to_time", "must be a timezone-aware datetime")
        request.target = broker_pb2.RESET_TARGET_TIME
        request.timestamp_ms = round(to_time.timestamp() * 1000)
        if request.timestamp_ms <= 0:
            raise InvalidFieldError("to_time", "must be after 1970")
    elif to_offsets:
        request.target = broker_pb2.RESET_TARGET_OFFSET
        for key, offset in to_offsets.items():
            broker, queue = ("", key) if isinstance(key, int) else key
            if not isinstance(queue, int) or queue < 0:
                raise InvalidFieldError("to_offsets", f"{key!r}: a queue is a non-negative integer")
            if not isinstance(offset, int) or offset < 0:
                raise InvalidFieldError("to_offsets", f"{key!r}: offset {offset!r} must be a non-negative integer")
            request.offsets.append(admin_pb2.BrokerQueueOffset(broker_name=broker, queue_id=queue, offset=offset))
    else:
        if not isinstance(shift, int) or isinstance(shift, bool):
            raise InvalidFieldError("shift", f"must be an integer, got {shift!r}")
        request.target = broker_pb2.RESET_TARGET_SHIFT
        request.shift = shift
    return request


def reset_result(request: admin_pb2.ResetOffsetsRequest, response: admin_pb2.ResetOffsetsResponse) -> ResetResult:
    asked = {(o.broker_name, o.queue_id): o.offset for o in request.offsets}

    def asked_offset(q: broker_pb2.QueueReset) -> int | None:
        if request.target == broker_pb2.RESET_TARGET_SHIFT:
            return q.current_offset + request.shift
        if request.target == broker_pb2.RESET_TARGET_OFFSET:
            return asked.get((q.broker_name, q.queue_id), asked.get(("", q.queue_id)))
        return None

    queues = tuple(sorted((QueueChange(q.broker_name, q.queue_id, q.current_offset, q.new_offset, q.min_offset,
                                       q.max_offset, q.lag_before, q.lag_after, q.inflight_invalidated,
                                       asked_offset(q))
                           for q in response.queues), key=lambda q: (q.broker_name, q.queue_id)))
    live = tuple(LiveConsumer(c.client_id, c.address, c.broker_name, c.waiting, c.last_seen_ms)
                 for c in response.live_consumers)
    return ResetResult(request.consumer_group, request.topic, response.applied, queues, live, response.operator,
                       tuple(response.unreachable_brokers))
