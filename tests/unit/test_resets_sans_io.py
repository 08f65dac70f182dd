"""The sans-I/O half of ``Admin.reset_offsets`` (``txmq._resets``) and the CLI's time and
offset parsing: the request an operator's words make, refused naming the field before any
call; the answer read back (lag change per queue)."""

from __future__ import annotations

import datetime as dt

import pytest

from txmq._cli import parse_duration
from txmq._group_cli import parse_time
from txmq._resets import parse_to_offset, reset_request, reset_result
from txmq.errors import InvalidFieldError
from txmq.v1 import admin_pb2, broker_pb2

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)


def test_one_target_each() -> None:
    assert reset_request("g", "t", to_earliest=True).target == broker_pb2.RESET_TARGET_EARLIEST
    assert reset_request("g", "t", to_latest=True, dry_run=False).dry_run is False
    timed = reset_request("g", "t", to_time=NOW)
    assert timed.target == broker_pb2.RESET_TARGET_TIME and timed.timestamp_ms == int(NOW.timestamp() * 1000)
    shifted = reset_request("g", "t", shift=-5)
    assert (shifted.target, shifted.shift) == (broker_pb2.RESET_TARGET_SHIFT, -5)
    offsets = reset_request("g", "t", to_offsets={0: 10, ("broker-1", 2): 7})
    assert [(o.broker_name, o.queue_id, o.offset) for o in offsets.offsets] == [("", 0, 10), ("broker-1", 2, 7)]
    assert reset_request("g", "t", shift=0).shift == 0  # a shift of 0 is a target (recompute, clamp)


@pytest.mark.parametrize("kwargs,field", [
    ({}, "target"), ({"to_earliest": True, "to_latest": True}, "target"), ({"to_time": dt.datetime(2026, 1, 1)},
                                                                           "to_time"),
    ({"to_offsets": {0: -1}}, "to_offsets"), ({"to_offsets": {-1: 0}}, "to_offsets"), ({"shift": 1.5}, "shift"),
    ({"shift": True}, "shift")])
def test_bad_requests_name_the_field(kwargs, field) -> None:
    with pytest.raises(InvalidFieldError) as refused:
        reset_request("g", "t", **kwargs)
    assert refused.value.field == field


def test_group_and_topic_are_required() -> None:
    with pytest.raises(InvalidFieldError, match="consumer_group"):
        reset_request("", "t", to_latest=True)
    with pytest.raises(InvalidFieldError, match="topic"):
        reset_request("g", "", to_latest=True)


def test_to_offset_and_times_as_an_operator_types_them() -> None:
    assert parse_to_offset("3:1200") == ("", 3, 1200)
    assert parse_to_offset("broker-1/3:1200") == ("broker-1", 3, 1200)
    for bad in ("3", "a:1", "3:-1", "b/c/3:1", ""):
        with pytest.raises(InvalidFieldError):
            parse_to_offset(bad)
    assert parse_time("15m ago", "to_time", parse_duration, NOW) == NOW - dt.timedelta(minutes=15)
    assert parse_time("-2h", "to_time", parse_duration, NOW) == NOW - dt.timedelta(hours=2)
    assert parse_time("2026-12-01T09:30:00Z", "to_time", parse_duration) == NOW.replace(hour=9, minute=30)
    assert parse_time("2026-12-01 09:30", "to_time", parse_duration).tzinfo == dt.UTC  # no zone: UTC
    assert parse_time("2026-12-01T09:30:00+01:00", "to_time", parse_duration) == NOW.replace(hour=8, minute=30)
    with pytest.raises(InvalidFieldError) as refused:
        parse_time("yesterday", "to_time", parse_duration)
    assert refused.value.field == "to_time"


def test_the_answer_read_back() -> None:
    request = reset_request("g", "t", shift=-3, dry_run=False)
    response = admin_pb2.ResetOffsetsResponse(applied=True, operator="alice", queues=[
        broker_pb2.QueueReset(broker_name="b1", queue_id=1, current_offset=10, new_offset=7, min_offset=0,
                              max_offset=12, lag_before=2, lag_after=5, inflight_invalidated=1),
        broker_pb2.QueueReset(broker_name="b0", queue_id=0, current_offset=4, new_offset=4, min_offset=4,
                              max_offset=4, lag_before=0, lag_after=0)],
        live_consumers=[broker_pb2.GroupClient(client_id="c1", broker_name="b1", waiting=True)])
    result = reset_result(request, response)
    assert result.applied and result.operator == "alice" and result.consumer_group == "g"
    assert [(q.broker_name, q.lag_change) for q in result.queues] == [("b0", 0), ("b1", 3)]
    assert [(c.client_id, c.waiting) for c in result.live_consumers] == [("c1", True)]


def queue_reset(broker: str, queue: int, current: int, new: int, low: int, high: int) -> broker_pb2.QueueReset:
    return broker_pb2.QueueReset(broker_name=broker, queue_id=queue, current_offset=current, new_offset=new,
                                 min_offset=low, max_offset=high, lag_before=high - current, lag_after=high - new)


def test_an_offset_outside_the_queue_says_it_was_clamped() -> None:
    request = reset_request("g", "t", shift=-3)
    result = reset_result(request, admin_pb2.ResetOffsetsResponse(queues=[
        queue_reset("b0", 0, 1, 0, 0, 5), queue_reset("b0", 1, 9, 6, 0, 9)]))
    assert [(q.asked_offset, q.clamped) for q in result.queues] == [(-2, True), (6, False)]
    request = reset_request("g", "t", to_offsets={0: 1000, ("b1", 1): 2})
    result = reset_result(request, admin_pb2.ResetOffsetsResponse(queues=[
        queue_reset("b0", 0, 1, 5, 0, 5), queue_reset("b1", 1, 4, 2, 0, 9)]))
    assert [(q.asked_offset, q.clamped) for q in result.queues] == [(1000, True), (2, False)]
    result = reset_result(reset_request("g", "t", to_latest=True),
                          admin_pb2.ResetOffsetsResponse(queues=[queue_reset("b0", 0, 1, 5, 0, 5)]))
    assert [(q.asked_offset, q.clamped) for q in result.queues] == [(None, False)]  # no offset was asked for
