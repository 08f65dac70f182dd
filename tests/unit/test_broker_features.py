"""The broker's domain for SQL92 filters and delay / timer messages, against a real RocksDB
directory with a controllable clock: the timer moves nothing early and everything due, a
reopened store keeps its schedule, retention never removes a message still waiting for its
time, and a long run of filtered-out messages is scanned in bounded steps."""

from __future__ import annotations

from typing import Any

import pytest

from services.broker.core import BrokerCore
from services.broker.delivery import MAX_FILTERED_SCAN
from services.broker.filters import parse_filter
from services.broker.model import RESOLUTION_COMMIT
from services.broker.store import codec
from services.broker.store.codec import LogRecord

from tests.support.clock import Clock

START_MS = Clock().ms


@pytest.fixture
def open_core(make_core):
    """The shared cores (tests/unit/conftest.py), each holding the topic ``orders``."""
    def make(**overrides: Any) -> BrokerCore:
        core = make_core(**overrides)
        if "orders" not in core.topics:
            core.db.call(core.create_topic_op("orders", 1))
        return core
    return make


def send(core: BrokerCore, body: bytes, *, kind: int = codec.KIND_NORMAL, **fields: Any):
    record = core.validate_message(LogRecord(kind=kind, topic="orders", body=body, message_id="", queue_id=0,
                                             stored_ms=0, producer_group="pg" if kind == codec.KIND_HALF else "",
                                             **fields))
    return core.db.call(core.send_op(record))


def received(core: BrokerCore, group: str = "cg", expression: str = "*", sql: bool = False) -> list[bytes]:
    result = core.db.call(core.receive_op(group, "orders", -1, parse_filter(expression, sql), 64, 30.0))
    return [core.read_message(d.log_seq).body for d in result.deliveries]


def test_the_timer_moves_nothing_early_and_everything_due(open_core, clock) -> None:
    core = open_core()
    assert send(core, b"in-2s", delay_seconds=2.0).queue_offset == -1
    send(core, b"at-1s", deliver_at_ms=clock.ms + 1000)
    send(core, b"now")
    assert core.timer_next_ms() == clock.ms + 1000
    assert core.db.call(core.timer_op()) == 0
    assert received(core) == [b"now"]
    clock.advance(0.999)
    assert core.db.call(core.timer_op()) == 0
    clock.advance(0.001)
    assert core.db.call(core.timer_op()) == 1
    assert core.timer_next_ms() == START_MS + 2000
    assert received(core) == [b"at-1s"]
    clock.advance(1.0)
    assert core.db.call(core.timer_op()) == 1
    assert core.timer_next_ms() is None
    assert received(core) == [b"in-2s"]
    # The moved message's record now names its queue offset (retention and reads need it).
    assert core.read_message(2).queue_offset == 1  # at-1s (the second record) went in first
    assert core.read_message(1).queue_offset == 2


def test_a_reopened_store_keeps_its_schedule(open_core, clock) -> None:
    core = open_core()
    send(core, b"later", delay_seconds=5.0)
    core.close()
    core = open_core()
    assert core.timer_next_ms() == START_MS + 5000
    clock.advance(5.0)
    assert core.db.call(core.timer_op()) == 1
    assert received(core) == [b"later"]


def test_retention_never_removes_a_message_waiting_for_its_time(open_core, clock) -> None:
    core = open_core(retention_seconds=0.0, max_delivery_delay_seconds=3600.0)
    send(core, b"first")
    send(core, b"waiting", delay_seconds=60.0)
    send(core, b"last")
    assert received(core) == [b"first", b"last"]
    clock.advance(30.0)
    core.db.call(core.retention_op())
    clock.advance(30.0)
    assert core.db.call(core.timer_op()) == 1
    assert b"waiting" in received(core)  # (with the other two again: their invisibility ran out)


def test_a_commit_with_a_delivery_time_waits_for_it(open_core, clock) -> None:
    core = open_core()
    result = send(core, b"tx", kind=codec.KIND_HALF, delay_seconds=3.0)
    clock.advance(1.0)
    ended = core.db.call(core.end_op(result.transaction_id, RESOLUTION_COMMIT, codec.SOURCE_CLIENT))
    assert ended.queue_offset == -1
    assert received(core) == []
    clock.advance(2.0)
    assert core.db.call(core.timer_op()) == 1
    assert received(core) == [b"tx"]
    row = core._read_txn(core.parse_txn_id(result.transaction_id))
    assert row is not None and row.queue_offset == 0
    # Committed after its delivery time: visible at once.
    late = send(core, b"late", kind=codec.KIND_HALF, delay_seconds=1.0)
    clock.advance(2.0)
    assert core.db.call(core.end_op(late.transaction_id, RESOLUTION_COMMIT, codec.SOURCE_CLIENT)).queue_offset == 1
    assert received(core) == [b"late"]


def test_a_long_filtered_out_run_is_scanned_in_bounded_steps(open_core, clock) -> None:
    core = open_core()
    with core.db.grouped():
        for i in range(MAX_FILTERED_SCAN + 10):
            core.db.apply(core.send_op(core.validate_message(LogRecord(
                kind=codec.KIND_NORMAL, topic="orders", body=b"x", message_id="", queue_id=0, stored_ms=0,
                properties={"n": str(i)}))), sync=False)
    send(core, b"wanted", properties={"n": "-1"})
    f = parse_filter("n < 0", sql=True)
    first = core.db.call(core.receive_op("cg", "orders", -1, f, 16, 30.0))
    assert first.deliveries == [] and first.next_deadline_ms == clock.ms  # come back at once
    second = core.db.call(core.receive_op("cg", "orders", -1, f, 16, 30.0))
    assert [core.read_message(d.log_seq).body for d in second.deliveries] == [b"wanted"]
